"""Typed configuration of a training run: :class:`TrainConfig`, made of the agents (one :class:`AgentConfig` each),
the algorithm (:class:`~openrlhf_hacpo.algorithms.HACPOConfig`) and one section per job:

=================  ==================  ===============================================================================
field              class               settings
=================  ==================  ===============================================================================
``prompts``        PromptConfig        training prompts: data, keys, chat template, prompt and response lengths
``rollout``        RolloutConfig       backend, prompts per step, G, sampling, EOS policy
``engines``        EngineConfig        engine actors (vLLM memory, graphs, sleep, colocation); mismatch metrics, alarm
``rewards``        RewardConfig        the verifier and its workers
``train``          StepConfig          batch geometry, mini-batch order, steps, seed, one-step-off schedule
``optim``          OptimConfig         learning-rate schedule, clipping, AdamW
``agent_defaults`` AgentDefaults       run-wide value of each per-agent setting (lr, ZeRO, bf16, dp, engines, LoRA, ...)
``compute``        ComputeConfig       kernels, log-prob path, compute-saving switches, the memory plan's check
``outputs``        OutputConfig        run folder, checkpoints, resume, overwrite
``logging``        LoggingConfig       metric sinks and cadence
``eval``           EvalConfig          periodic evaluation
``cluster``        ClusterConfig       device, Ray, nodes, phase time limit
=================  ==================  ===============================================================================

Per-agent settings left at ``None`` inherit the value of the same name in ``agent_defaults`` (``learning_rate``
from ``--actor_learning_rate``, ``zero_stage``, ``bf16``, ``dp_size`` from ``--actor_num_gpus_per_node``,
``vllm_num_engines``, ...); ``TrainConfig.validate`` resolves them once into :attr:`TrainConfig.resolved_agents`,
which everything downstream reads.

Every rule of a single setting sits with its field, in its :func:`~openrlhf_hacpo.utils.options.option` (type from the
annotation, ``choices``, ``ge`` / ``gt`` / ``le`` / ``lt``, ``only_for``); ``validate`` is one walk over every
section (:func:`~openrlhf_hacpo.utils.options.check_fields`) plus the rules that tie settings together
(:mod:`openrlhf_hacpo.config.rules`; the algorithm's sections validate themselves,
:mod:`openrlhf_hacpo.algorithms.config`). A config validates itself on construction, however it was built (flags,
:meth:`TrainConfig.from_dict`, YAML), and raises ``ValueError`` naming the flag and the setting by its path
(``--top_p (TrainConfig.rollout.top_p) must be <= 1, got 1.5``) or, for an agent's setting, its path
(``agents[1] ('qwen').zero_stage``).

Batch sizes follow OpenRLHF's meaning:

* ``rollout_batch_size`` prompts per step, each answered ``n_samples_per_prompt`` (G) times by every agent;
* a learner's batch holds its own ``rollout_batch_size · G`` rows (``gspo`` / ``grpo``) or every agent's rows,
  ``n_agents · rollout_batch_size · G`` (``hacpo`` / ``naive``);
* ``train_batch_size`` rows per optimizer update (global over the agent's data-parallel workers), so a learner takes
  ``max_epochs · rows / train_batch_size`` updates per step, numbered m = 0, 1, ... for stepwise clipping (eq. 14);
* ``micro_train_batch_size`` rows per forward/backward on one worker (gradient accumulation inside an update).
"""
from openrlhf_hacpo.config.agents import AGENT_FIELDS, INHERITED, AgentConfig, check_target_modules
from openrlhf_hacpo.config.sections import (
    DEVICES,
    ENGINE_BACKENDS,
    ENGINE_DTYPES,
    EOS_POLICIES,
    LR_SCHEDULERS,
    MINIBATCH_ORDERS,
    MISMATCH_ALARM,
    OWN_OLD_LOGPS,
    ROLLOUT_BACKENDS,
    WANDB_MODES,
    ZERO_STAGES,
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
from openrlhf_hacpo.config.train import FLAT_NAMES, SECTIONS, TrainConfig, only_for_refusal

__all__ = [
    "AGENT_FIELDS",
    "INHERITED",
    "FLAT_NAMES",
    "SECTIONS",
    "only_for_refusal",
    "check_target_modules",
    "ROLLOUT_BACKENDS",
    "ENGINE_BACKENDS",
    "ENGINE_DTYPES",
    "OWN_OLD_LOGPS",
    "MISMATCH_ALARM",
    "LR_SCHEDULERS",
    "DEVICES",
    "ZERO_STAGES",
    "WANDB_MODES",
    "EOS_POLICIES",
    "MINIBATCH_ORDERS",
    "AgentConfig",
    "AgentDefaults",
    "TrainConfig",
    "PromptConfig",
    "RolloutConfig",
    "EngineConfig",
    "RewardConfig",
    "StepConfig",
    "OptimConfig",
    "ComputeConfig",
    "OutputConfig",
    "LoggingConfig",
    "EvalConfig",
    "ClusterConfig",
]
