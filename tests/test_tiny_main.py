"""The tiny main job (``python -m openrlhf_hacpo.cli.tiny run``, openrlhf_hacpo/zoo/job.py).

Fast tests check the job's configuration, the generated trainer command and the run-folder rules; the e2e test runs
the whole main job (agent folders, evaluation, Ray + DeepSpeed training through the trainer CLI, evaluation, summary
and plot) on the shipped agents for two steps. The summary helpers are tested in tests/zoo/test_zoo_reports.py,
the comparison script in tests/benchmarks/test_compare_tiny.py.
"""
from __future__ import annotations

import json

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
        assert train.algo.algorithm == algorithm and train.algo.loss.params.kl_coef == 0
        assert train.rows_per_learner == rows and train.train.train_batch_size == rows and train.updates_per_step == 1
        assert train.train.micro_train_batch_size == 32                               # extra flags win
        assert (train.rollout.n_samples_per_prompt, train.rollout.rollout_batch_size, train.train.max_steps) == (
            8, 16, 80)
        assert (train.agent_defaults.learning_rate, train.optim.lr_warmup_steps, train.optim.max_norm) == (
            3e-4, 10, 1.0)
        assert train.optim.adam_betas == (0.9, 0.99) and train.optim.l2 == 0 and train.rollout.temperature == 1.0
        assert train.prompts.generate_max_len == 40 and train.eval.eval_steps == 10 and train.train.seed == 5
        assert train.rewards.reward_fn == "arithmetic" and train.prompts.apply_chat_template
        assert train.outputs.save_path == str(tmp_path / algorithm)


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
@pytest.mark.e2e
def test_main_job_end_to_end(tmp_path):
    """The whole main job on the shipped agents for two steps: it builds nothing, names the agents by fingerprint,
    writes the summary, evaluations, plot and trainer command, and its before/after accuracies equal both the
    trainer's own evaluations and an independent evaluation of the same folders in this process. (Building agents
    that do not ship is ``agent_folders``' job: tests/zoo/test_zoo_shipped.py and tests/zoo/test_zoo_cache.py.)"""
    from openrlhf_hacpo.data import make_splits
    from openrlhf_hacpo.zoo import AGENTS, SHIPPED_DIR, Preset, RLHyperparams
    from openrlhf_hacpo.zoo.job import evaluate_folders, task_config
    from openrlhf_hacpo.zoo.shipped import read_manifest

    names = ("llamaS", "qwenM")
    rl = RLHyperparams(prompts_per_step=4, group_size=2, num_steps=2, eval_every=1, eval_size=16)
    preset = Preset("e2e", "model", "the shipped agents, two steps", tuple(AGENTS[n] for n in names), rl)
    cfg = MainJobConfig(preset=preset, seed=1, output=tmp_path / "run", cache_dir=tmp_path / "zoo",
                        data_dir=tmp_path / "data", results_dir=tmp_path / "results", build_jobs=1, progress=False)
    returned = job.run_main_job(cfg)
    assert not (tmp_path / "zoo").exists(), "nothing is built"

    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary == json.loads(json.dumps(returned))
    run = summary["run"]
    assert (run["preset"], run["algorithm"], run["seed"], run["steps"]) == ("e2e", "hacpo", 1, 2)
    assert run["wall_seconds"] > run["train_seconds"] > 0
    assert set(run["phase_seconds"]) == {"setup", "train", "report"}
    assert run["rollouts_total"] == 2 * 2 * 4 * 2
    for name in names:
        used = run["agents_used"][name]
        assert used["source"] == "shipped" and used["path"] == str(SHIPPED_DIR / name)
        assert used["fingerprint"] == read_manifest(SHIPPED_DIR / name)["fingerprint"]
    assert summary["reference"]["status"] == "no_reference" and "does not exist" in summary["reference"]["note"]
    assert set(summary["agents"]) == set(names)

    # the trainer's evaluations before and after equal an evaluation of the same folders in this process
    problems = make_splits(task_config(rl))[rl.eval_split][: rl.eval_size]
    before = evaluate_folders({n: SHIPPED_DIR / n for n in names}, problems, rl.max_new_tokens)
    after = evaluate_folders({n: run_dir / "hf" / n for n in names}, problems, rl.max_new_tokens)
    evals = read_jsonl(run_dir / "eval.jsonl")
    for name, agent in summary["agents"].items():
        for key in ("acc_before", "acc_after", "acc_final"):
            assert isinstance(agent[key], float) and 0.0 <= agent[key] <= 1.0
        assert agent["acc_before"] == pytest.approx(before[name])
        assert agent["acc_after"] == pytest.approx(after[name])
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
