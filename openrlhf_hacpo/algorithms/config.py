"""Typed configuration for the HACPO math: capability tracking, advantages and the policy loss.

Defaults follow the official HACPO code (docs/algorithm.md §5), not the paper text, wherever the two differ; every
paper variant is reachable through a field (see ``docs/algorithm.md`` for the list). Each dataclass validates
itself in ``__post_init__`` and raises ``ValueError`` naming the offending field (and its ``train_hacpo`` flag, where
it has one). Each field's flag is declared with it (:func:`~openrlhf_hacpo.utils.options.option`). The values of
:class:`CapabilityConfig` and :class:`AdvantageConfig` fields (type, choices, range) are declared there too and
checked by :func:`~openrlhf_hacpo.utils.options.check_fields`, ``validate`` adding only the rules that tie several
fields together. The 21 :class:`PolicyLossConfig` fields that are also kernel parameters follow the kernel's one set
of rules instead (:func:`hacpo_kernels.hacpo_loss.check_loss_params`, the rules :class:`LossParams` applies), named
by their flags; ``PolicyLossConfig.validate`` checks ``capability_coef`` itself.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from hacpo_kernels.hacpo_loss import (
    CROSS_CLIP_MODES,
    LOG_RATIO_CLIP_MODES,
    LOSS_AGGS as LOSS_AGGREGATIONS,
    RATIO_LEVELS,
    ROLLOUT_IS_LEVELS,
    ROLLOUT_IS_MODES,
    LossParams,
    check_loss_params,
    cross_clip_lower_bound,
)
from openrlhf_hacpo.utils.checks import check_bool, check_choice, fail
from openrlhf_hacpo.utils.options import check_fields, field_label, option

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
    """How an error names a field: ``--cross_clip_delta (PolicyLossConfig.delta)``
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


@dataclass
class PolicyLossConfig:
    """Clip ranges and switches of the registered policy losses (eqs. 11–14, 47–53).

    * ``eps_low`` / ``eps_high``: self-rollout clip [1 − eps_low, 1 + eps_high] (GSPO 3e-4 / 4e-4; the GRPO
      preset uses 0.2 / 0.28).
    * ``delta``: foreign lower bound at update 0 is 1 − delta (eq. 13; the main-branch code stores the bound
      itself, 0.8).
    * ``delta_step``: the bound rises by ``delta_step`` per optimizer update m in the step, capped at 1 (eq. 14).
    * ``stepwise``: ``False`` keeps the bound fixed at 1 − delta (the "no Stepwise" ablation).
    * ``cross_clip``: ``False`` drops the foreign clamp entirely, c = s (the "no Clip" ablation).
    * ``cross_clip_high``: upper end of the foreign window [lo_m, high]; 1 in the paper and both official codes.
      Values above 1 (an extension of this project, measured in ``benchmarks/compare_tiny.py``) also train on
      foreign rollouts the learner already finds more likely than their source did (s in (1, high]).
    * ``cross_clip_mode``: ``"clamp"`` (paper and official code): c · sg(c)^α · ω · A with c = clamp(s, lo, high),
      zero gradient outside the window whatever the sign of A. ``"pessimistic"`` (an extension, measured in
      ``benchmarks/compare_tiny.py``): PPO's min(s·A, c·A) · sg(c)^α · ω, so a positive-advantage foreign row below
      the window and a negative one above it keep their gradient (weight s), the other two cases are dropped.
    * ``cross_clip_dual``: with ``"pessimistic"``, a negative-advantage foreign row with s above this bound gets no
      gradient (dual-clip PPO, objective max(min(s·A, c·A), dual·A)), so a rollout the learner finds far likelier
      than its source did cannot dominate an update; must be >= ``cross_clip_high``.
    * ``alpha``: exponent of the detached weight sg(c)^alpha (eq. 12); 0 disables exponential IS.
    * ``capability_coef``: multiply foreign objectives by ω^(j,k) (eq. 10); ``False`` is the "HACPO − ω" ablation.
    * ``log_ratio_clip``: clamp of the log importance ratio (``None``: no clamp); ``log_ratio_clip_mode``
      ``"symmetric"`` clamps to [−c, c] (verl-v1 code), ``"upper"`` to (−∞, c] (main-branch code).
    * ``kl_coef``: weight of the low-variance (k3) KL to the reference policy on own rows (code default 0.001,
      with use_kl_loss; the paper has no KL: set 0).
    * ``ratio_level``: ``"sequence"`` (GSPO, eq. 25) or ``"token"`` (per-token ratios with the same clip rules;
      needs per-token old log-probs aligned with the learner's tokens). The ``grpo`` loss is always token-level.
    * ``loss_agg``: ``"seq-mean-token-mean"`` (code default: mean over sequences of per-sequence objectives) or
      ``"token-mean"`` (every token weighted equally). For ``grpo`` this is the documented aggregation choice: the
      paper's GRPO formula is seq-mean-token-mean, a stock verl GRPO run uses token-mean.
    * ``dual_clip_c``: the ``grpo`` loss's dual clip (verl ``clip_ratio_c``, 3): a negative-advantage token's
      objective is bounded below by c·A, max(min(w·A, clip(w)·A), c·A); ``None`` disables it. GSPO, HACPO and Naive
      have no dual clip on own rows (verl's GSPO loss has none).
    * ``rollout_is`` (off): the training-inference correction (verl's ``rollout_is`` settings; docs/training.md,
      "Training-inference corrections"): a detached weight, the trainer's old probability over the sampling engine's,
      multiplies each unit objective. ``rollout_is_level``: ``"sequence"`` (per row, exp of the mean over the
      source's tokens of old − engine log-prob) or ``"token"`` (per own token; foreign rows are always corrected per
      row, their tokens being the learner's). ``rollout_is_mode``: ``"truncate"`` (weight min(w, C)) or ``"mask"``
      (units with w outside [C_low, C] contribute 0 but stay in the loss's denominator). ``rollout_is_threshold``:
      C >= 1 (verl's default 2); ``rollout_is_threshold_lower``: C_low (mask only; default 1 / C). Needs
      ``--temperature 1`` and engine actors (``TrainConfig`` checks both).
    """

    eps_low: float = option(3e-4, flag="--eps_clip_low", help="own-rollout clip: ratio in [1-low, 1+high] (GSPO "
                            "3e-4 / 4e-4; grpo 0.2 / 0.28)")
    eps_high: float = option(4e-4, flag="--eps_clip_high", help="upper end of the own-rollout clip")
    delta: float = option(0.2, flag="--cross_clip_delta", only_for="hacpo",
                          help="δ: foreign ratios are clipped to [1-δ, 1] (eq. 13)")
    delta_step: float = option(0.025, flag="--cross_clip_step", only_for="hacpo",
                               help="δ_step: the lower bound rises by this per update m (eq. 14)")
    stepwise: bool = option(True, flag="--no_stepwise", only_for="hacpo", help="fixed foreign lower bound 1-δ")
    cross_clip: bool = option(True, flag="--no_cross_clip", only_for="hacpo", help="no clamp on foreign ratios")
    cross_clip_high: float = option(1.0, only_for="hacpo", help="upper end of the foreign window [lo, high]; above 1 "
                                    "also trains on foreign rollouts the learner already finds likelier than their "
                                    "source did (extension, not in the paper)")
    cross_clip_mode: str = option("clamp", choices=CROSS_CLIP_MODES, only_for="hacpo",
                                  help="clamp: foreign rows outside the window get no gradient (paper); pessimistic: "
                                  "PPO's min(s·A, clip(s)·A), so foreign successes below the window and failures "
                                  "above it keep theirs (extension, not in the paper)")
    cross_clip_dual: float = option(3.0, only_for="hacpo", help="pessimistic mode: foreign failures with ratio above "
                                    "this get no gradient (dual clip)")
    alpha: float = option(1.0, only_for="hacpo", help="exponential importance-sampling exponent α (eq. 12)")
    capability_coef: bool = option(True, flag="--no_capability_coef", only_for="hacpo",
                                   help="drop the capability coefficient ω^(j,k) on foreign rows (eq. 10)")
    log_ratio_clip: float | None = option(10.0, help="clamp of the log importance ratio")
    log_ratio_clip_mode: str = "symmetric"
    kl_coef: float = option(0.001, flag="--init_kl_coef", help="low-variance KL to the initial policy on own rows; 0 "
                            "disables the reference model")
    ratio_level: str = option("sequence", choices=RATIO_LEVELS, help="sequence (GSPO) or token ratios (gspo / grpo "
                              "only)")
    loss_agg: str = option("seq-mean-token-mean", choices=LOSS_AGGREGATIONS, help="how objectives are averaged")
    dual_clip_c: float | None = option(3.0, help="grpo: dual clip c, negative-advantage tokens with ratio above c get "
                                       "no gradient (verl clip_ratio_c); 0 disables", zero_is_none=True)
    rollout_is: bool = option(False, help="training-inference correction: multiply each own token's or row's "
                              "objective by the trainer's old over the sampling engine's probability (detached, "
                              "truncated or masked), each foreign row's by its source's (needs --temperature 1 and "
                              "--rollout_backend hf_engine or vllm; docs/training.md, Training-inference corrections)")
    rollout_is_level: str = option("sequence", choices=ROLLOUT_IS_LEVELS, help="own rows' correction weight: per "
                                   "row (exp of the mean over its tokens) or per token; foreign rows: per row")
    rollout_is_mode: str = option("truncate", choices=ROLLOUT_IS_MODES, help="truncate: weights above "
                                  "--rollout_is_threshold are cut to it; mask: units whose weight is outside "
                                  "[--rollout_is_threshold_lower, --rollout_is_threshold] contribute nothing (they "
                                  "stay in the loss's denominator)")
    rollout_is_threshold: float = option(2.0, help="upper bound C of the correction weight (>= 1)")
    rollout_is_threshold_lower: float | None = option(None, help="mask mode: lower bound of the correction weight "
                                                      "(default 1 / --rollout_is_threshold)")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        owner = type(self).__name__
        # the loss hyperparameters follow the kernel's one set of rules (LossParams.check), named as the user
        # writes them: "--cross_clip_delta (PolicyLossConfig.delta) must be <= 1, got 1.5"
        check_bool(f"{_label(self, 'capability_coef')}", self.capability_coef)
        kernel_fields = {f.name for f in dataclasses.fields(LossParams)} & {f.name for f in dataclasses.fields(self)}
        check_loss_params({name: getattr(self, name) for name in kernel_fields}, owner,
                          {name: _label(self, name) for name in kernel_fields})

    @property
    def uses_kl(self) -> bool:
        """Whether the loss has the KL term to the reference policy (``kl_coef > 0``), so a reference model is
        needed."""
        return self.kl_coef > 0

    def cross_lower_bound(self, update_index: int) -> float:
        """Lower clip bound for foreign rows at optimizer update m (eq. 14): min(1, 1 − δ + m·δ_step).

        With ``stepwise=False`` the bound is the fixed 1 − δ of eq. 13.
        """
        if not isinstance(update_index, int):
            raise ValueError(f"update_index must be an int >= 0, got {update_index!r}")
        return cross_clip_lower_bound(self.delta, self.delta_step, update_index, self.stepwise)

    @classmethod
    def for_algorithm(cls, name: str, **overrides: Any) -> "PolicyLossConfig":
        """Defaults of one algorithm: GRPO gets the DAPO clip-higher range 0.2 / 0.28 and token ratios."""
        check_choice("PolicyLossConfig.for_algorithm.name", name, ALGORITHMS)
        values: dict[str, Any] = {}
        if name == "grpo":
            values.update(eps_low=0.2, eps_high=0.28, ratio_level="token")
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PolicyLossConfig":
        return _from_dict(cls, data)


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
        if self.trains_on_foreign and self.loss.ratio_level == "token":
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
        otherwise when ``loss.ratio_level == "token"`` (gspo only; hacpo / naive refuse it)."""
        return self.algorithm == "grpo" or self.loss.ratio_level == "token"

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

        ``loss_overrides`` are applied to the :class:`PolicyLossConfig` (e.g. ``alpha=3.0``).
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
        for name in ("capability", "advantage", "loss"):
            current = getattr(base, name)
            overrides = data.get(name) or {}
            _check_known_fields(type(current), overrides)
            sections[name] = dataclasses.replace(current, **overrides)
        return cls(algorithm=base.algorithm, **sections)
