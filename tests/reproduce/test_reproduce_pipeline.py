"""reproduce_table1.sh: stage order, one evaluation per base model, resumption from done-markers and from run folders
stopped anywhere, shared baselines (a stand-in ``python3`` records every command and can be told to fail; the run
folder check, ``openrlhf_hacpo.reproduce.run_state``, runs for real)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "scripts" / "reproduce_table1.sh"
RUN_STATE = "openrlhf_hacpo.reproduce.run_state"


def _pipeline(tmp_path: Path, fail_on: str = "", **env: str) -> tuple[int, list[list[str]]]:
    """Run the script; returns (exit code, the python3 command lines of this run)."""
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(f"#!{sys.executable}\nimport json, os, runpy, sys\n"
                    f"if sys.argv[1:3] == ['-m', {RUN_STATE!r}]:\n"
                    f"    sys.argv = sys.argv[2:]\n"
                    f"    runpy.run_module({RUN_STATE!r}, run_name='__main__')\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
                    "fail = os.environ.get('FAIL_ON')\n"
                    "sys.exit(1 if fail and fail in ' '.join(sys.argv[1:]) else 0)\n")
    shim.chmod(0o755)
    # the stand-in is the script's Python (HACPO_PYTHON: taken as given, so no probe of it is recorded)
    full_env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
                "DATA_DIR": "/data", "FAIL_ON": fail_on, "HACPO_PYTHON": str(shim), **env}
    result = subprocess.run(["bash", str(SCRIPT)], env=full_env, capture_output=True, text=True)
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return result.returncode, calls


def _kind(call: list[str]) -> str:
    module = call[1].rsplit(".", 1)[-1]
    if module == "evaluate":
        return f"evaluate {call[call.index('--model') + 1] if '--model' in call else call[call.index('--run') + 1]}"
    if module == "train_hacpo":
        return f"train {call[call.index('--save_path') + 1]}"
    if module == "share":
        return f"share {call[call.index('--model') + 1]} -> {call[call.index('--output_dir') + 1]}"
    return module


@pytest.mark.integration
def test_stages_run_in_order_and_base_models_once(tmp_path):
    code, calls = _pipeline(tmp_path, PAIRS="qwen3_1.7b_4b qwen3_4b_llama3.2_3b", METHODS="hacpo gspo")
    assert code == 0
    out = tmp_path / "out"
    assert [_kind(c) for c in calls] == [
        "prepare",
        "evaluate Qwen/Qwen3-1.7B-Base", "evaluate Qwen/Qwen3-4B-Base", "evaluate meta-llama/Llama-3.2-3B-Instruct",
        f"train {out}/qwen3_1.7b_4b/hacpo", f"evaluate {out}/qwen3_1.7b_4b/hacpo",
        f"train {out}/qwen3_1.7b_4b/gspo", f"evaluate {out}/qwen3_1.7b_4b/gspo",
        f"train {out}/qwen3_4b_llama3.2_3b/hacpo", f"evaluate {out}/qwen3_4b_llama3.2_3b/hacpo",
        f"train {out}/qwen3_4b_llama3.2_3b/gspo", f"evaluate {out}/qwen3_4b_llama3.2_3b/gspo",
        "table",
    ]
    evaluation = calls[1]
    data = evaluation[evaluation.index("--data") + 1:evaluation.index("--data") + 8]
    assert data == [f"/data/{s}.jsonl" for s in ("math500", "math", "gsm8k", "aime25", "amc23", "minerva",
                                                  "olympiadbench")]
    assert calls[0][calls[0].index("--output_dir") + 1] == "/data"
    # fresh run folders: neither --resume nor --overwrite
    assert not any({"--resume", "--overwrite"} & set(c) for c in calls if _kind(c).startswith("train"))
    assert calls[-1][calls[-1].index("--results") + 1] == str(out / "eval")


@pytest.mark.integration
def test_a_rerun_continues_where_it_stopped(tmp_path):
    env = {"PAIRS": "qwen3_1.7b_4b", "METHODS": "hacpo gspo"}
    code, calls = _pipeline(tmp_path, fail_on="qwen3_1.7b_4b/gspo", **env)  # the second training run fails
    assert code != 0 and _kind(calls[-1]) == f"train {tmp_path}/out/qwen3_1.7b_4b/gspo"
    code, calls = _pipeline(tmp_path, **env)
    assert code == 0
    assert [_kind(c) for c in calls] == [f"train {tmp_path}/out/qwen3_1.7b_4b/gspo",
                                         f"evaluate {tmp_path}/out/qwen3_1.7b_4b/gspo", "table"]
    code, calls = _pipeline(tmp_path, **env)
    assert code == 0 and [_kind(c) for c in calls] == ["table"]
    (tmp_path / "out" / ".done" / "prepare").unlink()
    assert [_kind(c) for c in _pipeline(tmp_path, **env)[1]] == ["prepare", "table"]


@pytest.mark.integration
def test_flags_reach_their_commands(tmp_path):
    code, calls = _pipeline(tmp_path, PAIRS="qwen3_4b_instruct", METHODS="naive", PREPARE_FLAGS="--source_dir /hf",
                            EVAL_FLAGS="--vllm_num_engines 8", TRAIN_FLAGS="--max_steps 3")
    assert code == 0
    assert calls[0][-2:] == ["--source_dir", "/hf"]
    assert all(c[-2:] == ["--vllm_num_engines", "8"] or "--vllm_num_engines" in c
               for c in calls if _kind(c).startswith("evaluate"))
    (train,) = [c for c in calls if _kind(c).startswith("train")]
    assert train[-2:] == ["--max_steps", "3"] and "--algorithm" in train and "naive" in train


@pytest.mark.integration
def test_unknown_pair_or_method_stops_before_anything_runs(tmp_path):
    assert _pipeline(tmp_path, PAIRS="nopair") == (2, [])
    assert _pipeline(tmp_path, METHODS="hacpo ppo") == (2, [])


def _restart_flags(call: list[str]) -> list[str]:
    return [x for x in call if x in ("--resume", "--overwrite")]


@pytest.mark.integration
def test_a_rerun_restarts_a_run_that_stopped_before_its_first_checkpoint(tmp_path):
    """The run stopped after its step-0 validation: eval.jsonl and nothing to continue from. The trainer refuses
    --resume there; the rerun starts it over in its folder, and keeps the finished run."""
    env = {"PAIRS": "qwen3_1.7b_4b", "METHODS": "hacpo gspo"}
    code, _ = _pipeline(tmp_path, fail_on="qwen3_1.7b_4b/gspo", **env)
    assert code != 0
    run = tmp_path / "out" / "qwen3_1.7b_4b" / "gspo"
    run.mkdir(parents=True, exist_ok=True)
    (run / "eval.jsonl").write_text('{"step": 0, "agent": "Qwen3-4B-Base", "mean@1": 0.25}\n')
    (run / "train.log").write_text("stopped\n")
    code, calls = _pipeline(tmp_path, **env)
    assert code == 0
    train = [c for c in calls if _kind(c).startswith("train")]
    assert [_kind(c) for c in train] == [f"train {run}"]  # the finished hacpo run is not trained again
    assert _restart_flags(train[0]) == ["--overwrite"]


@pytest.mark.integration
def test_a_rerun_continues_from_a_checkpoint_and_starts_an_empty_folder(tmp_path):
    env = {"PAIRS": "qwen3_1.7b_4b", "METHODS": "hacpo gspo grpo"}
    out = tmp_path / "out" / "qwen3_1.7b_4b"
    state = out / "hacpo" / "checkpoints" / "global_step10"
    state.mkdir(parents=True)
    (state / "trainer_state.pt").write_bytes(b"")
    (out / "hacpo" / "eval.jsonl").write_text("{}\n")
    (out / "gspo" / "checkpoints" / ".global_step10.x1.tmp").mkdir(parents=True)  # a save killed half-way
    (out / "grpo").mkdir()
    code, calls = _pipeline(tmp_path, **env)
    assert code == 0
    flags = {_kind(c): _restart_flags(c) for c in calls if _kind(c).startswith("train")}
    assert flags == {f"train {out}/hacpo": ["--resume"], f"train {out}/gspo": ["--overwrite"],
                     f"train {out}/grpo": []}


@pytest.mark.integration
def test_shared_baselines_are_trained_once(tmp_path):
    code, calls = _pipeline(tmp_path, PAIRS="qwen3_1.7b_4b qwen3_4b_llama3.2_3b", METHODS="gspo hacpo",
                            SHARE_BASELINES="1")
    assert code == 0
    out = tmp_path / "out"
    kinds = [_kind(c) for c in calls]
    assert kinds[4:] == [
        f"train {out}/qwen3_1.7b_4b/gspo", f"evaluate {out}/qwen3_1.7b_4b/gspo",
        f"train {out}/qwen3_1.7b_4b/hacpo", f"evaluate {out}/qwen3_1.7b_4b/hacpo",
        f"train {out}/qwen3_4b_llama3.2_3b/gspo", f"evaluate {out}/qwen3_4b_llama3.2_3b/gspo",
        f"share Qwen/Qwen3-4B-Base -> {out}/eval/qwen3_4b_llama3.2_3b/gspo",
        f"train {out}/qwen3_4b_llama3.2_3b/hacpo", f"evaluate {out}/qwen3_4b_llama3.2_3b/hacpo",
        "table",
    ]
    agents = {_kind(c): [c[i + 1].split(",")[0] for i, x in enumerate(c) if x == "--agent"]
              for c in calls if _kind(c).startswith("train")}
    assert agents[f"train {out}/qwen3_4b_llama3.2_3b/gspo"] == ["name=Llama-3.2-3B-Instruct"]
    assert agents[f"train {out}/qwen3_4b_llama3.2_3b/hacpo"] == ["name=Qwen3-4B-Base", "name=Llama-3.2-3B-Instruct"]
    (share,) = [c for c in calls if _kind(c).startswith("share")]
    assert share[share.index("--results") + 1] == f"{out}/eval/qwen3_1.7b_4b/gspo"
    assert share[share.index("--pair") + 1] == "qwen3_4b_llama3.2_3b"
    # without the option every pair trains both agents
    (tmp_path / "again").mkdir()
    code, calls = _pipeline(tmp_path / "again", PAIRS="qwen3_1.7b_4b qwen3_4b_llama3.2_3b", METHODS="gspo")
    assert code == 0 and not any(_kind(c).startswith("share") for c in calls)
    assert len([c for c in calls if _kind(c).startswith("train") and c.count("--agent") == 2]) == 2
