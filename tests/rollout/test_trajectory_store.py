"""Trajectory construction (EOS policy), serialisation, and the rollout store."""
import json
import math

import pytest
import torch

from openrlhf_hacpo.rollout import RolloutStore, Trajectory, apply_eos_policy, make_trajectory

EOS = 9


# --------------------------------------------------------------------------------------------------- EOS policy
def test_apply_eos_policy_cases():
    assert apply_eos_policy([1, 2, EOS], [-1.0, -2.0, -3.0], EOS, "drop") == ([1, 2], [-1.0, -2.0])
    assert apply_eos_policy([1, 2, EOS], [-1.0, -2.0, -3.0], EOS, "keep") == ([1, 2, EOS], [-1.0, -2.0, -3.0])
    assert apply_eos_policy([1, 2], [-1.0, -2.0], EOS, "drop") == ([1, 2], [-1.0, -2.0])  # truncated: no EOS
    assert apply_eos_policy([EOS], [-4.0], EOS, "drop") == ([EOS], [-4.0])  # EOS-only stays one action
    assert apply_eos_policy([EOS, EOS], None, EOS, "drop") == ([EOS], None)  # only the terminal one
    assert apply_eos_policy([1, 7], None, [7, EOS], "drop") == ([1], None)  # several EOS ids
    with pytest.raises(ValueError, match="2 log-probs for 3 token ids"):
        apply_eos_policy([1, 2, 3], [0.0, 0.0], EOS, "drop")
    with pytest.raises(ValueError, match="eos_policy"):
        apply_eos_policy([1], None, EOS, "trim")


def make(ids, logps, policy="drop", text="t", **kw):
    return make_trajectory(prompt_id=kw.pop("prompt_id", "p"), prompt=kw.pop("prompt", "q"), label="1",
                           source=kw.pop("source", 0), step=kw.pop("step", 0), token_ids=ids, token_logps=logps,
                           eos_token_id=EOS, eos_policy=policy, response_text=text, **kw)


def test_make_trajectory_summaries_follow_the_policy():
    t = make([1, 2, 3, EOS], [-0.5, -1.0, -1.5, -7.0])
    assert t.finished and t.source_num_tokens == 3
    assert t.source_logp_sum == pytest.approx(-3.0) and t.old_logp_mean == pytest.approx(-1.0)
    assert t.source_token_ids == [1, 2, 3, EOS] and t.action_token_ids() == [1, 2, 3]
    assert t.action_logp().tolist() == [-0.5, -1.0, -1.5] and t.action_logp().dtype == torch.float32
    k = make([1, 2, 3, EOS], [-0.5, -1.0, -1.5, -7.0], policy="keep")
    assert k.source_num_tokens == 4 and k.old_logp_mean == pytest.approx(-10.0 / 4)
    u = make([1, 2, 3], [-0.5, -1.0, -1.5])
    assert not u.finished and u.source_num_tokens == 3 and u.truncated and not t.truncated
    assert not make([1, 2, 3], [-0.5, -1.0, -1.5], finish_reason="stop").truncated  # e.g. a stop string
    slim = make([1, 2, EOS], [-1.0, -1.0, -5.0], keep_token_logps=False)
    assert len(slim.source_logp) == 0 and len(slim.action_logp()) == 0 and slim.source_logp_sum == pytest.approx(-2.0)


def test_make_trajectory_decodes_without_eos():
    class Tok:
        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens
            return "|".join(map(str, ids))

    t = make_trajectory(prompt_id="p", prompt="q", label=None, source=1, step=3, token_ids=[4, 5, EOS],
                        token_logps=[-1.0, -1.0, -1.0], eos_token_id=EOS, tokenizer=Tok())
    assert t.response_text == "4|5"


def test_trajectory_validation_names_the_field():
    good = make([1, 2, EOS], [-1.0, -2.0, -3.0]).to_dict()
    with pytest.raises(ValueError, match="source_num_tokens=3 but the response has 2 action tokens"):
        Trajectory.from_dict({**good, "source_num_tokens": 3})
    with pytest.raises(ValueError, match="does not match the sum"):
        Trajectory.from_dict({**good, "source_logp_sum": -6.0})
    with pytest.raises(ValueError, match="source_logp has 2 values for 3 token ids"):
        Trajectory.from_dict({**good, "source_logp": [-1.0, -2.0]})
    with pytest.raises(ValueError, match="reward must be finite"):
        Trajectory.from_dict({**good, "reward": float("nan")})
    with pytest.raises(ValueError, match=r"prompt\[0\]"):
        Trajectory.from_dict({**good, "prompt": [{"content": "no role"}]})
    with pytest.raises(ValueError, match="unknown field"):
        Trajectory.from_dict({**good, "colour": "red"})
    with pytest.raises(ValueError, match="source must be a non-negative int"):
        Trajectory.from_dict({**good, "source": -1})


def test_to_dict_is_json_safe_and_round_trips():
    t = make([1, 2, EOS], [-1.0, -2.0, -3.0], prompt=[{"role": "user", "content": "2+2?"}],
             metadata={"prompt_text": "<s>2+2?"})
    t.reward = 1.0
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t


# --------------------------------------------------------------------------------------------------- store
def _traj(step, source, prompt_id, reward, n_tokens=2, finished=True, text="ab"):
    ids = list(range(1, n_tokens + 1)) + ([EOS] if finished else [])
    t = make(ids, [-1.0] * len(ids), prompt_id=prompt_id, source=source, step=step, text=text,
             prompt=f"question {prompt_id}")
    t.reward = reward
    return t


def test_store_queries_and_grouping():
    store = RolloutStore(keep_last_steps=None)
    trajs = [_traj(0, 0, "a", 1.0), _traj(0, 1, "a", 0.0), _traj(0, 0, "b", 0.0), _traj(0, 1, "b", 1.0),
             _traj(1, 0, "c", 1.0)]
    store.add(trajs)
    assert store.steps == [0, 1] and len(store) == 5
    assert store.for_step(0) == trajs[:4]
    assert store.rewards_by_source(0, num_agents=2) == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(KeyError, match="no trajectories for step 7"):
        store.for_step(7)


def test_store_retention_keeps_last_k_steps():
    store = RolloutStore(keep_last_steps=2)
    for step in range(4):
        store.add([_traj(step, 0, f"p{step}", 1.0)])
    assert store.steps == [2, 3]
    default = RolloutStore()
    default.add([_traj(0, 0, "a", 1.0)])
    default.add([_traj(1, 0, "b", 1.0)])
    assert default.steps == [1]
    with pytest.raises(ValueError, match="keep_last_steps"):
        RolloutStore(keep_last_steps=0)


def test_store_summary_by_hand():
    store = RolloutStore()
    store.add([
        _traj(0, 0, "a", 1.0, n_tokens=2), _traj(0, 0, "a", 0.0, n_tokens=4, finished=False),
        _traj(0, 0, "b", 1.0, n_tokens=3), _traj(0, 1, "a", 0.5, n_tokens=5, text="abcd"),
    ])
    s = store.summary(0)
    assert s[0]["num_trajectories"] == 3 and s[0]["num_prompts"] == 2
    assert s[0]["reward_mean"] == pytest.approx(2 / 3)
    assert s[0]["reward_std"] == pytest.approx(math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 3))
    assert s[0]["positive_rate"] == pytest.approx(2 / 3)
    assert s[0]["response_tokens_mean"] == pytest.approx(3.0)
    assert s[0]["finished_rate"] == pytest.approx(2 / 3)
    assert s[1]["reward_mean"] == 0.5 and s[1]["response_chars_mean"] == 4.0


def test_unverified_rewards_are_reported():
    store = RolloutStore()
    t = _traj(0, 1, "a", None)
    store.add([t])
    with pytest.raises(ValueError, match="agent 1 at step 0 is not verified"):
        store.rewards_by_source(0, 2)
    assert "reward_mean" not in store.summary(0)[1]


def test_store_state_dict_and_jsonl_round_trip(tmp_path):
    store = RolloutStore(keep_last_steps=3)
    trajs = [_traj(0, 0, "a", 1.0), _traj(1, 1, "b", 0.0)]
    store.add(trajs)
    state = json.loads(json.dumps(store.state_dict()))
    other = RolloutStore()
    other.load_state_dict(state)
    assert other.keep_last_steps == 3 and other.for_step(0) == [trajs[0]] and other.for_step(1) == [trajs[1]]
    path = store.dump_jsonl(1, tmp_path / "dump" / "step_1.jsonl")
    assert RolloutStore.read_jsonl(path) == [trajs[1]]
    assert [p.name for p in path.parent.iterdir()] == ["step_1.jsonl"]  # no temporary left behind
    (tmp_path / "bad.jsonl").write_text('{"prompt_id": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        RolloutStore.read_jsonl(tmp_path / "bad.jsonl")
