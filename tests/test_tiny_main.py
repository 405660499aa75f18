"""The tiny main job (``python -m openrlhf_hacpo.cli.tiny run``: openrlhf_hacpo/zoo/job.py and zoo/reports.py) and
the comparison's statistics.

Fast tests check the summary, table and plot helpers and the generated trainer command on synthetic inputs with
hand-computed expectations; the slow test runs the whole main job (zoo build, evaluation, Ray + DeepSpeed training
through the trainer CLI, evaluation, summary and plot) on two barely warm-started agents for two steps.
"""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from openrlhf_hacpo.cli import tiny
from openrlhf_hacpo.utils.jsonl import read_jsonl
from openrlhf_hacpo.zoo import job
from openrlhf_hacpo.zoo.job import MainJobConfig, trainer_argv
from openrlhf_hacpo.zoo.reports import (
    agent_step_stats,
    build_summary,
    final_accuracy,
    format_table,
    mean_std,
    paired_differences,
    plot_validation,
)

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _compare_module():
    spec = importlib.util.spec_from_file_location("compare_tiny", REPO / "benchmarks" / "compare_tiny.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _step(step, agent, *, own=128, rows=256, tokens=25.0, gen=0.5, logprob=0.1, update=1.0, foreign=True,
          in_window=0.5, ratio=0.8):
    rec = {"step": step, "agent": agent, "view/num_own_rows": own, "view/num_rows": rows,
           "response/tokens_mean": tokens, "time/generate": gen, "time/logprob": logprob, "time/update": update,
           "time/reward": 0.01, "time/sync": 0.0, "time/step": 2.0, "reward/mean": 0.25}
    if foreign:
        rec.update({"policy/foreign_in_window_frac": in_window, "policy/foreign_ratio_mean": ratio,
                    "policy/foreign_clip_frac_lower": 1.0 - in_window - 0.1, "policy/foreign_clip_frac_upper": 0.1})
    return rec


# ------------------------------------------------------------------------------------------------------ helpers
def test_final_accuracy_is_the_mean_of_the_last_two_evaluations_by_step():
    assert final_accuracy([(30, 0.5), (10, 0.2), (20, 0.4)]) == pytest.approx(0.45)
    assert final_accuracy([(10, 0.3)]) == pytest.approx(0.3)
    assert final_accuracy([(10, 0.2), (20, 0.4), (30, 0.9)], last=3) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one"):
        final_accuracy([])


def test_agent_step_stats_totals_and_means():
    records = [_step(1, "a", tokens=20.0, gen=0.4, update=1.0, in_window=0.6, ratio=0.9),
               _step(2, "a", tokens=30.0, gen=0.6, update=3.0, in_window=0.2, ratio=0.7)]
    stats = agent_step_stats(records, rollouts_per_step=128)
    assert stats["steps"] == 2
    assert stats["rollouts_generated"] == 256
    assert stats["rows_trained"] == 512
    assert stats["generated_tokens"] == 20 * 128 + 30 * 128                  # 6400
    assert stats["tokens_per_s"] == pytest.approx(6400 / 1.0)                # over 0.4 + 0.6 generation seconds
    assert stats["samples_trained_per_s"] == pytest.approx(512 / 4.0)       # over 1 + 3 update seconds
    assert stats["seconds"]["generate"] == pytest.approx(0.5)
    assert stats["seconds"]["update"] == pytest.approx(2.0)
    assert stats["foreign"]["in_window_frac"] == pytest.approx(0.4)
    assert stats["foreign"]["ratio_mean"] == pytest.approx(0.8)
    assert stats["foreign"]["ratio_median"] is None                          # not logged by these records

    solo = [dict(_step(1, "a", foreign=False)), dict(_step(2, "a", foreign=False))]
    for rec in solo:
        del rec["view/num_own_rows"], rec["view/num_rows"]
    stats = agent_step_stats(solo, rollouts_per_step=64)
    assert stats["foreign"] is None
    assert stats["rollouts_generated"] == 128 and stats["rows_trained"] == 128
    with pytest.raises(ValueError):
        agent_step_stats([], rollouts_per_step=1)


def _synthetic_summary():
    evals = [{"step": s, "agent": a, "accuracy": acc} for s, a, acc in
             [(10, "llama", 0.2), (10, "qwen", 0.4), (20, "llama", 0.3), (20, "qwen", 0.6),
              (30, "llama", 0.5), (30, "qwen", 0.7)]]
    steps = [_step(s, a) for s in (1, 2, 3) for a in ("llama", "qwen")]
    return build_summary(run={"preset": "model", "algorithm": "hacpo", "seed": 3, "steps": 3,
                              "n_samples_per_prompt": 8, "eval_split": "test", "eval_problems": 400},
                         acc_before={"llama": 0.1, "qwen": 0.3}, acc_after={"llama": 0.5, "qwen": 0.7},
                         step_records=steps, eval_records=evals, rollouts_per_step=128)


def test_build_summary_table_and_plot(tmp_path):
    summary = _synthetic_summary()
    llama = summary["agents"]["llama"]
    assert llama["validation"] == [[0, 0.1], [10, 0.2], [20, 0.3], [30, 0.5]]
    assert llama["acc_final"] == pytest.approx(0.4)
    assert summary["agents"]["qwen"]["acc_final"] == pytest.approx(0.65)
    assert llama["steps"] == 3 and llama["rollouts_generated"] == 384
    assert summary["run"]["rollouts_total"] == 768
    json.dumps(summary, allow_nan=False)  # serialisable as strict JSON

    table = format_table(summary)
    assert "| llama | 0.100 | 0.500 | +0.400 | 0.400 | 384 |" in table
    assert "| qwen | 0.300 | 0.700 | +0.400 | 0.650 | 384 |" in table

    path = plot_validation(summary, tmp_path / "curve.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_trainer_argv_parses_into_the_preset_hyperparameters(tmp_path):
    from openrlhf_hacpo.cli.train_hacpo import build_config

    paths = {"llamaS": tmp_path / "llamaS", "qwenM": tmp_path / "qwenM"}
    data = {"train": tmp_path / "train.jsonl", "eval": tmp_path / "eval.jsonl"}
    for algorithm, rows in (("hacpo", 2 * 16 * 8), ("gspo", 16 * 8), ("naive", 2 * 16 * 8)):
        cfg = MainJobConfig(preset="model", algorithm=algorithm, seed=5, output=tmp_path / algorithm,
                            extra_args=("--micro_train_batch_size", "32"))
        train = build_config(trainer_argv(cfg, paths, data))
        assert train.agent_names == ["llamaS", "qwenM"]
        assert train.algo.algorithm == algorithm and train.algo.loss.kl_coef == 0
        assert train.rows_per_learner == rows and train.train_batch_size == rows and train.updates_per_step == 1
        assert train.micro_train_batch_size == 32                               # extra flags win
        assert (train.n_samples_per_prompt, train.rollout_batch_size, train.max_steps) == (8, 16, 80)
        assert (train.actor_learning_rate, train.lr_warmup_steps, train.max_norm) == (3e-4, 10, 1.0)
        assert train.adam_betas == (0.9, 0.99) and train.l2 == 0 and train.temperature == 1.0
        assert train.generate_max_len == 40 and train.eval_steps == 10 and train.seed == 5
        assert train.reward_fn == "arithmetic" and train.apply_chat_template
        assert train.save_path == str(tmp_path / algorithm)


def test_main_job_config_validation(tmp_path):
    with pytest.raises(ValueError, match="MainJobConfig.algorithm"):
        MainJobConfig(algorithm="ppo")
    with pytest.raises(ValueError, match="MainJobConfig.steps"):
        MainJobConfig(steps=0)
    with pytest.raises(ValueError, match="--save_path"):
        MainJobConfig(extra_args=("--save_path=/tmp/x",))
    with pytest.raises(ValueError, match="unknown zoo preset"):
        MainJobConfig(preset="nope")
    cfg = MainJobConfig(preset="three", algorithm="hacpo", n_samples_per_prompt=4)
    assert cfg.rows_per_learner == 3 * 16 * 4
    assert cfg.output.name == "tiny-three-hacpo-s0"
    assert tiny.main(["prepare", "--", "--seed", "1"]) == 2


def test_output_folder_of_another_program_is_refused(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="no tiny run wrote"):
        job.prepare_output(other)
    assert (other / "keep.txt").read_text() == "x"


def test_comparison_statistics():
    compare = _compare_module()
    mean, std = mean_std([0.5, 0.7, 0.6])
    assert mean == pytest.approx(0.6) and std == pytest.approx(0.1)     # sample std
    assert mean_std([0.4]) == (0.4, None)

    def arm(finals):
        return {"agents": {"a": {"final_by_seed": {str(s): v for s, v in finals.items()}}}}

    d = paired_differences(arm({0: 0.6, 1: 0.5, 2: 0.9}), arm({0: 0.4, 1: 0.55, 3: 0.1}))["a"]
    assert d["seeds"] == [0, 1]
    assert d["diffs"] == pytest.approx([0.2, -0.05])
    assert d["mean"] == pytest.approx(0.075) and d["positive"] == 1
    assert d["std"] == pytest.approx(math.sqrt(((0.2 - 0.075) ** 2 + (-0.05 - 0.075) ** 2) / 1))

    goals = compare.goal_checks({"hacpo": arm({0: 0.6, 1: 0.5}), "gspo": arm({0: 0.5, 1: 0.45}),
                                 "gspo2x": arm({0: 0.7, 1: 0.5}), "naive": arm({0: 0.55, 1: 0.52}),
                                 "pessimistic": arm({0: 0.72, 1: 0.49})})
    by_goal = {g["goal"]: g["met"] for g in goals}
    # HACPO: gspo +0.1, +0.05; gspo2x -0.1, 0.0 (level needs >= 0); naive +0.05, -0.02 (mean +0.015)
    # pessimistic: gspo +0.22, +0.04; gspo2x +0.02, -0.01 (mean +0.005); naive +0.17, -0.03
    pess = compare.ARMS["pessimistic"].label
    assert by_goal == {"HACPO > GSPO (same rollouts)": "yes, every seed", "HACPO ≥ GSPO ×2 (2G rollouts)": "no",
                       "HACPO > Naive sharing": "on average",
                       f"{pess} > GSPO (same rollouts)": "yes, every seed",
                       f"{pess} ≥ GSPO ×2 (2G rollouts)": "on average", f"{pess} > Naive sharing": "on average"}

    assert compare.parse_arms("main,no-clip") == ["hacpo", "gspo", "gspo2x", "naive", "no-clip"]
    with pytest.raises(ValueError, match="unknown arm"):
        compare.parse_arms("hacpo,ppo")
    with pytest.raises(ValueError):
        compare.parse_seeds("0,x")


def test_comparison_arms_build_valid_trainer_commands(tmp_path):
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.zoo import get_preset

    compare = _compare_module()
    preset = get_preset("model")
    for name, arm in compare.ARMS.items():
        cfg = MainJobConfig(preset=preset, algorithm=arm.algorithm, n_samples_per_prompt=arm.group_size(preset),
                            output=tmp_path / name, extra_args=tuple(arm.trainer_flags(preset)))
        train = build_config(trainer_argv(cfg, {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q"},
                                          {"train": tmp_path / "t.jsonl", "eval": tmp_path / "e.jsonl"}))
        assert train.updates_per_step == arm.updates_per_step, name
    assert compare.ARMS["gspo2x"].group_size(preset) == 16
    cmd = compare.run_command(compare.ARMS["no-stepwise"], preset, 1, 80, tmp_path / "x")
    assert cmd[cmd.index("--algorithm") + 1] == "hacpo-no-stepwise"
    assert cmd[cmd.index("--") + 1:] == ["--train_batch_size", "128", "--micro_train_batch_size", "64"]


# ------------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_main_job_end_to_end(tmp_path):
    from openrlhf_hacpo.zoo import AGENTS, Preset, RLHyperparams, WarmStartConfig

    def quick(name):
        spec = AGENTS[name]
        return spec.replace(warm_start=WarmStartConfig(lr=spec.warm_start.lr, steps=20, log_every=10))

    rl = RLHyperparams(prompts_per_step=4, group_size=2, num_steps=2, eval_every=1, eval_size=16)
    preset = Preset("e2e", "model", "two barely trained agents", (quick("llamaS"), quick("qwenM")), rl)
    cfg = MainJobConfig(preset=preset, seed=1, output=tmp_path / "run", cache_dir=tmp_path / "zoo",
                        data_dir=tmp_path / "data", build_jobs=1, progress=False)
    returned = job.run_main_job(cfg)

    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary == json.loads(json.dumps(returned))
    run = summary["run"]
    assert (run["preset"], run["algorithm"], run["seed"], run["steps"]) == ("e2e", "hacpo", 1, 2)
    assert run["wall_seconds"] > run["train_seconds"] > 0
    assert run["rollouts_total"] == 2 * 2 * 4 * 2
    assert set(summary["agents"]) == {"llamaS", "qwenM"}
    evals = read_jsonl(run_dir / "eval.jsonl")
    for name, agent in summary["agents"].items():
        for key in ("acc_before", "acc_after", "acc_final"):
            assert isinstance(agent[key], float) and 0.0 <= agent[key] <= 1.0
        assert agent["steps"] == 2 and isinstance(agent["steps"], int)
        assert agent["rollouts_generated"] == 2 * 4 * 2
        assert agent["rows_trained"] == 2 * (2 * 4 * 2)            # own and the other agent's rollouts
        assert [s for s, _ in agent["validation"]] == [0, 1, 2]
        assert agent["foreign"] is not None and 0.0 <= agent["foreign"]["in_window_frac"] <= 1.0
        # the trainer's own final evaluation and the job's independent one agree
        last = [e for e in evals if e["agent"] == name and e["step"] == 2]
        assert last and last[0]["accuracy"] == pytest.approx(agent["acc_after"])
    png = (run_dir / "validation.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 5000
    assert (run_dir / "train_command.sh").read_text().count("--agent") == 2
