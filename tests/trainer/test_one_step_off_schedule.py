"""The ``--one_step_off`` schedule of the controller, driven with stand-in agent groups (plain Python, no Ray).

Each stand-in keeps two weights versions apart, as an agent with engine actors does: its learner's (one more per
``train_step``) and its engines' (set at ``sync_weights``); it runs each call when it is made, in the order the calls
reach it, as a Ray actor runs its queue. Every generated row records the engines' version at generation, set by the
stand-in and not by the code under test, so the staleness the controller reports is checked against what the
stand-in saw. Also: the refusals of the configuration, and the in-flight batch's round trip through a checkpoint file.
"""
from __future__ import annotations

import io
import math

import pytest
import torch

from openrlhf_hacpo.actors.results import RolloutResult, TrainStepResult
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.rollout import Trajectory
from openrlhf_hacpo.trainer.controller import HACPOController
from openrlhf_hacpo.trainer.in_flight import GeneratedBatch

PROMPTS, G = 2, 2


class _Done:
    def __init__(self, value, on_result=None):
        self.value, self.on_result = value, on_result

    def result(self):
        if self.on_result is not None:
            self.on_result()
        return self.value


class StandInGroup:
    """One agent: a learner (weights version ``learner``) and engines (weights version ``engines``)."""

    def __init__(self, index: int, name: str, log: list):
        self.index, self.name, self.log = index, name, log
        self.learner = 0  # the stand-in's own count, independent of AgentGroup.policy_version
        self.engines = 0
        self.policy_version = 0
        self.generated_with: dict[int, int] = {}  # batch step -> engines' version at generation
        self.scored_at: dict[int, int] = {}  # batch step -> learner's version at the scoring pass
        self.trained_on: dict[int, tuple[int, ...]] = {}  # learner step -> policy_version of each row it got

    def render_for_rollout(self, prompts):
        self.log.append(("render", self.name, tuple(p["prompt_id"] for p in prompts)))
        return _Done([p["prompt_id"] for p in prompts])

    def rollout(self, prompts, sampling, step, rendered=None):
        self.log.append(("rollout", self.name, step))
        self.generated_with[step] = self.engines
        self.scored_at[step] = self.learner  # the scoring pass runs after whatever was queued before it
        trajs = []
        for p in prompts:
            for s in range(sampling.n):
                logp = -0.25 * (1 + self.engines) - 0.01 * s
                trajs.append(Trajectory(prompt_id=p["prompt_id"], prompt=p["prompt"], label="1",
                                        response_text=f"{self.name}{step}{s}", source=self.index,
                                        source_token_ids=[5, 6], source_logp=[logp, logp], source_logp_sum=2 * logp,
                                        source_num_tokens=2, finished=False, step=step,
                                        policy_version=self.engines))
        result = RolloutResult(trajectories=tuple(trajs), timings={"generate": 0.0, "scoring": 0.0},
                               generated_tokens=2 * len(trajs))
        return _Done(result, lambda: self.log.append(("rollout_result", self.name, step)))

    def train_step(self, trajectories, step, ratios):
        self.log.append(("train", self.name, step))
        self.trained_on[step] = tuple(t.policy_version for t in trajectories)
        self.learner += 1  # policy_version is the controller's to set once the step's updates are in
        result = TrainStepResult(metrics={"loss": float(step)}, skipped_updates=0, skipped_updates_total=0,
                                 updates=1, timings={})
        return _Done(result, lambda: self.log.append(("train_result", self.name, step)))

    def sync_weights(self):
        self.log.append(("sync", self.name, self.learner))
        self.engines = self.learner
        return 0.0


class StandInLoader:
    def __init__(self, batches: int):
        self.batches, self.cursor = batches, 0

    def __len__(self):
        return self.batches

    def state_dict(self):
        return {"cursor": self.cursor}

    def load_state_dict(self, state):
        self.cursor = state["cursor"]

    def next_batch(self):
        b = self.cursor
        self.cursor += 1
        return [{"prompt_id": f"b{b}p{i}", "prompt": f"question {b}.{i}"} for i in range(PROMPTS)]


class StandInRewards:
    def score_trajectories(self, trajectories):
        for t in trajectories:  # a fixed, uneven pattern: capability and advantages are not degenerate
            t.reward = float((len(t.response_text) + t.source + int(t.response_text[-1])) % 2)


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(agents=[AgentConfig(name="a", pretrain="/m/a"), AgentConfig(name="b", pretrain="/m/b")],
                prompt_data="d.jsonl", save_path=str(tmp_path), rollout_backend="hf_engine",
                n_samples_per_prompt=G, rollout_batch_size=PROMPTS, train_batch_size=2 * PROMPTS * G,
                micro_train_batch_size=2, max_steps=4)
    base.update(kw)
    return TrainConfig.of(**base)


def _controller(cfg: TrainConfig, log: list) -> HACPOController:
    ctrl = HACPOController(cfg)
    ctrl.groups = [StandInGroup(k, name, log) for k, name in enumerate(cfg.agent_names)]
    ctrl.dataloader = StandInLoader(batches=10)
    ctrl.reward_runner = StandInRewards()
    ctrl._shared = lambda trajectories: trajectories  # no Ray: the stand-ins take the list itself
    return ctrl


def _run(cfg, steps=None):
    log: list = []
    ctrl = _controller(cfg, log)
    records = [r for _ in range(steps or ctrl.total_steps) for r in ctrl.train_one_step()]
    return ctrl, records, log


def _untimed(records):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "rollout/tokens_per_s"))} for r in records]


def test_each_batch_is_generated_during_the_previous_update_and_trained_one_version_stale(tmp_path):
    ctrl, records, log = _run(_cfg(tmp_path, one_step_off=True))
    # order of calls: step 1 as synchronous training; then render(t+1), train(t), rollout(t+1), waits, sync
    expected = [("rollout", n, 1) for n in "ab"]  # step 1: the synchronous rollout (rendered by the group)
    expected += [("rollout_result", n, 1) for n in "ab"]
    for t in (1, 2, 3, 4):
        if t < 4:
            expected += [("render", n, (f"b{t}p0", f"b{t}p1")) for n in "ab"]
        expected += [("train", n, t) for n in "ab"]
        if t < 4:
            expected += [("rollout", n, t + 1) for n in "ab"]
        expected += [("train_result", n, t) for n in "ab"]
        if t < 4:
            expected += [("rollout_result", n, t + 1) for n in "ab"]
        expected += [("sync", n, t) for n in "ab"]
    assert log == expected
    # the last step generates nothing: 4 batches for 4 steps, nothing left in flight
    assert ctrl.in_flight is None and ctrl.dataloader.cursor == 4
    for group in ctrl.groups:
        # batch t was generated by the weights of step t-2 (step 1: the initial ones), scored at those of step t-1
        assert group.generated_with == {1: 0, 2: 0, 3: 1, 4: 2}
        assert group.scored_at == {1: 0, 2: 1, 3: 2, 4: 3}
        for t, versions in group.trained_on.items():
            stale = [(t - 1) - v for v in versions]  # the learner trains step t at the weights of step t-1
            assert stale == [0 if t == 1 else 1] * (2 * PROMPTS * G)
    for r in records:
        want = 0.0 if r["step"] == 1 else 1.0
        assert r["rollout/staleness_max"] == want and r["rollout/staleness_mean"] == want


def test_synchronous_schedule_is_unchanged_and_step_one_is_the_same(tmp_path):
    ctrl, records, log = _run(_cfg(tmp_path / "sync"))
    expected = []
    for t in (1, 2, 3, 4):
        expected += [("render", n, (f"b{t - 1}p0", f"b{t - 1}p1")) for n in "ab"]
        expected += [("rollout", n, t) for n in "ab"] + [("rollout_result", n, t) for n in "ab"]
        expected += [("train", n, t) for n in "ab"] + [("train_result", n, t) for n in "ab"]
        expected += [("sync", n, t) for n in "ab"]
    assert [e for e in log if e[0] != "render"] == [e for e in expected if e[0] != "render"]
    assert all(r["rollout/staleness_max"] == 0.0 for r in records)
    for group in ctrl.groups:
        assert group.generated_with == {1: 0, 2: 1, 3: 2, 4: 3}
    _, overlapped, _ = _run(_cfg(tmp_path / "off", one_step_off=True))
    assert len(records) == 8 and _untimed(overlapped[:2]) == _untimed(records[:2])  # step 1, both agents
    # step 2 differs: its batch was generated by older weights (the stand-in's rewards do not depend on them, the
    # staleness does)
    assert [r["rollout/staleness_max"] for r in overlapped[2:4]] == [1.0, 1.0]


def test_the_batch_in_flight_survives_a_checkpoint_file_and_is_trained_next(tmp_path):
    cfg = _cfg(tmp_path, one_step_off=True)
    _, uninterrupted, _ = _run(cfg)
    ctrl, _, _ = _run(cfg, steps=2)
    buffer = io.BytesIO()
    torch.save(ctrl.trainer_state(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    batch = GeneratedBatch.from_state(loaded["in_flight"], cfg.num_agents, "test")
    original = ctrl.in_flight
    assert batch.step == 3 and batch.trajectories == original.trajectories
    assert {t.policy_version for t in batch.trajectories} == {1}
    assert [r.generated_tokens for r in batch.rollouts] == [r.generated_tokens for r in original.rollouts]
    with pytest.raises(ValueError, match="holds 2 agents' rollouts, this run has 3"):
        GeneratedBatch.from_state(loaded["in_flight"], 3, "checkpoint x")

    # a fresh driver with the state (and agents holding the weights of step 2) continues as the uninterrupted run
    resumed = _controller(cfg, [])
    resumed.step = int(loaded["step"])
    resumed.dataloader.load_state_dict(loaded["dataloader"])
    resumed.tracker.load_state_dict(loaded["tracker"])
    resumed.in_flight = batch
    for group in resumed.groups:
        group.learner = group.engines = group.policy_version = 2
    rest = [r for _ in range(2) for r in resumed.train_one_step()]
    assert _untimed(rest) == _untimed(uninterrupted[4:])
    assert resumed.in_flight is None


@pytest.mark.parametrize("flags, named", [
    (dict(one_step_off=True, rollout_backend="hf"), ["--one_step_off", "--rollout_backend"]),
    (dict(one_step_off=True, rollout_backend="vllm", colocate_all_models=True),
     ["--one_step_off", "--colocate_all_models"]),
    (dict(one_step_off=True, rollout_backend="vllm", vllm_enable_sleep=True),
     ["--one_step_off", "--vllm_enable_sleep"]),
    (dict(one_step_off=True, old_logp_from_update=True), ["--one_step_off", "--old_logp_from_update"]),
    (dict(own_old_logp="behaviour"), ["--own_old_logp behaviour", "--one_step_off"]),
    (dict(one_step_off=True, own_old_logp="behaviour", temperature=0.7), ["--own_old_logp behaviour",
                                                                          "--temperature"]),
])
def test_refusals_name_the_flags(tmp_path, flags, named):
    with pytest.raises(ValueError) as err:
        _cfg(tmp_path, **flags)
    for flag in named:
        assert flag in str(err.value)


def test_accepted_combinations(tmp_path):
    # auto: the behaviour policy's log-probs in a one-step-off run at temperature 1, else the scoring pass
    assert _cfg(tmp_path, one_step_off=True).resolved_own_old_logp == "behaviour"
    assert _cfg(tmp_path, one_step_off=True, temperature=0.7).resolved_own_old_logp == "recompute"
    assert _cfg(tmp_path).resolved_own_old_logp == "recompute"
    assert _cfg(tmp_path, one_step_off=True, own_old_logp="recompute").resolved_own_old_logp == "recompute"
    assert _cfg(tmp_path, one_step_off=True, rollout_backend="vllm").train.one_step_off
    assert _cfg(tmp_path, one_step_off=True, own_old_logp="behaviour").resolved_own_old_logp == "behaviour"
    assert not _cfg(tmp_path).train.one_step_off


def test_behaviour_log_probs_are_the_own_rows_old_log_probs_and_foreign_rows_keep_the_scoring_means():
    from openrlhf_hacpo.rollout.views import build_learner_batch

    class Tok:  # one id per character; a chat template is not used (raw-text prompts)
        eos_token_id = 0
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            if isinstance(text, list):
                return {"input_ids": [[ord(c) for c in t] for t in text]}
            return {"input_ids": [ord(c) for c in text]}

    scored, behaviour = [-0.5, -1.0, -2.0], [-0.25, -1.5, -3.0]  # EOS (id 9) last: dropped under "drop"
    rows = [Trajectory(prompt_id="p", prompt="q", label=None, response_text="ab", source=src,
                       source_token_ids=[3, 4, 9], source_logp=scored, source_logp_sum=-1.5, source_num_tokens=2,
                       finished=True, reward=1.0, behaviour_logp=behaviour if src == 0 else []) for src in (0, 1)]
    from openrlhf_hacpo.rollout.views import LearnerViewConfig

    view = LearnerViewConfig(apply_chat_template=False, prompt_max_len=None, generate_max_len=None)
    own, foreign = build_learner_batch(rows, 0, Tok(), view, eos_token_id=9).rows
    assert own.old_logp.tolist() == [-0.25, -1.5]
    assert math.isclose(own.old_logp_mean, (-0.25 - 1.5) / 2, rel_tol=0, abs_tol=1e-12)
    assert foreign.old_logp is None and math.isclose(foreign.old_logp_mean, -1.5 / 2, abs_tol=1e-12)
    # learner 1: its own row has no behaviour values, so the scoring pass's stay
    own1 = build_learner_batch(rows, 1, Tok(), view, eos_token_id=9).rows[1]
    assert own1.old_logp.tolist() == [-0.5, -1.0] and math.isclose(own1.old_logp_mean, -0.75, abs_tol=1e-12)
    # and the dump keeps both, exactly
    assert Trajectory.from_dict(rows[0].to_dict()) == rows[0]
