"""End-to-end runs through the CLI on a local Ray cluster: every agent's policy is a Ray actor with a DeepSpeed
engine (gloo), rollouts use the transformers-generate backend inside the policy actor. The two-agent test's resumed
run loads the actors' checkpoint into policies in the test process (``--no_ray``)."""
from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from openrlhf_hacpo.cli.train_hacpo import build_config, run
from openrlhf_hacpo.rollout import RolloutStore, build_learner_batch
from openrlhf_hacpo.trainer.controller import HACPOController, TrainingError
from openrlhf_hacpo.utils.jsonl import read_records
from reference_logprobs import prompt_ids, sequence_logprobs

pytestmark = pytest.mark.e2e

STEP_KEYS = [
    "reward/mean", "capability", "advantage/mean", "advantage/std", "policy/own_ratio_mean",
    "policy/own_clip_frac_lower", "policy/own_clip_frac_upper", "policy/foreign_ratio_mean",
    "policy/foreign_clip_frac_lower", "policy/foreign_clip_frac_upper", "policy/foreign_in_window_frac",
    "policy/foreign_ratio_median",
    "view/truncated_fraction", "response/tokens_mean", "response/truncated_fraction", "rollout/tokens_per_s",
    "time/generate", "time/reward", "time/logprob", "time/update", "time/sync", "loss", "grad_norm", "lr",
    "skipped_updates",
]


def _agents(tiny_agents, *names):
    out = []
    for name in names:
        out += ["--agent", f"name={name},pretrain={tiny_agents[name]}"]
    return out


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval(), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def _greedy(model, tokenizer, prompt, max_new_tokens) -> str:
    ids = list(prompt)
    out = []
    for _ in range(max_new_tokens):
        token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(token)
        ids.append(token)
        if token == tokenizer.eos_token_id:
            break
    return tokenizer.decode(out, skip_special_tokens=True)


def test_two_heterogeneous_agents_train_together_and_resume_exactly(ray_cluster, tmp_path, tiny_agents, base_args,
                                                                  prompt_file):
    """Two agents for 4 steps (a joint checkpoint every 2, saved rollouts, evaluation every step, TensorBoard): the
    metrics, the foreign rows' old log-probs, the learners' views, the outputs and the evaluations; then a run resumed
    from the step-2 checkpoint for the 2 remaining steps must repeat steps 3 and 4 exactly."""
    out = tmp_path / "straight"
    common = [*_agents(tiny_agents, "llama", "qwen"), "--train_batch_size", "8", "--max_steps", "4", "--save_steps", "2",
              "--save_rollouts", "--eval_data", prompt_file, "--eval_steps", "1", "--eval_n_samples", "2",
              "--eval_max_samples", "4"]
    controller = run(base_args(out, *common, "--use_tensorboard", str(out / "tb")))
    cfg = controller.cfg

    # -- one metrics record per step and agent, with every figure
    records = read_records(out / "metrics.jsonl")
    assert [(r["step"], r["agent"]) for r in records] == [(s, a) for s in (1, 2, 3, 4) for a in ("llama", "qwen")]
    for rec in records:
        missing = [k for k in STEP_KEYS if k not in rec]
        assert not missing, missing
        assert rec["updates"] == 2 and rec["skipped_updates"] == 0
        assert rec["view/num_rows"] == 16 and rec["view/num_own_rows"] == 8
    assert list((out / "tb").glob("events.out.tfevents.*"))

    # -- foreign rows carry the source's old log-probs: recompute them from each source's initial weights
    step1 = RolloutStore.read_jsonl(out / "rollouts" / "step_000001.jsonl")
    assert len(step1) == 2 * 2 * 4
    initial = {name: _load(tiny_agents[name]) for name in ("llama", "qwen")}
    source_mean = {}
    for i, traj in enumerate(step1):
        model, tokenizer = initial[cfg.agent_names[traj.source]]
        recomputed = sequence_logprobs(model, prompt_ids(tokenizer, traj.prompt), traj.action_token_ids())
        assert traj.source_logp_sum == pytest.approx(math.fsum(recomputed), abs=2e-4)
        source_mean[i] = math.fsum(recomputed) / len(recomputed)
    for k, name in enumerate(cfg.agent_names):  # records[k]: step 1 of agent k
        foreign = [source_mean[i] for i, t in enumerate(step1) if t.source != k]
        assert records[k]["view/foreign_old_logp_mean"] == pytest.approx(sum(foreign) / len(foreign), abs=2e-4)

    # -- the store's per-learner views of the last step: own ids kept, foreign text re-tokenized by the learner
    last = controller.store.for_step(4)
    assert {t.prompt_id for t in last} == {t.prompt_id for t in last if t.source == 0}
    from openrlhf_hacpo.actors.scoring import view_config

    checked = 0
    for k, name in enumerate(cfg.agent_names):
        tokenizer = initial[name][1]
        batch = build_learner_batch(last, k, tokenizer, view_config(cfg))
        for traj, row in zip(last, batch.rows):
            assert row.is_own == (traj.source == k)
            assert tokenizer.decode(row.prompt_ids) == tokenizer.decode(prompt_ids(tokenizer, traj.prompt))
            if row.is_own:
                assert row.response_ids == traj.action_token_ids()
            elif traj.response_text and tokenizer.unk_token_id not in row.response_ids:
                assert tokenizer.decode(row.response_ids) == traj.response_text
                checked += 1
    assert checked >= 8

    # -- outputs: HF checkpoints (changed weights), joint checkpoint, evaluation
    for name in cfg.agent_names:
        model, tokenizer = _load(out / "hf" / name)
        assert tokenizer.chat_template is not None
        before = dict(initial[name][0].named_parameters())
        assert max(float((p.detach() - before[n].detach()).abs().max()) for n, p in model.named_parameters()) > 1e-4
    latest = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    assert latest.name == "global_step4"
    assert torch.load(latest / "trainer_state.pt", weights_only=False)["step"] == 4
    for name in cfg.agent_names:
        assert (latest / "agents" / name / "state").is_dir()

    evals = read_records(out / "eval.jsonl")
    assert [(r["step"], r["agent"]) for r in evals] == [(s, a) for s in (1, 2, 3, 4) for a in ("llama", "qwen")]
    from openrlhf_hacpo.data.prompts import load_prompt_dataset
    from openrlhf_hacpo.rollout import get_reward_fn

    eval_records = load_prompt_dataset(prompt_file, max_samples=4)
    reward = get_reward_fn(cfg.rewards.reward_fn)
    for rec in evals[-2:]:  # the last step's, made with the exported weights
        model, tokenizer = _load(out / "hf" / rec["agent"])
        responses = [_greedy(model, tokenizer, prompt_ids(tokenizer, r.prompt), cfg.prompts.generate_max_len)
                     for r in eval_records]
        expected = reward(responses, ["x"] * len(responses), [r.label for r in eval_records])
        assert rec["accuracy"] == pytest.approx(sum(v > 0 for v in expected) / len(expected))
        assert 0.0 <= rec["pass@1"] <= rec["pass@2"] <= 1.0

    # -- resume: 4 steps straight == 2 steps, then a resumed run from the step-2 checkpoint for 2 more steps
    # (evaluation samples under its own seeds, so it leaves the training's random state alone). The resumed run
    # loads the checkpoint the actors wrote into policies in this process (--no_ray): a checkpoint does not depend
    # on where its policies ran (resumes on actors: test_one_step_off.py, tests/multinode)
    resumed = tmp_path / "resumed"
    shutil.copytree(out / "checkpoints" / "global_step2", resumed / "checkpoints" / "global_step2")
    (resumed / "checkpoints" / "latest").write_text("global_step2\n")
    run(base_args(resumed, *common, "--resume", "--no_ray"))

    a = {(r["step"], r["agent"]): r for r in records}
    b = {(r["step"], r["agent"]): r for r in read_records(resumed / "metrics.jsonl")}
    assert sorted(b) == [(3, "llama"), (3, "qwen"), (4, "llama"), (4, "qwen")]
    for key, rec in b.items():
        for name, value in rec.items():
            if name.startswith(("time/", "rollout/tokens_per_s")) or not isinstance(value, float):
                continue
            assert value == pytest.approx(a[key][name], rel=1e-5, abs=1e-6), (key, name)
    for name in ("llama", "qwen"):
        wa, _ = _load(out / "hf" / name)
        wb, _ = _load(resumed / "hf" / name)
        pb = dict(wb.named_parameters())
        assert max(float((p.detach() - pb[n].detach()).abs().max()) for n, p in wa.named_parameters()) < 1e-6
    state = json.loads((resumed / "checkpoints" / "global_step4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["dataloader"]["position"] == 8


def test_three_agents_and_a_dead_actor(ray_cluster, tmp_path, tiny_agents, base_args):
    """Three agents, the third with two data-parallel workers (its own gloo group of two ranks)."""
    agents = _agents(tiny_agents, "llama", "qwen") + ["--agent", f"name=llama2,pretrain={tiny_agents['llama2']},"
                                                      "dp_size=2"]
    cfg = build_config(base_args(tmp_path, *agents, "--train_batch_size", "12", "--max_steps", "1",
                                 "--no_save_hf", "--micro_train_batch_size", "2"))
    controller = HACPOController(cfg)
    try:
        controller.fit()
        (records,) = controller.history
        assert [r["agent"] for r in records] == ["llama", "qwen", "llama2"]
        for rec in records:
            assert rec["view/num_rows"] == 3 * 2 * 4 and rec["updates"] == 2
            assert {k for k in rec if k.startswith("omega/")} == {f"omega/{n}" for n in cfg.agent_names
                                                                   if n != rec["agent"]}
        assert (tmp_path / "checkpoints" / "global_step1").is_dir()

        import ray

        ranks = [ray.get(p.state_dict_for_sync.remote()) for p in controller.groups[2].policies]
        assert len(ranks) == 2 and all(torch.equal(ranks[0][k], ranks[1][k]) for k in ranks[0])
        initial = _load(tiny_agents["llama2"])[0]
        assert max(float((ranks[0][n].double() - p.detach()).abs().max())
                   for n, p in initial.named_parameters()) > 1e-4

        ray.kill(controller.groups[1].policies[0])
        controller.cfg.train.max_steps = 2
        with pytest.raises(TrainingError, match=r"step 2 failed: agent 'qwen', policy rank 0, node .*, phase "
                                                r"(generate|update): the worker died .*global_step1.*--resume"):
            controller.fit()
    finally:
        controller.close()
