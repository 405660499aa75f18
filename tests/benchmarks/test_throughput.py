"""benchmarks/throughput.py: the summary, ratio and time-to-accuracy arithmetic on hand-made ``metrics.jsonl``
records (every expected figure computed by hand in the comments), the interleaved run order, records without the
newer keys, the report from run folders on disk, the commands of every configuration, and one short end-to-end
run of the ``model`` configuration (slow)."""
from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402
import throughput_report as report  # noqa: E402
import throughput_setups as setups  # noqa: E402
import throughput_stats as stats  # noqa: E402


def rec(step, agent, **values):
    """One metrics.jsonl record; keys given with '__' for '/' (time__step -> time/step)."""
    return {"step": step, "agent": agent, **{k.replace("__", "/"): v for k, v in values.items()}}


def gspo_run(step_seconds, *, gen=0.4, update=0.3):
    """Two agents alone on 8 own rows each, today's keys only (no perf/*, no time/scoring)."""
    out = []
    for step, t in enumerate(step_seconds, 1):
        for agent, tokens in (("a", 5.0), ("b", 10.0)):
            out.append(rec(step, agent, time__step=t, time__rollout_phase=0.5, time__reward=0.1,
                           time__train_phase=0.3, time__sync=0.05, time__generate=gen, time__logprob=0.1,
                           time__update=update, view__num_own_rows=8.0, view__num_rows=8.0,
                           view__response_tokens_mean=tokens, response__tokens_mean=tokens))
    return out


# ---------------------------------------------------------------------------------------------------------- math
def test_quantiles_by_hand():
    xs = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4
    assert stats.median(xs) == pytest.approx(2.5)      # h = 1.5
    assert stats.quantile(xs, 0.25) == pytest.approx(1.75)  # h = 0.75: 1 + 0.75 * (2 - 1)
    assert stats.quantile(xs, 0.75) == pytest.approx(3.25)  # h = 2.25
    assert stats.quantile([7.0], 0.25) == 7.0
    with pytest.raises(ValueError):
        stats.quantile([], 0.5)


def test_arm_summary_by_hand():
    # warm-up 1 drops step 1; run 1 keeps 1.0 3.0 2.0, run 2 keeps 4.0 1.5 2.5
    runs = [gspo_run([9.0, 1.0, 3.0, 2.0]), gspo_run([9.0, 4.0, 1.5, 2.5])]
    s = stats.summarize_arm(runs, warmup=1)
    assert s["steps"] == 6
    # sorted 1 1.5 2 2.5 3 4: median h = 2.5 -> 2.25; q1 h = 1.25 -> 1.5 + 0.25 * 0.5 = 1.625;
    # q3 h = 3.75 -> 2.5 + 0.75 * 0.5 = 2.875
    assert s["step_s"]["median"] == pytest.approx(2.25)
    assert s["step_s"]["q1"] == pytest.approx(1.625)
    assert s["step_s"]["q3"] == pytest.approx(2.875)
    assert s["step_s"]["iqr"] == pytest.approx(1.25)
    assert (s["step_s"]["min"], s["step_s"]["max"]) == (1.0, 4.0)
    # phases: rollout 0.5, reward 0.1, train 0.3, sync 2 x 0.05 = 0.1; other = T - 1.0, median of T - 1 = 1.25
    assert s["phases"]["time/sync"] == pytest.approx(0.1)
    assert s["phases"]["other"] == pytest.approx(1.25)
    # 16 rollouts per step over 6 steps = 96 in 14 s; generated tokens 5*8 + 10*8 = 120 per step -> 720 / 14
    assert s["rollouts_per_s"] == pytest.approx(96 / 14)
    assert s["tokens_generated_per_s"] == pytest.approx(720 / 14)
    assert s["tokens_trained_per_s"] == pytest.approx(720 / 14)  # trained rows = own rows here
    assert s["rows_trained"] == 16.0
    # not logged by these runs: None, never 0
    for key in ("rows_backward", "tokens_backward", "foreign_backward_share", "pad_frac_scoring",
                "pad_frac_update", "cuda_max_allocated_gib"):
        assert s[key] is None, key


def hacpo_run(step_seconds, backward=(20.0, 24.0)):
    """Two agents, 8 own + 8 foreign rows each, with the newer perf/* keys and time/scoring."""
    out = []
    for step, t in enumerate(step_seconds, 1):
        for agent, back in zip(("a", "b"), backward):
            out.append(rec(step, agent, time__step=t, time__rollout_phase=0.5, time__reward=0.1,
                           time__train_phase=0.6, time__sync=0.05, time__generate=0.4, time__scoring=0.08,
                           time__update=0.5, time__wait=0.02, view__num_own_rows=8.0, view__num_rows=16.0,
                           response__tokens_mean=4.0, perf__tokens_generated=30.0, perf__rows_trained=16.0,
                           perf__tokens_trained=100.0, perf__rows_backward=back / 2, perf__tokens_backward=back * 3,
                           perf__pad_frac_scoring=0.25 if agent == "a" else 0.15, perf__pad_frac_update=0.1,
                           perf__cuda_max_allocated_gib=1.5 if agent == "a" else 2.5,
                           policy__foreign_in_window_frac=0.5))
    return out


def test_newer_keys_are_read_and_ratios_by_hand():
    hacpo = stats.summarize_arm([hacpo_run([0.0, 3.0, 3.0])], warmup=1)
    # perf keys win over the fallbacks: generated 2 x 30 = 60 per step, 2 steps of 3 s -> 120 / 6
    assert hacpo["tokens_generated_per_s"] == pytest.approx(20.0)
    assert hacpo["tokens_trained_per_s"] == pytest.approx(200 * 2 / 6)
    assert hacpo["rows_backward"] == pytest.approx(22.0)  # 10 + 12
    assert hacpo["tokens_backward"] == pytest.approx(132.0)  # 60 + 72
    # backward rows 22 per step, 16 own rows always, 16 foreign rows: (22 - 16) / 16
    assert hacpo["foreign_backward_share"] == pytest.approx(6 / 16)
    assert hacpo["pad_frac_scoring"] == pytest.approx(0.2)
    assert hacpo["cuda_max_allocated_gib"] == 2.5

    gspo = stats.summarize_arm([gspo_run([0.0, 2.0, 2.0])], warmup=1)
    gspo["peak_rss_gib"], hacpo["peak_rss_gib"] = 2.0, 3.0
    r = stats.arm_ratios(hacpo, gspo)
    assert r["step_s.median"] == pytest.approx(1.5)            # 3 / 2
    assert r["rollouts_per_s"] == pytest.approx((16 / 3) / (16 / 2))
    assert r["tokens_generated_per_s"] == pytest.approx(20.0 / 60.0)  # GSPO: 120 per 2 s
    assert r["phases.time/train_phase"] == pytest.approx(2.0)  # 0.6 / 0.3
    assert r["peak_rss_gib"] == pytest.approx(1.5)
    assert r["rows_backward"] is None and r["cuda_max_allocated_gib"] is None  # GSPO lacks them


def test_agent_phase_columns_follow_the_records():
    keys = stats.agent_phase_keys(hacpo_run([1.0]) + [rec(1, "a", time__step=1.0, time__repack=0.1)])
    # known phases in their order, the unknown one after them; step-level keys are not per-agent phases
    assert keys == ["time/generate", "time/scoring", "time/update", "time/sync", "time/wait", "time/repack"]
    agents = stats.summarize_agents([hacpo_run([1.0, 2.0])], warmup=0)
    assert agents["a"]["phases"]["time/scoring"] == pytest.approx(0.08)
    assert agents["a"]["perf/pad_frac_scoring"] == pytest.approx(0.25)
    assert agents["b"]["perf/rows_backward"] == pytest.approx(12.0)


def test_missing_keys_never_crash():
    bare = [rec(s, a, time__step=float(s)) for s in (1, 2, 3) for a in ("a", "b")]
    s = stats.summarize_arm([bare], warmup=1)
    assert s["step_s"]["median"] == pytest.approx(2.5)
    assert s["phases"]["time/reward"] is None and s["phases"]["other"] is None
    assert s["rollouts_per_s"] is None and s["tokens_trained_per_s"] is None
    with pytest.raises(ValueError, match="time/step"):
        stats.summarize_arm([[rec(2, "a", time__generate=1.0)]], warmup=1)
    with pytest.raises(ValueError, match="no step after"):
        stats.summarize_arm([bare], warmup=3)
    with pytest.raises(ValueError, match="record 0"):
        stats.steps_of([{"agent": "a"}], 0)


def test_evaluation_flags_are_dropped():
    argv = ["--agent", "a", "--eval_data", "e.jsonl", "--eval_steps", "10", "--eval_before_training", "--seed", "1",
            "--adam_betas", "0.9", "0.99", "--eval_x=3", "--no_save_hf"]
    assert setups.without_eval_flags(argv) == ["--agent", "a", "--seed", "1", "--adam_betas", "0.9", "0.99",
                                               "--no_save_hf"]


def test_interleaved_order():
    assert setups.interleave(["a", "b", "c"], 3) == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"),
                                                     (2, "a"), (2, "b"), (2, "c")]
    assert setups.interleave(["a"], 1) == [(0, "a")]
    with pytest.raises(ValueError):
        setups.interleave(["a", "a"], 1)
    with pytest.raises(ValueError):
        setups.interleave(["a"], 0)


def test_time_to_reach_by_hand():
    curve = [(0, 0.10), (10, 0.20), (20, 0.35), (30, 0.30)]
    seconds = {t: 0.5 if t <= 10 else 1.0 for t in range(1, 31)}
    # first evaluation >= 0.3 is step 20: 10 x 0.5 + 10 x 1.0
    assert stats.time_to_reach(curve, seconds, 0.3) == {"step": 20, "accuracy": 0.35, "seconds": 15.0}
    assert stats.time_to_reach(curve, seconds, 0.1)["seconds"] == 0.0  # reached before training
    assert stats.time_to_reach(curve, seconds, 0.4) is None
    with pytest.raises(ValueError, match="no time/step"):
        stats.time_to_reach(curve, {1: 1.0}, 0.2)


# ---------------------------------------------------------------------------------------------------------- reports
def _fake_run(root: Path, arm: str, rnd: int, records, *, rss: float, summary=None) -> None:
    out = throughput.run_dir(root, arm, rnd)
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (out / "summary.json").write_text(json.dumps(summary))
    (out.parent / f"round{rnd}.json").write_text(json.dumps({"status": 0, "wall_seconds": 10.0, "peak_rss_gib": rss,
                                                             "peak_pss_gib": rss / 2}))


@pytest.mark.integration
def test_report_from_run_folders(tmp_path):
    setup = setups.make_setup("three")
    order = setups.interleave(["gspo", "hacpo", "hacpo-n2"], 2)
    _fake_run(tmp_path, "gspo", 0, gspo_run([9.0, 2.0, 2.0]), rss=2.0)
    _fake_run(tmp_path, "gspo", 1, gspo_run([9.0, 2.0, 2.0]), rss=2.5)
    _fake_run(tmp_path, "hacpo", 0, hacpo_run([9.0, 3.0, 3.0]), rss=3.0)
    _fake_run(tmp_path, "hacpo", 1, hacpo_run([9.0, 3.0, 3.0]), rss=3.0)
    _fake_run(tmp_path, "hacpo-n2", 0, hacpo_run([9.0, 2.4, 2.4]), rss=3.0)
    _fake_run(tmp_path, "hacpo-n2", 1, hacpo_run([9.0, 2.4, 2.4]), rss=3.0)
    payload = throughput.build_payload(setup, order, tmp_path, steps=3, warmup=1, rounds=2, command="x")
    assert payload["arms"]["gspo"]["peak_rss_gib"] == 2.5  # max over rounds
    assert payload["arms"]["hacpo"]["run_medians"] == [3.0, 3.0]
    assert payload["arms"]["hacpo"]["ratios"]["step_s.median"] == pytest.approx(1.5)
    assert payload["arms"]["hacpo"]["ratios"]["peak_rss_gib"] == pytest.approx(1.2)
    assert any("**1.250**" in n for n in payload["notes"])  # N = 3 / N = 2: 3.0 / 2.4
    md = report.format_report(payload)
    # GSPO logs no backward rows and no scoring phase: shown as –; the newer columns appear for HACPO
    gspo_line = next(line for line in md.splitlines() if line.startswith("| GSPO |") and "rollouts" not in line
                     and line.count("|") > 12)
    assert "–" in gspo_line
    assert "scoring" in md and "wait" in md and "GPU max alloc" in md
    assert json.loads(json.dumps(payload)) == payload  # JSON-safe
    png = report.plot_report(payload)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"

    with pytest.raises(FileNotFoundError, match="naive round 0"):
        throughput.build_payload(setup, [(0, "gspo"), (0, "naive")], tmp_path, steps=3, warmup=1, rounds=1,
                                 command="x")
    with pytest.raises(ValueError, match="gspo"):
        throughput.build_payload(setup, [(0, "hacpo")], tmp_path, steps=3, warmup=1, rounds=1, command="x")


@pytest.mark.integration
def test_mismatch_columns_and_their_cost_by_hand(tmp_path):
    """The own rows' mismatch per agent (mean over the measured steps) and the metrics' cost as the step of an arm
    over that of the same arm with --no_mismatch_metrics, minus 1."""
    def with_mismatch(records, gaps):
        for r in records:  # agent a logs gaps[step], agent b ten times that; the warm-up step is dropped
            scale = 1.0 if r["agent"] == "a" else 10.0
            r.update({"mismatch/mean_abs": scale * gaps[r["step"]], "mismatch/max_abs": 100 * scale * gaps[r["step"]],
                      "mismatch/k3_kl": 1e-3 * scale * gaps[r["step"]]})
        return records

    setup = setups.make_setup("three")
    order = setups.interleave(["gspo", "hacpo", "hacpo-no-mismatch"], 1)
    _fake_run(tmp_path, "gspo", 0, gspo_run([9.0, 2.0, 2.0]), rss=2.0)
    _fake_run(tmp_path, "hacpo", 0, with_mismatch(hacpo_run([9.0, 2.1, 2.1]), {1: 5.0, 2: 1e-7, 3: 3e-7}), rss=3.0)
    _fake_run(tmp_path, "hacpo-no-mismatch", 0, hacpo_run([9.0, 2.0, 2.0]), rss=3.0)
    payload = throughput.build_payload(setup, order, tmp_path, steps=3, warmup=1, rounds=1, command="x")
    agents = payload["arms"]["hacpo"]["agents"]
    assert agents["a"]["mismatch/mean_abs"] == pytest.approx(2e-7)   # (1e-7 + 3e-7) / 2, step 1 dropped
    assert agents["b"]["mismatch/max_abs"] == pytest.approx(2e-4)    # 100 * 10 * 2e-7
    assert agents["a"]["mismatch/k3_kl"] == pytest.approx(2e-10)
    assert payload["arms"]["hacpo-no-mismatch"]["agents"]["a"]["mismatch/mean_abs"] is None
    assert ARM_NOTE_COST in " ".join(payload["notes"])               # 2.1 / 2.0 - 1 = +5.0%
    md = report.format_report(payload)
    assert "mismatch mean abs" in md and "2.00e-07" in md and "2.00e-04" in md
    assert setups.ARMS["hacpo-no-mismatch"].flags == ("--no_mismatch_metrics",)


ARM_NOTE_COST = "**+5.0%** of the step"


@pytest.mark.integration
def test_time_to_accuracy_from_run_folders(tmp_path):
    setup = setups.make_setup("model")
    # GSPO x2: 1 s per step, evals 0.1 / 0.3 / 0.5 / 0.4 at 0/10/20/30: final = (0.5 + 0.4) / 2 = 0.45, reached at 20
    # HACPO: 1.5 s per step, reaches 0.5 at step 10: 15 s, ratio 15 / 20 = 0.75; agent b never reaches 0.45
    def summary(a_curve, b_curve):
        return {"agents": {"a": {"acc_final": (a_curve[-1][1] + a_curve[-2][1]) / 2, "validation": a_curve},
                           "b": {"acc_final": (b_curve[-1][1] + b_curve[-2][1]) / 2, "validation": b_curve}}}

    ref = [[0, 0.1], [10, 0.3], [20, 0.5], [30, 0.4]]
    _fake_run(tmp_path, "gspo2x", 0, gspo_run([1.0] * 30), rss=1.0, summary=summary(ref, ref))
    _fake_run(tmp_path, "hacpo", 0, hacpo_run([1.5] * 30), rss=1.0,
              summary=summary([[0, 0.1], [10, 0.5], [20, 0.4], [30, 0.4]], [[0, 0.1], [10, 0.2], [20, 0.3],
                                                                           [30, 0.4]]))
    payload = throughput.accuracy_payload(setup, ["gspo2x", "hacpo"], tmp_path, "gspo2x", steps=30, eval_steps=10,
                                          command="x")
    assert payload["targets"] == {"a": pytest.approx(0.45), "b": pytest.approx(0.45)}
    assert payload["arms"]["gspo2x"]["reached"]["a"] == {"step": 20, "accuracy": 0.5, "seconds": 20.0}
    assert payload["arms"]["hacpo"]["reached"]["a"]["seconds"] == pytest.approx(15.0)
    assert payload["ratios"]["hacpo"]["a"] == pytest.approx(0.75)
    assert payload["arms"]["hacpo"]["reached"]["b"] is None and payload["ratios"]["hacpo"]["b"] is None
    md = report.format_accuracy(payload)
    assert "not reached (best 0.400)" in md and "0.750" in md
    assert report.plot_accuracy(payload)[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------------------------------------- commands
def test_commands_of_every_configuration(tmp_path):
    from openrlhf_hacpo.cli.train_hacpo import build_config

    def ready(setup):  # what prepare() finds: the presets' agent folders and prompt files
        for preset in ("model", "three"):
            agents = {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q", "qwenS": tmp_path / "s"}
            if preset == "model":
                del agents["qwenS"]
            setup.context[preset] = {"agents": agents, "data": {"train": tmp_path / "t", "eval": tmp_path / "e"}}
        return setup

    model = ready(setups.make_setup("model"))
    for arm, group, rows in (("gspo", 8, 128), ("gspo2x", 16, 256), ("naive", 8, 256), ("hacpo", 8, 256)):
        cmd = model.command(setups.ARMS[arm], seed=3, steps=12, output=tmp_path / arm, eval_steps=None,
                            extra=["--micro_train_batch_size", "32"])
        assert cmd[1:3] == ["-m", "openrlhf_hacpo.cli.train_hacpo"]
        assert not [t for t in cmd if t.startswith("--eval")] and "--no_save_hf" in cmd
        cfg = build_config(cmd[3:])
        # 16 prompts x G per agent; HACPO and Naive train on both agents' rollouts; one update per step
        assert (cfg.rollout.n_samples_per_prompt, cfg.train.train_batch_size, cfg.train.max_steps,
                cfg.train.seed) == (group, rows, 12, 3), arm
        assert cfg.train.micro_train_batch_size == 32  # the benchmark's trainer flags come last and win
    tiny = model.command(setups.ARMS["hacpo"], seed=0, steps=80, output=tmp_path / "o", eval_steps=10)
    assert tiny[1:4] == ["-m", "openrlhf_hacpo.cli.tiny", "run"] and tiny[tiny.index("--eval_steps") + 1] == "10"
    with pytest.raises(ValueError, match="not resolved"):
        setups.make_setup("model").command(setups.ARMS["gspo"], seed=0, steps=2, output=tmp_path, eval_steps=None)
    three = ready(setups.make_setup("three"))
    assert three.arms[-1] == "hacpo-n2"
    n3 = build_config(three.command(setups.ARMS["hacpo"], seed=0, steps=5, output=tmp_path / "a", eval_steps=None)[3:])
    n2 = build_config(three.command(setups.ARMS["hacpo-n2"], seed=0, steps=5, output=tmp_path / "b",
                                    eval_steps=None)[3:])
    assert (len(n3.agents), n3.train.train_batch_size, len(n2.agents), n2.train.train_batch_size) == (3, 384, 2, 256)

    smol = setups.make_setup("smollm2")
    smol.models, smol.prompt_data = {"smollm2": str(tmp_path / "s"), "llamaS": str(tmp_path / "l")}, tmp_path / "p"
    for arm, rows in (("gspo", 8), ("gspo2x", 16), ("naive", 16), ("hacpo", 16)):  # 2 prompts x G = 4
        cmd = smol.command(setups.ARMS[arm], seed=0, steps=4, output=tmp_path / arm, eval_steps=None)
        cfg = build_config(cmd[3:])
        assert cfg.train.train_batch_size == rows and cfg.rollout.rollout_backend == "hf", arm
    with pytest.raises(ValueError, match="tiny presets"):
        smol.command(setups.ARMS["hacpo"], seed=0, steps=4, output=tmp_path / "x", eval_steps=10)
    smol.models = {"smollm2": str(tmp_path / "s")}  # one agent: GSPO runs, an arm that shares rollouts is refused
    one = build_config(smol.command(setups.ARMS["gspo"], seed=0, steps=4, output=tmp_path / "one",
                                    eval_steps=None)[3:])
    assert one.agent_names == ["smollm2"] and one.train.train_batch_size == 8
    with pytest.raises(ValueError, match="hacpo needs two or more agents"):
        smol.command(setups.ARMS["hacpo"], seed=0, steps=4, output=tmp_path / "x", eval_steps=None)

    with pytest.raises(ValueError, match="two or more"):
        setups.make_setup("gpu", models={"a": "/x"})
    with pytest.raises(ValueError, match="NAME=PATH"):
        setups.parse_models(["nopath"])
    gpu = setups.make_setup("gpu", models=setups.parse_models(["a=/x", "b=/y"]))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        with pytest.raises(RuntimeError, match="needs CUDA"):
            gpu.prepare()
    with pytest.raises(ValueError, match="unknown --config"):
        setups.make_setup("tpu")


def test_cli_errors_name_the_flag(tmp_path, capsys):
    assert throughput.main(["--arms", "hacpo", "--report_only", "--runs_dir", str(tmp_path)]) == 2
    assert "--arms must include gspo" in capsys.readouterr().err
    assert throughput.main(["--arms", "gspo,ppo", "--report_only", "--runs_dir", str(tmp_path)]) == 2
    assert "ppo" in capsys.readouterr().err
    assert throughput.main(["--steps", "2", "--warmup", "2", "--report_only", "--runs_dir", str(tmp_path)]) == 2
    assert "--warmup 2" in capsys.readouterr().err
    assert throughput.main(["--config", "smollm2", "--time_to_accuracy", "--runs_dir", str(tmp_path)]) == 2
    assert throughput.main(["--report_only", "--runs_dir", str(tmp_path), "--results_dir", str(tmp_path)]) == 2
    assert "no run at" in capsys.readouterr().err


def test_scripts_use_library_modules_only():
    for name in ("throughput.py", "throughput_setups.py", "throughput_stats.py", "throughput_report.py"):
        tree = ast.parse((BENCH / name).read_text(encoding="utf-8"))
        imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        imported += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        ours = [m for m in imported if m.startswith("openrlhf_hacpo")]
        assert not [m for m in ours if m.split(".")[1] in ("cli", "actors", "trainer")], (name, ours)


# ---------------------------------------------------------------------------------------------------------- end to end
@pytest.mark.e2e
def test_model_comparison_one_step_per_arm(tmp_path):
    """The plumbing end to end on two arms (the baseline and HACPO): every arm's workers in the trainer's process
    (--no_ray), one measured step and no warm-up step, and 8-token responses (trainer flags after '--' win). The
    commands of the other arms (GSPO x2, Naive) are checked in test_commands_of_every_configuration, the arithmetic
    (warm-up steps dropped included) in the tests above."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(BENCH / "throughput.py"), "--steps", "1", "--warmup", "0", "--rounds", "1",
           "--arms", "gspo,hacpo", "--runs_dir", str(tmp_path / "runs"), "--results_dir", str(tmp_path / "results"),
           "--", "--no_ray", "--generate_max_len", "8"]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    payload = json.loads((tmp_path / "results" / "throughput_model.json").read_text())
    assert list(payload["arms"]) == ["gspo", "hacpo"]
    arms = payload["arms"]
    assert all(a["steps"] == 1 for a in arms.values())
    # rollouts per step: 2 agents x 16 prompts x G = 8; HACPO trains on twice its own rollouts
    assert arms["gspo"]["rollouts_per_step"] == arms["hacpo"]["rollouts_per_step"] == 256
    assert arms["hacpo"]["rows_trained"] == 512 and arms["gspo"]["rows_trained"] == 256
    assert arms["gspo"]["ratios"]["step_s.median"] == 1.0
    assert all(math.isfinite(a["step_s"]["median"]) and a["step_s"]["median"] > 0 for a in arms.values())
    assert arms["hacpo"]["peak_rss_gib"] > 0.1
    assert (tmp_path / "results" / "throughput_model.md").read_text().startswith("# Throughput against GSPO")
    assert (tmp_path / "results" / "throughput_model.png").stat().st_size > 1000
