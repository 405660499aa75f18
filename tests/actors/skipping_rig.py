"""What the zero-gradient row-skipping tests share: a tiny Llama, rows placed at chosen sequence log-ratios, an update
loop over a plain engine that records each update's gradient, and a float64 reference of each row's gradient.

A foreign row's log-ratio ℓ = mean_t log π_θ(y_t) − old_logp_mean is placed by setting ``old_logp_mean`` to the
row's float64 mean log-prob under the current model minus the wanted ℓ; the update loop then sees ℓ up to float32
noise (about 1e-6 here). The reference objective is written from the paper's formulas (eqs. 10–14, 47–49, with the
log-ratio clamp), not from the kernel, and differentiated in float64.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkippableAdamW
from openrlhf_hacpo.actors.update_loop import UpdateLoop
from openrlhf_hacpo.actors.zero_grad_probe import SKIP_MARGIN
from openrlhf_hacpo.algorithms.config import PolicyLossConfig
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.rollout import LearnerBatch, LearnerRow
from plain_engine import PlainEngine, Tok

PROMPTS = [[1, 5, 7], [2, 9], [3, 4, 6, 8], [10, 1]]
RESPONSES = [[4, 11, 3, 6], [8, 2], [5, 5, 9], [12, 13, 2, 7, 1], [6], [9, 9, 14]]
COEF = 0.7
"""ω^(j,k) of every foreign row (the capability coefficient, eq. 10)."""

RULES = {
    "clamp": [],
    "pessimistic": ["--cross_clip_mode", "pessimistic"],
    "no_clip": ["--no_cross_clip"],
    "naive": ["--algorithm", "naive"],
    # a log-ratio clamp whose ends lie inside the foreign window: e^-0.15 = 0.861 > lo_0 = 0.8, e^0.15 = 1.162 < 1.2
    "log_clamp": ["--log_ratio_clip", "0.15", "--cross_clip_high", "1.2"],
}
"""The foreign rules under test, by name: their flags on top of :func:`make_config`'s."""


@dataclass(frozen=True)
class Row:
    """One learner row: token sequences (indices into PROMPTS / RESPONSES), own or foreign, the sequence log-ratio ℓ
    the update should see, and the advantage."""

    prompt: int
    response: int
    own: bool
    ell: float
    adv: float


def make_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))


@torch.no_grad()
def mean_logps(model: torch.nn.Module, rows: list[Row] | None = None) -> dict[tuple[int, int], float]:
    """Float64 mean response log-prob under ``model`` of the (prompt, response) pairs of ``rows`` (default: every
    pair), one unpadded forward each."""
    model64 = copy.deepcopy(model).double().eval()
    pairs = sorted({(r.prompt, r.response) for r in rows} if rows is not None
                   else {(p, r) for p in range(len(PROMPTS)) for r in range(len(RESPONSES))})
    out = {}
    for p, r in pairs:
        prompt, response = PROMPTS[p], RESPONSES[r]
        logits = model64(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1: -1]
        logp = torch.log_softmax(logits, dim=-1)[torch.arange(len(response)), torch.tensor(response)]
        out[p, r] = float(logp.mean())
    return out


def learner_batch(rows: list[Row], means: dict[tuple[int, int], float]) -> LearnerBatch:
    """The rows as a learner batch, each row's old log-prob mean set so that its log-ratio is ``row.ell``."""
    learner_rows = [LearnerRow(prompt_id=f"q{i}", prompt_ids=PROMPTS[r.prompt], response_ids=RESPONSES[r.response],
                               is_own=r.own, source=0 if r.own else 1, reward=1.0,
                               old_logp_mean=means[r.prompt, r.response] - r.ell, old_logp=None)
                    for i, r in enumerate(rows)]
    batch = LearnerBatch(learner=0, rows=learner_rows)
    batch.attach(torch.tensor([r.adv for r in rows], dtype=torch.float64),
                 torch.tensor([1.0 if r.own else COEF for r in rows], dtype=torch.float64))
    return batch


def make_config(backend: str, skip: bool, rule: str, micro: int = 3, extra: tuple[str, ...] = ()) -> TrainConfig:
    """Two agents, learner ``a``; ``micro`` rows per micro-batch (the probe's forwards too); without ``skip`` the
    full computation: every row through the backward, consecutive micro-batches."""
    flags = ["--agent", "name=a,pretrain=/m", "--agent", "name=b,pretrain=/m", "--prompt_data", "x.jsonl",
             "--n_samples_per_prompt", "2", "--rollout_batch_size", "3", "--train_batch_size", "12",
             "--micro_train_batch_size", str(micro), "--kernel_backend", backend, "--init_kl_coef", "0",
             *RULES[rule], *extra]
    if not skip:
        flags += ["--no_skip_zero_grad_rows", "--no_length_grouping"]
    return build_config(flags)


class GradRecordingEngine(PlainEngine):
    """A :class:`PlainEngine` that keeps, at each optimizer step, the flat accumulated gradient it applies."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(module, optimizer, gas=1)
        self.step_grads: list[torch.Tensor] = []

    def step(self) -> None:
        if self.is_gradient_accumulation_boundary():
            self.step_grads.append(torch.cat([
                (p.grad if p.grad is not None else torch.zeros_like(p)).detach().flatten().clone()
                for p in self.module.parameters()]))
        super().step()


def make_loop(model: torch.nn.Module, cfg: TrainConfig, lr: float, world_size: int = 1) -> UpdateLoop:
    """Learner ``a``'s loop as rank 0 of ``world_size`` data-parallel ranks (more than one needs
    ``torch.distributed.all_reduce`` replaced: there is no process group)."""
    optimizer = SkippableAdamW(model.parameters(), lr=lr)
    return UpdateLoop(cfg, cfg.resolved_agents[0], 0, 0, world_size, GradRecordingEngine(model, optimizer),
                      optimizer, Tok(), None, torch.device("cpu"))


# ------------------------------------------------------------------------------------------------ the reference
def lower_bound(loss: PolicyLossConfig, m: int) -> float:
    """lo_m = min(1, 1 − δ + m·δ_step) (eq. 14), or 1 − δ without the stepwise rise (eq. 13)."""
    p = loss.params
    return min(1.0, 1.0 - p.delta + m * p.delta_step) if p.stepwise else 1.0 - p.delta


def objective64(ell: torch.Tensor, adv: float, own: bool, rule: str, loss: PolicyLossConfig, m: int
                ) -> torch.Tensor:
    """A row's objective as a function of its log-ratio ℓ (float64): the log-ratio clamp, then the own-row clip
    min(sA, clip(s, 1 − ε_low, 1 + ε_high)A) (eqs. 47–49; every row under Naive), or the foreign rule
    c·sg(c)^α·ω·A with c = clamp(s, lo_m, hi) (eqs. 10–14; c = s without the cross clip; the pessimistic mode
    takes max(min(sA, cA), dual·A if A < 0))."""
    if loss.params.log_ratio_clip is not None:
        ell = ell.clamp(-loss.params.log_ratio_clip, loss.params.log_ratio_clip)
    s = ell.exp()
    if own or rule == "naive":
        return torch.minimum(s * adv, s.clamp(1.0 - loss.params.eps_low, 1.0 + loss.params.eps_high) * adv)
    c = s.clamp(lower_bound(loss, m), loss.params.cross_clip_high) if loss.params.cross_clip else s
    weight = c.detach() ** loss.params.alpha * (COEF if loss.capability_coef else 1.0)
    if loss.params.cross_clip and loss.params.cross_clip_mode == "pessimistic":
        value = torch.minimum(s * adv, c * adv)
        if adv < 0:
            value = torch.maximum(value, torch.tensor(loss.params.cross_clip_dual * adv, dtype=torch.float64))
        return value * weight
    return c * weight * adv


def grad64(ells: list[float], row: Row, rule: str, loss: PolicyLossConfig, m: int) -> list[float]:
    """d objective / d ℓ of ``row`` at each log-ratio of ``ells`` (float64 autograd of :func:`objective64`; each
    value depends on its own ℓ only, so one backward of the sum gives them all)."""
    x = torch.tensor(ells, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(objective64(x, row.adv, row.own, rule, loss, m).sum(), x, allow_unused=True)
    return [0.0] * len(ells) if g is None else g.tolist()


def has_gradient(row: Row, rule: str, loss: PolicyLossConfig, m: int) -> bool:
    """Whether the row's gradient is non-zero in the full computation (own rows always count as trained)."""
    return row.own or grad64([row.ell], row, rule, loss, m)[0] != 0.0


def zero_gradient_nearby(row: Row, rule: str, loss: PolicyLossConfig, m: int, reach: float) -> bool:
    """Whether a foreign row's gradient is zero at every log-ratio within ``reach`` of its own (a grid of steps of
    at most 2.5e-5, finer than any gap between edges used here: Naive's window is 7e-4 wide, plus every edge inside
    the reach: once lo_m has risen to hi the window is the single point ℓ = 0, where the clamp still passes
    gradient, and a row within float noise of it may train)."""
    steps = max(2, math.ceil(2 * reach / 2.5e-5))
    grid = [row.ell - reach + 2 * reach * k / steps for k in range(steps + 1)]
    grid += [e for e, _ in edges(rule, loss, m) if abs(e - row.ell) <= reach]
    return not row.own and not any(grad64(grid, row, rule, loss, m))


def expected_backward_rows(rows: list[Row], rule: str, loss: PolicyLossConfig, m: int) -> set[int]:
    """The rows the skipping path must train: own rows, and foreign rows whose gradient is non-zero at ℓ or at ℓ
    moved by ``SKIP_MARGIN`` either way (the probe's documented safety margin). Only valid for rows whose ℓ lies
    well away (≫ float noise) from every edge and from every edge ± the margin."""
    return {i for i, r in enumerate(rows)
            if r.own or any(grad64([r.ell, r.ell + SKIP_MARGIN, r.ell - SKIP_MARGIN], r, rule, loss, m))}


def edges(rule: str, loss: PolicyLossConfig, m: int) -> list[tuple[float, int]]:
    """The log-ratios where a foreign row's gradient switches on or off at update m, each with the direction (+1:
    larger ℓ, −1: smaller ℓ) towards the side where the rule passes gradient for some sign of A."""
    lo, hi = math.log(lower_bound(loss, m)), math.log(loss.params.cross_clip_high)
    clip = loss.params.log_ratio_clip
    if rule == "naive":  # own-row clip: A > 0 trains up to 1 + ε_high, A < 0 from 1 − ε_low up
        return [(math.log(1.0 + loss.params.eps_high), -1), (math.log(1.0 - loss.params.eps_low), +1)]
    if rule == "no_clip":  # only the log-ratio clamp stops the gradient
        return [(-clip, +1), (clip, -1)]
    if rule == "pessimistic":  # A > 0: up to hi (and down to the log clamp); A < 0: from lo up to the dual clip
        return [(hi, -1), (-clip, +1), (lo, +1), (math.log(loss.params.cross_clip_dual), -1)]
    return [(max(lo, -clip), +1), (min(hi, clip), -1)]  # clamp: the window, cut by the log-ratio clamp
