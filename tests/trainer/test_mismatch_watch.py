"""The mismatch/* metrics and the broken-sync alarm without actors: the engine's log-probs are requested only where
they compare with the scoring pass (tests/engines/test_mismatch_logprobs.py: same tokens either way), each own row is
summarised against the scoring pass, records get each agent's and each source's figures, the batch in flight keeps
its rows through a checkpoint, and the alarm names the agent, the backend and the gap."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from openrlhf_hacpo.actors.results import RolloutResult
from openrlhf_hacpo.actors.scoring import mismatch_rows, mismatch_sampling
from openrlhf_hacpo.algorithms.mismatch import row_summaries_ragged, summarize
from openrlhf_hacpo.config import FLAT_NAMES, MISMATCH_ALARM
from openrlhf_hacpo.engines import GenerationOutput, SamplingConfig
from openrlhf_hacpo.trainer.failures import TrainingError
from openrlhf_hacpo.trainer.mismatch_watch import alarm_threshold, check_mismatch, mismatch_metrics


def _sections(**settings) -> SimpleNamespace:
    """A stand-in config: each setting (by its flat name) in its section, as ``TrainConfig`` holds it."""
    sections: dict = {}
    for name, value in settings.items():
        section, field = FLAT_NAMES[name]
        sections.setdefault(section, {})[field] = value
    return SimpleNamespace(**{name: SimpleNamespace(**values) for name, values in sections.items()})


@pytest.mark.parametrize("change", [dict(mismatch_metrics=False), dict(temperature=0.7),
                                    dict(old_logp_from_update=True)])
def test_no_log_probs_where_they_cannot_be_compared(change):
    cfg = _sections(**{**dict(mismatch_metrics=True, temperature=1.0, old_logp_from_update=False), **change})
    assert not mismatch_sampling(cfg, SamplingConfig(n=1, max_new_tokens=4)).return_logprobs


def _out(i, logps, n=1):
    return GenerationOutput(prompt_index=i, sample_index=0, response_token_ids=list(range(len(logps or [0] * n))),
                            response_text="", finished=True, finish_reason="stop", logprobs=logps)


def test_rows_compare_the_engine_with_the_scoring_pass():
    outs = [_out(0, [-1.1, -1.8, -0.5]), _out(1, [-2.6])]
    trajs = [SimpleNamespace(source_logp=torch.tensor([-1.0, -2.0, -0.5])),
             SimpleNamespace(source_logp=torch.tensor([-3.0]))]
    rows = mismatch_rows(outs, trajs)
    assert len(rows) == 2 and rows[0][0] == 3 and rows[1][0] == 1
    # float32 trainer values against the engine's: d = (0.1, -0.2, 0, -0.4) up to float32 rounding
    assert summarize(rows)["mean_abs"] == pytest.approx(0.7 / 4, abs=1e-6)
    assert mismatch_rows([_out(0, None)], trajs[:1]) == ()  # no engine log-probs
    assert mismatch_rows(outs[:1], [SimpleNamespace(source_logp=torch.empty(0))]) == ()  # nothing scored


def _rollout(train, engine):
    rows = tuple(tuple(r) for r in row_summaries_ragged(train, engine).tolist())
    return RolloutResult(trajectories=(), timings={}, generated_tokens=0, mismatch_rows=rows)


def test_records_hold_own_figures_and_each_sources_figures_under_foreign_learners():
    a = _rollout([[-1.0, -2.0]], [[-1.0, -2.5]])  # |d| = 0, 0.5
    b = _rollout([[-1.0]], [[-1.2]])
    # combining ranks concatenates their rows
    assert RolloutResult.combine([a, b]).mismatch_rows == a.mismatch_rows + b.mismatch_rows
    recs = mismatch_metrics([a, b, RolloutResult((), {}, 0)], ["x", "y", "z"], trains_on_foreign=True)
    assert recs[0]["mismatch/mean_abs"] == pytest.approx(0.25)
    assert recs[0]["mismatch/max_abs"] == pytest.approx(0.5)
    assert recs[0]["mismatch/ppl_ratio"] == pytest.approx(math.exp(-0.25))
    assert recs[0]["mismatch/source/y/mean_abs"] == pytest.approx(0.2)
    assert recs[1]["mismatch/source/x/k3_kl"] == recs[0]["mismatch/k3_kl"]  # the source's own figure, reused
    assert not any(k.startswith("mismatch/source/z/") for k in recs[0])  # z's engines gave no log-probs
    assert recs[2] == {**{f"mismatch/source/x/{k[9:]}": v for k, v in recs[0].items() if "/source/" not in k},
                       **{f"mismatch/source/y/{k[9:]}": v for k, v in recs[1].items() if "/source/" not in k}}
    own_only = mismatch_metrics([a, b], ["x", "y"], trains_on_foreign=False)
    assert not any("/source/" in k for rec in own_only for k in rec)


def _cfg(**kw):
    return _sections(**{"mismatch_alarm": 0.1, "one_step_off": False, "rollout_backend": "hf_engine", **kw})


def _agents(*names, bf16=False, engine_dtype=None):
    engine_dtype = engine_dtype or ("bfloat16" if bf16 else "float32")
    return [SimpleNamespace(name=n, bf16=bf16, policy_dtype="bfloat16" if bf16 else "float32",
                            resolved_engine_dtype=engine_dtype) for n in names]


def test_the_alarm_names_agent_backend_and_gap():
    fine = _rollout([[-1.0, -2.0]], [[-1.0, -2.05]])  # 0.025
    broken = _rollout([[-1.0, -2.0]], [[-1.5, -2.0]])  # 0.25
    check_mismatch(3, [fine, fine], _agents("x", "y"), _cfg())
    with pytest.raises(TrainingError) as err:
        check_mismatch(3, [fine, broken], _agents("x", "y"), _cfg())
    message = str(err.value)
    assert "step 3" in message and "agent 'y'" in message and "hf_engine" in message
    assert "0.25 > --mismatch_alarm 0.1" in message and "weight sync after step 2" in message
    assert err.value.agent == "y"
    check_mismatch(3, [broken], _agents("y"), _cfg(mismatch_alarm=0.0))  # 0: off
    check_mismatch(3, [broken], _agents("y"), _cfg(one_step_off=True))  # engines one version behind by design
    check_mismatch(3, [RolloutResult((), {}, 0)], _agents("y"), _cfg())  # no figures, nothing to check


def test_the_default_threshold_is_the_fp32_one_and_off_for_bf16_agents():
    just_above = _rollout([[-1.0]], [[-1.0 - 2 * MISMATCH_ALARM]])
    with pytest.raises(TrainingError, match=r"step 1: agent 'x'.*initial weights"):
        check_mismatch(1, [just_above], _agents("x"), _cfg(mismatch_alarm=None))
    assert alarm_threshold(_cfg(mismatch_alarm=None), _agents("x")[0]) == MISMATCH_ALARM
    assert alarm_threshold(_cfg(mismatch_alarm=None), _agents("x", bf16=True)[0]) == 0.0
    # fp32 learners beside bf16 engines (--engine_dtype bfloat16): off too
    assert alarm_threshold(_cfg(mismatch_alarm=None), _agents("x", engine_dtype="bfloat16")[0]) == 0.0
    check_mismatch(1, [just_above], _agents("x", bf16=True), _cfg(mismatch_alarm=None))
    # a given threshold holds for bf16 agents too
    with pytest.raises(TrainingError):
        check_mismatch(1, [just_above], _agents("x", bf16=True), _cfg(mismatch_alarm=MISMATCH_ALARM))


def test_the_batch_in_flight_keeps_its_mismatch_rows_through_a_checkpoint():
    from openrlhf_hacpo.trainer.in_flight import GeneratedBatch

    a = _rollout([[-1.0, -2.0]], [[-1.0, -2.5]])
    state = GeneratedBatch(step=2, rollouts=[a]).state_dict()
    assert GeneratedBatch.from_state(state, 1, "ckpt").rollouts[0].mismatch_rows == a.mismatch_rows
    del state["rollouts"][0]["mismatch_rows"]  # a checkpoint written before the metrics
    assert GeneratedBatch.from_state(state, 1, "ckpt").rollouts[0].mismatch_rows == ()
