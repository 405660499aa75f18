"""Supervised warm start of a tiny agent on worked solutions.

Each step draws ``batch_size`` fresh problems from a seeded stream over ``levels`` (validation and test problems
are skipped), renders the prompt with the agent's chat template and trains on ``response + EOS`` only (prompt
and padding positions carry label -100). AdamW with a linear warmup to ``lr``, then a constant ``lr``.

Two ways to stop:

* ``steps=N``: exactly N steps.
* ``target_band=(lo, hi)``: greedy accuracy on a probe set (level-4 validation problems) is measured every
  ``probe_every`` steps from ``probe_start``; training stops at the first probe inside ``[lo, hi]``. If a probe
  overshoots (``> hi``) or ``max_steps`` is reached first, the weights of the probe closest to the band are
  restored (``band_hit`` is then False). RL learns fastest at the frontier, and the frontier is a narrow window
  of warm-start steps, so stopping on accuracy is steadier than a step count across machines.

With the same seed and one CPU thread a run is deterministic.
"""
from __future__ import annotations

import copy
import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openrlhf_hacpo.data.arithmetic import RESPONSE_FORMATS, Problem, get_level, random_problem, response_text
from openrlhf_hacpo.zoo.evaluate import evaluate_accuracy

__all__ = ["WarmStartConfig", "WarmStartResult", "problem_stream", "make_sft_batch", "warm_start"]


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    lr: float
    steps: int | None = None
    """Fixed number of steps (exclusive with ``target_band``)."""
    target_band: tuple[float, float] | None = None
    """Stop when probe greedy accuracy enters ``[lo, hi]`` (exclusive with ``steps``)."""
    max_steps: int = 1000
    probe_start: int = 100
    probe_every: int = 25
    probe_size: int = 200
    batch_size: int = 64
    warmup_steps: int = 50
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    levels: tuple[int, ...] = (1, 2, 4)
    response_format: str = "worked"
    seed: int = 0
    log_every: int = 25

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.target_band is None):
            raise ValueError("WarmStartConfig needs exactly one of steps and target_band")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"WarmStartConfig.steps must be >= 1, got {self.steps}")
        if self.target_band is not None:
            lo, hi = self.target_band
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError(f"WarmStartConfig.target_band must satisfy 0 <= lo <= hi <= 1, got {self.target_band}")
        if self.lr <= 0:
            raise ValueError(f"WarmStartConfig.lr must be > 0, got {self.lr}")
        for name in ("max_steps", "probe_every", "probe_size", "batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmStartConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("probe_start", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"WarmStartConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not self.levels:
            raise ValueError("WarmStartConfig.levels must name at least one level")
        for lv in self.levels:
            get_level(lv)
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(
                f"WarmStartConfig.response_format must be one of {RESPONSE_FORMATS}, got {self.response_format!r}"
            )

    @property
    def step_cap(self) -> int:
        return self.steps if self.steps is not None else self.max_steps


@dataclasses.dataclass
class WarmStartResult:
    steps: int
    """Steps of the returned weights."""
    steps_run: int
    """Steps actually trained (larger than ``steps`` when an earlier probe's weights were restored)."""
    stop_reason: str
    """``"steps"``, ``"band"``, ``"overshoot"`` or ``"max_steps"``."""
    band_hit: bool | None
    probe_accuracy: float | None
    """Probe greedy accuracy of the returned weights (None without a band)."""
    probes: list[tuple[int, float]]
    losses: list[tuple[int, float]]
    """(step, mean training loss over the last ``log_every`` steps)."""
    train_seconds: float
    """Wall-clock seconds of the training steps (probes excluded)."""
    train_cpu_seconds: float
    """CPU seconds of this process over the same steps (steadier than wall time on a shared machine)."""
    probe_seconds: float


def problem_stream(levels: Sequence[int], seed: int, exclude: Iterable[Problem] = ()) -> Iterator[Problem]:
    """Endless seeded stream of problems, level drawn uniformly from ``levels``, never one in ``exclude``."""
    rng = random.Random(f"warmstart:{seed}")
    skip = frozenset(exclude)
    while True:
        p = random_problem(rng.choice(levels), rng)
        if p not in skip:
            yield p


def make_sft_batch(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem], response_format: str = "worked"
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels``: prompt (chat template, generation prompt) and
    response are tokenized separately, as at generation time; labels cover the response and EOS only."""
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer needs eos_token and pad_token for warm start")
    prompts = tokenizer.apply_chat_template([p.messages for p in problems], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer([response_text(p, response_format) for p in problems], add_special_tokens=False)[
        "input_ids"
    ]
    rows = [(p, r + [tokenizer.eos_token_id]) for p, r in zip(prompt_ids, response_ids)]
    width = max(len(p) + len(r) for p, r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        n = len(p) + len(r)
        input_ids[i, :n] = torch.tensor(p + r)
        labels[i, len(p) : n] = torch.tensor(r)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


class _BandTracker:
    """Keeps the probe closest to the band (a copy of its weights) and decides when to stop."""

    def __init__(self, band: tuple[float, float]) -> None:
        self.band = band
        self.best: tuple[float, int, float, dict] | None = None  # (distance, step, accuracy, weights)

    def observe(self, step: int, acc: float, model: torch.nn.Module) -> str | None:
        """Record a probe; returns ``"band"`` or ``"overshoot"`` when training should stop."""
        lo, hi = self.band
        distance = max(lo - acc, acc - hi, 0.0)
        if self.best is None or distance < self.best[0]:
            self.best = (distance, step, acc, copy.deepcopy(model.state_dict()))
        if distance == 0.0:
            return "band"
        return "overshoot" if acc > hi else None


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    cfg: WarmStartConfig,
    *,
    probe_problems: Sequence[Problem] = (),
    exclude: Iterable[Problem] = (),
    log: Callable[[str], None] | None = None,
) -> WarmStartResult:
    """Train ``model`` in place per ``cfg``; returns what was chosen and the loss / probe history.

    ``probe_problems`` (the first ``cfg.probe_size``) are needed with a ``target_band``; problems in ``exclude``
    never appear in training batches."""
    if cfg.target_band is not None and len(probe_problems) == 0:
        raise ValueError("warm_start with a target_band needs probe_problems")
    probe_set = list(probe_problems)[: cfg.probe_size]
    tracker = _BandTracker(cfg.target_band) if cfg.target_band is not None else None
    stream = problem_stream(cfg.levels, cfg.seed, exclude)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min(1.0, (i + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
    )
    losses: list[tuple[int, float]] = []
    probes: list[tuple[int, float]] = []
    window: list[float] = []
    stop_reason = "steps" if tracker is None else "max_steps"
    train_s = train_cpu_s = probe_s = 0.0
    step = 0
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        while step < cfg.step_cap:
            t0, c0 = time.perf_counter(), time.process_time()
            batch = make_sft_batch(tokenizer, [next(stream) for _ in range(cfg.batch_size)], cfg.response_format)
            loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            train_s += time.perf_counter() - t0
            train_cpu_s += time.process_time() - c0
            window.append(loss.item())
            if step % cfg.log_every == 0 or step == cfg.step_cap:
                losses.append((step, sum(window) / len(window)))
                window = []
                if log:
                    log(f"step {step}/{cfg.step_cap} loss {losses[-1][1]:.4f}")
            if tracker is None or step < cfg.probe_start or (step - cfg.probe_start) % cfg.probe_every:
                continue
            t0 = time.perf_counter()
            acc = evaluate_accuracy(model, tokenizer, probe_set).accuracy
            probe_s += time.perf_counter() - t0
            probes.append((step, acc))
            if log:
                lo, hi = cfg.target_band
                log(f"step {step} probe greedy accuracy {acc:.3f} (band {lo:.2f}-{hi:.2f})")
            verdict = tracker.observe(step, acc, model)
            if verdict is not None:
                stop_reason = verdict
                break
    if window:
        losses.append((step, sum(window) / len(window)))
    chosen_step, probe_acc = step, None
    if tracker is not None and tracker.best is not None:
        _, chosen_step, probe_acc, weights = tracker.best
        if chosen_step != step:
            model.load_state_dict(weights)
            if log:
                log(f"restored the weights of step {chosen_step} (probe accuracy {probe_acc:.3f})")
    model.eval()
    return WarmStartResult(
        steps=chosen_step,
        steps_run=step,
        stop_reason=stop_reason,
        band_hit=None if tracker is None else stop_reason == "band",
        probe_accuracy=probe_acc,
        probes=probes,
        losses=losses,
        train_seconds=train_s,
        train_cpu_seconds=train_cpu_s,
        probe_seconds=probe_s,
    )
