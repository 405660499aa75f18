"""One agent's policy worker: an HF causal LM inside a DeepSpeed engine.

A :class:`PolicyWorker` is one data-parallel rank of one agent. It

* renders prompts with the agent's own tokenizer and chat template and, with the ``hf`` backend, samples
  responses with transformers ``generate`` (:class:`~openrlhf_hacpo.engines.hf_generate.HFGenerateEngine`);
* recomputes the old log-probs of its own responses at the rollout temperature (spec §3.c: the ratio denominator
  is the policy's recompute, not the engine's log-probs) and turns them into tokenizer-neutral
  :class:`~openrlhf_hacpo.rollout.Trajectory` objects;
* trains on a step's trajectories (:meth:`train_step`): learner view of every trajectory, capability-aware
  advantages (eqs. 6–8), optional reference log-probs, mini-batch updates m = 0, 1, ... (eq. 14) with gradient
  accumulation over micro-batches, gradient clipping and a DeepSpeed optimizer step;
* exports its weights (engine sync, Hugging Face checkpoints) and saves / loads its full training state.

Each agent's ranks form their own ``torch.distributed`` group (gloo on CPU, NCCL on GPU), so agents never
synchronise with each other. ``PolicyActor = ray.remote(PolicyWorker)``; without Ray the same class runs in the
driver process.

Non-finite losses: a micro-batch whose loss (or log-probs) is NaN/inf contributes no gradient, and the optimizer
update of its mini-batch is skipped (the parameters and Adam moments stay untouched); ``skipped_updates`` counts them.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from openrlhf_hacpo.algorithms import compute_advantages, get_policy_loss
from openrlhf_hacpo.algorithms.losses import PolicyLossInput
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig, derive_seed
from openrlhf_hacpo.models import response_logprobs, score_rows
from openrlhf_hacpo.utils.network import free_port
from openrlhf_hacpo.utils.partition import split_evenly
from openrlhf_hacpo.utils.safe_load import checkpoint_io, load_torch_file
from openrlhf_hacpo.rollout import (
    LearnerBatch,
    LearnerViewConfig,
    Trajectory,
    build_learner_batch,
    make_trajectory,
    render_prompt_ids,
    render_prompt_text,
)
from openrlhf_hacpo.utils.rng import capture_rng_state, restore_rng_state
from openrlhf_hacpo.config import AgentConfig, TrainConfig

__all__ = ["PolicyWorker", "PolicyActor", "SkippableAdamW", "load_tokenizer", "view_config", "build_ds_config"]

logger = logging.getLogger(__name__)

CHECKPOINT_TAG = "state"
GENERATE_BATCH_ROWS = 64
"""Rows (prompt x sample) per transformers ``generate`` call of the ``hf`` backend."""


# ---------------------------------------------------------------------------------------------------------- helpers
def load_tokenizer(agent: AgentConfig):
    """The agent's tokenizer with its chat-template override applied; errors name the agent and the path.

    A tokenizer without a pad token pads with its EOS token (padding is always masked).
    """
    from transformers import AutoTokenizer

    path = agent.tokenizer_path
    if looks_like_local_path(path) and not os.path.exists(path):
        raise FileNotFoundError(f"agent {agent.name!r}: tokenizer path {path!r} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise FileNotFoundError(f"agent {agent.name!r}: cannot load the tokenizer from {path!r}: {err}") from err
    if agent.chat_template is not None:
        template = agent.chat_template
        if os.path.isfile(template):
            template = Path(template).read_text(encoding="utf-8")
        tokenizer.chat_template = template
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"agent {agent.name!r}: tokenizer {path!r} has neither a pad nor an EOS token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def looks_like_local_path(path: str) -> bool:
    """A filesystem path rather than a hub id (absolute, relative with ./ or ../, or home-relative)."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def view_config(cfg: TrainConfig) -> LearnerViewConfig:
    """How trajectories become token rows for a learner (prompt rendering, EOS policy, truncation)."""
    return LearnerViewConfig(
        eos_policy=cfg.eos_policy,
        prompt_max_len=cfg.prompt_max_len,
        generate_max_len=cfg.generate_max_len,
        apply_chat_template=cfg.apply_chat_template,
        enable_thinking=cfg.enable_thinking if cfg.apply_chat_template else None,
    )


class SkippableAdamW(torch.optim.AdamW):
    """AdamW whose ``step`` is a no-op while ``skip_next_step`` is True.

    DeepSpeed runs its whole update path (gradient reduction, clipping, fp32 master copy, zeroing) unchanged; only
    the parameter and moment update is left out, which is how a non-finite loss skips an update.

    One ``engine.step()`` calls this optimizer's ``step`` several times under ZeRO: once per parameter group
    (ZeRO-1/2, ``DeepSpeedZeroOptimizer._optimizer_step``) or per parameter sub-group (ZeRO-3,
    ``DeepSpeedZeroOptimizer_Stage3._optimizer_step``), each time with ``param_groups`` narrowed to that group. The
    flag therefore never clears itself: the caller sets it before ``engine.step()`` and clears it afterwards, so
    every group of the update is skipped and no Adam step counter advances.
    """

    skip_next_step: bool = False

    def step(self, closure=None):  # noqa: D102 - torch API
        if self.skip_next_step:
            return None
        return super().step(closure)


def build_ds_config(cfg: TrainConfig, agent: AgentConfig) -> dict[str, Any]:
    """DeepSpeed config of an agent's policy engine (ZeRO stage, bf16, clipping, accumulation)."""
    gas = cfg.train_batch_size // (cfg.micro_train_batch_size * agent.dp_size)
    zero: dict[str, Any] = {"stage": agent.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if agent.zero_stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_gather_16bit_weights_on_model_save=True)
    return {
        "train_batch_size": cfg.train_batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_train_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.max_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": bool(agent.bf16)},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _lr_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_updates: int):
    from transformers import get_scheduler

    name = cfg.lr_scheduler
    kwargs: dict[str, Any] = {}
    if name == "cosine":
        name, kwargs = "cosine_with_min_lr", {"min_lr_rate": cfg.min_lr_ratio}
    warmup = cfg.lr_warmup_steps if name != "constant" else None
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=max(total_updates, 1),
                         scheduler_specific_kwargs=kwargs or None)


def _grouped_parameters(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on matrices only; biases and norm weights (1-D) are not decayed."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        ndim = len(getattr(param, "ds_shape", param.shape))  # ZeRO-3 partitions hold a flat local shard
        (no_decay if ndim < 2 or name.endswith(".bias") else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class _Weighted:
    """Weighted means of named values (merged across micro-batches, updates and data-parallel ranks)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, key: str, value: float, weight: float = 1.0) -> None:
        if weight > 0 and math.isfinite(value):
            self.sums[key] += value * weight
            self.weights[key] += weight

    def state(self) -> dict[str, tuple[float, float]]:
        return {k: (self.sums[k], self.weights[k]) for k in self.sums}


def _record_view_stats(batch: LearnerBatch, advantages: torch.Tensor, stats: _Weighted,
                       agent_names: Sequence[str]) -> None:
    """Sizes, truncation, advantage and old log-prob statistics of a learner's view; per foreign source agent, the
    mean length of its responses in the learner's tokens (``view/foreign_tokens/<source>``) and the re-tokenization
    ratio, learner tokens over source tokens summed over its rows (``view/retokenization_ratio/<source>``)."""
    n_rows = float(len(batch))
    for key, value in batch.stats().items():
        if key != "num_rows":
            stats.add(f"view/{key}", value, n_rows)
    stats.add("view/num_rows", n_rows, 1.0)
    own = torch.tensor([r.is_own for r in batch.rows])
    n_own, n_foreign = float(own.sum()), float((~own).sum())
    stats.add("advantage/mean", float(advantages.mean()), n_rows)
    stats.add("advantage/std", float(advantages.std()) if len(batch) > 1 else 0.0, n_rows)
    stats.add("advantage/own_mean", float(advantages[own].mean()), n_own)
    stats.add("view/own_old_logp_mean", float(np.mean([r.old_logp_mean for r in batch.rows if r.is_own])), n_own)
    if n_foreign:
        stats.add("advantage/foreign_mean", float(advantages[~own].mean()), n_foreign)
        foreign_old = [r.old_logp_mean for r in batch.rows if not r.is_own]
        stats.add("view/foreign_old_logp_mean", float(np.mean(foreign_old)), n_foreign)
    for source in sorted({r.source for r in batch.rows if not r.is_own}):
        rows = [r for r in batch.rows if r.source == source]
        learner_tokens = sum(len(r.response_ids) for r in rows)
        source_tokens = sum(r.source_num_tokens for r in rows)
        name = agent_names[source]
        stats.add(f"view/foreign_tokens/{name}", learner_tokens / len(rows), float(len(rows)))
        if source_tokens:
            stats.add(f"view/retokenization_ratio/{name}", learner_tokens / source_tokens, float(source_tokens))


def merge_weighted(states: Sequence[dict[str, tuple[float, float]]]) -> dict[str, float]:
    """Merge :class:`_Weighted` states of several ranks into weighted means."""
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    for state in states:
        for key, (s, w) in state.items():
            sums[key] += s
            weights[key] += w
    return {k: sums[k] / weights[k] for k in sums if weights[k] > 0}


# ---------------------------------------------------------------------------------------------------------- worker
class PolicyWorker:
    """One data-parallel rank of one agent's policy.

    Args:
        cfg: the run configuration.
        agent_index: index of this agent in ``cfg.agents``.
        rank / world_size: data-parallel rank of this worker within the agent and the agent's worker count.
        master_addr / master_port: rendezvous of the agent's process group (rank 0's address; see
            :meth:`get_master_addr_port`). ``None`` on rank 0 of a single-worker agent picks a free local port.
        total_updates: optimizer updates of the whole run (for the learning-rate schedule).
    """

    def __init__(self, cfg: TrainConfig, agent_index: int, rank: int = 0, world_size: int = 1,
                 master_addr: str | None = None, master_port: int | None = None, total_updates: int = 1) -> None:
        self.cfg = cfg
        self.agent_index = agent_index
        self.agent = cfg.resolved_agents()[agent_index]
        self.rank = rank
        self.world_size = world_size
        self.master_addr = master_addr
        self.master_port = master_port
        self.total_updates = total_updates
        self.view_cfg = view_config(cfg)
        self.engine = None
        self.hf_engine = None
        self.reference = None
        self.updates_done = 0
        self.skipped_updates = 0
        self._nonfinite_injections: set[tuple[int, int]] = set()

    # ------------------------------------------------------------------------------------------------ setup
    def get_master_addr_port(self) -> tuple[str, int]:
        """Rendezvous of the agent's process group (called on rank 0): ``--bind_host`` (loopback by default) for a
        single-machine run, this node's address when the run joins a cluster (``--ray_address``)."""
        if self.cfg.ray_address is None:
            return self.cfg.bind_host, free_port(self.cfg.bind_host)
        import ray

        address = ray.util.get_node_ip_address()
        return address, free_port(address)

    def _init_distributed(self) -> None:
        import deepspeed

        if torch.distributed.is_initialized():
            if torch.distributed.get_world_size() != self.world_size:
                raise RuntimeError(
                    f"agent {self.agent.name!r}: this process already belongs to a process group of size "
                    f"{torch.distributed.get_world_size()}, expected {self.world_size}")
            return
        os.environ["MASTER_ADDR"] = self.master_addr or self.cfg.bind_host
        os.environ["MASTER_PORT"] = str(self.master_port or free_port(os.environ["MASTER_ADDR"]))
        if self.cfg.ray_address is None and self.cfg.bind_host in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's pair connections on loopback too
        os.environ["RANK"] = str(self.rank)
        os.environ["WORLD_SIZE"] = str(self.world_size)
        os.environ["LOCAL_RANK"] = str(self._local_rank())
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)

    def _local_rank(self) -> int:
        if self.device.type != "cuda":
            return 0
        return torch.cuda.current_device()

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> dict[str, Any]:
        """Load tokenizer and model, build the DeepSpeed engine; returns facts the controller logs.

        ``master_addr`` / ``master_port`` override the rendezvous given at construction (rank 0 learns its own
        address only once it runs).
        """
        if master_addr is not None:
            self.master_addr, self.master_port = master_addr, master_port
        import deepspeed
        from transformers import AutoModelForCausalLM

        from openrlhf_hacpo.engines.hf_generate import HFGenerateEngine, resolve_eos_token_ids

        for name in ("DeepSpeed", "deepspeed"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from openrlhf_hacpo.engines.placement import actor_device

        self.device = actor_device()
        self._init_distributed()
        agent = self.agent
        self.tokenizer = load_tokenizer(agent)
        ds_config = build_ds_config(self.cfg, agent)
        dtype = torch.bfloat16 if agent.bf16 else torch.float32
        self._hf_ds_config = None
        if agent.zero_stage == 3:
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_ds_config = HfDeepSpeedConfig(ds_config)  # partitions the weights while loading
        try:
            model = AutoModelForCausalLM.from_pretrained(agent.pretrain, dtype=dtype,
                                                         attn_implementation=agent.attn_implementation)
        except OSError as err:
            raise FileNotFoundError(f"agent {agent.name!r}: cannot load the model from {agent.pretrain!r}: {err}") \
                from err
        if self._hf_ds_config is not None and not self.cfg.use_ray:
            # several agents share this process: ZeRO-3 partitioning must not leak into the next agent's load
            from transformers.integrations.deepspeed import unset_hf_deepspeed_config

            unset_hf_deepspeed_config()
        if agent.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        optimizer = SkippableAdamW(_grouped_parameters(model, self.cfg.l2), lr=agent.learning_rate,
                                   betas=tuple(self.cfg.adam_betas))
        scheduler = _lr_scheduler(self.cfg, optimizer, self.total_updates)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config,
            dist_init_required=False)
        self.client_optimizer = optimizer
        self.model = self.engine.module
        self.eos_token_ids = resolve_eos_token_ids(self.model, self.tokenizer)
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        # a fixed generation batch: the sampled tokens of a seeded step must not depend on training batch sizes
        self.hf_engine = HFGenerateEngine(self.model, self.tokenizer, max_batch_size=GENERATE_BATCH_ROWS)
        # under ZeRO-3 the embedding is partitioned (its local shape is empty): take the size from the config
        self.hf_engine.vocab_size = int(self.model.config.vocab_size)
        self.loss_fn = get_policy_loss(self.cfg.algo.loss_name)
        return {
            "agent": agent.name,
            "rank": self.rank,
            "num_parameters": sum(p.numel() for p in self.model.parameters()),
            "vocab_size": len(self.tokenizer),
            "eos_token_ids": self.eos_token_ids,
            "device": str(self.device),
        }

    def set_reference(self, reference: Any) -> None:
        """Handle of this agent's reference worker (a Ray actor handle or a plain :class:`ReferenceWorker`)."""
        self.reference = reference

    def ping(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------------------ rollout
    def render_prompts(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt ids for generation: the agent's own rendering, left-truncated to ``prompt_max_len``."""
        out = []
        for record in prompts:
            ids = render_prompt_ids(record.prompt, self.tokenizer, self.view_cfg)
            out.append(ids[-self.cfg.prompt_max_len:])
        return out

    def render_prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        """The prompts as this agent's model reads them (chat template applied), e.g. for reward files."""
        return [render_prompt_text(record.prompt, self.tokenizer, self.view_cfg) for record in prompts]

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[GenerationOutput]:
        """Sample ``sampling.n`` responses per prompt with transformers ``generate`` (``hf`` backend)."""
        return self.hf_engine.generate(self.render_prompts(prompts), sampling)

    def rollout(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int) -> dict[str, Any]:
        """Generate (``hf`` backend) and score own responses; returns trajectories and timings."""
        t0 = time.perf_counter()
        prompt_ids = self.render_prompts(prompts)
        outputs = self.hf_engine.generate(prompt_ids, sampling)
        t1 = time.perf_counter()
        trajs = self._trajectories(prompts, prompt_ids, outputs, step)
        t2 = time.perf_counter()
        return {"trajectories": trajs, "generate_s": t1 - t0, "logprob_s": t2 - t1,
                "generated_tokens": sum(o.num_tokens for o in outputs)}

    def make_trajectories(self, prompts: Sequence[Any], outputs: Sequence[GenerationOutput],
                          step: int) -> dict[str, Any]:
        """Score responses sampled elsewhere (vLLM engines) and return trajectories and the scoring time."""
        t0 = time.perf_counter()
        trajs = self._trajectories(prompts, self.render_prompts(prompts), outputs, step)
        return {"trajectories": trajs, "logprob_s": time.perf_counter() - t0}

    def _trajectories(self, prompts: Sequence[Any], prompt_ids: list[list[int]],
                      outputs: Sequence[GenerationOutput], step: int) -> list[Trajectory]:
        rows_prompt = [prompt_ids[o.prompt_index] for o in outputs]
        rows_response = [list(o.response_token_ids) for o in outputs]
        self.engine.eval()
        try:
            logps = score_rows(self.engine, rows_prompt, rows_response, self.pad_token_id, self.cfg.temperature,
                               self.cfg.micro_train_batch_size, self.device, path=self.cfg.logprob_path,
                               backend=self.cfg.kernel_backend)
        finally:
            self.engine.train()
        trajs = []
        for out, logp in zip(outputs, logps):
            record = prompts[out.prompt_index]
            trajs.append(make_trajectory(
                prompt_id=record.prompt_id, prompt=record.prompt, label=record.label, source=self.agent_index,
                step=step, token_ids=out.response_token_ids, token_logps=logp, eos_token_id=self.eos_token_ids,
                eos_policy=self.cfg.eos_policy, tokenizer=self.tokenizer, finish_reason=out.finish_reason,
                metadata={"prompt_text": render_prompt_text(record.prompt, self.tokenizer, self.view_cfg),
                          "sample_index": out.sample_index},
            ))
        return trajs

    # ------------------------------------------------------------------------------------------------ training
    def learner_batch(self, trajectories: Sequence[Trajectory]) -> LearnerBatch:
        """This agent's view of a step's trajectories (own rows only for gspo / grpo)."""
        k = self.agent_index
        rows = trajectories if self.cfg.trains_on_foreign else [t for t in trajectories if t.source == k]
        if not any(t.source == k for t in rows):
            raise ValueError(f"agent {self.agent.name!r}: the step holds none of its own trajectories")
        eos = self.tokenizer.eos_token_id
        return build_learner_batch(rows, k, self.tokenizer, self.view_cfg, eos_token_id=eos)

    def inject_nonfinite_loss(self, step: int, update_index: int) -> None:
        """Test hook: make the loss of update ``update_index`` of step ``step`` NaN (that update must be skipped)."""
        self._nonfinite_injections.add((int(step), int(update_index)))

    def train_step(self, trajectories: Sequence[Trajectory], step: int, ratio_matrix: Sequence[Sequence[float]],
                   ) -> dict[str, Any]:
        """Update the policy on one step's trajectories.

        Args:
            trajectories: every verified trajectory of the step (all agents).
            step: the training step (1-based).
            ratio_matrix: R[a][b] = clip(P̂_a / P̂_b) from the capability tracker (pre-update, shared by learners);
                learner k uses ω^(k,j) = R[k][j] in its baseline (eq. 7) and ω^(j,k) = R[j][k] on foreign rows (eq. 10).

        Returns:
            ``{"metrics": weighted-mean state, "skipped_updates": int, "updates": int, "timings": {...}}``.
        """
        t_start = time.perf_counter()
        batch = self.learner_batch(trajectories)
        advantages = self._attach_advantages(batch, torch.tensor(ratio_matrix, dtype=torch.float64))
        stats = _Weighted()
        _record_view_stats(batch, advantages, stats, [a.name for a in self.cfg.resolved_agents()])
        plan = self._plan_updates(batch, step)

        t_ref = time.perf_counter()
        ref_logp = self._reference_logprobs(plan) if self.cfg.algo.loss.kl_coef > 0 else {}
        logprob_s = time.perf_counter() - t_ref

        skipped_before = self.skipped_updates
        grad_norms, lrs, foreign_ratios = [], [], []
        for m, minibatch in enumerate(plan):
            grad_norm, lr = self._update(minibatch, m, step, ref_logp, stats, foreign_ratios)
            if grad_norm is not None:
                grad_norms.append(grad_norm)
            lrs.append(lr)
        for g in grad_norms:
            stats.add("grad_norm", g, 1.0)
        foreign_s = torch.cat(foreign_ratios) if foreign_ratios else torch.empty(0)
        if foreign_s.numel():
            # median of s over the foreign rows this rank trained on (ranks' medians are averaged when merged)
            stats.add("policy/foreign_ratio_median", float(foreign_s.median()), float(foreign_s.numel()))
        stats.add("lr", lrs[-1] if lrs else 0.0, 1.0)
        total_s = time.perf_counter() - t_start
        return {
            "metrics": stats.state(),
            "skipped_updates": self.skipped_updates - skipped_before,
            "skipped_updates_total": self.skipped_updates,
            "updates": len(plan),
            "timings": {"logprob_s": logprob_s, "update_s": total_s - logprob_s},
        }

    def _attach_advantages(self, batch: LearnerBatch, ratio: torch.Tensor) -> torch.Tensor:
        """Columns ``advantages`` (eqs. 6–8 with ω^(k,j) = R[k, j]), ``coef`` (ω^(j,k) = R[j, k], eq. 10; 1 on own
        rows) and ``row_index``; returns the advantages."""
        k = self.agent_index
        sources = torch.tensor([r.source for r in batch.rows], dtype=torch.long)
        rewards = torch.tensor([r.reward for r in batch.rows], dtype=torch.float64)
        prompt_index = torch.tensor(batch.prompt_index(), dtype=torch.long)
        adv = compute_advantages(rewards, prompt_index, sources, k, ratio[k].clone(), self.cfg.algo.advantage)
        batch.set_column("advantages", adv.advantages)
        batch.set_column("coef", ratio[:, k][sources])
        batch.set_column("row_index", range(len(batch)))
        return adv.advantages.float()

    def _plan_updates(self, batch: LearnerBatch, step: int) -> list[LearnerBatch]:
        """The step's global mini-batches in update order m = 0, 1, ... (``max_epochs`` passes)."""
        cfg = self.cfg
        num_minibatches = len(batch) // cfg.train_batch_size
        plan = []
        for epoch in range(cfg.max_epochs):
            seed = derive_seed(cfg.seed, "minibatch", step, self.agent.name, epoch)
            plan.extend(batch.split_minibatches(num_minibatches, order=cfg.minibatch_order, seed=seed,
                                                dp_chunks=self.world_size))
        return plan

    def _my_share(self, minibatch: LearnerBatch) -> LearnerBatch:
        """This rank's contiguous share of a global mini-batch (v1's data-parallel dispatch)."""
        return minibatch.select(split_evenly(len(minibatch), self.world_size)[self.rank])

    def _reference_logprobs(self, plan: list[LearnerBatch]) -> dict[int, list[float]]:
        """Reference log-probs of this rank's own rows (the KL term covers own rows only), by row index."""
        if self.reference is None:
            raise RuntimeError(f"agent {self.agent.name!r}: kl_coef > 0 but no reference worker is attached")
        wanted: dict[int, Any] = {}
        for minibatch in plan:
            share = self._my_share(minibatch)
            for row, index in zip(share.rows, share.columns["row_index"]):
                if row.is_own:
                    wanted[int(index)] = row
        indices = sorted(wanted)
        args = ([wanted[i].prompt_ids for i in indices], [wanted[i].response_ids for i in indices],
                self.cfg.temperature)
        if hasattr(self.reference.compute_logprobs, "remote"):
            import ray

            values = ray.get(self.reference.compute_logprobs.remote(*args))
        else:
            values = self.reference.compute_logprobs(*args)
        return dict(zip(indices, values))

    def _update(self, minibatch: LearnerBatch, m: int, step: int, ref_logp: dict[int, list[float]],
                stats: _Weighted, foreign_ratios: list[torch.Tensor]) -> tuple[float | None, float]:
        """One optimizer update on one global mini-batch (this rank's share, in micro-batches); the sequence ratios
        of its foreign rows are appended to ``foreign_ratios``.

        Returns (gradient norm or None when skipped, learning rate of the update).
        """
        engine = self.engine
        own_rows = [r for r in minibatch.rows if r.is_own]
        totals = dict(num_seqs=len(minibatch), num_tokens=minibatch.num_response_tokens,
                      num_own_seqs=len(own_rows), num_own_tokens=sum(len(r.response_ids) for r in own_rows))
        micros = self._my_share(minibatch).micro_batches(self.cfg.micro_train_batch_size)
        lr = float(self.client_optimizer.param_groups[0]["lr"])  # the rate this update uses
        nonfinite = False
        loss_total = 0.0
        for micro in micros:
            loss, out = self._micro_loss(micro, m, step, totals, ref_logp)
            if out is None:
                nonfinite = True
            else:
                loss_total += float(loss.detach())
                self._record_loss_metrics(out.metrics, stats)
                if out.ratios is not None:
                    foreign = ~torch.as_tensor([r.is_own for r in micro.rows], dtype=torch.bool)
                    foreign_ratios.append(out.ratios.detach().float().cpu()[foreign])
            # DeepSpeed averages gradients over data-parallel ranks; the loss denominators are global totals
            engine.backward(loss * self.world_size, scale_wrt_gas=False)
            if micro is micros[-1]:
                if not engine.is_gradient_accumulation_boundary():
                    raise RuntimeError(f"agent {self.agent.name!r}: micro-batches of update {m} are out of step "
                                       "with DeepSpeed's gradient accumulation")
                nonfinite = self._any_rank(nonfinite)
                self.client_optimizer.skip_next_step = nonfinite
                if self.agent.zero_stage == 0 and not nonfinite:
                    self._last_grad_norm = _grad_norm(engine.module)
            engine.step()
        self.client_optimizer.skip_next_step = False
        if nonfinite:
            self.skipped_updates += 1
            logger.warning("agent %r step %d update %d: non-finite loss, update skipped (%d skipped so far)",
                           self.agent.name, step, m, self.skipped_updates)
            return None, lr
        self.updates_done += 1
        # each rank holds a share of the mini-batch loss; the merged mean over ranks times world_size is their sum
        stats.add("loss", loss_total * self.world_size, 1.0)
        grad_norm = engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = self._last_grad_norm
        return (float(grad_norm) if grad_norm is not None else None), lr

    def _micro_loss(self, micro: LearnerBatch, m: int, step: int, totals: dict[str, int],
                    ref_logp: dict[int, list[float]]):
        """Policy loss of one micro-batch: ``(loss, PolicyLossOutput)``, or ``(zero-gradient surrogate, None)`` when
        the log-probs or the loss are not finite."""
        cfg = self.cfg
        loss_cfg = cfg.algo.loss
        padded = micro.to_padded(self.pad_token_id, device=self.device)
        scored = response_logprobs(self.engine, padded, cfg.temperature, with_entropy=True, path=cfg.logprob_path,
                                   backend=cfg.kernel_backend)
        logp = scored.logp
        mask = padded["response_mask"]
        if bool(torch.isfinite(logp.detach()[mask > 0]).all()):
            ref = None
            if loss_cfg.kl_coef > 0:
                ref = torch.zeros_like(padded["old_logp"])
                for i, (row, index) in enumerate(zip(micro.rows, micro.columns["row_index"])):
                    if row.is_own:
                        values = ref_logp[int(index)]
                        ref[i, : len(values)] = torch.tensor(values, dtype=ref.dtype)
            token_level = cfg.algo.algorithm == "grpo" or loss_cfg.ratio_level == "token"
            out = self.loss_fn(PolicyLossInput(
                logp=logp, mask=mask, advantages=padded["advantages"], old_logp_mean=padded["old_logp_mean"],
                is_own=padded["is_own"], coef=padded["coef"], update_index=m,
                old_logp=padded["old_logp"] if token_level else None, ref_logp=ref, **totals,
            ), loss_cfg, backend=cfg.kernel_backend)
            # mean entropy of the next-token distribution over this micro-batch's response tokens
            out.metrics["entropy"] = float((scored.entropy * mask).sum() / mask.sum().clamp(min=1))
            loss = out.loss * float("nan") if (step, m) in self._nonfinite_injections else out.loss
            if bool(torch.isfinite(loss.detach())):
                return loss, out
        # a zero loss built from the forward outputs: every rank runs backward through the same graph (ZeRO-3's
        # gather/reduce hooks stay in step) and no gradient reaches the parameters
        return (torch.nan_to_num(logp, nan=0.0, posinf=0.0, neginf=0.0) * 0.0).sum(), None

    def _any_rank(self, flag: bool) -> bool:
        """True on every rank of this agent when ``flag`` is True on any (all ranks skip an update together)."""
        if self.world_size == 1:
            return flag
        value = torch.tensor([float(flag)], device=self.device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item() > 0)

    _last_grad_norm: float | None = None

    @staticmethod
    def _record_loss_metrics(metrics: dict[str, float], stats: _Weighted) -> None:
        n_own, n_foreign = metrics.get("num_own", 0.0), metrics.get("num_foreign", 0.0)
        for key, value in metrics.items():
            if key in ("num_own", "num_foreign", "num_foreign_pos", "loss"):
                continue
            if key.startswith("own_"):
                weight = n_own
            elif key.startswith("foreign_pos_"):
                weight = metrics.get("num_foreign_pos", 0.0)
            elif key.startswith("foreign_"):
                weight = n_foreign
            else:
                weight = n_own + n_foreign
            stats.add(f"policy/{key}", value, weight)

    # ------------------------------------------------------------------------------------------------ weights
    weight_bucket_bytes: int = 512 * 2**20
    """Full-tensor bytes gathered at once under ZeRO-3 when weights are exported (sync, ``save_hf``)."""

    def _weight_buckets(self):
        """The model's state-dict tensors in buckets, gathered one bucket at a time under ZeRO-3 (all ranks iterate;
        see :mod:`openrlhf_hacpo.actors.weight_export`)."""
        from openrlhf_hacpo.actors.weight_export import gathered_buckets

        return gathered_buckets(self.model, zero3=self.agent.zero_stage == 3, bucket_bytes=self.weight_bucket_bytes)

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """The full state dict by HF name, on CPU (gathered bucket by bucket under ZeRO-3): what the engines receive.

        Tied weights appear under every name (e.g. ``lm_head.weight`` next to ``model.embed_tokens.weight``), as one
        CPU tensor: vLLM keeps its own copy of a tied output projection.
        """
        state: dict[str, torch.Tensor] = {}
        for bucket in self._weight_buckets():
            for entry in bucket:
                copy = entry.tensor.detach().to("cpu", copy=True)
                state.update((name, copy) for name in entry.names)
        return state

    def init_engine_weight_sync(self, engines: Sequence[Any]) -> None:
        """Build the broadcast group between this rank (rank 0 of the agent) and every worker of ``engines``."""
        from openrlhf_hacpo.engines.weight_sync import init_engine_weight_sync

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        self._engine_group = init_engine_weight_sync(
            engines, self.agent.vllm_tensor_parallel_size, backend,
            group_name=f"hacpo_sync_{self.agent.name}")

    def sync_weights_to_engines(self, engines: Sequence[Any], mode: str = "object_store") -> int:
        """Send the current weights to the agent's vLLM engines (all ranks call it; only rank 0 sends).

        ``mode="object_store"`` puts one CPU copy into Ray's object store for every engine to load;
        ``"broadcast"`` streams each tensor over the group made by :meth:`init_engine_weight_sync`, announcing the
        names, dtypes and full shapes first, so under ZeRO-3 each bucket is gathered, sent and released in turn;
        ``"cuda_ipc"`` (engines colocated on this agent's GPUs) hands the engines CUDA IPC handles of each bucket
        from every rank's GPU, so each engine worker maps the copy on its own GPU (no host copy).
        Tied weights are sent under every name (vLLM keeps its own copy of a tied output projection). Returns the
        number of named tensors sent (0 on the other ranks).
        """
        from openrlhf_hacpo.engines.weight_sync import (
            broadcast_weights_to_engines,
            dtype_name,
            push_weights_to_engines,
        )

        if mode not in ("object_store", "broadcast", "cuda_ipc"):
            raise ValueError(f"weight sync mode must be 'object_store', 'broadcast' or 'cuda_ipc', got {mode!r}")
        if mode == "cuda_ipc":
            return self._sync_weights_cuda_ipc(engines)
        if mode == "object_store":
            named: list[tuple[str, torch.Tensor]] = []
            for bucket in self._weight_buckets():
                if self.rank == 0:
                    for entry in bucket:
                        copy = entry.tensor.detach().to("cpu", copy=True)
                        named.extend((name, copy) for name in entry.names)
            if self.rank == 0:
                push_weights_to_engines(engines, named)
            return len(named)
        stream = ((name, entry.tensor.detach()) for bucket in self._weight_buckets() for entry in bucket
                  for name in entry.names)
        if self.rank != 0:
            for _ in stream:  # take part in the ZeRO-3 gathers
                pass
            return 0
        from openrlhf_hacpo.actors.weight_export import weight_entries

        specs = [(name, dtype_name(entry.tensor.dtype), list(entry.full_shape))
                 for entry in weight_entries(self.model) for name in entry.names]
        broadcast_weights_to_engines(engines, stream, self._engine_group, specs=specs)
        return len(specs)

    def _sync_weights_cuda_ipc(self, engines: Sequence[Any]) -> int:
        """Per bucket: every rank makes IPC handles of its (gathered) tensors, rank 0 collects them by GPU and has
        every engine load them, then all ranks move on together (the bucket's memory must outlive the loads)."""
        import ray

        from openrlhf_hacpo.engines.weight_sync import cuda_ipc_payload, gpu_uuid

        sent = 0
        for bucket in self._weight_buckets():
            named = [(name, entry.tensor) for entry in bucket for name in entry.names]
            payload, keep = cuda_ipc_payload(named)
            by_gpu = {gpu_uuid(self.device): payload}
            if self.world_size > 1:
                gathered: list[Any] = [None] * self.world_size
                torch.distributed.all_gather_object(gathered, by_gpu)
                by_gpu = {uuid: data for part in gathered for uuid, data in part.items()}
            if self.rank == 0:
                ray.get([engine.update_weights_ipc.remote(by_gpu) for engine in engines])
                sent += len(named)
            if self.world_size > 1:
                torch.distributed.barrier()
            del keep
        return sent

    def save_hf(self, path: str, dtype: str = "auto") -> str | None:
        """Write a ``from_pretrained``-loadable checkpoint (model, tokenizer, generation config) atomically.

        ``dtype="auto"`` stores the floating tensors in the dtype of the agent's pretrained checkpoint (its config's
        ``dtype``; the training dtype when the config names none), so a bf16 model trained in fp32 comes back in
        bf16; ``"float32"``, ``"bfloat16"`` or ``"float16"`` choose one. Tied weights are stored once, as
        ``save_pretrained`` does for the model itself. Every rank must call it (ZeRO-3 gathers bucket by bucket);
        rank 0 writes. Returns the path on rank 0.
        """
        import json

        from openrlhf_hacpo.utils.atomic import atomic_dir

        target = self._hf_save_dtype(dtype)
        state: dict[str, torch.Tensor] = {}
        for bucket in self._weight_buckets():
            if self.rank != 0:
                continue
            for entry in bucket:
                tensor = entry.tensor.detach()
                cast = target if tensor.is_floating_point() else tensor.dtype
                copy = tensor.to("cpu", dtype=cast, copy=True)
                state.update((name, copy) for name in entry.names)  # one tensor: the tie survives the save
        if self.rank != 0:
            return None
        with atomic_dir(path) as tmp:
            self.model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(tmp)
            # save_pretrained names the training dtype; config.json must name the stored one
            config_file = Path(tmp) / "config.json"
            config = json.loads(config_file.read_text(encoding="utf-8"))
            config["dtype"] = str(target).removeprefix("torch.")
            config.pop("torch_dtype", None)
            config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return str(path)

    def _hf_save_dtype(self, dtype: str) -> torch.dtype:
        choices = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        if dtype in choices:
            return choices[dtype]
        if dtype != "auto":
            raise ValueError(f"agent {self.agent.name!r}: save_hf dtype must be 'auto' or one of {sorted(choices)}, "
                             f"got {dtype!r}")
        from transformers import AutoConfig

        from openrlhf_hacpo.actors.weight_export import checkpoint_dtype

        original = checkpoint_dtype(AutoConfig.from_pretrained(self.agent.pretrain))
        return original or next(p.dtype for p in self.model.parameters() if p.is_floating_point())

    # ------------------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """Save weights, optimizer, scheduler, counters and RNG states under ``path`` (all ranks call it)."""
        client_state = {"updates_done": self.updates_done, "skipped_updates": self.skipped_updates}
        with checkpoint_io(f"agent {self.agent.name!r}", path, "save"):
            self.engine.save_checkpoint(path, tag=CHECKPOINT_TAG, client_state=client_state, save_latest=False)
            torch.save(capture_rng_state(), os.path.join(path, f"rng_rank{self.rank}.pt"))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote."""
        if not os.path.isdir(os.path.join(path, CHECKPOINT_TAG)):
            raise FileNotFoundError(f"agent {self.agent.name!r}: no checkpoint under {path}")
        with checkpoint_io(f"agent {self.agent.name!r}", path, "load"):
            load_path, client_state = self.engine.load_checkpoint(
                path, tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=True)
        if load_path is None:
            raise RuntimeError(f"agent {self.agent.name!r}: DeepSpeed could not load the checkpoint under {path}")
        self.updates_done = int(client_state.get("updates_done", 0))
        self.skipped_updates = int(client_state.get("skipped_updates", 0))
        rng_file = os.path.join(path, f"rng_rank{self.rank}.pt")
        if os.path.isfile(rng_file):
            restore_rng_state(load_torch_file(rng_file, f"agent {self.agent.name!r}"))
        return {"updates_done": self.updates_done, "skipped_updates": self.skipped_updates}


def _grad_norm(model: torch.nn.Module) -> float:
    """L2 norm of the accumulated gradients (before clipping), for engines that do not report one."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def _remote_class():
    import ray

    return ray.remote(PolicyWorker)


PolicyActor = _remote_class()
