"""One agent's rollouts and generations: :class:`AgentRollout` fans a prompt batch out to the agent's policy ranks
(``hf``: they generate and score) or to its engines (``vllm``, ``hf_engine``: the engines generate, the policy ranks
score their share straight from the engines' results), and keeps its sleeping engines' state (vLLM sleep mode).

The engines' own log-probs of the sampled tokens are handled in one place, :meth:`AgentRollout.engine_rollout`
with :func:`attach_behaviour_logps`: asked for with ``--own_old_logp behaviour`` or ``--rollout_is``
(``TrainConfig.keeps_engine_logps``) and attached to the trajectories as ``Trajectory.behaviour_logp``.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Sequence

from openrlhf_hacpo.actors.pending import Pending
from openrlhf_hacpo.actors.policy import PolicyWorker
from openrlhf_hacpo.actors.results import RolloutResult
from openrlhf_hacpo.actors.scoring import mismatch_sampling
from openrlhf_hacpo.actors.sharding import reindex, shard_sampling, split_shards
from openrlhf_hacpo.engines.base import GenerationOutput, SamplingConfig
from openrlhf_hacpo.utils.timing import PhaseTimer

__all__ = ["AgentRollout", "attach_behaviour_logps", "engine_class", "stamped"]


class AgentRollout:
    """Rollouts and generations of one agent (``group``: its :class:`~openrlhf_hacpo.actors.agent_group.
    AgentGroup`); with vLLM sleep mode (:attr:`AgentPlan.engine_settings`) the engines sleep except while they
    generate or receive weights."""

    def __init__(self, group: Any) -> None:
        self.group = group
        settings = group.plan.engine_settings
        self.engines_sleep = bool(settings is not None and settings.enable_sleep_mode)
        self.engines_awake = False

    def rollout(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int, rendered: Any = None) -> Pending:
        """See :meth:`AgentGroup.rollout <openrlhf_hacpo.actors.agent_group.AgentGroup.rollout>`."""
        group = self.group
        sampling = mismatch_sampling(group.cfg, sampling)  # the engines' log-probs for the mismatch/* metrics
        if group.plan.has_engines:
            return self.engine_rollout(prompts, sampling, step, rendered)
        version = group.policy_version
        shards = split_shards(prompts, len(group.policies))
        args = [(shard, shard_sampling(sampling, rank), step) for rank, shard in enumerate(shards)]
        return group.call(group.policies, PolicyWorker.rollout, args, "policy",
                          lambda parts: stamped(RolloutResult.combine(parts), version))

    def render_for_rollout(self, prompts: Sequence[Any]) -> Pending:
        """Rank 0 renders ``prompts`` for the engines (the argument ``rendered`` of :meth:`rollout`)."""
        group = self.group
        return group.call(group.policies[:1], PolicyWorker.render, [(list(prompts),)], "policy", lambda v: v[0])

    def engine_rollout(self, prompts: Sequence[Any], sampling: SamplingConfig, step: int,
                       rendered: Any = None) -> Pending:
        """Rank 0 renders the prompts once (unless given); the engines sample and every policy rank scores its
        prompts' responses.

        Both phases start now: each scoring call takes the engines' results as Ray arguments, so it runs as soon as
        they exist (sleeping engines are put back to sleep first: the scoring call waits for that too) and the
        agents' phases overlap however the driver waits. The ``generate`` phase runs from the rendering to the engines'
        outputs (read when the driver waits for them); ``engine_generate`` is the slowest engine's own time in its
        ``generate`` call (asked once the outputs are in: an actor runs one caller's calls in order, so no later
        generation has run on it yet); the ranks' results bring their ``scoring``.

        With ``--own_old_logp behaviour`` (``auto`` in a one-step-off run at temperature 1) or ``--rollout_is`` (the
        training-inference correction) the engines also return their log-probs of the sampled tokens, which the
        driver attaches to the trajectories
        (``Trajectory.behaviour_logp``, :func:`attach_behaviour_logps`).
        """
        group = self.group
        cfg = group.cfg
        timer = PhaseTimer()
        generated = timer.start("generate")  # ends when the engines' outputs are in
        version = group.engine_version
        behaviour = cfg.keeps_engine_logps
        if behaviour:
            sampling = replace(sampling, return_logprobs=True)
        if rendered is None:
            rendered = self.render_for_rollout(prompts).result()
        indices = list(range(len(prompts)))
        self.wake_engines()
        engine_shards = [s for s in split_shards(indices, len(group.engines)) if s]
        engines = group.engines[:len(engine_shards)]

        def generation_done(outputs: list[list[GenerationOutput]]) -> list[list[GenerationOutput]]:
            generated()
            return outputs

        generation = group.call(engines, engine_class(cfg.rollout.rollout_backend).generate,
                                [([rendered.ids[i] for i in shard], shard_sampling(sampling, e))
                                 for e, shard in enumerate(engine_shards)], group.plan.engine_role, generation_done)
        outputs = generation.parts
        if self.engines_sleep:  # engines sleep before the (colocated) policies score
            outputs = self._after_sleep(engines, outputs)
        shards = split_shards(indices, len(group.policies))
        args = [([prompts[i] for i in shard], rendered.select(shard), shard, engine_shards, step, *outputs)
                for shard in shards]
        scoring = group.call(group.policies, PolicyWorker.score_engine_outputs, args, "policy",
                             RolloutResult.combine)

        def combine(parts: list[RolloutResult], outputs: list[list[GenerationOutput]]) -> RolloutResult:
            combined = stamped(scoring.combine(parts), version)
            if behaviour:
                attach_behaviour_logps(group.name, combined.trajectories, engine_shards, outputs,
                                       cfg.rollout.n_samples_per_prompt)
            engine_s = group.call(engines, engine_class(cfg.rollout.rollout_backend).last_generate_seconds,
                                  [()] * len(engines), group.plan.engine_role, max).result()
            return replace(combined, timings={**combined.timings, **timer.seconds, "engine_generate": engine_s})

        return Pending(group, scoring.role, scoring.parts, combine, scoring.remote, scoring.method, after=generation,
                       workers=scoring.workers)

    def _after_sleep(self, engines: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
        """Engine e's outputs, available once engine e is asleep again (its ``sleep`` runs after its ``generate``:
        a Ray actor runs one caller's calls in order)."""
        slept = [engine.sleep.remote() for engine in engines]
        self.engines_awake = False
        return [_first_of_task().remote(out, done) for out, done in zip(outputs, slept)]

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> Pending:
        """See :meth:`AgentGroup.generate <openrlhf_hacpo.actors.agent_group.AgentGroup.generate>`."""
        group = self.group
        if group.plan.has_engines:
            prompt_ids = self.render_prompts(prompts)
            self.wake_engines()
            shards = split_shards(list(range(len(prompts))), len(group.engines))
            args = [([prompt_ids[i] for i in shard], shard_sampling(sampling, e)) for e, shard in enumerate(shards)]
            workers, role = group.engines, group.plan.engine_role
            method = engine_class(group.cfg.rollout.rollout_backend).generate
        else:
            shards = split_shards(list(range(len(prompts))), len(group.policies))
            args = [([prompts[i] for i in shard], shard_sampling(sampling, r)) for r, shard in enumerate(shards)]
            workers, role, method = group.policies, "policy", PolicyWorker.generate

        def combine(parts: list[list[GenerationOutput]]) -> list[GenerationOutput]:
            if group.plan.has_engines:
                self.sleep_engines()
                if group.plan.deepspeed_enable_sleep:
                    group.all_policies(PolicyWorker.wake, combine=lambda v: None).result()
            out = []
            for shard, outs in zip(shards, parts):
                out.extend(reindex(o, shard[o.prompt_index]) for o in outs)
            return out

        live = [(w, a, s) for w, a, s in zip(workers, args, shards) if s]
        shards = [s for _, _, s in live]
        return group.call([w for w, _, _ in live], method, [a for _, a, _ in live], role, combine)

    def render_prompts(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Prompt ids as this agent generates from them (its chat template, left-truncated)."""
        group = self.group
        return group.call(group.policies[:1], PolicyWorker.render_prompts, [(list(prompts),)], "policy",
                          lambda v: v[0]).result()

    def render_prompt_texts(self, prompts: Sequence[Any]) -> list[str]:
        """Prompt texts as this agent's model reads them."""
        group = self.group
        return group.call(group.policies[:1], PolicyWorker.render_prompt_texts, [(list(prompts),)], "policy",
                          lambda v: v[0]).result()

    # ------------------------------------------------------------------------------------------------ sleep mode
    def engines_created(self) -> None:
        """Engines with sleep mode start asleep (they hold GPU memory only from a weight sync or a generation)."""
        if self.engines_sleep:
            self._engines_call(engine_class().sleep)

    def _engines_call(self, method: Any) -> None:
        group = self.group
        group.call(group.engines, method, [()] * len(group.engines), group.plan.engine_role, lambda v: v).result()

    def wake_engines(self) -> None:
        """Sleep mode, before a generation: wake whatever the engines still have asleep (everything, or after a
        weight sync, which woke only the weights, the KV cache). Engines hold GPU memory only from a weight sync or
        a generation to the end of the next generation.

        With ``deepspeed_enable_sleep`` the policies' DeepSpeed states leave the device first
        (:meth:`PolicyWorker.sleep`); they come back when the policies next score or train (:meth:`PolicyWorker.wake`,
        after the engines slept again)."""
        group = self.group
        if group.plan.deepspeed_enable_sleep:
            group.all_policies(PolicyWorker.sleep, combine=lambda v: None).result()
        if self.engines_sleep and not self.engines_awake:
            self._engines_call(engine_class().wake_up)
            self.engines_awake = True

    def sleep_engines(self) -> None:
        if self.engines_sleep and self.engines_awake:
            self._engines_call(engine_class().sleep)
            self.engines_awake = False


def stamped(result: RolloutResult, version: int) -> RolloutResult:
    """``result`` with every trajectory's ``policy_version`` set to ``version``."""
    for traj in result.trajectories:
        traj.policy_version = version
    return result


def attach_behaviour_logps(agent: str, trajectories: Sequence[Any], engine_shards: Sequence[Sequence[int]],
                           outputs: Sequence[Sequence[GenerationOutput]], n: int) -> None:
    """Give each trajectory the log-probs its engine returned for its tokens (``Trajectory.behaviour_logp``).

    Engine e sampled the prompts ``engine_shards[e]`` (its ``prompt_index`` counts within them); the trajectories
    come prompt-major, ``n`` per prompt, in prompt order. Each pairing is checked on the token ids."""
    import torch

    by_row: dict[tuple[int, int], GenerationOutput] = {}
    for shard, outs in zip(engine_shards, outputs):
        for out in outs:
            by_row[(shard[out.prompt_index], out.sample_index)] = out
    if len(by_row) != len(trajectories):
        raise RuntimeError(f"agent {agent!r}: {len(by_row)} engine outputs for {len(trajectories)} trajectories")
    for row, traj in enumerate(trajectories):
        out = by_row.get((row // n, row % n))
        if out is None or out.logprobs is None or list(out.response_token_ids) != traj.source_token_ids:
            raise RuntimeError(f"agent {agent!r}: trajectory {row} ({traj.prompt_id!r}) has no engine output with "
                               "its token ids and log-probs")
        traj.behaviour_logp = torch.tensor(out.logprobs, dtype=torch.float32)


def _first_of(value: Any, *_: Any) -> Any:
    """``value``, once the other arguments (Ray object references) are ready too."""
    return value


@functools.cache
def _first_of_task():
    """:func:`_first_of` as a Ray task, exported once per process rather than once per rollout."""
    import ray

    return ray.remote(num_cpus=0)(_first_of)


def engine_class(backend: str = "vllm"):
    """The engine class of ``backend`` (its module is loaded only when an agent has engines: the vLLM one imports
    Ray)."""
    if backend == "hf_engine":
        from openrlhf_hacpo.engines.hf_engine import HFEngine

        return HFEngine
    from openrlhf_hacpo.engines.vllm_engine import VLLMEngine

    return VLLMEngine
