"""Whole runs through the command line (``--no_ray``, one tiny agent): warnings for runs that do less than asked,
the run log, and a second command in the same folder that must neither destroy nor silently continue the run."""
from __future__ import annotations

import pytest

from openrlhf_hacpo.cli.train_hacpo import main
from openrlhf_hacpo.utils.jsonl import read_records

from fault_inputs import ZERO_REWARD, write_file

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_shortfalls_are_logged_and_a_finished_run_is_protected(tmp_path, run_args, capsys):
    run = tmp_path / "run"
    reward = write_file(tmp_path, "zero.py", ZERO_REWARD)
    args = run_args(run, "--max_samples", "4", "--max_steps", "6", "--reward_stall_steps", "2", "--save_steps", "1",
                    "--max_ckpt_num", "1")
    args[args.index("--reward_fn") + 1] = reward
    assert main(args) == 0
    log = (run / "train.log").read_text()
    # fewer steps than asked: announced at start with the numbers
    assert "--max_steps 6 asks for more steps than the data gives: 4 prompts // rollout_batch_size 2 = 2 step(s)" in log
    # all-zero rewards: a warning naming the agent and the reward function
    assert "agent 'llama': every reward was 0 for 2 steps in a row (up to step 2)" in log and reward in log
    # save messages reach the run log; pruning kept the newest checkpoint
    assert "saved joint checkpoint" in log and (run / "checkpoints" / "global_step2").is_dir()
    assert [r["step"] for r in read_records(run / "metrics.jsonl")] == [1, 2]
    capsys.readouterr()

    # the same command again: refused in one line, nothing touched (train.log only grows)
    before = {k: v for k, v in _tree(run).items() if k != "train.log"}
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a run" in err[0] and "--resume" in err[0] and "--overwrite" in err[0]
    assert {k: v for k, v in _tree(run).items() if k != "train.log"} == before

    # resuming with another seed: refused with the difference, before any worker starts
    changed = [*args, "--resume"]
    changed[changed.index("--seed") + 1] = "8"
    assert main(changed) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed: checkpoint 7, this run 8" in err[0]
    assert {k: v for k, v in _tree(run).items() if k != "train.log"} == before

    # resuming with the same settings: nothing left to do (the data gives 2 steps), the run log says so
    assert main([*args, "--resume"]) == 0
    assert "resumed from" in (run / "train.log").read_text()
    assert [r["step"] for r in read_records(run / "metrics.jsonl")] == [1, 2]
