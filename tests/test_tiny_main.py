"""The tiny main job (``python -m openrlhf_hacpo.cli.tiny run``, openrlhf_hacpo/zoo/job.py).

Fast tests check the job's configuration, the generated trainer command and the run-folder rules; the slow test runs
the whole main job (zoo build, evaluation, Ray + DeepSpeed training through the trainer CLI, evaluation, summary and
plot) on two barely warm-started agents for two steps. The summary helpers are tested in tests/zoo/test_zoo_reports.py,
the comparison script in tests/benchmarks/test_compare_tiny.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_hacpo.cli import tiny
from openrlhf_hacpo.utils.jsonl import read_jsonl
from openrlhf_hacpo.zoo import job
from openrlhf_hacpo.zoo.job import MainJobConfig, trainer_argv

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
