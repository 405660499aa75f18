"""The main job with the shipped agents: accuracies taken from the trainer's evaluations, the options that choose the
agents, and (slow) a short run end to end that builds nothing, names the shipped agents by fingerprint in its
summary, and whose before/after accuracies equal an independent evaluation of the same folders."""
import json

import pytest

from openrlhf_hacpo.zoo import AGENTS, SHIPPED_DIR, Preset, RLHyperparams
from openrlhf_hacpo.zoo import job
from openrlhf_hacpo.zoo.job import MainJobConfig, accuracies_at, trainer_argv
from openrlhf_hacpo.zoo.shipped import read_manifest


def test_accuracies_at_a_step_or_the_last_one():
    records = [{"agent": "a", "step": 0, "accuracy": 0.1}, {"agent": "b", "step": 0, "accuracy": 0.3},
               {"agent": "a", "step": 10, "accuracy": 0.2}, {"agent": "b", "step": 10, "accuracy": 0.4},
               {"agent": "a", "step": 20, "accuracy": 0.25}]
    assert accuracies_at(records, ["a", "b"], 0) == {"a": 0.1, "b": 0.3}
    assert accuracies_at(records, ["a", "b"], 10) == {"a": 0.2, "b": 0.4}
    assert accuracies_at(records, ["a", "b"], None) == {"a": 0.25, "b": 0.4}
    assert accuracies_at(records, ["a", "b"], 20) is None                      # b has no evaluation at step 20
    assert accuracies_at([], ["a"], 0) is None


def test_trainer_evaluates_before_training_and_rebuild_is_validated(tmp_path):
    from openrlhf_hacpo.cli.train_hacpo import build_config

    cfg = MainJobConfig(output=tmp_path / "run")
    argv = trainer_argv(cfg, {"llamaS": tmp_path / "l", "qwenM": tmp_path / "q"},
                        {"train": tmp_path / "t.jsonl", "eval": tmp_path / "e.jsonl"})
    train = build_config(argv)
    assert train.eval_before_training and train.eval_steps == 10
    with pytest.raises(ValueError, match="MainJobConfig.rebuild"):
        MainJobConfig(rebuild="yes")
    assert MainJobConfig(rebuild=True, output=tmp_path / "r").rebuild is True


def test_tiny_cli_passes_rebuild(monkeypatch):
    from openrlhf_hacpo.cli import tiny

    seen = {}
    monkeypatch.setattr(job, "run_main_job", lambda cfg, started: seen.update(cfg=cfg, started=started))
    assert tiny.main(["run", "--rebuild", "--steps", "3"]) == 0
    assert seen["cfg"].rebuild is True and seen["cfg"].num_steps == 3
    assert seen["started"] == tiny._STARTED                    # the job's clock counts the command's imports
    args = tiny.build_parser().parse_args(["evaluate"])
    assert args.rebuild is False


@pytest.mark.slow
def test_main_job_with_the_shipped_agents(tmp_path):
    from openrlhf_hacpo.data import make_splits
    from openrlhf_hacpo.zoo.job import evaluate_folders, task_config

    rl = RLHyperparams(prompts_per_step=4, group_size=2, num_steps=2, eval_every=1, eval_size=32)
    preset = Preset("shipped-e2e", "model", "the shipped agents, two steps", (AGENTS["llamaS"], AGENTS["qwenM"]), rl)
    cfg = MainJobConfig(preset=preset, seed=0, output=tmp_path / "run", cache_dir=tmp_path / "zoo",
                        data_dir=tmp_path / "data", results_dir=tmp_path / "results", progress=False)
    summary = job.run_main_job(cfg)
    assert not (tmp_path / "zoo").exists(), "nothing is built"
    run = summary["run"]
    for name in ("llamaS", "qwenM"):
        used = run["agents_used"][name]
        assert used["source"] == "shipped" and used["path"] == str(SHIPPED_DIR / name)
        assert used["fingerprint"] == read_manifest(SHIPPED_DIR / name)["fingerprint"]
    assert summary["reference"]["status"] == "no_reference" and "does not exist" in summary["reference"]["note"]
    assert set(run["phase_seconds"]) == {"setup", "train", "report"}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["run"]["agents_used"] == run["agents_used"]

    # the trainer's evaluations before and after equal an evaluation of the same folders in this process
    problems = make_splits(task_config(rl))[rl.eval_split][: rl.eval_size]
    before = evaluate_folders({n: SHIPPED_DIR / n for n in ("llamaS", "qwenM")}, problems, rl.max_new_tokens)
    after = evaluate_folders({n: tmp_path / "run" / "hf" / n for n in ("llamaS", "qwenM")}, problems,
                             rl.max_new_tokens)
    for name in ("llamaS", "qwenM"):
        assert summary["agents"][name]["acc_before"] == pytest.approx(before[name])
        assert summary["agents"][name]["acc_after"] == pytest.approx(after[name])
        assert [s for s, _ in summary["agents"][name]["validation"]] == [0, 1, 2]
