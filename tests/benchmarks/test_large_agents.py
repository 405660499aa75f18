"""benchmarks/large_agents.py: the pure parts (resident-memory parsing, step-time median, the plan's per-worker
bytes, the report and its LoRA ratio, the trainer flags of every configuration), and one configuration run end to
end on the tiny agents without Ray."""
from __future__ import annotations

import json

import pytest
from benchmark_script import load_benchmark

from openrlhf_hacpo.utils.process_memory import (
    ProcessMemory,
    process_memory,
    status_bytes,
)

GIB = 2**30

STATUS = """Name:\tpython
VmPeak:\t 5025156 kB
VmSize:\t 4925000 kB
VmHWM:\t 1234567 kB
VmRSS:\t  654321 kB
Threads:\t4
"""


def _module():
    return load_benchmark("large_agents")


def test_status_fields_are_read_in_bytes():
    assert status_bytes(STATUS, "VmHWM") == 1234567 * 1024
    assert status_bytes(STATUS, "VmRSS") == 654321 * 1024
    assert status_bytes(STATUS, "VmSwap") is None
    with pytest.raises(ValueError, match="VmHWM.*expected '<number> kB'"):
        status_bytes("VmHWM:\t12 MB\n", "VmHWM")


def test_this_process_memory_is_its_high_water_mark():
    before = process_memory()
    held = bytearray(64 * 2**20)  # 64 MiB written: resident
    held[::4096] = b"x" * len(held[::4096])
    after = process_memory()
    assert isinstance(after, ProcessMemory) and after.peak_rss_bytes >= before.peak_rss_bytes
    if after.rss_bytes is not None:  # Linux: VmHWM >= VmRSS, and the new pages count
        assert after.peak_rss_bytes >= after.rss_bytes >= 64 * 2**20
    del held


def test_median_step_time_leaves_out_the_first_step():
    bench = _module()
    history = [[{"time/step": 30.0}, {"time/step": 30.0}], [{"time/step": 4.0}], [{"time/step": 6.0}],
               [{"time/step": 5.0}]]
    assert bench.median_step_seconds(history) == 5.0
    assert bench.median_step_seconds(history[:1]) == 30.0
    assert bench.median_step_seconds([]) is None


def test_plan_worker_bytes_leave_the_reference_out():
    bench = _module()
    from openrlhf_hacpo.trainer.memory_layout import AgentLayout
    from openrlhf_hacpo.trainer.memory_rows import plan_agent
    from openrlhf_hacpo.trainer.memory_sizes import REDUCE_BUCKET_ELEMENTS, ModelShape

    shape = ModelShape(model_type="llama", vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                       intermediate=128, tied=True)
    P = 138048  # tests/trainer/test_memory_plan.py counts it by hand
    layout = AgentLayout("a", shape, dp=1, zero_stage=2, bf16=False, micro_batch=2, prompt_len=8, response_len=8)
    # on a CPU only the written part of DeepSpeed's reduce bucket is resident: the P gradients that pass through it
    on_cpu = bench.cpu_layout(layout)
    assert layout.bucket_elements == REDUCE_BUCKET_ELEMENTS and on_cpu.bucket_elements == P
    row = plan_agent(on_cpu, None)[0]
    got = bench.plan_worker_bytes(row, on_cpu)
    # fp32 ZeRO-2 on one rank, backward pass: weights 4P + fp32 master clone 4P + gradient partition 4P + bucket 4P
    # + Adam 8P; the reference 4P is not the worker's
    assert row.phase == "train"
    assert got["states"] == 24 * P and row.reference == 4 * P
    assert got["activations"] == row.activations + row.logprobs and got["host"] == 0
    assert got["total"] == 24 * P + row.activations + row.logprobs
    offload = bench.cpu_layout(AgentLayout("a", shape, dp=1, zero_stage=2, bf16=False, adam_offload=True,
                                           micro_batch=2, prompt_len=8, response_len=8))
    got = bench.plan_worker_bytes(plan_agent(offload, None)[0], offload)
    # here: weights 4P, bucket 4P and the copy buffer of the largest parameter (the 1000 x 64 embedding) 4 x 64000;
    # host: master 4P, Adam 8P, fp32 gradients 4P, the copy-back buffer 4P and the host copy buffer 4 x 64000
    assert got["states"] == 8 * P + 256000 and got["host"] == 20 * P + 256000
    with pytest.raises(ValueError, match="ref_reward_offload"):
        bench.plan_worker_bytes(row, AgentLayout("a", shape, ref_reward_offload=True))


def test_replan_keeps_the_measurements_and_recomputes_the_plan(tmp_path, monkeypatch):
    bench = _module()
    measured = {"workers": {"smollm2": _worker(134_515_008, 134_515_008, 4 * GIB)},
                "plan": {"smollm2": {"states": 1, "activations": 1, "host": 0, "total": 2}},
                "reference_workers": {"smollm2": 1}, "step_seconds": 12.0, "tree_peak_rss_bytes": 9 * GIB}
    meta = {"command": "python benchmarks/large_agents.py", "time": "2026-12-02T08:47:28",
            "baseline_peak_rss_bytes": GIB // 2}
    (tmp_path / "large_agents_cpu.json").write_text(json.dumps({"meta": meta, "results": {"full": measured}}))
    seen = []
    monkeypatch.setattr(bench, "prepare_inputs", lambda: ({"smollm2": "models/smollm2"}, "prompts.jsonl"))
    monkeypatch.setattr(bench, "plan_for_flags", lambda flags: seen.append(flags) or {
        "smollm2": {"states": 3 * GIB, "activations": GIB, "host": 0, "total": 4 * GIB}})
    assert bench.replan(tmp_path, "python benchmarks/large_agents.py --replan") == 0
    written = json.loads((tmp_path / "large_agents_cpu.json").read_text())
    assert written["results"]["full"]["workers"] == measured["workers"]
    assert written["results"]["full"]["plan"]["smollm2"]["total"] == 4 * GIB
    assert written["meta"]["replanned"]["command"] == "python benchmarks/large_agents.py --replan"
    assert seen and "--agent" in seen[0] and "name=smollm2,pretrain=models/smollm2" in seen[0]
    text = (tmp_path / "large_agents_cpu.md").read_text()
    assert "| full-parameter | smollm2 | 134,515,008 | 134,515,008 | 4.00 | 3.50 | 4.00 (3.00 + 1.00 + 0.00) |" in text
    assert "measured figure (peak RSS, step, run tree) is from the run of 2026-12-02T08:47:28" in text


def _worker(params, trainable, peak):
    return {"parameters": params, "trainable_parameters": trainable, "peak_rss_bytes": peak}


def test_report_rows_and_the_lora_target():
    bench = _module()
    plan = {"smollm2": {"states": 2 * GIB, "activations": GIB, "host": 0, "total": 3 * GIB}}
    results = {
        "full": {"workers": {"smollm2": _worker(134_515_008, 134_515_008, 4 * GIB)}, "plan": plan,
                 "reference_workers": {"smollm2": 1}, "step_seconds": 12.34, "tree_peak_rss_bytes": 9 * GIB},
        "lora": {"workers": {"smollm2": _worker(134_515_008, 4_884_480, int(1.5 * GIB))}, "plan": plan,
                 "reference_workers": {"smollm2": 0}, "step_seconds": None, "tree_peak_rss_bytes": None},
    }
    text = bench.format_report(results, {"command": "python benchmarks/large_agents.py",
                                         "baseline_peak_rss_bytes": GIB // 2})
    rows = [line for line in text.splitlines() if line.startswith("| full") or line.startswith("| LoRA")]
    # peak / plan = 4 / 3; above the baseline / plan = 3.5 / 3
    assert rows[0] == ("| full-parameter | smollm2 | 134,515,008 | 134,515,008 | 4.00 | 3.50 | 3.00 (2.00 + 1.00 + "
                       "0.00) | 1.33 | 1.17 | 1 | 12.3 | 9.00 |")
    assert rows[1].startswith("| LoRA r=16 | smollm2 | 134,515,008 | 4,884,480 | 1.50 | 1.00 |")
    assert rows[1].endswith("| 0.50 | 0.33 | 0 | – | – |")
    # 1.5 / 4 = 0.375 of the whole peak; (1.5 - 0.5) / (4 - 0.5) = 0.286 above the baseline
    assert "LoRA / full-parameter: 0.38** (target ≤ 0.50: met); above the baseline: 0.29." in text
    assert bench.lora_ratio({"full": results["full"]}) is None


def test_every_configuration_builds_a_valid_trainer_config(tiny_agents, prompt_file, tmp_path):
    bench = _module()
    from openrlhf_hacpo.cli.train_hacpo import build_config

    models = {"llama": tiny_agents["llama"], "qwen": tiny_agents["qwen"]}
    for name, configuration in bench.CONFIGURATIONS.items():
        cfg = build_config(bench.trainer_flags(models, prompt_file, str(tmp_path / name), configuration))
        agents = cfg.resolved_agents
        assert cfg.cluster.use_ray and cfg.train.train_batch_size == 2 * 2 * 4 and cfg.algo.loss_name == "hacpo"
        assert not cfg.outputs.save_hf and not cfg.outputs.save_final_checkpoint
        assert [a.lora_rank for a in agents] == [16 if name == "lora" else 0] * 2
        assert [a.adam_offload for a in agents] == [name == "adam_offload"] * 2


@pytest.mark.integration
def test_one_configuration_runs_and_reports_its_workers(tiny_agents, prompt_file, tmp_path):
    """The child's work on one tiny agent without Ray (the worker is this process): the LoRA count of a rank-16
    adapter on every linear layer by hand, a peak RSS, a step time and the plan's bytes."""
    bench = _module()
    settings = bench.RunSettings(steps=2, prompts_per_step=2, group_size=2, prompt_max_len=64, generate_max_len=4,
                                 micro_train_batch_size=4)
    flags = bench.trainer_flags({"llama": tiny_agents["llama"]}, prompt_file, str(tmp_path / "run"),
                                bench.CONFIGURATIONS["lora"], settings, use_ray=False)
    result = bench.run_configuration(flags + ["--algorithm", "gspo"])
    worker = result["workers"]["llama"]
    # the tiny llama of tests/conftest.py: hidden 32, 2 layers, 2 heads of 32, 1 KV head, MLP 64; all-linear:
    # q 32->64, k 32->32, v 32->32, o 64->32, gate 32->64, up 32->64, down 64->32
    per_layer = 16 * ((32 + 64) + (32 + 32) + (32 + 32) + (64 + 32) + 3 * (32 + 64))
    assert worker["trainable_parameters"] == 2 * per_layer < worker["parameters"]
    assert worker["peak_rss_bytes"] >= (worker["rss_bytes"] or 0) > 0
    assert result["reference_workers"] == {"llama": 0} and result["steps"] == 2
    assert result["step_seconds"] == result["step_times"][1] > 0
    assert result["plan"]["llama"]["total"] > 0
