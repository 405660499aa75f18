"""Named tiny agents and the presets that pair them, one per heterogeneity type of the paper (Defs. 2.1-2.3).

Agents (all warm-started on worked L1/L2/L4 solutions until L4 probe accuracy enters a frontier band):

============  ===========================  ==========  ======================================  ===========
name          architecture                 tokenizer   shape                                   L4 band
============  ===========================  ==========  ======================================  ===========
llamaS        LlamaForCausalLM             char        hidden 64, 2 layers, 4 heads            .12 - .30
qwenM         Qwen3ForCausalLM (qk-norm)   bpe         hidden 96, 3 layers, 4 heads x 24       .20 - .35
qwenS         Qwen3ForCausalLM             bpe         hidden 64, 2 layers, 4 heads x 16       .12 - .30
qwenM-early   qwenM, earlier in warm start bpe         as qwenM                                .05 - .15
============  ===========================  ==========  ======================================  ===========

Presets: ``model`` (default; llamaS + qwenM: different architecture and tokenizer), ``size`` (qwenS + qwenM: one
family, two sizes), ``state`` (qwenM + qwenM-early: one model, two warm-start stages) and ``three``
(llamaS + qwenM + qwenS). Every preset carries the recommended RL hyperparameters (:class:`RLHyperparams`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from openrlhf_hacpo.data.arithmetic import get_level
from openrlhf_hacpo.zoo.models import ModelSpec
from openrlhf_hacpo.zoo.tokenizers import TOKENIZER_KINDS
from openrlhf_hacpo.zoo.warmstart import WarmStartConfig

__all__ = [
    "AgentSpec",
    "AGENTS",
    "RLHyperparams",
    "Regime",
    "REGIMES",
    "DEFAULT_REGIME",
    "get_regime",
    "Preset",
    "PRESETS",
    "DEFAULT_PRESET",
    "get_preset",
    "resolve_agents",
]

HETEROGENEITY_TYPES = ("model", "size", "state", "mixed")


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    """Everything that decides a built agent: its name, tokenizer kind, architecture and warm start."""

    name: str
    tokenizer: str
    model: ModelSpec
    warm_start: WarmStartConfig

    def __post_init__(self) -> None:
        if not self.name or any(c in self.name for c in "/\\ \t\n") or self.name.startswith("."):
            raise ValueError(f"AgentSpec.name must be a plain folder-safe name, got {self.name!r}")
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ValueError(f"AgentSpec.tokenizer must be one of {TOKENIZER_KINDS}, got {self.tokenizer!r}")

    def replace(self, **changes) -> "AgentSpec":
        """A copy with fields changed; ``warm_start`` may be given as a dict of WarmStartConfig fields."""
        ws = changes.pop("warm_start", None)
        if isinstance(ws, dict):
            changes["warm_start"] = dataclasses.replace(self.warm_start, **ws)
        elif ws is not None:
            changes["warm_start"] = ws
        return dataclasses.replace(self, **changes)


_QWEN_M = ModelSpec("qwen3", hidden_size=96, num_layers=3, num_heads=4, head_dim=24)

AGENTS: dict[str, AgentSpec] = {
    spec.name: spec
    for spec in (
        AgentSpec(
            "llamaS",
            "char",
            ModelSpec("llama", hidden_size=64, num_layers=2, num_heads=4),
            WarmStartConfig(lr=3e-3, target_band=(0.12, 0.30), max_steps=900),
        ),
        AgentSpec("qwenM", "bpe", _QWEN_M, WarmStartConfig(lr=2e-3, target_band=(0.20, 0.35), max_steps=500)),
        AgentSpec(
            "qwenS",
            "bpe",
            ModelSpec("qwen3", hidden_size=64, num_layers=2, num_heads=4, head_dim=16),
            WarmStartConfig(lr=3e-3, target_band=(0.12, 0.30), max_steps=900),
        ),
        AgentSpec(
            "qwenM-early", "bpe", _QWEN_M, WarmStartConfig(lr=2e-3, target_band=(0.05, 0.15), max_steps=500)
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class RLHyperparams:
    """Recommended RL settings for the tiny presets (GSPO / HACPO on 3-digit addition)."""

    prompt_levels: tuple[int, ...] = (4,)
    prompts_per_step: int = 16
    group_size: int = 8
    num_steps: int = 80
    lr: float = 3e-4
    adam_betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = 10
    grad_clip: float = 1.0
    temperature: float = 1.0
    max_new_tokens: int = 40
    eval_every: int = 10
    eval_split: str = "test"
    eval_size: int = 400
    seed: int = 0

    def __post_init__(self) -> None:
        for lv in self.prompt_levels:
            get_level(lv)
        for name in ("prompts_per_step", "group_size", "num_steps", "max_new_tokens", "eval_every", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"RLHyperparams.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "grad_clip", "temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RLHyperparams.{name} must be > 0, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"RLHyperparams.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.eval_split not in ("validation", "test"):
            raise ValueError(f"RLHyperparams.eval_split must be 'validation' or 'test', got {self.eval_split!r}")


@dataclasses.dataclass(frozen=True)
class Regime:
    """How a tiny run splits each step into optimizer updates, and the learning rate that goes with it.

    * ``rows_per_update``: rows of one learner mini-batch; ``None`` trains the learner's whole step batch in one
      update (the ``single-update`` regime, the main job's default). With a fixed number, the number of updates per
      step follows from the rows a learner sees, as in the paper's code (mini-batch 64 prompts x G = 512 rows):
      GSPO ``rows / rows_per_update`` own-row updates, HACPO and the naives twice as many (own + foreign rows),
      GSPO x2 twice as many (2G rollouts).
    * ``lr``: the Adam learning rate (``None``: the preset's :attr:`RLHyperparams.lr`).
    * The warm-up stays ``RLHyperparams.warmup_steps`` *steps*: the trainer's ``--lr_warmup_steps`` counts optimizer
      updates, so the job passes ``warmup_steps x updates per step``.
    """

    name: str
    rows_per_update: int | None = None
    lr: float | None = None
    description: str = ""

    def __post_init__(self) -> None:
        if self.rows_per_update is not None and self.rows_per_update < 1:
            raise ValueError(f"Regime.rows_per_update must be >= 1 or None, got {self.rows_per_update!r}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"Regime.lr must be > 0 or None, got {self.lr!r}")

    def updates_per_step(self, rows_per_learner: int) -> int:
        """Optimizer updates a learner makes per step on ``rows_per_learner`` rows."""
        if self.rows_per_update is None:
            return 1
        if rows_per_learner % self.rows_per_update:
            raise ValueError(f"regime {self.name!r}: {rows_per_learner} rows per learner and step do not split into "
                             f"mini-batches of {self.rows_per_update} rows")
        return rows_per_learner // self.rows_per_update

    def rows_per_mini_batch(self, rows_per_learner: int) -> int:
        return rows_per_learner if self.rows_per_update is None else self.rows_per_update

    def learning_rate(self, rl: "RLHyperparams") -> float:
        return rl.lr if self.lr is None else self.lr


DEFAULT_REGIME = "single-update"
REGIMES: dict[str, Regime] = {r.name: r for r in (
    Regime("single-update", description="one optimizer update per step on the learner's whole batch (own ratio 1: "
           "GSPO's clip and the stepwise bound do not act); lr 3e-4"),
    # 16 prompts x G = 8 per step and a mini-batch of 8 prompts x 8 = 64 rows, the paper's 128 / 64 prompts scaled
    # down: GSPO 2 updates, HACPO and the naives 4, GSPO x2 4 (docs/tiny.md, "The paper's regime"). lr 1e-4 was
    # frozen by the stability protocol of docs/tiny.md on seeds 100-102 (GSPO x2), before any comparison run.
    Regime("paper", rows_per_update=64, lr=1e-4,
           description="the paper's code in miniature: mini-batches of 64 rows, so GSPO makes 2 updates per step and "
           "HACPO, the naives and GSPO x2 make 4; lr 1e-4"),
)}
"""The training regimes of the tiny runs (``--regime``)."""


def get_regime(name: str) -> Regime:
    if name not in REGIMES:
        raise ValueError(f"unknown regime {name!r}; regimes: {sorted(REGIMES)}")
    return REGIMES[name]


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    heterogeneity: str
    description: str
    agents: tuple[AgentSpec, ...]
    rl: RLHyperparams = RLHyperparams()

    def __post_init__(self) -> None:
        if self.heterogeneity not in HETEROGENEITY_TYPES:
            raise ValueError(f"Preset.heterogeneity must be one of {HETEROGENEITY_TYPES}, got {self.heterogeneity!r}")
        if len(self.agents) < 2:
            raise ValueError(f"Preset.agents needs at least two agents, got {len(self.agents)}")
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ValueError(f"Preset.agents names must be distinct, got {names}")

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.agents)


def _preset(name: str, heterogeneity: str, description: str, *agents: str) -> Preset:
    return Preset(name, heterogeneity, description, tuple(AGENTS[a] for a in agents))


DEFAULT_PRESET = "model"
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _preset("model", "model", "heterogeneous model: Llama (char tokenizer) + Qwen3 (BPE)", "llamaS", "qwenM"),
        _preset("size", "size", "heterogeneous size: Qwen3 at two widths and depths", "qwenS", "qwenM"),
        _preset("state", "state", "heterogeneous state: one Qwen3 at two warm-start stages", "qwenM", "qwenM-early"),
        _preset("three", "mixed", "three agents: Llama + two Qwen3 sizes", "llamaS", "qwenM", "qwenS"),
    )
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown zoo preset {name!r}; presets: {sorted(PRESETS)}")
    return PRESETS[name]


def resolve_agents(preset_or_names: str | Preset | Sequence[str | AgentSpec]) -> tuple[AgentSpec, ...]:
    """Agent specs from a preset (name or object), or a list of agent names / specs."""
    if isinstance(preset_or_names, Preset):
        return preset_or_names.agents
    if isinstance(preset_or_names, str):
        if preset_or_names in PRESETS:
            return PRESETS[preset_or_names].agents
        preset_or_names = [preset_or_names]
    specs = []
    for item in preset_or_names:
        if isinstance(item, AgentSpec):
            specs.append(item)
        elif item in AGENTS:
            specs.append(AGENTS[item])
        else:
            raise ValueError(
                f"unknown zoo agent or preset {item!r}; agents: {sorted(AGENTS)}, presets: {sorted(PRESETS)}"
            )
    return tuple(specs)
