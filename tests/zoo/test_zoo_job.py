"""The main job with the shipped agents: accuracies taken from the trainer's evaluations and the options that choose
the agents. The run end to end on the shipped agents is tests/test_tiny_main.py::test_main_job_end_to_end."""
import pytest

from openrlhf_hacpo.zoo import job
from openrlhf_hacpo.zoo.job import MainJobConfig, accuracies_at, trainer_argv


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
    assert train.eval.eval_before_training and train.eval.eval_steps == 10
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
