"""Training-time evaluation over several validation files: per-data_source figures, step-0 evaluation."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from openrlhf_hacpo.engines.base import GenerationOutput
from openrlhf_hacpo.trainer.evaluation import Evaluator, load_eval_records
from openrlhf_hacpo.utils.jsonl import read_records


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def two_files(tmp_path):
    first = _write(tmp_path / "math500.jsonl", [
        {"input": f"q{i}", "label": str(i), "prompt_id": f"math500:{i}", "data_source": "math500"} for i in range(4)])
    second = _write(tmp_path / "gsm8k_small.jsonl", [{"input": f"g{i}", "label": str(10 + i)} for i in range(2)])
    return first, second


def test_load_eval_records_tags_sources_and_limits_each_file(two_files):
    records = load_eval_records(",".join(two_files), "input", "label", "test", max_samples=3)
    assert [r.prompt_id for r in records] == ["math500:0", "math500:1", "math500:2", "gsm8k_small:0", "gsm8k_small:1"]
    assert [r.metadata["data_source"] for r in records] == ["math500"] * 3 + ["gsm8k_small"] * 2


def test_load_eval_records_rejects_a_prompt_id_in_two_files(two_files):
    with pytest.raises(ValueError, match=r"math500:0.*unique over all evaluation files"):
        load_eval_records(f"{two_files[0]},{two_files[0]}", "input", "label", "test")


class _FakeGroup:
    """Answers prompt i greedily with ``greedy[i]`` and, sampled, with the texts of ``samples[i]``."""

    name = "fake"

    def __init__(self, greedy: list[str], samples: list[list[str]]) -> None:
        self.greedy, self.samples = greedy, samples

    def generate(self, records, sampling):
        texts = [[g] for g in self.greedy] if sampling.is_greedy else self.samples
        outs = [GenerationOutput(p, s, [0] * (p + 1), t, True, "stop") for p, ts in enumerate(texts)
                for s, t in enumerate(ts)]
        return SimpleNamespace(result=lambda: list(reversed(outs)))  # any order: the evaluator must not rely on it

    def render_prompt_texts(self, records):
        return [str(r.prompt) for r in records]


def test_figures_per_data_source_match_hand_values(two_files):
    records = load_eval_records(",".join(two_files), "input", "label", "test")
    labels = [r.label for r in records]  # math500: 0..3, gsm8k_small: 10, 11
    greedy = [labels[0], "x", labels[2], labels[3], "x", labels[5]]  # math500 3/4 right, gsm8k 1/2
    samples = [[labels[i] if j < c else "x" for j in range(3)] for i, c in enumerate([0, 1, 3, 2, 0, 1])]
    exact = lambda responses, prompts, labels: [float(r == l) for r, l in zip(responses, labels)]  # noqa: E731
    rec = Evaluator(records, exact, max_new_tokens=8, num_samples=3).evaluate([_FakeGroup(greedy, samples)], 5)[0]
    assert rec["step"] == 5 and rec["num_prompts"] == 6
    assert rec["accuracy"] == pytest.approx(4 / 6)
    assert rec["accuracy/math500"] == pytest.approx(3 / 4) and rec["accuracy/gsm8k_small"] == pytest.approx(1 / 2)
    assert rec["response_tokens/gsm8k_small"] == pytest.approx((5 + 6) / 2)
    # pass@1 = c/3 per prompt; pass@3 = 1 when c >= 1
    assert rec["pass@1/math500"] == pytest.approx((0 + 1 + 3 + 2) / 12)
    assert rec["pass@3/math500"] == pytest.approx(3 / 4) and rec["pass@3/gsm8k_small"] == pytest.approx(1 / 2)
    assert rec["sample_accuracy"] == pytest.approx(7 / 18)


def test_one_source_has_no_per_source_keys(two_files):
    records = load_eval_records(two_files[0], "input", "label", "test")
    exact = lambda responses, prompts, labels: [float(r == l) for r, l in zip(responses, labels)]  # noqa: E731
    rec = Evaluator(records, exact, max_new_tokens=8).evaluate([_FakeGroup(["0", "1", "x", "x"], [])], 0)[0]
    assert rec["accuracy"] == 0.5 and not any("/" in key for key in rec)


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")
def test_run_evaluates_before_the_first_step_on_every_file(one_step_llama_run):
    """A run with ``--eval_data`` of two files and ``--eval_before_training`` (tests/trainer/conftest.py) evaluates
    at step 0 and after its one step, on the 8 + 1 prompts, with accuracy per data source."""
    evals = read_records(one_step_llama_run / "eval.jsonl")
    assert [r["step"] for r in evals] == [0, 1]
    for rec in evals:
        assert rec["num_prompts"] == 9
        assert {"accuracy/train", "accuracy/extra"} <= set(rec)


@pytest.mark.parametrize("eval_len, expected", [(None, 64 + 16), (8, 64 + 16), (48, 64 + 48)])
def test_vllm_engines_have_room_for_the_longer_evaluation_responses(monkeypatch, eval_len, expected):
    """max_model_len = prompt_max_len + max(generate_max_len, eval_generate_max_len): no silent cap of eval length."""
    import openrlhf_hacpo.engines.vllm_engine as vllm_engine
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.config import AgentConfig, TrainConfig

    seen = {}
    monkeypatch.setattr(vllm_engine, "create_vllm_engines", lambda *a, **kw: seen.update(kw) or [])
    cfg = TrainConfig.of(agents=[AgentConfig("a", "/m/a")], prompt_data="d.jsonl", rollout_backend="vllm",
                      vllm_num_engines=1, prompt_max_len=64, generate_max_len=16, eval_data="e.jsonl",
                      eval_generate_max_len=eval_len, rollout_batch_size=2, n_samples_per_prompt=2,
                      train_batch_size=4, micro_train_batch_size=2)
    AgentGroup(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=1).launcher.create_engines()
    assert seen["max_model_len"] == expected
