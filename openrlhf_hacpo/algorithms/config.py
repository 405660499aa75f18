"""Typed configuration for the HACPO math: capability tracking, advantages and the policy loss.

Defaults follow the official HACPO code (docs/algorithm.md §5), not the paper text, wherever the two differ; every
paper variant is reachable through a field (see ``docs/algorithm.md`` for the list). Each dataclass validates
itself in ``__post_init__`` and raises ``ValueError`` naming the offending field (and its ``train_hacpo`` flag, where
it has one). Each field's flag is declared with it (:func:`~openrlhf_hacpo.utils.options.option`). The values of
:class:`CapabilityConfig` and :class:`AdvantageConfig` fields (type, choices, range) are declared there too and
checked by :func:`~openrlhf_hacpo.utils.options.check_fields`, ``validate`` adding only the rules that tie several
fields together. :class:`PolicyLossConfig` holds the loss kernel's parameter object itself (``params``, a
:class:`LossParams`): its values follow the kernel's one set of rules
(:func:`hacpo_kernels.hacpo_loss.check_loss_params`), named by their flags when the config is built from values
(:func:`loss_params`); their flags are declared in :data:`LOSS_OPTIONS`, and ``PolicyLossConfig.validate`` checks
``capability_coef`` itself.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from hacpo_kernels.hacpo_loss import (
    CROSS_CLIP_MODES,
    LOSS_AGGS as LOSS_AGGREGATIONS,
    RATIO_LEVELS,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
    LossParams,
    check_loss_params,
    cross_clip_lower_bound,
)
from openrlhf_hacpo.utils.checks import check_bool, check_choice, fail
from openrlhf_hacpo.utils.options import check_fields, field_label, nested, option, option_label

ALGORITHMS = ("hacpo", "gspo", "grpo", "naive")
"""Policy-loss families; each is also the name of a registered policy loss."""

PRESETS = (
    "hacpo",
    "gspo",
    "grpo",
    "naive",
    "naive-paper",
    "naive-gated",
    "hacpo-no-adv",
    "hacpo-no-omega",
    "hacpo-no-clip",
    "hacpo-no-stepwise",
)
"""Named configurations: the four algorithms, the two readings of the paper's Naive baseline and the paper's ablations
(Table 2, Table 3, Figure 4). ``naive`` is the older name of ``naive-gated`` (kept so saved configs and commands
load)."""

CAPABILITY_METRICS = ("positive_rate", "mean_reward")
ADVANTAGE_SCOPES = ("joint", "own")


def _label(obj: Any, name: str) -> str:
    """How an error names a field: ``--no_capability_coef (PolicyLossConfig.capability_coef)``
    (:func:`~openrlhf_hacpo.utils.options.field_label`)."""
    return field_label(next(f for f in dataclasses.fields(obj) if f.name == name), type(obj).__name__)


def _check_known_fields(cls, data: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}; known fields: {sorted(known)}")


def _from_dict(cls, data: Mapping[str, Any]):
    _check_known_fields(cls, data)
    return cls(**dict(data))


@dataclass
class CapabilityConfig:
    """Capability estimate P̂ (eq. 9) and the capability ratios ω built from it (eqs. 8, 10).

    * ``metric``: per-step capability P_τ of an agent. ``"positive_rate"`` (code default) is the fraction of its
      rewards > 0; ``"mean_reward"`` (paper, eq. 9) is the mean reward. They agree for {0, 1} rewards.
    * ``window``: K, the number of most recent steps averaged, the current step included.
    * ``floor``: P̂ is floored at this value so ratios stay finite.
    * ``ratio_min`` / ``ratio_max``: every ratio P̂_a / P̂_b is clipped to this range (code; the paper has no
      clip: use ``0`` and ``math.inf``).
    * ``warmup_steps``: for the first ``warmup_steps`` updates every ratio is 1.
    """

    metric: str = option("positive_rate", flag="--capability_metric", choices=CAPABILITY_METRICS,
                         help="per-step capability")
    window: int = option(5, flag="--capability_window", ge=1,
                         help="K, steps averaged in the capability estimate (eq. 9)")
    floor: float = option(1e-8, gt=0)
    ratio_min: float = option(0.1, flag="--capability_ratio_min", ge=0,
                              help="capability ratios are clipped to [min, max]")
    ratio_max: float = option(10.0, flag="--capability_ratio_max", gt=0, allow_inf=True,
                              help="upper clip of the capability ratios")
    warmup_steps: int = option(0, flag="--capability_warmup_steps", ge=0, help="steps with every capability ratio 1")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        owner = type(self).__name__
        check_fields(self, owner)
        if self.ratio_max < self.ratio_min:
            fail(_label(self, "ratio_max"), f"> 0 and >= ratio_min ({self.ratio_min})", self.ratio_max)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CapabilityConfig":
        return _from_dict(cls, data)


@dataclass
class AdvantageConfig:
    """Capability-aware group advantage (eqs. 6–8).

    * ``capability_weighting``: weight rewards by ω^(k,j) in the baseline (eq. 7). ``False`` gives the plain
      group mean: the "HACPO − Adv" ablation and the Naive baseline.
    * ``scope``: ``"joint"`` groups all n·G responses to a prompt (HACPO); ``"own"`` groups only the learner's
      own G responses (single-agent GSPO / GRPO, eq. 5).
    * ``std_normalize``: divide by σ + ``eps`` (eq. 6); ``False`` gives A = R − μ̂ (eq. 15).
    * ``eps``: added to σ.
    * ``uniform_reward_guard``: a group whose rewards are all equal gets A = 0 and the plain mean as baseline
      (code; not in the paper).
    * ``baseline_guard``: a capability-weighted baseline above ``baseline_guard_threshold`` is replaced by the
      mean of the learner's own rewards in the group (code; not in the paper; meant for rewards in [0, 1]).
    * ``require_equal_group_sizes``: reject batches where some (prompt, source) pair has a different number of
      responses than the others.
    """

    capability_weighting: bool = option(True, flag="--no_capability_advantage", only_for="shared_rollouts",
                                        help="plain joint-group mean baseline instead of the capability-weighted one "
                                        "(eq. 7)")
    scope: str = option("joint", choices=ADVANTAGE_SCOPES)
    std_normalize: bool = True
    eps: float = option(1e-6, ge=0)
    uniform_reward_guard: bool = True
    baseline_guard: bool = True
    baseline_guard_threshold: float = 1.0
    require_equal_group_sizes: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        # every rule is a single field's (its annotation, choices and range), so the one walk covers them all
        check_fields(self, type(self).__name__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AdvantageConfig":
        return _from_dict(cls, data)


LOSS_OPTIONS: dict[str, dataclasses.Field] = {
    "eps_low": option(flag="--eps_clip_low", help="own-rollout clip: ratio in [1-low, 1+high] (GSPO 3e-4 / 4e-4; "
                      "grpo 0.2 / 0.28)"),
    "eps_high": option(flag="--eps_clip_high", help="upper end of the own-rollout clip"),
    "delta": option(flag="--cross_clip_delta", only_for="hacpo", help="δ: foreign ratios are clipped to [1-δ, 1] "
                    "(eq. 13)"),
    "delta_step": option(flag="--cross_clip_step", only_for="hacpo",
                         help="δ_step: the lower bound rises by this per update m (eq. 14)"),
    "stepwise": option(flag="--no_stepwise", only_for="hacpo", help="fixed foreign lower bound 1-δ"),
    "cross_clip": option(flag="--no_cross_clip", only_for="hacpo", help="no clamp on foreign ratios"),
    "cross_clip_high": option(only_for="hacpo", help="upper end of the foreign window [lo, high]; above 1 also trains "
                              "on foreign rollouts the learner already finds likelier than their source did "
                              "(extension, not in the paper)"),
    "cross_clip_mode": option(choices=CROSS_CLIP_MODES, only_for="hacpo",
                              help="clamp: foreign rows outside the window get no gradient (paper); pessimistic: "
                              "PPO's min(s·A, clip(s)·A), so foreign successes below the window and failures above "
                              "it keep theirs (extension, not in the paper)"),
    "cross_clip_dual": option(only_for="hacpo", help="pessimistic mode: foreign failures with ratio above this get no "
                              "gradient (dual clip)"),
    "alpha": option(only_for="hacpo", help="exponential importance-sampling exponent α (eq. 12)"),
    "log_ratio_clip": option(help="clamp of the log importance ratio"),
    "log_ratio_clip_mode": option(),
    "kl_coef": option(flag="--init_kl_coef", help="low-variance KL to the initial policy on own rows; 0 disables the "
                      "reference model"),
    "ratio_level": option(choices=RATIO_LEVELS, help="sequence (GSPO) or token ratios (gspo / grpo only)"),
    "loss_agg": option(choices=LOSS_AGGREGATIONS, help="how objectives are averaged"),
    "dual_clip_c": option(help="grpo: dual clip c, negative-advantage tokens with ratio above c get no gradient (verl "
                          "clip_ratio_c); 0 disables", zero_is_none=True),
    "rollout_is": option(help="training-inference correction: multiply each own token's or row's objective by the "
                         "trainer's old over the sampling engine's probability (detached, truncated or masked), each "
                         "foreign row's by its source's (needs --temperature 1 and --rollout_backend hf_engine or "
                         "vllm; docs/training.md, Training-inference corrections)"),
    "rollout_is_level": option(choices=ROLLOUT_IS_LEVELS, help="own rows' correction weight: per row (exp of the mean "
                               "over its tokens) or per token; foreign rows: per row"),
    "rollout_is_mode": option(choices=ROLLOUT_IS_MODES, help="truncate: weights above --rollout_is_threshold are cut "
                              "to it; mask: units whose weight is outside [--rollout_is_threshold_lower, "
                              "--rollout_is_threshold] contribute nothing (they stay in the loss's denominator)"),
    "rollout_is_threshold": option(help="upper bound C of the correction weight (>= 1)"),
    "rollout_is_threshold_lower": option(help="mask mode: lower bound of the correction weight (default 1 / "
                                         "--rollout_is_threshold)"),
}
"""The kernel parameters (fields of :class:`LossParams`) a run sets, each with its flag and ``only_for`` rule (the
values themselves follow the kernel's rules, :func:`check_loss_params`). The kernel's other two fields are not
settings: ``update_index`` is set per optimizer update and ``foreign_rule`` by the loss family
(:meth:`PolicyLoss.params <openrlhf_hacpo.algorithms.losses.PolicyLoss.params>`)."""

RUN_LOSS_DEFAULTS: dict[str, Any] = {"kl_coef": 0.001, "dual_clip_c": 3.0}
"""A run's defaults where they differ from the kernel's: the code's KL coefficient (with use_kl_loss) and GRPO's
dual clip c = 3 (verl ``clip_ratio_c``; only losses with a dual clip apply it)."""

_PER_UPDATE = {"update_index": 0, "foreign_rule": "cross"}
"""The kernel fields a run does not set, at the values its config holds."""


def loss_params(**values: Any) -> LossParams:
    """The kernel's :class:`LossParams` of a run: :data:`RUN_LOSS_DEFAULTS` over the kernel's defaults, then
    ``values`` (fields of :data:`LOSS_OPTIONS`); a value at fault is named by its flag, ``--cross_clip_delta
    (PolicyLossConfig.params.delta) must be <= 1, got 1.5``."""
    unknown = sorted(set(values) - set(LOSS_OPTIONS))
    if unknown:
        raise ValueError(f"PolicyLossConfig has no field(s) {unknown}; known fields: "
                         f"{sorted([*LOSS_OPTIONS, 'capability_coef'])}")
    values = {**RUN_LOSS_DEFAULTS, **values}
    check_loss_params(values, _PARAMS_OWNER, _PARAMS_LABELS)
    return LossParams(**values)


@dataclass
class PolicyLossConfig:
    """Clip ranges and switches of the registered policy losses (eqs. 11–14, 47–53): the kernel's parameter object
    ``params`` (:class:`~hacpo_kernels.hacpo_loss.LossParams`, whose docstring defines each field) and the
    capability coefficient switch. Build it from flat values with :meth:`of` (``PolicyLossConfig.of(delta=0.3)``).

    * ``params.eps_low`` / ``eps_high``: self-rollout clip [1 − eps_low, 1 + eps_high] (GSPO 3e-4 / 4e-4; the GRPO
      preset uses 0.2 / 0.28).
    * ``params.delta``: foreign lower bound at update 0 is 1 − delta (eq. 13; the main-branch code stores the bound
      itself, 0.8); ``delta_step``: the bound rises by it per optimizer update m in the step, capped at 1 (eq. 14);
      ``stepwise=False`` keeps it fixed at 1 − delta (the "no Stepwise" ablation).
    * ``params.cross_clip``: ``False`` drops the foreign clamp entirely, c = s (the "no Clip" ablation);
      ``cross_clip_high``: upper end of the foreign window [lo_m, high] (1 in the paper and both official codes;
      above 1, an extension measured in ``benchmarks/compare_tiny.py``, also trains on foreign rollouts the learner
      already finds more likely than their source did); ``cross_clip_mode``: ``"clamp"`` (paper and official code,
      zero gradient outside the window whatever the sign of A) or ``"pessimistic"`` (an extension: PPO's
      min(s·A, c·A) · sg(c)^α · ω, with the dual clip ``cross_clip_dual`` >= ``cross_clip_high`` on
      negative-advantage rows).
    * ``params.alpha``: exponent of the detached weight sg(c)^alpha (eq. 12); 0 disables exponential IS.
    * ``params.log_ratio_clip`` / ``log_ratio_clip_mode``: clamp of the log importance ratio (``None``: none;
      ``"symmetric"`` [−c, c], verl-v1 code; ``"upper"`` (−∞, c], main-branch code).
    * ``params.kl_coef``: weight of the low-variance (k3) KL to the reference policy on own rows (code default
      0.001, with use_kl_loss; the paper has no KL: set 0).
    * ``params.ratio_level``: ``"sequence"`` (GSPO, eq. 25) or ``"token"`` (gspo only; the ``grpo`` loss is always
      token-level); ``loss_agg``: ``"seq-mean-token-mean"`` (code default) or ``"token-mean"`` (a stock verl GRPO
      run); ``dual_clip_c``: the ``grpo`` loss's dual clip (verl ``clip_ratio_c``, 3; ``None`` disables it; GSPO,
      HACPO and Naive have none on own rows).
    * ``params.rollout_is*`` (off): the training-inference correction (docs/training.md, "Training-inference
      corrections"; needs ``--temperature 1`` and engine actors, which ``TrainConfig`` checks).
    * ``capability_coef``: multiply foreign objectives by ω^(j,k) (eq. 10); ``False`` is the "HACPO − ω" ablation.

    ``params.update_index`` and ``params.foreign_rule`` stay at 0 and ``"cross"``: the update and the loss family set
    them (:meth:`PolicyLoss.params <openrlhf_hacpo.algorithms.losses.PolicyLoss.params>`).
    """

    params: LossParams = nested(loss_params, LOSS_OPTIONS)
    capability_coef: bool = option(True, flag="--no_capability_coef", only_for="hacpo",
                                   help="drop the capability coefficient ω^(j,k) on foreign rows (eq. 10)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        check_bool(_label(self, "capability_coef"), self.capability_coef)
        if not isinstance(self.params, LossParams):
            fail(_PARAMS_OWNER, "a LossParams", self.params)
        for name, value in _PER_UPDATE.items():
            if getattr(self.params, name) != value:
                raise ValueError(f"{_PARAMS_OWNER}.{name} must be {value!r} in a config (each update and the loss "
                                 f"family set it), got {getattr(self.params, name)!r}")

    @classmethod
    def of(cls, capability_coef: bool = True, **params: Any) -> "PolicyLossConfig":
        """A config from flat values: ``capability_coef`` and kernel parameters (:data:`LOSS_OPTIONS`) over the run's
        defaults, e.g. ``PolicyLossConfig.of(delta=0.3, kl_coef=0.0)``."""
        return cls(params=loss_params(**params), capability_coef=capability_coef)

    def settings(self) -> dict[str, Any]:
        """Every setting by its name (the flat layout :meth:`of` takes): the kernel parameters of
        :data:`LOSS_OPTIONS` and ``capability_coef``."""
        return {**{name: getattr(self.params, name) for name in LOSS_OPTIONS}, "capability_coef": self.capability_coef}

    def replaced(self, values: Mapping[str, Any]) -> "PolicyLossConfig":
        """This config with ``values`` changed: flat settings (as :meth:`settings` names them) and/or a ``params``
        mapping (the layout of ``to_dict``); unknown names raise ``ValueError``."""
        values = dict(values)
        params = values.pop("params", None) or {}
        if isinstance(params, LossParams):
            params = {name: getattr(params, name) for name in (*LOSS_OPTIONS, *_PER_UPDATE)}
        for name, fixed in _PER_UPDATE.items():  # a to_dict's params hold them, at the only values a config takes
            if params.get(name, fixed) != fixed:
                raise ValueError(f"{_PARAMS_OWNER}.{name} must be {fixed!r} in a config (each update and the loss "
                                 f"family set it), got {params[name]!r}")
            params.pop(name, None)
        twice = sorted(set(params) & set(values))
        if twice:
            raise ValueError(f"PolicyLossConfig: {twice} given both flat and under 'params'")
        return type(self).of(**{**self.settings(), **params, **values})

    @property
    def uses_kl(self) -> bool:
        """Whether the loss has the KL term to the reference policy (``kl_coef > 0``), so a reference model is
        needed."""
        return self.params.kl_coef > 0

    def cross_lower_bound(self, update_index: int) -> float:
        """Lower clip bound for foreign rows at optimizer update m (eq. 14): min(1, 1 − δ + m·δ_step).

        With ``stepwise=False`` the bound is the fixed 1 − δ of eq. 13.
        """
        if not isinstance(update_index, int):
            raise ValueError(f"update_index must be an int >= 0, got {update_index!r}")
        p = self.params
        return cross_clip_lower_bound(p.delta, p.delta_step, update_index, p.stepwise)

    @classmethod
    def for_algorithm(cls, name: str, **overrides: Any) -> "PolicyLossConfig":
        """Defaults of one algorithm: GRPO gets the DAPO clip-higher range 0.2 / 0.28 and token ratios;
        ``overrides`` are flat settings (:meth:`of`)."""
        check_choice("PolicyLossConfig.for_algorithm.name", name, ALGORITHMS)
        values: dict[str, Any] = {}
        if name == "grpo":
            values.update(eps_low=0.2, eps_high=0.28, ratio_level="token")
        values.update(overrides)
        return cls.of(**values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PolicyLossConfig":
        """Flat settings (``{"delta": 0.3}``, the layout configs were saved in before ``params``) or the layout of
        ``to_dict`` (``{"params": {...}, "capability_coef": ...}``), over the defaults."""
        return cls().replaced(data)


_PARAMS_OWNER = "PolicyLossConfig.params"
_PARAMS_LABELS = {name: option_label(f.metadata, name, _PARAMS_OWNER) for name, f in LOSS_OPTIONS.items()}
"""How errors name each kernel parameter: ``--cross_clip_delta (PolicyLossConfig.params.delta)``."""


@dataclass
class HACPOConfig:
    """One algorithm: the policy-loss family plus the capability, advantage and loss settings.

    ``algorithm`` names the registered policy loss (``hacpo``, ``gspo``, ``grpo``, ``naive``). ``gspo`` and
    ``grpo`` train each agent on its own rollouts only (``trains_on_foreign`` is False); ``hacpo`` and ``naive``
    train on every agent's rollouts. Use :meth:`preset` for the named algorithms and ablations.
    """

    algorithm: str = "hacpo"
    capability: CapabilityConfig = field(default_factory=CapabilityConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        owner = type(self).__name__
        check_choice(f"{owner}.algorithm", self.algorithm, ALGORITHMS)
        for name, cls in (("capability", CapabilityConfig), ("advantage", AdvantageConfig),
                          ("loss", PolicyLossConfig)):
            value = getattr(self, name)
            if not isinstance(value, cls):
                fail(f"{owner}.{name}", f"a {cls.__name__}", value)
            value.validate()
        if self.trains_on_foreign and self.loss.params.ratio_level == "token":
            raise ValueError(
                f"ratio_level='token' is incompatible with algorithm={self.algorithm!r}: foreign rows carry only the "
                "source's sequence-mean old log-prob (use ratio_level='sequence', or gspo / grpo)"
            )

    @property
    def loss_name(self) -> str:
        """Name of the registered policy loss for this algorithm."""
        return self.algorithm

    @property
    def trains_on_foreign(self) -> bool:
        """Whether a learner's batch contains the other agents' rollouts."""
        return self.algorithm in ("hacpo", "naive")

    @property
    def token_level_ratios(self) -> bool:
        """Whether the importance ratios are per token: always for ``grpo`` (its loss ignores ``ratio_level``),
        otherwise when ``loss.params.ratio_level == "token"`` (gspo only; hacpo / naive refuse it)."""
        return self.algorithm == "grpo" or self.loss.params.ratio_level == "token"

    @classmethod
    def preset(cls, name: str, **loss_overrides: Any) -> "HACPOConfig":
        """Configuration of a named algorithm or ablation (one of :data:`PRESETS`).

        * ``hacpo``: all four mechanisms, code defaults.
        * ``gspo`` / ``grpo``: single agent, advantage over the learner's own G responses.
        * ``naive-paper``: the paper's naive sharing read literally (docs/algorithm.md, "Two naives"): shared
          rollouts, plain joint-mean advantage, no ω, no exponential IS (α = 0), no foreign window, so a foreign row
          enters as s·A with s its plain sequence importance ratio; own rows keep GSPO's clip. It is the ``hacpo``
          loss with those four mechanisms off.
        * ``naive-gated`` (older name ``naive``): shared rollouts, plain joint-mean advantage, GSPO's own-row clip
          [1 − ε_low, 1 + ε_high] on every row. Applied to a foreign row whose ratio is rarely inside that narrow
          range, the clip keeps the gradient of successes with s < 1 and drops failures with s < 1 − ε_low: a
          success-gated transfer (``naive`` loss family).
        * ``hacpo-no-adv``: plain joint-mean baseline (Table 2). ``hacpo-no-omega``: no ω^(j,k) on foreign
          objectives, ω kept in the baseline (Table 3). ``hacpo-no-clip``: no foreign clamp (Figure 4).
          ``hacpo-no-stepwise``: fixed foreign bound 1 − δ (Figure 4).

        ``loss_overrides`` are flat settings of the :class:`PolicyLossConfig` (e.g. ``alpha=3.0``).
        """
        check_choice("HACPOConfig.preset.name", name, PRESETS)
        algorithm = {"naive-paper": "hacpo", "naive-gated": "naive"}.get(name, name.split("-", 1)[0])
        advantage = AdvantageConfig()
        loss_values: dict[str, Any] = {}
        if algorithm in ("gspo", "grpo"):
            advantage = AdvantageConfig(scope="own")
        elif name == "naive-paper":
            advantage = AdvantageConfig(capability_weighting=False)
            loss_values.update(capability_coef=False, alpha=0.0, cross_clip=False)
        elif name in ("naive", "naive-gated", "hacpo-no-adv"):
            advantage = AdvantageConfig(capability_weighting=False)
        elif name == "hacpo-no-omega":
            loss_values["capability_coef"] = False
        elif name == "hacpo-no-clip":
            loss_values["cross_clip"] = False
        elif name == "hacpo-no-stepwise":
            loss_values["stepwise"] = False
        loss_values.update(loss_overrides)
        loss = PolicyLossConfig.for_algorithm(algorithm, **loss_values)
        return cls(algorithm=algorithm, capability=CapabilityConfig(), advantage=advantage, loss=loss)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HACPOConfig":
        """Build from a nested mapping (e.g. parsed YAML); unknown keys raise ``ValueError``.

        ``algorithm`` may be any preset name (e.g. ``"hacpo-no-clip"``): the preset is the starting point and the
        ``capability`` / ``advantage`` / ``loss`` sections override its fields.
        """
        _check_known_fields(cls, data)
        base = cls.preset(data.get("algorithm", "hacpo"))
        sections = {}
        for name in ("capability", "advantage"):
            current = getattr(base, name)
            overrides = data.get(name) or {}
            _check_known_fields(type(current), overrides)
            sections[name] = dataclasses.replace(current, **overrides)
        sections["loss"] = base.loss.replaced(data.get("loss") or {})  # flat, or the params layout of to_dict
        return cls(algorithm=base.algorithm, **sections)
