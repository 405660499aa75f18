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
                                 "gspo2x": arm({0: 0.7, 1: 0.5}), "naive-gated": arm({0: 0.55, 1: 0.52}),
                                 "pessimistic": arm({0: 0.72, 1: 0.49})})
    by_goal = {g["goal"]: g["met"] for g in goals}
    # HACPO: gspo +0.1, +0.05; gspo2x -0.1, 0.0 (level needs >= 0); naive +0.05, -0.02 (mean +0.015)
    # pessimistic: gspo +0.22, +0.04; gspo2x +0.02, -0.01 (mean +0.005); naive +0.17, -0.03
    pess, gated = compare.ARMS["pessimistic"].label, compare.ARMS["naive-gated"].label
    assert by_goal == {"HACPO > GSPO (same rollouts)": "yes, every seed", "HACPO ≥ GSPO ×2 (2G rollouts)": "no",
                       f"HACPO > {gated}": "on average",
                       f"{pess} > GSPO (same rollouts)": "yes, every seed",
                       f"{pess} ≥ GSPO ×2 (2G rollouts)": "on average", f"{pess} > {gated}": "on average"}

    assert compare.parse_arms("main,no-clip") == ["hacpo", "gspo", "gspo2x", "naive-paper", "naive-gated",
                                                  "no-clip"]
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


def test_the_mismatch_arms_are_bf16_engines_with_each_correction_against_fp32_and_bf16_engines(tmp_path):
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.zoo import get_preset

    compare = _compare_module()
    preset = get_preset("model")
    seen = {}
    for name in compare.parse_arms("mismatch"):
        arm = compare.ARMS[name]
        cfg = MainJobConfig(preset=preset, algorithm=arm.algorithm, n_samples_per_prompt=arm.group_size(preset),
                            output=tmp_path / name, extra_args=tuple(arm.trainer_flags(preset, "paper")),
                            regime="paper")
        train = build_config(trainer_argv(cfg, {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q"},
                                          {"train": tmp_path / "t.jsonl", "eval": tmp_path / "e.jsonl"}))
        loss = train.algo.loss.params
        seen[name] = (train.rollout.rollout_backend, [a.resolved_engine_dtype for a in train.resolved_agents],
                      loss.rollout_is and (loss.rollout_is_level, loss.rollout_is_mode), arm.reference,
                      arm.also_against)
    fp32, bf16, both = ["float32", "float32"], ["bfloat16", "bfloat16"], ("engines-fp32", "engines-bf16")
    assert seen == {"engines-fp32": ("hf_engine", fp32, False, None, None),
                    "engines-bf16": ("hf_engine", bf16, False, "engines-fp32", None),
                    "bf16-is-seq-truncate": ("hf_engine", bf16, ("sequence", "truncate"), *both),
                    "bf16-is-seq-mask": ("hf_engine", bf16, ("sequence", "mask"), *both),
                    "bf16-is-tok-truncate": ("hf_engine", bf16, ("token", "truncate"), *both),
                    "bf16-is-tok-mask": ("hf_engine", bf16, ("token", "mask"), *both)}


def test_imports_library_modules_only():
    tree = ast.parse(SCRIPT.read_text(encoding="utf-8"))
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
    ours = [m for m in imported if m.startswith("openrlhf_hacpo")]
    assert ours and not [m for m in ours if m.split(".")[1] in ("cli", "actors", "trainer")], ours


def test_the_paper_regime_sets_the_mini_batches_and_refuses_arms_with_their_own_updates(tmp_path):
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.zoo import get_preset

    compare = _compare_module()
    preset = get_preset("model")
    # 16 prompts x 8 = 128 own rows, mini-batches of 64 rows: GSPO 2 updates, HACPO and both naives 4 (own +
    # foreign rows), GSPO x2 4 (16 per prompt), as the paper's code makes 2 / 4 / 4
    expected = {"gspo": 2, "hacpo": 4, "naive-paper": 4, "naive-gated": 4, "gspo2x": 4, "no-adv": 4}
    for name, updates in expected.items():
        arm = compare.ARMS[name]
        cfg = MainJobConfig(preset=preset, algorithm=arm.algorithm, regime="paper", output=tmp_path / name,
                            n_samples_per_prompt=arm.group_size(preset), extra_args=tuple(arm.trainer_flags(preset,
                                                                                                             "paper")))
        argv = trainer_argv(cfg, {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q"},
                            {"train": tmp_path / "t.jsonl", "eval": tmp_path / "e.jsonl"})
        train = build_config(argv)
        assert train.updates_per_step == updates, name
        assert argv[argv.index("--actor_learning_rate") + 1] == "0.0001"
        assert argv[argv.index("--lr_warmup_steps") + 1] == str(10 * updates)  # 10 steps of warm-up
    cmd = compare.run_command(compare.ARMS["hacpo"], preset, 3, 80, tmp_path / "x", regime="paper")
    assert cmd[cmd.index("--regime") + 1] == "paper" and "--" not in cmd
    with pytest.raises(ValueError, match="belongs to the single-update regime"):
        compare.ARMS["hacpo-m2"].trainer_flags(preset, "paper")
    assert compare.reference_of(compare.ARMS["no-stepwise"], "paper") == "hacpo"
    assert compare.reference_of(compare.ARMS["no-stepwise"], "single-update") == "hacpo-m2"
    # no-stepwise runs in the paper's regime with the regime's updates (HACPO's 4, where the stepwise bound moves),
    # hacpo-m2 (whose point is its 2 updates) does not run there
    assert compare.runs_in_regime(compare.ARMS["no-stepwise"], "paper")
    assert not compare.runs_in_regime(compare.ARMS["hacpo-m2"], "paper")
    arm = compare.ARMS["no-stepwise"]
    cfg = MainJobConfig(preset=preset, algorithm=arm.algorithm, regime="paper", output=tmp_path / "ns",
                        n_samples_per_prompt=arm.group_size(preset), extra_args=tuple(arm.trainer_flags(preset,
                                                                                                         "paper")))
    train = build_config(trainer_argv(cfg, {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q"},
                                      {"train": tmp_path / "t.jsonl", "eval": tmp_path / "e.jsonl"}))
    assert train.updates_per_step == 4 and train.algo.loss.params.stepwise is False
    single = build_config(trainer_argv(
        MainJobConfig(preset=preset, algorithm=arm.algorithm, output=tmp_path / "ns1",
                      n_samples_per_prompt=arm.group_size(preset), extra_args=tuple(arm.trainer_flags(preset))),
        {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q"},
        {"train": tmp_path / "t.jsonl", "eval": tmp_path / "e.jsonl"}))
    assert single.updates_per_step == 2


def test_runs_of_different_commits_are_refused_unless_marked():
    compare = _compare_module()

    def run(commit, dirty=False):
        return {"run": {"commit": commit, "dirty": dirty}}

    same = {"hacpo": {0: run("a" * 40), 1: run("a" * 40)}, "gspo": {0: run("a" * 40)}}
    commits = compare.run_commits(same)
    assert commits == {"hacpo": {"a" * 12: [0, 1]}, "gspo": {"a" * 12: [0]}}
    assert compare.check_commits(commits, allow_mixed=False) == ["a" * 12]
    mixed = compare.run_commits({"hacpo": {0: run("a" * 40)}, "gspo": {0: run("b" * 40), 1: run("a" * 40)}})
    with pytest.raises(ValueError, match=r"gspo: bbbbbbbbbbbb \(seeds \[0\]\), aaaaaaaaaaaa \(seeds \[1\]\)"):
        compare.check_commits(mixed, allow_mixed=False)
    assert compare.check_commits(mixed, allow_mixed=True) == ["a" * 12, "b" * 12]
    for odd in ({"hacpo": {0: run("a" * 40, dirty=True)}}, {"hacpo": {0: {"run": {}}}}):
        with pytest.raises(ValueError, match="allow_mixed_commits"):
            compare.check_commits(compare.run_commits(odd), allow_mixed=False)


def _arms(found):
    """The aggregated arms' final accuracies by seed (what aggregate_arm gives the report) of raw ``found`` runs."""
    return {arm: {"agents": {"a": {"final_by_seed": {str(seed): r["agents"]["a"]["acc_final"]
                                                     for seed, r in runs.items()}}}} for arm, runs in found.items()}


def test_evidence_report_pairs_by_seed_and_corrects_the_primary_family():
    compare = _compare_module()

    def runs(finals, before=0.3):
        return {seed: {"agents": {"a": {"acc_final": f, "acc_before": before,
                                        "validation": [(0, before), (10, f)]}}} for seed, f in finals.items()}

    found = {"hacpo": runs({s: 0.5 + 0.01 * s for s in range(5)}), "gspo2x": runs({s: 0.4 for s in range(5)}),
             "naive-paper": runs({s: 0.2 for s in range(5)}), "naive-gated": runs({0: 0.6, 1: 0.4, 2: 0.6, 3: 0.4,
                                                                                  4: 0.6})}
    ev = compare.evidence_report(_arms(found), found, ["a"], "paper")
    c = ev["comparisons"]
    assert c["hacpo - gspo2x"]["a"]["diffs"] == pytest.approx([0.1, 0.11, 0.12, 0.13, 0.14])
    assert c["hacpo - gspo2x"]["a"]["p_sign_flip"] == pytest.approx(2 / 32)  # every seed positive, n = 5
    # Holm over the three primary p-values (agent a): 1/16, 1/16 and naive-gated's
    gated = c["hacpo - naive-gated"]["a"]["p_sign_flip"]
    ps = sorted([2 / 32, 2 / 32, gated])
    assert c["hacpo - gspo2x"]["a"]["p_holm"] == pytest.approx(min(1, 3 * ps[0]))
    assert c["hacpo - naive-gated"]["a"]["p_holm"] == pytest.approx(max(min(1, 3 * ps[0]), min(1, 2 * ps[1]),
                                                                        min(1, gated)))
    assert ev["curves"]["naive-paper"]["a"]["below_start"] == 5 and ev["curves"]["hacpo"]["a"]["below_start"] == 0
    assert ev["curves"]["gspo2x"]["a"]["auc_mean"] == pytest.approx((0.3 + 0.4) / 2)


def test_a_correction_is_paired_against_fp32_engines_and_against_bf16_engines_without_it():
    compare = _compare_module()

    def runs(finals):
        return {seed: {"agents": {"a": {"acc_final": f, "acc_before": 0.3, "validation": [(0, 0.3), (10, f)]}}}
                for seed, f in finals.items()}

    found = {"engines-fp32": runs({0: 0.50, 1: 0.60}), "engines-bf16": runs({0: 0.40, 1: 0.55}),
             "bf16-is-tok-mask": runs({0: 0.45, 1: 0.58})}
    c = compare.evidence_report(_arms(found), found, ["a"], "paper")["comparisons"]
    assert set(c) == {"engines-bf16 - engines-fp32", "bf16-is-tok-mask - engines-fp32",
                      "bf16-is-tok-mask - engines-bf16"}
    assert c["bf16-is-tok-mask - engines-fp32"]["a"]["diffs"] == pytest.approx([-0.05, -0.02])
    assert c["bf16-is-tok-mask - engines-bf16"]["a"]["diffs"] == pytest.approx([0.05, 0.03])


def test_the_paper_orderings_are_judged_on_the_interval():
    compare = _compare_module()

    def runs(finals):
        return {seed: {"agents": {"a": {"acc_final": f, "acc_before": 0.3, "validation": [(0, 0.3), (10, f)]}}}
                for seed, f in finals.items()}

    found = {"hacpo": runs({0: 0.5, 1: 0.6, 2: 0.55}), "gspo": runs({0: 0.4, 1: 0.45, 2: 0.42}),
             "gspo2x": runs({0: 0.6, 1: 0.4, 2: 0.55}), "naive-paper": runs({0: 0.6, 1: 0.7, 2: 0.66})}
    verdicts = {o["claim"]: o["verdict"] for o in compare.evidence_report(_arms(found), found, ["a"], "paper")["orderings"]}
    # hacpo - gspo: +0.10, +0.15, +0.13 (interval above 0); hacpo - gspo2x: -0.1, +0.2, 0 (contains 0);
    # hacpo - naive-paper: -0.1, -0.1, -0.11 (below 0); gspo - naive-paper: -0.2, -0.25, -0.24
    assert verdicts == {"hacpo > gspo": "holds", "hacpo > gspo2x": "not resolved", "hacpo > naive-paper": "reversed",
                        "gspo > naive-paper": "reversed"}
