"""One agent's policy worker: one data-parallel rank, an HF causal LM inside a DeepSpeed engine.

:class:`PolicyWorker` is a facade over plain parts, each with one job:

* :mod:`~openrlhf_hacpo.actors.deepspeed_setup`: the agent's process group and the DeepSpeed engine;
* :class:`~openrlhf_hacpo.actors.scoring.RolloutScorer`: prompt rendering and the old-log-prob recompute that turns
  sampled responses into trajectories (the ``hf`` backend samples here with transformers ``generate``);
* :class:`~openrlhf_hacpo.actors.update_loop.UpdateLoop`: the training step (view, advantages, mini-batch updates);
* :class:`~openrlhf_hacpo.actors.policy_io.PolicyIO`: weight sync to the engines, HF export, training-state I/O.

Each agent's ranks form their own ``torch.distributed`` group, so agents never synchronise with each other.
:func:`policy_actor_class` is ``ray.remote(PolicyWorker)``; without Ray the same class runs in the driver process.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import torch

from openrlhf_hacpo.actors import first_update
from openrlhf_hacpo.actors.agent_plan import AgentPlan
from openrlhf_hacpo.actors.deepspeed_setup import build_policy_engine, init_agent_process_group, listening_store
from openrlhf_hacpo.actors.lora import AdapterDisabledReference
from openrlhf_hacpo.actors.policy_io import PolicyIO
from openrlhf_hacpo.actors.results import RankTrainResult, RolloutResult, WorkerInfo, WorkerResources
from openrlhf_hacpo.actors.scoring import RenderedPrompts, RolloutScorer, mismatch_rows, view_config
from openrlhf_hacpo.actors.sharding import outputs_for_shard
from openrlhf_hacpo.actors.update_loop import UpdateLoop
from openrlhf_hacpo.algorithms import CapabilityRatios
from openrlhf_hacpo.config import TrainConfig
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.models.tokenizer import load_tokenizer
from openrlhf_hacpo.rollout import Trajectory
from openrlhf_hacpo.utils.network import rendezvous_host
from openrlhf_hacpo.utils.process_memory import process_memory
from openrlhf_hacpo.utils.timing import PhaseTimer, with_rest

__all__ = ["PolicyWorker", "policy_actor_class"]


class PolicyWorker:
    """One data-parallel rank of one agent's policy.

    Args:
        cfg: the run configuration.
        plan: this agent's plan (:class:`~openrlhf_hacpo.actors.agent_plan.AgentPlan`, from the driver): its LoRA
            adapter and where its reference log-probs come from.
        rank / world_size: data-parallel rank of this worker within the agent and the agent's worker count.
        master_addr / master_port: rendezvous of the agent's process group (rank 0's address; see
            :meth:`get_master_addr_port`, which starts rank 0's store). ``None`` on rank 0 of a single-worker agent:
            its store listens on a port the system picks.
        total_updates: optimizer updates of the whole run (for the learning-rate schedule).
    """

    def __init__(self, cfg: TrainConfig, plan: AgentPlan, rank: int = 0, world_size: int = 1,
                 master_addr: str | None = None, master_port: int | None = None, total_updates: int = 1) -> None:
        self.cfg = cfg
        self.plan = plan
        self.agent_index = plan.index
        self.agent = cfg.resolved_agents[plan.index]  # model, tokenizer and optimizer settings
        self.rank, self.world_size = rank, world_size
        self.master_addr, self.master_port = master_addr, master_port
        self.store: torch.distributed.TCPStore | None = None  # rank 0's, from get_master_addr_port (dp > 1)
        self.total_updates = total_updates

    def get_master_addr_port(self, started_local_ray: bool) -> tuple[str, int]:
        """Rendezvous of the agent's process group (called on rank 0): ``--bind_host`` (loopback by default) when the
        driver started its own local Ray, else this node's address, however the run joined its cluster
        (:func:`~openrlhf_hacpo.utils.network.rendezvous_host`), and the port of the group's store, listening from
        here on (:func:`~openrlhf_hacpo.actors.deepspeed_setup.listening_store`)."""
        import ray

        address = rendezvous_host(started_local_ray, self.cfg.cluster.bind_host, ray.util.get_node_ip_address())
        self.store = listening_store(address, self.world_size)  # held until setup() builds the group on it
        return address, self.store.port

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> WorkerInfo:
        """Join the agent's process group, load tokenizer and model, build the DeepSpeed engine and the parts.

        ``master_addr`` / ``master_port`` override the rendezvous given at construction (rank 0 learns its own
        address only once it runs).
        """
        from openrlhf_hacpo.engines.hf_generate import GENERATE_BATCH_ROWS, HFGenerateEngine, resolve_eos_token_ids
        from openrlhf_hacpo.engines.placement import actor_device

        if master_addr is not None:
            self.master_addr, self.master_port = master_addr, master_port
        agent = self.agent
        self.device = actor_device(self.cfg.cluster.device)
        init_agent_process_group(self.cfg, agent, self.rank, self.world_size, self.master_addr, self.master_port,
                                 self.device, store=self.store)
        self.tokenizer = load_tokenizer(agent.tokenizer_path, agent.chat_template, owner=f"agent {agent.name!r}")
        built = build_policy_engine(self.cfg, agent, self.plan.lora, self.total_updates)
        self.engine, self.model, self.client_optimizer = built.engine, built.model, built.client_optimizer
        self._hf_ds_config = built.hf_ds_config  # ZeRO-3: keeps transformers' loading config alive
        self.states = built.states  # deepspeed_enable_sleep: see sleep() / wake()
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        eos_token_ids = resolve_eos_token_ids(self.model, self.tokenizer)
        # a fixed generation batch: the sampled tokens of a seeded step must not depend on training batch sizes
        self.hf_engine = HFGenerateEngine(self.model, self.tokenizer, max_batch_size=GENERATE_BATCH_ROWS)
        # under ZeRO-3 the embedding is partitioned (its local shape is empty): take the size from the config
        self.hf_engine.vocab_size = int(self.model.config.vocab_size)
        self.scorer = RolloutScorer(self.cfg, self.agent_index, self.tokenizer, eos_token_ids)
        self._first_phase_s = 0.0  # seconds of train_own_rows_first, added to train_finish's train_rest
        self._first_phase: first_update.FirstPhase | None = None  # a step between train_own_rows_first and finish
        self.updater = UpdateLoop(self.cfg, agent, self.agent_index, self.rank, self.world_size, self.engine,
                                  self.client_optimizer, self.tokenizer, view_config(self.cfg), self.device)
        if self.cfg.compute.old_logp_from_update:
            first_update.check_dropout_free(self.model, agent.name)
        self.io = PolicyIO(agent, self.engine, self.tokenizer, self.rank, self.world_size, self.device)
        if self.plan.adapter_reference:  # the plan launched no reference worker: the adapter-off model is it
            self.updater.reference = AdapterDisabledReference(
                self.model, self.pad_token_id, self.cfg.train.micro_train_batch_size, self.device,
                logprob_path=self.cfg.compute.logprob_path, kernel_backend=self.cfg.compute.kernel_backend)
        return WorkerInfo(agent=agent.name, rank=self.rank,
                          num_parameters=sum(p.numel() for p in self.model.parameters()),
                          vocab_size=len(self.tokenizer), eos_token_ids=tuple(eos_token_ids), device=str(self.device))

    def resources(self) -> WorkerResources:
        """This rank's parameter counts (all and trainable, full sizes under ZeRO-3) and its process's peak and
        present resident memory (:func:`~openrlhf_hacpo.utils.process_memory.process_memory`)."""
        params = list(self.model.parameters())
        numel = lambda p: int(getattr(p, "ds_numel", p.numel()))  # noqa: E731 - ZeRO-3 holds a local partition
        memory = process_memory()
        return WorkerResources(agent=self.agent.name, rank=self.rank, parameters=sum(map(numel, params)),
                               trainable_parameters=sum(numel(p) for p in params if p.requires_grad),
                               peak_rss_bytes=memory.peak_rss_bytes, rss_bytes=memory.rss_bytes,
                               memory_source=memory.source)

    def set_reference(self, reference: Any) -> None:
        """Handle of this agent's reference worker (a Ray actor handle or a plain :class:`ReferenceWorker`); an agent
        whose plan has none (:attr:`~openrlhf_hacpo.actors.agent_plan.AgentPlan.has_reference`) gets no call, a LoRA
        agent's reference being :class:`~openrlhf_hacpo.actors.lora.AdapterDisabledReference`."""
        self.updater.reference = reference

    # ------------------------------------------------------------------------------------------------ rollout
    def render_prompts(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt ids for generation: the agent's own rendering, left-truncated to ``prompt_max_len``."""
        return self.scorer.prompt_ids(prompts)

    def render_prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        """The prompts as this agent's model reads them (chat template applied), e.g. for reward files."""
        return self.scorer.prompt_texts(prompts)

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[GenerationOutput]:
        """Sample ``sampling.n`` responses per prompt with transformers ``generate`` (``hf`` backend)."""
        return self.hf_engine.generate(self.scorer.prompt_ids(prompts), sampling)

    def rollout(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int) -> RolloutResult:
        """Generate (``hf`` backend) and score own responses; times the ``generate`` and ``scoring`` phases and the
        rest of the call (``rollout_rest``)."""
        started = time.perf_counter()
        timer = PhaseTimer()
        with timer.phase("generate"):
            rendered = self.scorer.render(prompts)
            outputs = self.hf_engine.generate(rendered.ids, sampling)
        return with_rest(self._scored(prompts, rendered, outputs, step, timer), "rollout_rest", started)

    def render(self, prompts: Sequence[Any]) -> RenderedPrompts:
        """The prompts' ids (what the engines generate from) and texts, rendered once for the whole agent."""
        return self.scorer.render(prompts)

    def score_engine_outputs(self, prompts: Sequence[Any], rendered: RenderedPrompts, shard: Sequence[int],
                             engine_shards: Sequence[Sequence[int]], step: int,
                             *engine_outputs: Sequence[GenerationOutput]) -> RolloutResult:
        """Score the responses the agent's vLLM engines sampled for this rank's prompts.

        ``shard`` holds the global indices of this rank's ``prompts`` (and of their ``rendered`` form); engine e
        sampled the prompts ``engine_shards[e]`` and returned ``engine_outputs[e]`` (Ray hands the engines' results
        straight to this call). Only the ``scoring`` phase and the rest of the call (``rollout_rest``) are timed
        here: the agent group times the engines' ``generate``.
        """
        started = time.perf_counter()
        self.wake()
        outputs = outputs_for_shard(shard, engine_shards, engine_outputs)
        return with_rest(self._scored(prompts, rendered, outputs, step, PhaseTimer()), "rollout_rest", started)

    def sleep(self) -> None:
        """``deepspeed_enable_sleep``: move the engine's weights, gradients and optimizer states off the device while
        colocated vLLM engines generate (DeepSpeed ``offload_states``); a no-op when the option is off or asleep."""
        self.states.sleep()

    def wake(self) -> None:
        """Bring back what :meth:`sleep` moved (DeepSpeed ``reload_states``); a no-op when nothing is asleep."""
        self.states.wake()

    def _scored(self, prompts: Sequence[Any], rendered: RenderedPrompts, outputs: Sequence[GenerationOutput],
                step: int, timer: PhaseTimer) -> RolloutResult:
        """Score ``outputs`` into trajectories (the ``scoring`` phase of ``timer``) and report the rollout."""
        trajs = self.scorer.trajectories(self.engine, prompts, rendered, outputs, step, self.device, timer)
        positions, tokens = self.scorer.scoring_positions(rendered, outputs)
        return RolloutResult(trajectories=tuple(trajs), timings=timer.seconds,
                             generated_tokens=sum(o.num_tokens for o in outputs),
                             scoring_positions=positions, scoring_tokens=tokens,
                             mismatch_rows=mismatch_rows(outputs, trajs))

    # ------------------------------------------------------------------------------------------------ training
    def train_step(self, trajectories: Sequence[Trajectory], step: int,
                   ratios: CapabilityRatios) -> RankTrainResult:
        """Update the policy on one step's trajectories (see :meth:`UpdateLoop.train_step`); the call's seconds
        outside the learner's named phases are its ``train_rest``."""
        started = time.perf_counter()
        self.wake()
        return with_rest(self.updater.train_step(trajectories, step, ratios), "train_rest", started)

    def train_own_rows_first(self, trajectories: Sequence[Trajectory], step: int,
                             ratios: CapabilityRatios) -> dict[int, tuple[float, int]]:
        """Phase 1 of a step with ``old_logp_from_update``: the sums and counts of this rank's own rows' old
        log-probs, by trajectory position (see :func:`~openrlhf_hacpo.actors.first_update.own_rows_first`)."""
        started = time.perf_counter()
        self.wake()
        self._first_phase = first_update.own_rows_first(self.updater, trajectories, step, ratios)
        sums = first_update.old_logp_sums(self._first_phase.old_logps)
        self._first_phase_s = time.perf_counter() - started
        return sums

    def train_finish(self, old_means: Sequence[float]) -> RankTrainResult:
        """Phase 2: every trajectory's old log-prob mean in, the step's updates out
        (:func:`~openrlhf_hacpo.actors.first_update.finish_step`); its ``train_rest`` covers both calls."""
        started = time.perf_counter() - self._first_phase_s
        self._first_phase_s = 0.0
        phase, self._first_phase = self._first_phase, None
        return with_rest(first_update.finish_step(self.updater, phase, old_means), "train_rest", started)

    # ------------------------------------------------------------------------------------------------ weights, state
    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """The full state dict by HF name, on CPU (see :meth:`PolicyIO.state_dict_for_sync`)."""
        return self.io.state_dict_for_sync()

    def init_engine_weight_sync(self, engines: Sequence[Any]) -> None:
        self.io.init_engine_weight_sync(engines)

    def sync_weights_to_engines(self, engines: Sequence[Any], mode: str = "object_store") -> int:
        """Send the current weights to the agent's vLLM engines (see :meth:`PolicyIO.sync_weights_to_engines`)."""
        return self.io.sync_weights_to_engines(engines, mode)

    def save_hf(self, path: str, dtype: str = "auto") -> str | None:
        """Write a ``from_pretrained``-loadable checkpoint (see :meth:`PolicyIO.save_hf`)."""
        return self.io.save_hf(path, dtype)

    def save_checkpoint(self, path: str) -> dict[str, Any]:
        """Save weights, optimizer, scheduler, update counters and RNG states under ``path`` (all ranks call it);
        returns the files this rank wrote (see :meth:`PolicyIO.save_checkpoint`)."""
        return self.io.save_checkpoint(path, {"updates_done": self.updater.updates_done,
                                              "skipped_updates": self.updater.skipped_updates})

    def load_checkpoint(self, path: str) -> dict[str, int]:
        """Restore what :meth:`save_checkpoint` wrote; returns the update counters."""
        saved = self.io.load_checkpoint(path)
        self.updater.updates_done = int(saved.get("updates_done", 0))
        self.updater.skipped_updates = int(saved.get("skipped_updates", 0))
        return {"updates_done": self.updater.updates_done, "skipped_updates": self.updater.skipped_updates}


@functools.cache
def policy_actor_class():
    """``ray.remote(PolicyWorker)``, made on first use (importing this module does not import Ray)."""
    import ray

    return ray.remote(PolicyWorker)
