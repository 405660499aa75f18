"""benchmarks/compare_tiny.py: the arms' goal checks and selection, the trainer commands every arm builds, and that
the script uses library modules only (the main job through its command line, never ``openrlhf_hacpo.cli``)."""
import ast
from pathlib import Path

import pytest
from benchmark_script import load_benchmark

from openrlhf_hacpo.zoo.job import MainJobConfig, trainer_argv

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare_tiny.py"


def _compare_module():
    return load_benchmark("compare_tiny")


def test_goal_checks_and_arm_selection():
    compare = _compare_module()

    def arm(finals):
        return {"agents": {"a": {"final_by_seed": {str(s): v for s, v in finals.items()}}}}

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


def test_imports_library_modules_only():
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    ours = [m for m in imported if m.startswith("openrlhf_hacpo")]
    assert ours and not [m for m in ours if m.split(".")[1] in ("cli", "actors", "trainer")], ours
