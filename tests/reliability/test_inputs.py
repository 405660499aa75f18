"""Bad inputs that used to be accepted silently or reported late: each is an error (or a warning with the numbers)
before any worker starts, naming the file, line, agent or flag at fault."""
from __future__ import annotations

import json
import logging

import pytest

from openrlhf_hacpo.cli.train_hacpo import build_config, load_agents_file
from openrlhf_hacpo.data.prompts import load_prompt_dataset
from openrlhf_hacpo.trainer.controller import HACPOController
from openrlhf_hacpo.trainer.input_checks import planned_steps_message

from fault_inputs import write_file

GEOMETRY = ["--n_samples_per_prompt", "2", "--rollout_batch_size", "2", "--train_batch_size", "4",
            "--micro_train_batch_size", "2"]


def _flags(*extra: str) -> list[str]:
    return ["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", *GEOMETRY, *extra]


def test_non_utf8_prompt_line_names_file_line_and_column(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"input": "1+1", "label": "2"}\n{"input": "2+2", "label": "4"}\n{"input": "caf\xe9", "label": "1"}\n')
    with pytest.raises(ValueError, match=rf"{path}:3: byte 0xe9 at column 15 is not valid UTF-8"):
        load_prompt_dataset(path)
    whole = tmp_path / "prompts.json"
    whole.write_bytes(b'[\n {"input": "ok", "label": "1"},\n {"input": "\xff", "label": "2"}\n]\n')
    with pytest.raises(ValueError, match=rf"{whole}:3: byte 0xff at column 13"):
        load_prompt_dataset(whole)


@pytest.mark.parametrize("entry, message", [
    ("learning_rate: fast", r"entry 1 \(agent 'qwen'\): .*learning_rate must be a finite number, got 'fast'"),
    ("learning_rate: 1e-6", r"entry 1 \(agent 'qwen'\): .*YAML read learning_rate: 1e-6 as text"),
    ("zero_stage: two", r"entry 1 \(agent 'qwen'\): .*zero_stage must be an int, got 'two'"),
])
def test_agents_yaml_type_errors_name_the_entry_and_agent(tmp_path, entry, message):
    path = write_file(tmp_path, "agents.yaml",
                      f"agents:\n  - name: llama\n    pretrain: /m/llama\n  - name: qwen\n    pretrain: /m/qwen\n"
                      f"    {entry}\n")
    with pytest.raises(ValueError, match=message):
        load_agents_file(path)


@pytest.mark.parametrize("algorithm", ["gspo", "grpo", "hacpo"])
def test_one_sample_per_prompt_without_foreign_rows_is_an_error(algorithm):
    """G = 1 gives one-response groups, so every advantage is 0 (for hacpo: with a single agent)."""
    flags = ["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--algorithm", algorithm,
             "--n_samples_per_prompt", "1", "--rollout_batch_size", "2", "--train_batch_size", "2",
             "--micro_train_batch_size", "2"]
    with pytest.raises(ValueError, match=rf"n_samples_per_prompt=1 with algorithm='{algorithm}' and 1 agent"):
        build_config(flags)


def test_one_sample_per_prompt_is_fine_for_hacpo_with_two_agents():
    cfg = build_config(["--agent", "name=a,pretrain=/m", "--agent", "name=b,pretrain=/n", "--prompt_data", "x.jsonl",
                        "--n_samples_per_prompt", "1", "--rollout_batch_size", "2", "--train_batch_size", "4",
                        "--micro_train_batch_size", "2"])
    assert cfg.rollout.n_samples_per_prompt == 1


def test_learning_rate_zero_needs_an_explicit_flag():
    with pytest.raises(ValueError, match=r"agent 'a' has learning rate 0.*--allow_zero_lr"):
        build_config(_flags("--actor_learning_rate", "0"))
    with pytest.raises(ValueError, match=r"agent 'b' has learning rate 0"):
        build_config(_flags("--agent", "name=b,pretrain=/n,learning_rate=0.0"))
    assert build_config(_flags("--actor_learning_rate", "0", "--allow_zero_lr")).optim.allow_zero_lr


def test_reward_timeout_is_kept_without_reward_workers():
    cfg = build_config(_flags("--reward_num_workers", "0", "--reward_timeout", "5"))
    assert (cfg.rewards.reward_num_workers, cfg.rewards.reward_timeout) == (0, 5.0)


def test_max_steps_beyond_the_data_is_announced_with_the_numbers():
    message = planned_steps_message(max_steps=6, batches_per_epoch=2, num_episodes=1, num_prompts=4,
                                    rollout_batch_size=2)
    assert message is not None
    assert "--max_steps 6" in message and "4 prompts // rollout_batch_size 2 = 2 step(s)" in message
    assert "stops after 2" in message
    assert planned_steps_message(max_steps=2, batches_per_epoch=2, num_episodes=1, num_prompts=4,
                                 rollout_batch_size=2) is None


# ------------------------------------------------------------------------------ through the controller's preflight
def _controller(args) -> HACPOController:
    return HACPOController(build_config(args))


def test_chat_prompts_without_chat_template_fail_before_workers(tmp_path, run_args, prompt_file):
    args = [a for a in run_args(tmp_path) if a != "--apply_chat_template"]
    with pytest.raises(ValueError, match=rf"{prompt_file}: record 0 \(prompt_id 'p0'\) is a list of chat messages"
                                         r".*--apply_chat_template"):
        _controller(args).preflight()


@pytest.mark.parametrize("body", [
    "def reward_func(queries):\n    return [0.0] * len(queries)\n",
    "def reward_func(queries, prompts, labels, extra):\n    return [0.0] * len(queries)\n",
])
def test_reward_function_signature_is_checked_before_workers(tmp_path, run_args, body):
    reward = write_file(tmp_path, "bad_signature.py", body)
    args = run_args(tmp_path)
    args[args.index("--reward_fn") + 1] = reward
    with pytest.raises(ValueError, match=rf"reward file {reward}: reward_func.* cannot be called as "
                                         r"reward_func\(queries, prompts, labels\)"):
        _controller(args).preflight()


def test_shortfalls_are_logged_at_start(tmp_path, run_args, caplog):
    """max_steps beyond the data and prompts beyond --prompt_max_len: warnings with the numbers, before any worker."""
    args = run_args(tmp_path, "--max_steps", "6", "--num_episodes", "1")
    args[args.index("--prompt_max_len") + 1] = "5"
    with caplog.at_level(logging.INFO, logger="openrlhf_hacpo"):
        _controller(args).preflight()
    assert "--max_steps 6 asks for more steps than the data gives" in caplog.text
    assert "= 4 step(s)" in caplog.text
    assert "agent 'llama': 8 of 8 prompts are longer than --prompt_max_len 5 tokens" in caplog.text


def test_missing_labels_are_reported_before_workers(tmp_path, run_args):
    data = tmp_path / "unlabelled.jsonl"
    data.write_text("".join(json.dumps({"input": f"{i}+1=?"}) + "\n" for i in range(4)))
    args = run_args(tmp_path)
    args[args.index("--prompt_data") + 1] = str(data)
    with pytest.raises(ValueError, match=rf"{data}: record 0 has no label key 'label'"):
        _controller(args).preflight()


def test_drop_long_prompts_keeps_what_every_agent_renders_within_the_limit(tmp_path):
    """--drop_long_prompts: a prompt longer than --prompt_max_len in any agent's rendering is dropped for all agents.

    Two agents: the zoo's character tokenizer (one token per character) and its BPE tokenizer (never more tokens
    than characters), so the prompts the character tokenizer finds too long are exactly the ones dropped."""
    from openrlhf_hacpo.data.prompts import PromptRecord
    from openrlhf_hacpo.rollout import LearnerViewConfig
    from openrlhf_hacpo.trainer.input_checks import drop_long_prompts
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    texts = ["1+2=", "12+34=", "123+456=", "1234+5678=", "9+9="]  # 4, 6, 8, 10, 4 characters
    records = [PromptRecord(prompt_id=f"p{i}", prompt=t, label="0") for i, t in enumerate(texts)]
    view = LearnerViewConfig(eos_policy="drop", prompt_max_len=7, generate_max_len=8, apply_chat_template=False)
    char = build_tokenizer("char")
    lengths = [len(char(t, add_special_tokens=True)["input_ids"]) for t in texts]
    kept, counts = drop_long_prompts(records, {"char": char, "bpe": build_tokenizer("bpe")}, view)
    expected = [t for t, n in zip(texts, lengths) if n <= 7]
    assert [r.prompt for r in kept] == expected
    assert counts["char"] == sum(n > 7 for n in lengths) >= 2
    assert counts["bpe"] <= counts["char"]


def test_drop_long_prompts_flag_shrinks_the_data_before_workers(tmp_path, run_args, caplog):
    args = run_args(tmp_path, "--drop_long_prompts")
    args[args.index("--prompt_max_len") + 1] = "5"
    with caplog.at_level(logging.WARNING, logger="openrlhf_hacpo"):
        with pytest.raises(ValueError, match=r"0 prompts fit --prompt_max_len 5, fewer than rollout_batch_size"):
            _controller(args).preflight()
    assert "--drop_long_prompts: 8 of 8 prompts dropped" in caplog.text
