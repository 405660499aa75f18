"""Own-row old log-probs from the scorer to the learner view: the scorer's float32 tensor is kept on the trajectory
(no list in between) and a learner view's own row reads exactly those values; a JSON round trip of the trajectory
(the rollout dump, the checkpoint) gives the same float32 values back."""
from __future__ import annotations

import json
import math
import pickle
from types import SimpleNamespace

import pytest
import torch

import openrlhf_hacpo.actors.scoring as scoring
from openrlhf_hacpo.actors.scoring import RenderedPrompts, RolloutScorer
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.engines.base import GenerationOutput
from openrlhf_hacpo.rollout import LearnerViewConfig, RolloutStore, Trajectory, build_learner_batch
from openrlhf_hacpo.utils.timing import PhaseTimer

EOS = 3


class CharTok:
    """Ids 4.. by hand for the view's prompt rendering; no chat template (raw prompts)."""

    pad_token_id = 0
    eos_token_id = EOS
    name_or_path = "chars"

    def __call__(self, text, add_special_tokens):
        if isinstance(text, list):
            return {"input_ids": [self(t, add_special_tokens)["input_ids"] for t in text]}
        return {"input_ids": [4 + ord(c) % 12 for c in text]}

    def decode(self, ids, skip_special_tokens):
        return "".join(chr(ord("a") + i) for i in ids)


def bits(t: torch.Tensor) -> list[int]:
    """The float32 values' bit patterns (equal bits, not merely close values)."""
    assert t.dtype == torch.float32
    return t.contiguous().view(torch.int32).tolist()


@pytest.fixture
def scored(tmp_path, monkeypatch):
    """Trajectories scored by a tiny Llama through :meth:`RolloutScorer.trajectories`, with the tensors the
    recompute returned (captured by wrapping ``score_logprobs``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    cfg = TrainConfig.of(agents=[AgentConfig(name="a", pretrain="/m")], prompt_data="x.jsonl", save_path=str(tmp_path),
                      apply_chat_template=False, kernel_backend="torch", temperature=0.7,
                      micro_train_batch_size=2)
    captured: list[torch.Tensor] = []
    real = scoring.score_logprobs

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        captured.extend(t.clone() for t in out)
        return out

    monkeypatch.setattr(scoring, "score_logprobs", spy)
    scorer = RolloutScorer(cfg, 0, CharTok(), eos_token_ids=[EOS])
    prompts = [SimpleNamespace(prompt_id="p0", prompt="1+2", label="3"),
               SimpleNamespace(prompt_id="p1", prompt="30+4", label="34")]
    rendered = RenderedPrompts(ids=[[5, 9, 7], [6, 2, 8, 10]], texts=["1+2", "30+4"])
    outputs = [GenerationOutput(0, 0, [4, 11, 6, EOS], "", True, "stop"),   # finished: EOS dropped from actions
               GenerationOutput(1, 0, [8, 2, 12, 13, 14], "", False, "length"),
               GenerationOutput(1, 1, [EOS], "", True, "stop")]                # EOS-only: one EOS action
    timer = PhaseTimer()
    trajs = scorer.trajectories(model, prompts, rendered, outputs, step=1, device=torch.device("cpu"), timer=timer)
    for t in trajs:
        t.reward = 1.0
    assert list(timer.seconds) == ["scoring"] and timer.seconds["scoring"] > 0
    assert len(captured) == len(trajs) == 3
    return cfg, trajs, captured


def test_own_row_old_logp_is_the_scorers_float32_values(scored):
    cfg, trajs, captured = scored
    # the trajectory keeps the recompute's tensor, not a list
    for traj, logp in zip(trajs, captured):
        assert isinstance(traj.source_logp, torch.Tensor) and traj.source_logp.dtype == torch.float32
        assert bits(traj.source_logp) == bits(logp)
        n = traj.source_num_tokens
        # the summary is the exact sum of the float32 values (as when they were a list of floats)
        assert traj.source_logp_sum == math.fsum(logp[:n].tolist())
    batch = build_learner_batch(trajs, 0, CharTok(), scoring.view_config(cfg))
    for traj, row, logp in zip(trajs, batch.rows, captured):
        assert row.is_own and row.old_logp.dtype == torch.float32
        assert bits(row.old_logp) == bits(logp[: traj.source_num_tokens])
    assert [len(r.old_logp) for r in batch.rows] == [3, 5, 1]
    # the packed micro-batch's per-token column holds the same values
    batch.attach(torch.zeros(3), torch.ones(3))
    micro = batch.packed(pad_id=0)
    for i, (traj, logp) in enumerate(zip(trajs, captured)):
        assert bits(micro.old_logp[i, : traj.source_num_tokens]) == bits(logp[: traj.source_num_tokens])


def test_json_round_trip_gives_the_same_values(scored, tmp_path):
    cfg, trajs, captured = scored
    back = [Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) for t in trajs]
    assert back == trajs
    for traj, logp in zip(back, captured):
        assert traj.source_logp.dtype == torch.float32 and bits(traj.source_logp) == bits(logp)
    # the rollout dump and the checkpoint's store state go through the same dict
    store = RolloutStore()
    store.add(trajs)
    dumped = RolloutStore.read_jsonl(store.dump_jsonl(1, tmp_path / "step_1.jsonl"))
    restored = RolloutStore()
    restored.load_state_dict(json.loads(json.dumps(store.state_dict())))
    view_cfg = scoring.view_config(cfg)
    before = build_learner_batch(trajs, 0, CharTok(), view_cfg)
    for again in (dumped, restored.for_step(1)):
        after = build_learner_batch(again, 0, CharTok(), view_cfg)
        assert [bits(r.old_logp) for r in after.rows] == [bits(r.old_logp) for r in before.rows]
        assert [r.old_logp_mean for r in after.rows] == [r.old_logp_mean for r in before.rows]


def test_trajectory_equality_and_transport(scored):
    _, trajs, _ = scored
    t = trajs[0]
    assert pickle.loads(pickle.dumps(t)) == t  # Ray moves trajectories by pickling
    other = Trajectory.from_dict(t.to_dict())
    other.source_logp = other.source_logp.clone()
    other.source_logp[0] += 1.0
    assert other != t  # the per-token values take part in ==
    assert Trajectory.from_dict(t.to_dict()) == t and t != trajs[1]
    assert t.__eq__("not a trajectory") is NotImplemented
    with pytest.raises(TypeError):
        hash(t)


def test_a_view_of_a_larger_tensor_is_copied_and_lists_become_float32():
    from openrlhf_hacpo.rollout import make_trajectory

    block = torch.randn(4, 6, dtype=torch.float32)
    t = make_trajectory(prompt_id="p", prompt="q", label=None, source=0, step=0, token_ids=[4, 5, 6, EOS],
                        token_logps=block[1, :4], eos_token_id=EOS, response_text="abc")
    assert bits(t.source_logp) == bits(block[1, :4])
    assert t.source_logp.untyped_storage().nbytes() == 4 * 4  # its own storage: pickling carries 4 values only
    assert t.source_logp_sum == math.fsum(block[1, :3].tolist())
    listed = make_trajectory(prompt_id="p", prompt="q", label=None, source=0, step=0, token_ids=[4, 5, EOS],
                             token_logps=[-0.1, -0.2, -0.3], eos_token_id=EOS, response_text="ab")
    assert listed.source_logp.dtype == torch.float32
    assert bits(listed.source_logp) == bits(torch.tensor([-0.1, -0.2, -0.3], dtype=torch.float32))
    assert listed.source_logp_sum == math.fsum([-0.1, -0.2])  # summed over the values as given
    with pytest.raises(ValueError, match=r"source_logp must be a 1-D tensor"):
        Trajectory.from_dict({**listed.to_dict(), "source_logp": torch.zeros(1, 3)})
    view = build_learner_batch([_verified(listed)], 0, CharTok(), LearnerViewConfig(apply_chat_template=False))
    assert bits(view.rows[0].old_logp) == bits(torch.tensor([-0.1, -0.2], dtype=torch.float32))


def _verified(t: Trajectory) -> Trajectory:
    t.reward = 0.0
    return t


def test_scoring_positions_count_the_scoring_pass(scored, monkeypatch):
    """The padding the scoring pass computed, by hand: micro-batches of 2 grouped by length take rows {0, 2}
    (prompts 3, 4; responses 4, 1 -> 2 x 8 positions, 12 real) and {1} (9 positions, 9 real)."""
    cfg, _, _ = scored
    scorer = RolloutScorer(cfg, 0, CharTok(), eos_token_ids=[EOS])
    rendered = RenderedPrompts(ids=[[5, 9, 7], [6, 2, 8, 10]], texts=["1+2", "30+4"])
    outputs = [GenerationOutput(0, 0, [4, 11, 6, EOS], "", True, "stop"),
               GenerationOutput(1, 0, [8, 2, 12, 13, 14], "", False, "length"),
               GenerationOutput(1, 1, [EOS], "", True, "stop")]
    assert scorer.scoring_positions(rendered, outputs) == (16 + 9, 12 + 9)
    monkeypatch.setattr(cfg.compute, "length_grouping", False)  # in order: {0, 1} (2 x 9, 16 real) and {2} (5, 5 real)
    assert scorer.scoring_positions(rendered, outputs) == (18 + 5, 16 + 5)
