"""Train N heterogeneous agents together with HACPO (or a single-agent baseline) from one command.

    python -m openrlhf_hacpo.cli.train_hacpo \\
        --agent name=qwen,pretrain=Qwen/Qwen3-1.7B-Base \\
        --agent name=qwen4b,pretrain=Qwen/Qwen3-4B-Base,learning_rate=1e-6 \\
        --prompt_data data/train.jsonl --input_key input --label_key label --apply_chat_template \\
        --algorithm hacpo --n_samples_per_prompt 8 --rollout_batch_size 128 --train_batch_size 512 \\
        --rollout_backend vllm --vllm_num_engines 2 --save_path runs/qwen_pair

Flag names follow OpenRLHF where the meaning is the same. Per-agent settings come from repeatable ``--agent
key=value,...`` strings or an ``--agents_config`` YAML file (a list of agents, or a mapping with an ``agents`` list);
settings an agent leaves out inherit the run-wide flag of the same meaning. :func:`build_config` turns ``argv`` into
a validated :class:`~openrlhf_hacpo.config.TrainConfig`; :func:`run` trains and returns the controller.

:func:`main` (the console entry point) prints every error a person can act on (bad flags and files, a refused run
folder, checkpoint and disk-space errors, a reward function that fails, a worker that dies or hangs) as one line and
exits with status 2; ``--debug`` prints the traceback too. SIGINT and SIGTERM stop the workers and the Ray session
before the process exits (status 130 / 143).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import traceback
import typing
from pathlib import Path
from typing import Any, Sequence

from openrlhf_hacpo.algorithms import PRESETS, HACPOConfig
from openrlhf_hacpo.algorithms.config import CAPABILITY_METRICS, CROSS_CLIP_MODES, LOSS_AGGREGATIONS, RATIO_LEVELS
from openrlhf_hacpo.config import (
    AGENT_FIELDS,
    DEVICES,
    EOS_POLICIES,
    KERNEL_BACKENDS,
    LOGPROB_PATHS,
    LR_SCHEDULERS,
    MINIBATCH_ORDERS,
    ROLLOUT_BACKENDS,
    WANDB_MODES,
    AgentConfig,
    TrainConfig,
)

__all__ = ["build_parser", "build_config", "parse_agent_spec", "load_agents_file", "run", "main"]

# HACPO-only switches: they shape foreign rows, so single-agent algorithms reject them
_FOREIGN_FLAGS = ("alpha", "cross_clip_delta", "cross_clip_step", "cross_clip_high", "cross_clip_mode",
                  "cross_clip_dual", "no_stepwise", "no_cross_clip", "no_capability_coef")
_SHARED_ROLLOUT_FLAGS = ("no_capability_advantage",)


def _bool_text(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (true/false), got {text!r}")


def _agent_field_types() -> dict[str, Any]:
    hints = typing.get_type_hints(AgentConfig)
    out = {}
    for name in AGENT_FIELDS:
        args = [a for a in typing.get_args(hints[name]) if a is not type(None)] or [hints[name]]
        out[name] = args[0]
    return out


def parse_agent_spec(spec: str, where: str = "--agent") -> AgentConfig:
    """``"name=qwen,pretrain=/models/qwen,learning_rate=1e-6,zero_stage=2"`` -> :class:`AgentConfig`."""
    types = _agent_field_types()
    values: dict[str, Any] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{where} {spec!r}: {item!r} is not key=value")
        if key not in types:
            raise ValueError(f"{where} {spec!r}: unknown agent setting {key!r}; known settings: {list(AGENT_FIELDS)}")
        if key in values:
            raise ValueError(f"{where} {spec!r}: setting {key!r} given twice")
        kind = types[key]
        try:
            if kind is bool:
                values[key] = _bool_text(text)
            elif kind is int:
                values[key] = int(text)
            elif kind is float:
                values[key] = float(text)
            else:
                values[key] = text.strip()
        except ValueError as err:
            raise ValueError(f"{where} {spec!r}: bad value for {key!r}: {err}") from None
    return AgentConfig.from_dict(values, where=f"{where} {spec!r}")


def load_agents_file(path: str) -> list[AgentConfig]:
    """Agents from a YAML file: a list of agent mappings, or a mapping with an ``agents`` list."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"agents config {path} does not exist")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ValueError(f"agents config {path}: invalid YAML ({err})") from err
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"agents"})
        if unknown:
            raise ValueError(f"agents config {path}: unknown top-level key(s) {unknown}; expected 'agents'")
        data = data.get("agents")
    if not isinstance(data, list) or not data:
        raise ValueError(f"agents config {path}: expected a non-empty list of agents")
    agents = []
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ValueError(f"agents config {path}: entry {i} must be a mapping, got {type(entry).__name__}")
        agents.append(AgentConfig.from_dict(entry, where=f"agents config {path}, entry {i}"))
    return agents


def build_parser() -> argparse.ArgumentParser:
    """The grouped argument parser of ``train_hacpo``."""
    d = TrainConfig.__dataclass_fields__

    def default(name: str) -> Any:
        f = d[name]
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()

    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_hacpo.cli.train_hacpo",
        description="Heterogeneous Agent Collaborative Policy Optimization: N agents with different architectures, "
        "sizes and tokenizers learn one verifiable-reward task together on Ray + DeepSpeed.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    g = parser.add_argument_group("agents")
    g.add_argument("--agent", action="append", default=[], metavar="KEY=VALUE,...",
                   help="one agent per flag (repeatable), e.g. name=qwen,pretrain=/models/qwen,learning_rate=1e-6. "
                   f"Settings: {', '.join(AGENT_FIELDS)}; unset settings inherit the run-wide flag")
    g.add_argument("--agents_config", default=None, metavar="YAML",
                   help="YAML file with a list of agents (same settings as --agent); combined with --agent flags")

    g = parser.add_argument_group("prompts")
    g.add_argument("--prompt_data", required=True, help="jsonl / json / parquet file or a datasets hub name")
    g.add_argument("--prompt_split", default=default("prompt_split"), help="split of a hub dataset")
    g.add_argument("--input_key", default=default("input_key"), help="record field holding the prompt")
    g.add_argument("--label_key", default=default("label_key"), help="record field holding the answer")
    g.add_argument("--max_samples", type=int, default=None, help="use only the first N prompts")
    g.add_argument("--apply_chat_template", action="store_true",
                   help="render prompts with each agent's chat template (each agent its own)")
    g.add_argument("--enable_thinking", action="store_true",
                   help="pass enable_thinking=True to chat templates that read it (Qwen3); default False")
    g.add_argument("--prompt_max_len", type=int, default=default("prompt_max_len"),
                   help="prompt tokens kept (left-truncated) in learner views")
    g.add_argument("--drop_long_prompts", action="store_true",
                   help="drop, at load, prompts longer than --prompt_max_len tokens in any agent's rendering (as the "
                        "official code does) instead of keeping their last --prompt_max_len tokens")
    g.add_argument("--generate_max_len", type=int, default=default("generate_max_len"),
                   help="max new tokens per response (foreign re-tokenized responses are right-truncated to it)")

    g = parser.add_argument_group("rollout")
    g.add_argument("--rollout_backend", choices=ROLLOUT_BACKENDS, default=default("rollout_backend"),
                   help="vllm: vLLM engines as Ray actors; hf: transformers generate inside the policy actor")
    g.add_argument("--n_samples_per_prompt", type=int, default=default("n_samples_per_prompt"),
                   help="G, responses per prompt and agent")
    g.add_argument("--rollout_batch_size", type=int, default=default("rollout_batch_size"), help="prompts per step")
    g.add_argument("--temperature", type=float, default=default("temperature"),
                   help="rollout temperature (also used for every log-prob)")
    g.add_argument("--top_p", type=float, default=default("top_p"))
    g.add_argument("--top_k", type=int, default=default("top_k"), help="-1 disables")
    g.add_argument("--eos_policy", choices=EOS_POLICIES, default=default("eos_policy"),
                   help="drop: the terminal EOS is not trained (official v1 code); keep: it is an action")
    g.add_argument("--vllm_num_engines", type=int, default=default("vllm_num_engines"), help="engines per agent")
    g.add_argument("--vllm_tensor_parallel_size", type=int, default=default("vllm_tensor_parallel_size"))
    g.add_argument("--vllm_gpu_memory_utilization", type=float, default=default("vllm_gpu_memory_utilization"),
                   help="GPU memory fraction of an engine (default: 0.95 on a dedicated GPU, 0.5 colocated)")
    eager = g.add_mutually_exclusive_group()
    eager.add_argument("--vllm_enable_cuda_graph", action="store_true",
                       help="let vLLM capture CUDA graphs (the default on GPU)")
    eager.add_argument("--vllm_enforce_eager", action="store_true",
                       help="no CUDA graphs (the default on CPU; faster start, slower generation on GPU)")
    sleep = g.add_mutually_exclusive_group()
    sleep.add_argument("--vllm_enable_sleep", action="store_true",
                       help="engines free their GPU memory between generations (the default when colocated)")
    sleep.add_argument("--vllm_disable_sleep", action="store_true", help="engines keep their GPU memory")
    g.add_argument("--colocate_all_models", action="store_true",
                   help="place an agent's policy, reference and vLLM engines on the same GPUs")

    g = parser.add_argument_group("rewards")
    g.add_argument("--reward_fn", default=default("reward_fn"),
                   help="registered verifier (exact_match, boxed_math, arithmetic) or a Python file defining "
                   "reward_func(queries, prompts, labels)")
    g.add_argument("--reward_num_workers", type=int, default=default("reward_num_workers"),
                   help="reward worker processes (0: in a thread of the driver)")
    g.add_argument("--reward_timeout", type=float, default=default("reward_timeout"),
                   help="seconds allowed to score one step's responses, with any number of workers (0: no limit)")
    g.add_argument("--reward_stall_steps", type=int, default=default("reward_stall_steps"),
                   help="warn when an agent's rewards are all equal (e.g. all 0) for this many steps in a row "
                   "(0: never)")

    hacpo = HACPOConfig()
    g = parser.add_argument_group("algorithm", "HACPO settings (defaults follow the official code; spec §3.f)")
    g.add_argument("--algorithm", choices=PRESETS, default="hacpo",
                   help="hacpo; the baselines gspo / grpo (each agent alone) and naive (shared rollouts, plain "
                   "advantages); or a HACPO ablation")
    g.add_argument("--alpha", type=float, default=None,
                   help=f"exponential importance-sampling exponent α (eq. 12) [{hacpo.loss.alpha}]")
    g.add_argument("--cross_clip_delta", type=float, default=None,
                   help=f"δ: foreign ratios are clipped to [1-δ, 1] (eq. 13) [{hacpo.loss.delta}]")
    g.add_argument("--cross_clip_step", type=float, default=None,
                   help=f"δ_step: the lower bound rises by this per update m (eq. 14) [{hacpo.loss.delta_step}]")
    g.add_argument("--cross_clip_high", type=float, default=None,
                   help="upper end of the foreign window [lo, high]; above 1 also trains on foreign rollouts the "
                   f"learner already finds likelier than their source did (extension, not in the paper) "
                   f"[{hacpo.loss.cross_clip_high}]")
    g.add_argument("--cross_clip_mode", choices=CROSS_CLIP_MODES, default=None,
                   help="clamp: foreign rows outside the window get no gradient (paper); pessimistic: PPO's "
                   "min(s·A, clip(s)·A), so foreign successes below the window and failures above it keep theirs "
                   f"(extension, not in the paper) [{hacpo.loss.cross_clip_mode}]")
    g.add_argument("--cross_clip_dual", type=float, default=None,
                   help="pessimistic mode: foreign failures with ratio above this get no gradient (dual clip) "
                   f"[{hacpo.loss.cross_clip_dual}]")
    g.add_argument("--no_stepwise", action="store_true", help="fixed foreign lower bound 1-δ")
    g.add_argument("--no_cross_clip", action="store_true", help="no clamp on foreign ratios")
    g.add_argument("--no_capability_advantage", action="store_true",
                   help="plain joint-group mean baseline instead of the capability-weighted one (eq. 7)")
    g.add_argument("--no_capability_coef", action="store_true",
                   help="drop the capability coefficient ω^(j,k) on foreign rows (eq. 10)")
    g.add_argument("--capability_window", type=int, default=None,
                   help=f"K, steps averaged in the capability estimate (eq. 9) [{hacpo.capability.window}]")
    g.add_argument("--capability_metric", choices=CAPABILITY_METRICS, default=None,
                   help=f"per-step capability [{hacpo.capability.metric}]")
    g.add_argument("--capability_ratio_min", type=float, default=None,
                   help=f"capability ratios are clipped to [min, max] [{hacpo.capability.ratio_min}]")
    g.add_argument("--capability_ratio_max", type=float, default=None, help=f"[{hacpo.capability.ratio_max}]")
    g.add_argument("--capability_warmup_steps", type=int, default=None,
                   help=f"steps with every capability ratio 1 [{hacpo.capability.warmup_steps}]")
    g.add_argument("--eps_clip_low", type=float, default=None,
                   help="own-rollout clip: ratio in [1-low, 1+high] (GSPO 3e-4 / 4e-4; grpo 0.2 / 0.28)")
    g.add_argument("--eps_clip_high", type=float, default=None)
    g.add_argument("--loss_agg", choices=LOSS_AGGREGATIONS, default=None, help=f"[{hacpo.loss.loss_agg}]")
    g.add_argument("--ratio_level", choices=RATIO_LEVELS, default=None,
                   help="sequence (GSPO) or token ratios (gspo / grpo only)")
    g.add_argument("--log_ratio_clip", type=float, default=None,
                   help=f"clamp of the log importance ratio [{hacpo.loss.log_ratio_clip}]")
    g.add_argument("--init_kl_coef", type=float, default=None,
                   help=f"low-variance KL to the initial policy on own rows; 0 disables the reference model "
                   f"[{hacpo.loss.kl_coef}]")

    g = parser.add_argument_group("training")
    g.add_argument("--train_batch_size", type=int, default=default("train_batch_size"),
                   help="rows per optimizer update (global over an agent's workers)")
    g.add_argument("--micro_train_batch_size", type=int, default=default("micro_train_batch_size"),
                   help="rows per forward/backward on one worker")
    g.add_argument("--max_epochs", type=int, default=default("max_epochs"), help="passes over each step's rows")
    g.add_argument("--num_episodes", type=int, default=default("num_episodes"), help="passes over the prompts")
    g.add_argument("--max_steps", type=int, default=None, help="stop after this many steps")
    g.add_argument("--minibatch_order", choices=MINIBATCH_ORDERS, default=default("minibatch_order"),
                   help="how rows are assigned to the updates m of a step: stratified (every update sees the same share "
                        "of each source, the net effect of both official runs), own_first (the v1 code's literal "
                        "order; it mixes sources only at 8-rank data parallelism), shuffle")
    g.add_argument("--actor_learning_rate", type=float, default=default("actor_learning_rate"))
    g.add_argument("--allow_zero_lr", action="store_true",
                   help="accept a learning rate of 0 (an agent that never changes); refused without this flag")
    g.add_argument("--lr_scheduler", choices=LR_SCHEDULERS, default=default("lr_scheduler"))
    g.add_argument("--lr_warmup_steps", type=int, default=default("lr_warmup_steps"), help="optimizer updates")
    g.add_argument("--min_lr_ratio", type=float, default=default("min_lr_ratio"),
                   help="final lr / lr of the cosine schedule")
    g.add_argument("--max_norm", type=float, default=default("max_norm"), help="gradient clipping (0 disables)")
    g.add_argument("--adam_betas", type=float, nargs=2, default=list(default("adam_betas")))
    g.add_argument("--l2", type=float, default=default("l2"), help="AdamW weight decay")
    g.add_argument("--zero_stage", type=int, choices=(0, 1, 2, 3), default=default("zero_stage"))
    g.add_argument("--bf16", action="store_true", help="bf16 weights with fp32 master weights")
    g.add_argument("--gradient_checkpointing", action="store_true")
    g.add_argument("--attn_implementation", default=default("attn_implementation"),
                   help="sdpa | eager | flash_attention_2")
    g.add_argument("--kernel_backend", choices=KERNEL_BACKENDS, default=default("kernel_backend"),
                   help="loss and log-prob kernels: auto = Triton on CUDA tensors, the torch twin elsewhere "
                        "(the HACPO_KERNEL_BACKEND environment variable overrides auto)")
    g.add_argument("--logprob_path", choices=LOGPROB_PATHS, default=default("logprob_path"),
                   help="fused: log-probs from the final hidden states and the LM head in tiles, without the full "
                        "logits; logits: from the model's logits of the response positions")
    g.add_argument("--actor_num_gpus_per_node", type=int, default=default("actor_num_gpus_per_node"),
                   help="data-parallel policy workers per agent")
    g.add_argument("--device", choices=DEVICES, default=default("device"),
                   help="auto: cuda when the Ray cluster has GPUs")
    g.add_argument("--no_ray", action="store_true",
                   help="run every agent's worker inside this process (one worker per agent; hf backend)")
    g.add_argument("--seed", type=int, default=default("seed"))

    g = parser.add_argument_group("checkpoints and logging")
    g.add_argument("--save_path", default=default("save_path"),
                   help="run folder: metrics.jsonl, eval.jsonl, hf/<agent>/, tensorboard/")
    g.add_argument("--ckpt_path", default=None, help="joint checkpoints [<save_path>/checkpoints]")
    g.add_argument("--save_steps", type=int, default=default("save_steps"),
                   help="joint checkpoint every N steps (-1: only at the end)")
    g.add_argument("--max_ckpt_num", type=int, default=default("max_ckpt_num"), help="joint checkpoints kept")
    g.add_argument("--no_save_hf", action="store_true", help="skip the per-agent Hugging Face checkpoints")
    g.add_argument("--save_rollouts", action="store_true", help="write each step's trajectories as jsonl")
    g.add_argument("--resume", action="store_true", help="continue from the latest joint checkpoint")
    g.add_argument("--resume_accept_mismatch", action="store_true",
                   help="resume even when the checkpoint was written with other settings (algorithm, agents, seed, "
                   "batch geometry, loss settings); the differences are logged")
    g.add_argument("--overwrite", action="store_true",
                   help="start a fresh run in a save path that holds an earlier run, deleting its metrics, "
                   "evaluations, checkpoints, hf/ and rollouts/ (refused without this flag or --resume)")
    g.add_argument("--logging_steps", type=int, default=default("logging_steps"))
    g.add_argument("--use_tensorboard", default=None, metavar="DIR", help="TensorBoard log folder")
    g.add_argument("--use_wandb", action="store_true", help="log to Weights & Biases")
    g.add_argument("--wandb_project", default=default("wandb_project"))
    g.add_argument("--wandb_run_name", default=None)
    g.add_argument("--wandb_mode", choices=WANDB_MODES, default=default("wandb_mode"))
    g.add_argument("--no_progress_bar", action="store_true")

    g = parser.add_argument_group("evaluation", "greedy accuracy of each agent alone, and pass@k")
    g.add_argument("--eval_data", nargs="+", default=None, metavar="FILE",
                   help="validation prompts (same keys as --prompt_data); several files are reported per data_source")
    g.add_argument("--eval_split", default=default("eval_split"))
    g.add_argument("--eval_steps", type=int, default=default("eval_steps"),
                   help="evaluate every N steps and at the end (-1: only at the end, when eval_data is given)")
    g.add_argument("--eval_n_samples", type=int, default=default("eval_n_samples"),
                   help="k of pass@k: sampled responses per prompt besides the greedy one (1: greedy only)")
    g.add_argument("--eval_temperature", type=float, default=default("eval_temperature"))
    g.add_argument("--eval_max_samples", type=int, default=None, help="evaluate on the first N prompts")
    g.add_argument("--eval_generate_max_len", type=int, default=None,
                   help="max new tokens of evaluation responses; vLLM engines are sized for the longer of the two "
                   "[--generate_max_len]")
    g.add_argument("--eval_before_training", action="store_true", help="also evaluate at step 0, before training")

    g = parser.add_argument_group("reliability and network")
    g.add_argument("--step_timeout", type=float, default=default("step_timeout"),
                   help="seconds any remote phase (setup, generate, score, update, sync, save, evaluate) of an agent "
                   "may take before the run stops with an error naming the agent and phase (0: no limit)")
    g.add_argument("--bind_host", default=default("bind_host"),
                   help="node address of the local Ray instance a run starts (choose the interface on a machine with "
                   "several; Ray 2.60 replaces a loopback address by the machine's, see docs/training.md, Security)")
    g.add_argument("--ray_address", default=None,
                   help="join an existing Ray cluster (e.g. auto or HOST:6379) instead of starting a local one")
    g.add_argument("--debug", action="store_true", help="print tracebacks with error messages; debug logging")
    return parser


def _algorithm_config(args: argparse.Namespace) -> HACPOConfig:
    preset = HACPOConfig.preset(args.algorithm)
    if not preset.trains_on_foreign or preset.algorithm == "naive":
        given = [f"--{n}" for n in _FOREIGN_FLAGS if getattr(args, n) not in (None, False)]
        if not preset.trains_on_foreign:
            given += [f"--{n}" for n in _SHARED_ROLLOUT_FLAGS if getattr(args, n)]
        if given:
            raise ValueError(
                f"--algorithm {args.algorithm} is incompatible with {', '.join(given)}: "
                + ("it trains each agent on its own rollouts only"
                   if not preset.trains_on_foreign else "naive applies the self clip to every row")
            )
    cap, adv, loss = {}, {}, {}
    for flag, target, key in (
        ("capability_window", cap, "window"), ("capability_metric", cap, "metric"),
        ("capability_ratio_min", cap, "ratio_min"), ("capability_ratio_max", cap, "ratio_max"),
        ("capability_warmup_steps", cap, "warmup_steps"),
        ("alpha", loss, "alpha"), ("cross_clip_delta", loss, "delta"), ("cross_clip_step", loss, "delta_step"),
        ("cross_clip_high", loss, "cross_clip_high"), ("cross_clip_mode", loss, "cross_clip_mode"),
        ("cross_clip_dual", loss, "cross_clip_dual"),
        ("eps_clip_low", loss, "eps_low"), ("eps_clip_high", loss, "eps_high"), ("loss_agg", loss, "loss_agg"),
        ("ratio_level", loss, "ratio_level"), ("log_ratio_clip", loss, "log_ratio_clip"),
        ("init_kl_coef", loss, "kl_coef"),
    ):
        value = getattr(args, flag)
        if value is not None:
            target[key] = value
    if args.no_stepwise:
        loss["stepwise"] = False
    if args.no_cross_clip:
        loss["cross_clip"] = False
    if args.no_capability_coef:
        loss["capability_coef"] = False
    if args.no_capability_advantage:
        adv["capability_weighting"] = False
    return HACPOConfig(
        algorithm=preset.algorithm,
        capability=dataclasses.replace(preset.capability, **cap),
        advantage=dataclasses.replace(preset.advantage, **adv),
        loss=dataclasses.replace(preset.loss, **loss),
    )


def build_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse ``argv`` into a validated :class:`TrainConfig` (``ValueError`` names what is wrong)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    agents = load_agents_file(args.agents_config) if args.agents_config else []
    agents += [parse_agent_spec(spec) for spec in args.agent]
    if not agents:
        raise ValueError("no agents: give at least one --agent name=...,pretrain=... or an --agents_config file")
    return TrainConfig(
        agents=agents,
        algo=_algorithm_config(args),
        prompt_data=args.prompt_data,
        prompt_split=args.prompt_split,
        input_key=args.input_key,
        label_key=args.label_key,
        max_samples=args.max_samples,
        apply_chat_template=args.apply_chat_template,
        enable_thinking=args.enable_thinking,
        prompt_max_len=args.prompt_max_len,
        generate_max_len=args.generate_max_len,
        rollout_backend=args.rollout_backend,
        n_samples_per_prompt=args.n_samples_per_prompt,
        rollout_batch_size=args.rollout_batch_size,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        eos_policy=args.eos_policy,
        vllm_num_engines=args.vllm_num_engines,
        vllm_tensor_parallel_size=args.vllm_tensor_parallel_size,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        vllm_enforce_eager=True if args.vllm_enforce_eager else False if args.vllm_enable_cuda_graph else None,
        vllm_enable_sleep=True if args.vllm_enable_sleep else False if args.vllm_disable_sleep else None,
        colocate_all_models=args.colocate_all_models,
        reward_fn=args.reward_fn,
        reward_num_workers=args.reward_num_workers,
        reward_timeout=args.reward_timeout if args.reward_timeout else None,
        reward_stall_steps=args.reward_stall_steps,
        allow_zero_lr=args.allow_zero_lr,
        drop_long_prompts=args.drop_long_prompts,
        resume_accept_mismatch=args.resume_accept_mismatch,
        overwrite=args.overwrite,
        step_timeout=args.step_timeout if args.step_timeout else None,
        bind_host=args.bind_host,
        ray_address=args.ray_address,
        train_batch_size=args.train_batch_size,
        micro_train_batch_size=args.micro_train_batch_size,
        max_epochs=args.max_epochs,
        num_episodes=args.num_episodes,
        max_steps=args.max_steps,
        minibatch_order=args.minibatch_order,
        actor_learning_rate=args.actor_learning_rate,
        lr_scheduler=args.lr_scheduler,
        lr_warmup_steps=args.lr_warmup_steps,
        min_lr_ratio=args.min_lr_ratio,
        max_norm=args.max_norm,
        adam_betas=tuple(args.adam_betas),
        l2=args.l2,
        zero_stage=args.zero_stage,
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        attn_implementation=args.attn_implementation,
        kernel_backend=args.kernel_backend,
        logprob_path=args.logprob_path,
        actor_num_gpus_per_node=args.actor_num_gpus_per_node,
        device=args.device,
        use_ray=not args.no_ray,
        seed=args.seed,
        save_path=args.save_path,
        ckpt_path=args.ckpt_path,
        save_steps=args.save_steps,
        max_ckpt_num=args.max_ckpt_num,
        save_hf=not args.no_save_hf,
        save_rollouts=args.save_rollouts,
        resume=args.resume,
        logging_steps=args.logging_steps,
        use_tensorboard=args.use_tensorboard,
        use_wandb=args.use_wandb,
        wandb_project=args.wandb_project,
        wandb_run_name=args.wandb_run_name,
        wandb_mode=args.wandb_mode,
        progress_bar=not args.no_progress_bar,
        eval_data=",".join(args.eval_data) if args.eval_data else None,
        eval_split=args.eval_split,
        eval_steps=args.eval_steps,
        eval_n_samples=args.eval_n_samples,
        eval_temperature=args.eval_temperature,
        eval_max_samples=args.eval_max_samples,
        eval_generate_max_len=args.eval_generate_max_len,
        eval_before_training=args.eval_before_training,
    )


def run(argv: Sequence[str] | None = None):
    """Build the config, train, and return the finished :class:`~openrlhf_hacpo.trainer.HACPOController`."""
    from openrlhf_hacpo.trainer.controller import HACPOController

    controller = HACPOController(build_config(argv))
    _fit(controller)
    return controller


def _fit(controller) -> None:
    """Train, then stop the workers and Ray whatever happened."""
    try:
        controller.fit()
    finally:
        controller.close()


def _known_errors() -> tuple[type[BaseException], ...]:
    from openrlhf_hacpo.rollout.rewards import RewardFunctionError
    from openrlhf_hacpo.trainer.controller import TrainingError
    from openrlhf_hacpo.utils.errors import USER_ERRORS

    return (*USER_ERRORS, RewardFunctionError, TrainingError)


def _one_line(err: BaseException) -> str:
    """The error's message on one line; an error raised inside a Ray worker is reported by its cause, without the
    remote traceback Ray prepends."""
    cause = getattr(err, "cause", None)
    if type(err).__name__.startswith("RayTaskError") and isinstance(cause, BaseException):
        err = cause
    return " ".join(str(err).split()) or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: 0 on success; 2 on an error a person can act on (one line on stderr, ``--debug`` adds the
    traceback); 128 + the signal number when stopped by SIGINT or SIGTERM (workers and Ray are stopped first)."""
    from openrlhf_hacpo.utils.logging_setup import configure_logging
    from openrlhf_hacpo.utils.shutdown import RunInterrupted, signals_raise

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    configure_logging(debug)
    controller = None
    try:
        with signals_raise():
            cfg = build_config(argv)
            from openrlhf_hacpo.trainer.controller import HACPOController

            controller = HACPOController(cfg)
            _fit(controller)
    except RunInterrupted as err:
        where = (f"; the last joint checkpoint is {controller.last_checkpoint} (continue with --resume)"
                 if controller is not None and controller.last_checkpoint is not None else "")
        print(f"train_hacpo: {err}, workers stopped{where}", file=sys.stderr)
        return 128 + err.signum
    except _known_errors() as err:
        if debug:
            traceback.print_exc()
        print(f"train_hacpo: error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
