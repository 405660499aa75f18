"""The run's configuration, :class:`TrainConfig`: the agents, the algorithm and one section per job
(:mod:`openrlhf_hacpo.config.sections`), validated on construction with the agents' inherited settings resolved
once (:attr:`TrainConfig.resolved_agents`); and its dict layouts (:meth:`TrainConfig.to_dict` /
:meth:`TrainConfig.from_dict`, which also reads the flat layout of configs written before the sections).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from openrlhf_hacpo.algorithms import HACPOConfig
from openrlhf_hacpo.config.agents import AgentConfig, check_target_modules
from openrlhf_hacpo.config.rules import check_combinations
from openrlhf_hacpo.config.sections import (
    AgentDefaults,
    ClusterConfig,
    ComputeConfig,
    EngineConfig,
    EvalConfig,
    LoggingConfig,
    OptimConfig,
    OutputConfig,
    PromptConfig,
    RewardConfig,
    RolloutConfig,
    StepConfig,
)
from openrlhf_hacpo.rollout.reward_fns import reward_spec_problem
from openrlhf_hacpo.utils.checks import fail
from openrlhf_hacpo.utils.options import check_fields, check_only_for, section

__all__ = ["FLAT_NAMES", "SECTIONS", "TrainConfig", "only_for_refusal"]


def only_for_refusal(algo: HACPOConfig, only_for: str) -> str | None:
    """Why ``algo`` has no use for the fields marked ``option(only_for=...)``, or None when it uses them: every such
    field shapes foreign rows, and ``"hacpo"`` ones also assume the cross clip that naive does not apply."""
    if not algo.trains_on_foreign:
        return "it trains each agent on its own rollouts only"
    if only_for == "hacpo" and algo.algorithm != "hacpo":
        return f"{algo.algorithm} applies the self clip to every row"
    return None


@dataclass
class TrainConfig:
    """Everything one run needs; built from the command line by ``openrlhf_hacpo.cli.train_hacpo.build_config``.

    ``agents`` as given (settings left at ``None`` inherit ``agent_defaults``), ``algo`` (the algorithm's preset with
    its flags applied), then one section per job, each setting named by its path (``cfg.rollout.top_p``). Each
    setting's ``metadata`` holds its command-line flag and its allowed values
    (:func:`~openrlhf_hacpo.utils.options.option`); flag names follow OpenRLHF where the meaning is the same.
    """

    agents: list[AgentConfig]
    algo: HACPOConfig = field(default_factory=HACPOConfig, metadata={"group": "algorithm"})
    prompts: PromptConfig = section(PromptConfig)
    rollout: RolloutConfig = section(RolloutConfig)
    engines: EngineConfig = section(EngineConfig)
    rewards: RewardConfig = section(RewardConfig)
    train: StepConfig = section(StepConfig)
    optim: OptimConfig = section(OptimConfig)
    agent_defaults: AgentDefaults = section(AgentDefaults)
    compute: ComputeConfig = section(ComputeConfig)
    outputs: OutputConfig = section(OutputConfig)
    logging: LoggingConfig = section(LoggingConfig)
    eval: EvalConfig = section(EvalConfig)
    cluster: ClusterConfig = section(ClusterConfig)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self) -> None:
        """The agents and the algorithm (each validates itself), every setting of every section against its
        ``option`` rules, the algorithm-only fields (:func:`only_for_refusal`); then the agents' inherited settings
        are resolved (:attr:`resolved_agents`) and the rules that tie settings together run
        (:func:`~openrlhf_hacpo.config.rules.check_combinations`). Call it again after changing a config in place."""
        if not isinstance(self.agents, (list, tuple)) or not self.agents:
            raise ValueError("agents must name at least one agent (--agent name=...,pretrain=... or --agents_config)")
        self.agents = list(self.agents)
        names = []
        for i, agent in enumerate(self.agents):
            if not isinstance(agent, AgentConfig):
                fail(f"agents[{i}]", "an AgentConfig", agent)
            agent.validate(f"agents[{i}] ({agent.name!r})" if isinstance(agent.name, str) else f"agents[{i}]")
            names.append(agent.name)
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"agents: agent names must be unique, {duplicates} appear more than once")
        if not isinstance(self.algo, HACPOConfig):
            fail("algo", "a HACPOConfig", self.algo)
        self.algo.validate()

        for name, cls in SECTIONS.items():  # each setting: type, choices, range (its option(...) in the section)
            value = getattr(self, name)
            if not isinstance(value, cls):
                fail(f"TrainConfig.{name}", f"a {cls.__name__}", value)
            check_fields(value, f"TrainConfig.{name}")
        reward_problem = reward_spec_problem(self.rewards.reward_fn)  # a registered name or FILE.py[:FUNCTION]
        if reward_problem:
            raise ValueError(f"--reward_fn (TrainConfig.rewards.reward_fn): {reward_problem}")
        check_target_modules("--target_modules (TrainConfig.agent_defaults.target_modules)",
                             self.agent_defaults.target_modules)
        check_only_for(self.algo, functools.partial(only_for_refusal, self.algo), self.algo.algorithm)
        if self.outputs.overwrite and self.outputs.resume:
            raise ValueError("overwrite and resume exclude each other: --resume continues the run in save_path, "
                             "--overwrite deletes it")
        # every agent with its inherited settings filled in, in agent order: what the workers, the plans, the checks
        # and the fingerprint read (resolved here only)
        self.resolved_agents: tuple[AgentConfig, ...] = tuple(a.resolved(self.agent_defaults) for a in self.agents)
        check_combinations(self)

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.agents]

    def agent(self, name: str) -> AgentConfig:
        """The resolved settings of the agent called ``name``."""
        for agent in self.resolved_agents:
            if agent.name == name:
                return agent
        raise KeyError(f"no agent named {name!r}; agents: {self.agent_names}")

    @property
    def resolved_own_old_logp(self) -> str:
        """What ``own_old_logp`` means for this run: ``behaviour`` or ``recompute`` (``auto``: behaviour for a
        one-step-off run at temperature 1, else recompute; synchronous rows are generated by the weights being
        trained, so the two coincide there and the scoring pass gives them)."""
        if self.train.own_old_logp != "auto":
            return self.train.own_old_logp
        return "behaviour" if self.train.one_step_off and self.rollout.temperature == 1.0 else "recompute"

    @property
    def keeps_engine_logps(self) -> bool:
        """Whether the engines return their log-probs of the sampled tokens and the rollout attaches them to the
        trajectories (``Trajectory.behaviour_logp``): for ``--own_old_logp behaviour`` (as resolved) or a
        training-inference correction (``--rollout_is``). ``AgentGroup`` asks this before every engine rollout."""
        return self.resolved_own_old_logp == "behaviour" or self.algo.loss.params.rollout_is

    @property
    def trains_on_foreign(self) -> bool:
        return self.algo.trains_on_foreign

    @property
    def rows_per_learner(self) -> int:
        """Rows in one learner's batch per step (own only for gspo / grpo, every agent's for hacpo / naive)."""
        sources = self.num_agents if self.trains_on_foreign else 1
        return sources * self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt

    def rows_formula(self) -> str:
        """:attr:`rows_per_learner` as a product, for errors."""
        sources = f"{self.num_agents} agents × " if self.trains_on_foreign else ""
        return (f"{sources}rollout_batch_size {self.rollout.rollout_batch_size} × n_samples_per_prompt "
                f"{self.rollout.n_samples_per_prompt}")

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per learner per step: max_epochs × rows / train_batch_size."""
        return self.train.max_epochs * self.rows_per_learner // self.train.train_batch_size

    @property
    def checkpoint_dir(self) -> str:
        return self.outputs.ckpt_path or os.path.join(self.outputs.save_path, "checkpoints")

    # ------------------------------------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The nested layout: ``agents``, ``algo`` and one mapping per section (JSON- and YAML-safe values)."""
        out = dataclasses.asdict(self)
        out["optim"]["adam_betas"] = list(self.optim.adam_betas)
        return out

    @classmethod
    def of(cls, agents: list[AgentConfig], **settings: Any) -> "TrainConfig":
        """A config from keyword settings, each a section (``rollout=RolloutConfig(...)``) or a single setting by its
        flat name (``top_p=0.9``, :data:`FLAT_NAMES`), as :meth:`from_dict` reads them."""
        return cls.from_dict({"agents": agents, **settings})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        """Inverse of :meth:`to_dict`. Also reads the flat layout of configs written before the sections
        (``{"top_p": 0.9, "actor_learning_rate": 1e-6, ...}``, each setting under its former field name,
        :data:`FLAT_NAMES`), alone or beside sections; ``agents`` and ``algo`` may be objects already. Unknown keys,
        and a setting given twice, raise ``ValueError``."""
        values = _sectioned(data)
        agents = [a if isinstance(a, AgentConfig) else AgentConfig.from_dict(a, f"agents[{i}]")
                  for i, a in enumerate(values.pop("agents", []))]
        if "algo" in values and not isinstance(values["algo"], HACPOConfig):
            values["algo"] = HACPOConfig.from_dict(values["algo"])
        for name, given in values.items():
            section_cls = SECTIONS.get(name)
            if section_cls is None or isinstance(given, section_cls):
                continue
            known = {f.name for f in dataclasses.fields(section_cls)}
            unknown = sorted(set(given) - known, key=str)
            if unknown:
                raise ValueError(f"TrainConfig.{name} has no field(s) {unknown}; known fields: {sorted(known)}")
            values[name] = section_cls(**given)
        return cls(agents=agents, **values)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig)
                             if f.metadata.get("section")}
"""Section name -> its dataclass, in declaration order."""

_FORMER_NAMES = {("agent_defaults", "learning_rate"): "actor_learning_rate",
                 ("agent_defaults", "dp_size"): "actor_num_gpus_per_node"}
"""Settings whose field was named otherwise in the flat layout (their flags keep those names)."""

FLAT_NAMES: dict[str, tuple[str, str]] = {
    _FORMER_NAMES.get((name, f.name), f.name): (name, f.name)
    for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
"""Each setting's name in the flat layout (a field of the former flat ``TrainConfig``, the key of its config
fingerprint) -> its (section, field)."""


def _sectioned(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every flat key moved into its section (see :meth:`TrainConfig.from_dict`)."""
    out: dict[str, Any] = {}
    flat: dict[str, dict[str, Any]] = {}
    unknown = []
    for key, value in data.items():
        if key in ("agents", "algo") or key in SECTIONS:
            out[key] = value
        elif key in FLAT_NAMES:
            name, setting = FLAT_NAMES[key]
            flat.setdefault(name, {})[setting] = value
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"TrainConfig has no field(s) {sorted(unknown, key=str)}")
    for name, settings in flat.items():
        given = out.get(name, {})
        if isinstance(given, SECTIONS[name]):
            given = dataclasses.asdict(given)
        twice = sorted(set(given) & set(settings))
        if twice:
            raise ValueError(f"TrainConfig.{name}: {twice} given both in the section and as flat keys")
        out[name] = {**given, **settings}
    return out
