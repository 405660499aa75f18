"""Errors a person can act on reach the command line as one line and exit status 2, wherever they arise (flags,
files, preflight, resume); ``--debug`` adds the traceback."""
from __future__ import annotations

from openrlhf_hacpo.cli.train_hacpo import main

from fault_inputs import write_file


def _one_line_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("train_hacpo: error: ")
    return lines[0]


def test_missing_prompt_file_is_one_line(tmp_path, run_args, capsys):
    args = run_args(tmp_path / "run")
    args[args.index("--prompt_data") + 1] = str(tmp_path / "absent.jsonl")
    assert main(args) == 2
    assert f"prompt file {tmp_path / 'absent.jsonl'} does not exist" in _one_line_error(capsys)


def test_agents_yaml_type_error_is_one_line(tmp_path, run_args, capsys, tiny_agents):
    agents = write_file(tmp_path, "agents.yaml",
                        f"- name: llama\n  pretrain: {tiny_agents['llama']}\n  dp_size: many\n")
    args = [a for a in run_args(tmp_path / "run") if not a.startswith(("--agent", "name=llama"))]
    assert main([*args, "--agents_config", agents]) == 2
    line = _one_line_error(capsys)
    assert "entry 0 (agent 'llama')" in line and "dp_size must be an int, got 'many'" in line


def test_corrupt_trainer_state_on_resume_is_one_line(tmp_path, run_args, capsys):
    checkpoint = tmp_path / "run" / "checkpoints" / "global_step1"
    (checkpoint / "agents" / "llama").mkdir(parents=True)
    (checkpoint / "trainer_state.pt").write_bytes(b"PK\x03\x04 torn zip")
    (checkpoint.parent / "latest").write_text("global_step1\n")
    assert main(run_args(tmp_path / "run", "--resume")) == 2
    line = _one_line_error(capsys)
    assert f"{checkpoint / 'trainer_state.pt'} is corrupt" in line


def test_debug_keeps_the_traceback(tmp_path, run_args, capsys):
    args = run_args(tmp_path / "run", "--debug")
    args[args.index("--prompt_data") + 1] = str(tmp_path / "absent.jsonl")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("train_hacpo: error: prompt file")
