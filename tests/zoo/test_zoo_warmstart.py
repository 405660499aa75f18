"""Warm start: loss masking, data stream, determinism, loss decrease and the target-band stopping rule."""
import pytest
import torch

from openrlhf_hacpo.data.arithmetic import LEVELS, Problem, response_text, sample_problems
from openrlhf_hacpo.zoo import AGENTS, WarmStartConfig, build_model, build_tokenizer, read_meta, warm_start
from openrlhf_hacpo.zoo import warmstart as ws
from openrlhf_hacpo.zoo.warmstart import make_sft_batch, problem_stream


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_sft_batch_trains_on_response_and_eos_only(kind):
    tok = build_tokenizer(kind)
    problems = [Problem(1, (5, 7)), Problem(4, (347, 285)), Problem(3, (47, 85, 39))]
    batch = make_sft_batch(tok, problems)
    for i, p in enumerate(problems):
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        prompt = tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
        assert tok.decode(ids) == prompt + response_text(p) + tok.eos_token
        labels = batch["labels"][i]
        target = labels[labels != -100].tolist()
        assert target[-1] == tok.eos_token_id
        assert tok.decode(target, skip_special_tokens=True) == response_text(p)
        prompt_len = len(tok.encode(prompt, add_special_tokens=False))
        assert (labels != -100).sum() == batch["attention_mask"][i].sum() - prompt_len
    assert (batch["input_ids"][batch["attention_mask"] == 0] == tok.pad_token_id).all()


def test_problem_stream_is_seeded_and_skips_excluded():
    excluded = set(sample_problems([1], 90, seed=0))
    stream = problem_stream([1, 2], seed=3, exclude=excluded)
    first = [next(stream) for _ in range(400)]
    assert not set(first) & excluded
    assert {p.level for p in first} == {1, 2}
    again = problem_stream([1, 2], seed=3, exclude=excluded)
    assert [next(again) for _ in range(400)] == first


def _tiny_llama(**cfg):
    tok = build_tokenizer("char")
    model = build_model(AGENTS["llamaS"].model, tok, seed=0)
    base = dict(lr=3e-3, batch_size=8, warmup_steps=2, log_every=1)
    return model, tok, WarmStartConfig(**{**base, **cfg})


def test_same_seed_same_weights():
    m1, tok, cfg = _tiny_llama(steps=4)
    m2, _, _ = _tiny_llama(steps=4)
    r1, r2 = warm_start(m1, tok, cfg), warm_start(m2, tok, cfg)
    assert r1.losses == r2.losses
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    m3, _, cfg3 = _tiny_llama(steps=4, seed=1)
    warm_start(m3, tok, cfg3)
    assert not all(torch.equal(a, b) for a, b in zip(m1.parameters(), m3.parameters()))


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_warm_start_lowers_loss(tiny_zoo):
    _, paths = tiny_zoo
    for path in paths.values():
        losses = read_meta(path)["warm_start"]["losses"]
        assert len(losses) == 4 and losses[-1][0] == 20
        assert losses[-1][1] < 0.9 * losses[0][1]


@pytest.mark.parametrize(
    "accuracies, reason, chosen_probe",
    [
        ([0.0, 0.1, 0.25, 0.9], "band", 2),
        ([0.0, 0.15, 0.6, 0.9], "overshoot", 1),
        ([0.0, 0.05, 0.12], "max_steps", 2),
    ],
)
def test_target_band_stopping(monkeypatch, accuracies, reason, chosen_probe):
    """Probes at steps 2, 4, 6 (max 6) with scripted accuracies; band [0.2, 0.3]."""
    script = iter(accuracies)

    class _Acc:
        def __init__(self):
            self.accuracy = next(script)

    monkeypatch.setattr(ws, "evaluate_accuracy", lambda *a, **k: _Acc())
    model, tok, cfg = _tiny_llama(target_band=(0.2, 0.3), max_steps=6, probe_start=2, probe_every=2)
    result = warm_start(model, tok, cfg, probe_problems=[Problem(4, (100, 100))])
    assert result.stop_reason == reason
    assert result.band_hit == (reason == "band")
    assert result.steps == 2 * (chosen_probe + 1)
    assert result.probe_accuracy == accuracies[chosen_probe]
    assert result.steps_run == 2 * min(len(accuracies), 3)
    reference, _, fixed = _tiny_llama(steps=result.steps)
    warm_start(reference, tok, fixed)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters())), (
        "the returned weights are those of the chosen step"
    )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "exactly one of steps and target_band"),
        ({"steps": 5, "target_band": (0.1, 0.2)}, "exactly one"),
        ({"target_band": (0.3, 0.2)}, "target_band"),
        ({"steps": 0}, "steps"),
        ({"steps": 5, "levels": (9,)}, "unknown arithmetic level"),
        ({"steps": 5, "batch_size": 0}, "batch_size"),
        ({"steps": 5, "response_format": "latex"}, "response_format"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        WarmStartConfig(lr=1e-3, **kwargs)


def test_band_needs_probe_problems():
    model, tok, cfg = _tiny_llama(target_band=(0.1, 0.2))
    with pytest.raises(ValueError, match="probe_problems"):
        warm_start(model, tok, cfg)


def test_levels_cover_task():
    assert set(AGENTS["qwenM"].warm_start.levels) == {1, 2, 4} <= set(LEVELS)
