"""Training through the plain worker classes in the test process (``--no_ray``): DeepSpeed engines on CPU (gloo),
one worker per agent. Covers update equivalences, the non-finite-loss skip and the bad-input errors."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from loss_injection import nan_loss_at
from openrlhf_hacpo.algorithms import CapabilityRatios
from openrlhf_hacpo.cli.train_hacpo import build_config, run
from openrlhf_hacpo.rollout import RewardFunctionError
from openrlhf_hacpo.trainer.controller import HACPOController
from openrlhf_hacpo.utils.jsonl import read_records

# DeepSpeed's ZeRO code calls torch.distributed collectives that torch marks as deprecated
pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def _weights(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest elementwise difference over the parameters of ``b`` (``a`` may also hold tied aliases)."""
    assert set(b) <= set(a)
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def _relative_change(a, b, ref) -> float:
    num = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a) ** 0.5
    den = sum(float(((a[k] - ref[k]) ** 2).sum()) for k in a) ** 0.5
    return num / den


def test_one_agent_hacpo_matches_gspo(tmp_path, tiny_agents, base_args):
    """With a single agent HACPO has no foreign rows and a group of its own G responses: same update as GSPO.

    Two steps of two updates each (m = 0, 1) and a positive KL coefficient (reference worker) are exercised."""
    results = {}
    for algorithm in ("hacpo", "gspo"):
        out = tmp_path / algorithm
        controller = run(base_args(out, "--no_ray", "--algorithm", algorithm, "--agent",
                                   f"name=llama,pretrain={tiny_agents['llama']}", "--train_batch_size", "4",
                                   "--max_steps", "2", "--init_kl_coef", "0.05"))
        results[algorithm] = (_weights(out / "hf" / "llama"), controller.history[-1][0])
    initial = _weights(tiny_agents["llama"])
    (w_hacpo, rec_hacpo), (w_gspo, rec_gspo) = results["hacpo"], results["gspo"]
    assert _max_diff(w_hacpo, initial) > 1e-4  # the step did move the weights
    assert _max_diff(w_hacpo, w_gspo) < 1e-7
    assert rec_hacpo["updates"] == rec_gspo["updates"] == 2
    assert rec_hacpo["policy/kl"] == pytest.approx(rec_gspo["policy/kl"]) and rec_hacpo["policy/kl"] > 0
    assert rec_hacpo["loss"] == pytest.approx(rec_gspo["loss"], abs=1e-7)


def test_micro_batches_and_zero_stages_give_the_same_update(tmp_path, tiny_agents, base_args):
    """One step of two agents, compared with the reference run (micro-batches of 4 rows, ZeRO-2):
    * micro-batches of 1 row inside the 4-row update give the same step: loss denominators are the mini-batch
      totals, so the micro-batch losses sum to the mini-batch loss;
    * ZeRO 0 and 3 partition the same optimizer differently than ZeRO-2; the update must not change."""
    weights = {}
    for arm, extra in (("reference", ()), ("micro1", ("--micro_train_batch_size", "1")),
                       ("zero0", ("--zero_stage", "0")), ("zero3", ("--zero_stage", "3"))):
        out = tmp_path / arm
        run(base_args(out, "--no_ray", *_agent(tiny_agents, "qwen"), *_agent(tiny_agents), "--train_batch_size", "8",
                      "--max_steps", "1", *extra))
        weights[arm] = _weights(out / "hf" / "qwen")
    initial = _weights(tiny_agents["qwen"])
    for arm in ("micro1", "zero0", "zero3"):
        assert _relative_change(weights[arm], weights["reference"], initial) < 1e-3, arm


@pytest.mark.parametrize("extra", [
    ["--algorithm", "grpo", "--train_batch_size", "4"],
    ["--algorithm", "naive"],
    ["--algorithm", "hacpo-no-clip", "--max_epochs", "2", "--minibatch_order", "shuffle"],
    ["--bf16", "--gradient_checkpointing", "--eos_policy", "keep", "--temperature", "0.7"],
    ["--eos_policy", "text", "--save_rollouts"],
])
def test_algorithms_and_precisions_train(tmp_path, tiny_agents, base_args, extra):
    controller = run(base_args(tmp_path, "--no_ray", *_agent(tiny_agents), *_agent(tiny_agents, "qwen"),
                               "--train_batch_size", "8", "--max_steps", "1", "--no_save_hf", *extra))
    cfg = controller.cfg
    for rec in controller.history[0]:
        assert rec["updates"] == cfg.updates_per_step
        assert rec["view/num_rows"] == cfg.rows_per_learner
        assert all(v is None or isinstance(v, str) or v == v for v in rec.values())  # no NaN
        assert 0.0 <= rec["perf/pad_frac_scoring"] < 1.0 and 0.0 <= rec["perf/pad_frac_update"] < 1.0
    weights = controller.groups[0].weights()
    initial = _weights(tiny_agents["llama"])
    assert _max_diff({k: v.float() for k, v in weights.items()}, initial) > 1e-4


def test_nonfinite_loss_skips_the_update_and_counts_it(tmp_path, tiny_agents, base_args):
    args = base_args(tmp_path, "--no_ray", "--algorithm", "gspo", "--agent",
                     f"name=llama,pretrain={tiny_agents['llama']}", "--train_batch_size", "8", "--max_steps", "1")
    controller = HACPOController(build_config(args))
    try:
        controller.setup()
        nan_loss_at(controller.groups[0].policies[0], step=1, update_index=0)
        controller.fit()
        record = controller.history[0][0]
        assert record["skipped_updates"] == 1 and record["skipped_updates/step"] == 1
        assert _max_diff(controller.groups[0].weights(), _weights(tiny_agents["llama"])) == 0.0
        controller.cfg.train.max_steps = 2  # one more, clean step: the update happens, the counter stays
        controller.fit()
        record = controller.history[1][0]
        assert record["skipped_updates"] == 1 and record["skipped_updates/step"] == 0
        assert _max_diff(controller.groups[0].weights(), _weights(tiny_agents["llama"])) > 1e-4
    finally:
        controller.close()
    logged = read_records(tmp_path / "metrics.jsonl")
    assert [r["skipped_updates"] for r in logged] == [1, 1]


# ---------------------------------------------------------------------------------------------------- bad input
def _agent(tiny_agents, name="llama"):
    return ["--agent", f"name={name},pretrain={tiny_agents[name]}"]


def test_missing_model_or_tokenizer_path_names_the_agent(tmp_path, tiny_agents, base_args):
    with pytest.raises(FileNotFoundError, match=r"agent 'ghost'.*does not exist"):
        run(base_args(tmp_path, "--no_ray", "--agent", f"name=ghost,pretrain={tmp_path / 'nowhere'}",
                      "--train_batch_size", "8"))
    with pytest.raises(FileNotFoundError, match=r"agent 'llama': tokenizer path .*no_tokenizer.* does not exist"):
        run(base_args(tmp_path, "--no_ray", "--agent",
                      f"name=llama,pretrain={tiny_agents['llama']},tokenizer={tmp_path / 'no_tokenizer'}",
                      "--train_batch_size", "8"))


def test_missing_weights_name_the_agent(tmp_path, tiny_agents, base_args):
    only_tokenizer = tmp_path / "tok_only"
    shutil.copytree(tiny_agents["llama"], only_tokenizer)
    (only_tokenizer / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"agent 'half'.*cannot load the model"):
        run(base_args(tmp_path, "--no_ray", "--agent", f"name=half,pretrain={only_tokenizer}",
                      "--train_batch_size", "8"))


def test_tokenizer_without_chat_template_is_reported(tmp_path, tiny_agents, base_args):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_agents["qwen"], bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"agent 'bare'.*no chat template.*--apply_chat_template"):
        run(base_args(tmp_path, "--no_ray", *_agent(tiny_agents), "--agent", f"name=bare,pretrain={bare}",
                      "--train_batch_size", "8"))


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ('{"question": "Q: 1+1=?", "label": "2"}\n' * 4, "no input key 'input'"),
    ('{"input": "Q: 1+1=?", "answer": "2"}\n' * 4, "no label key 'label'"),
])
def test_bad_dataset_is_reported_with_its_file(tmp_path, tiny_agents, base_args, content, message):
    data = tmp_path / "prompts.jsonl"
    data.write_text(content)
    args = base_args(tmp_path, "--no_ray", *_agent(tiny_agents), "--train_batch_size", "8")
    args[args.index("--prompt_data") + 1] = str(data)
    with pytest.raises(ValueError, match=message) as info:
        run(args)
    assert "prompts" in str(info.value)


@pytest.mark.parametrize("body, message", [
    ("def reward_func(queries, prompts, labels):\n    raise RuntimeError('verifier crashed')\n",
     r"step 1: reward_func in .*bad_reward\.py raised RuntimeError: verifier crashed"),
    ("def reward_func(queries, prompts, labels):\n    return [1.0]\n",
     r"step 1: reward_func in .*bad_reward\.py returned 1 rewards for 8 samples"),
])
def test_reward_function_errors_are_reported(tmp_path, tiny_agents, base_args, body, message):
    reward = tmp_path / "bad_reward.py"
    reward.write_text(body)
    args = base_args(tmp_path, "--no_ray", *_agent(tiny_agents), "--train_batch_size", "8", "--max_steps", "1")
    args[args.index("--reward_fn") + 1] = str(reward)
    with pytest.raises(RewardFunctionError, match=message):
        run(args)


def test_resume_rejects_a_checkpoint_of_other_agents(tmp_path, tiny_agents, base_args, one_step_llama_run):
    shutil.copytree(one_step_llama_run, tmp_path / "run")  # the shared run folder stays as it was
    with pytest.raises(ValueError, match=r"holds agents \['llama'\]"):
        run(base_args(tmp_path / "run", "--no_ray", *_agent(tiny_agents, "qwen"), "--train_batch_size", "8",
                      "--max_steps", "2", "--resume"))


def test_no_final_checkpoint_writes_the_hf_checkpoints_only(tmp_path, tiny_agents, base_args, one_step_llama_run):
    """--no_final_checkpoint: a finished run leaves hf/<agent>/ and no joint checkpoint; by default the end of the
    run is a joint checkpoint that --resume continues from (the shared one-step run of tests/trainer/conftest.py)."""
    run(base_args(tmp_path / "skip", "--no_ray", *_agent(tiny_agents), "--train_batch_size", "8", "--max_steps", "1",
                  "--no_final_checkpoint"))
    assert (tmp_path / "skip" / "hf" / "llama" / "config.json").is_file()
    assert not (tmp_path / "skip" / "checkpoints").exists() or not any((tmp_path / "skip" / "checkpoints").iterdir())
    assert (one_step_llama_run / "checkpoints" / "latest").read_text().strip() == "global_step1"


@pytest.mark.parametrize("kernel_backend", ["torch", "triton"])
def test_worker_update_equals_a_hand_written_gspo_step(tmp_path, tiny_agents, base_args, prompt_file, kernel_backend):
    """The policy worker's GSPO update on its own rollouts (DeepSpeed ZeRO-2, two micro-batches) is one hand-written
    step on a copy of the initial model: group-normalised rewards (eq. 6 with one agent), the sequence ratio of
    eq. 25 computed from a plain forward pass, the mean over sequences, torch Adam. The gradient norm before
    clipping checks the scale of the gradient (Adam's first step is scale-free), the parameter change its direction.
    Both kernel backends (the Triton kernels run in Triton's interpreter on CPU).
    """
    import copy

    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker
    from openrlhf_hacpo.data.prompts import load_prompt_dataset
    from openrlhf_hacpo.engines.base import SamplingConfig

    cfg = build_config(base_args(tmp_path, "--no_ray", "--algorithm", "gspo", "--agent",
                                 f"name=qwen,pretrain={tiny_agents['qwen']}", "--train_batch_size", "8",
                                 "--micro_train_batch_size", "4", "--lr_scheduler", "constant",
                                 "--adam_betas", "0.9", "0.99", "--max_norm", "100",
                                 "--kernel_backend", kernel_backend))
    worker = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=1)
    worker.setup()
    hand_model = copy.deepcopy(worker.model).float().train()
    initial = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    records = load_prompt_dataset(prompt_file, "input", "label", "train", None)[:2]
    trajectories = worker.rollout(records, SamplingConfig(n=4, max_new_tokens=8, seed=11), step=1).trajectories
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    for traj, reward in zip(trajectories, rewards):
        traj.reward = reward
    result = worker.train_step(trajectories, 1, CapabilityRatios(torch.ones(1, 1)))
    worker_grad_norm = result.metrics["grad_norm"][0]

    tokenizer = worker.tokenizer
    grouped = torch.tensor(rewards, dtype=torch.float64).view(2, 4)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
    loss = torch.zeros(())
    for i, traj in enumerate(trajectories):
        text = tokenizer.apply_chat_template(records[i // 4].prompt, add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        response = traj.action_token_ids()
        ids = torch.tensor([prompt + response])
        logits = hand_model(input_ids=ids).logits[0, len(prompt) - 1:-1]
        token_logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        mean_logp = token_logp.mean()
        ratio = torch.exp(mean_logp - mean_logp.detach())  # s = 1 with gradient ∇ mean log π (eq. 25)
        loss = loss - float(advantages[i]) * ratio / len(trajectories)
    optimizer = torch.optim.Adam(hand_model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    loss.backward()
    hand_grad_norm = float(torch.nn.utils.clip_grad_norm_(hand_model.parameters(), 100.0))
    optimizer.step()

    assert hand_grad_norm > 1e-3
    assert worker_grad_norm == pytest.approx(hand_grad_norm, rel=1e-4)
    hand = {n: p.detach() for n, p in hand_model.named_parameters()}
    trained = {n: p.detach() for n, p in worker.model.named_parameters()}
    assert _relative_change(trained, hand, initial) < 1e-3
