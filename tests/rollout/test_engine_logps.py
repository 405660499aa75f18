"""The engines' log-probs on their way to the training-inference correction (``--rollout_is``), kept apart from the
old log-probs: the run's predicate that keeps them (``TrainConfig.keeps_engine_logps``) and its refusals, the learner
view's columns (own rows per token, every row its source engine's mean over the source's own tokens), and the loss
they feed: with ``--own_old_logp behaviour`` (one-step-off) the own rows' weight is exactly 1, with ``recompute`` it
is the scoring pass over the engine."""
from __future__ import annotations

import math

import pytest
import torch

from openrlhf_hacpo.actors.scoring import view_config
from openrlhf_hacpo.algorithms import get_policy_loss
from openrlhf_hacpo.cli.train_hacpo import build_config
from openrlhf_hacpo.rollout import LearnerViewConfig, Trajectory, build_learner_batch
from openrlhf_hacpo.trainer.fingerprint import config_fingerprint

BASE = ["--agent", "name=a,pretrain=/m", "--agent", "name=b,pretrain=/m", "--prompt_data", "x.jsonl",
        "--n_samples_per_prompt", "2", "--rollout_batch_size", "3", "--train_batch_size", "12",
        "--micro_train_batch_size", "3", "--init_kl_coef", "0"]
ENGINES = ["--rollout_backend", "hf_engine"]


class Tok:
    """One id per character; no chat template (raw-text prompts)."""

    eos_token_id = 9
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        if isinstance(text, list):
            return {"input_ids": [[ord(c) for c in t] for t in text]}
        return {"input_ids": [ord(c) for c in text]}


SCORED = [-0.5, -1.0, -2.0, -0.1]       # the source's scoring pass (old log-probs); the EOS (id 9) last
ENGINE = [-0.25, -1.5, -3.0, -0.2]      # its sampling engine's, on the same tokens


def trajectories(behaviour=True):
    """One trajectory per agent on the same prompt: 3 action tokens and a terminal EOS (dropped under "drop"); the
    response text "abcde" has 5 characters, so a learner re-tokenizing it sees 5 tokens, not the source's 3."""
    return [Trajectory(prompt_id="p", prompt="q", label=None, response_text="abcde", source=src,
                       source_token_ids=[3, 4, 5, 9], source_logp=SCORED, source_logp_sum=math.fsum(SCORED[:3]),
                       source_num_tokens=3, finished=True, reward=float(src),
                       behaviour_logp=[x + 0.1 * src for x in ENGINE] if behaviour else []) for src in (0, 1)]


def view(own_old_logp_from_engine, generate_max_len=None):
    return LearnerViewConfig(apply_chat_template=False, prompt_max_len=None, generate_max_len=generate_max_len,
                             own_old_logp_from_engine=own_old_logp_from_engine)


# ------------------------------------------------------------------------------------------------ the run's settings
def test_keeps_engine_logps_and_the_refusals_name_the_flags():
    assert not build_config(BASE).keeps_engine_logps
    assert not build_config(BASE + ENGINES).keeps_engine_logps
    assert build_config(BASE + ENGINES + ["--rollout_is"]).keeps_engine_logps
    one_step_off = build_config(BASE + ENGINES + ["--one_step_off"])
    assert one_step_off.resolved_own_old_logp == "behaviour" and one_step_off.keeps_engine_logps
    recompute = build_config(BASE + ENGINES + ["--one_step_off", "--own_old_logp", "recompute"])
    assert not recompute.keeps_engine_logps
    assert build_config(BASE + ENGINES + ["--one_step_off", "--own_old_logp", "recompute",
                                          "--rollout_is"]).keeps_engine_logps
    with pytest.raises(ValueError, match="--rollout_is needs the sampling engines' log-probs .* --rollout_backend "
                                         "hf_engine or vllm, got --rollout_backend hf"):
        build_config(BASE + ["--rollout_is"])
    with pytest.raises(ValueError, match="--rollout_is needs --temperature 1, got --temperature 0.7"):
        build_config(BASE + ENGINES + ["--rollout_is", "--temperature", "0.7"])
    with pytest.raises(ValueError, match=r"--rollout_is_mode \(PolicyLossConfig.params.rollout_is_mode\) = 'mask' sets "
                                         r"the training-inference correction, which is off: turn it on with "
                                         r"--rollout_is"):
        build_config(BASE + ENGINES + ["--rollout_is_mode", "mask"])
    with pytest.raises(ValueError, match=r"--rollout_is_threshold_lower .* is a bound of the mask mode"):
        build_config(BASE + ENGINES + ["--rollout_is", "--rollout_is_threshold_lower", "0.5"])
    with pytest.raises(ValueError, match=r"--rollout_is_threshold \(PolicyLossConfig.params.rollout_is_threshold\) "
                                         r"must be >= 1, got 0.8"):
        build_config(BASE + ENGINES + ["--rollout_is", "--rollout_is_threshold", "0.8"])


def test_the_settings_reach_the_kernel_and_the_fingerprint_only_when_on():
    cfg = build_config(BASE + ENGINES + ["--rollout_is", "--rollout_is_level", "token", "--rollout_is_mode", "mask",
                                         "--rollout_is_threshold", "3", "--rollout_is_threshold_lower", "0.5"])
    params = get_policy_loss("hacpo").params(cfg.algo.loss, 0)
    assert (params.is_mode, params.is_token, params.is_hi, params.is_lo) == (2, True, 3.0, 0.5)
    fingerprint = config_fingerprint(cfg)
    assert fingerprint["algo.loss.rollout_is"] is True and fingerprint["algo.loss.rollout_is_threshold_lower"] == 0.5
    assert not any(k.startswith("algo.loss.rollout_is") for k in config_fingerprint(build_config(BASE + ENGINES)))
    # LoRA agents need nothing of their own: the correction is in the loss, the adapter in the model
    lora = build_config(BASE + ENGINES + ["--rollout_is", "--lora_rank", "4"])
    assert lora.keeps_engine_logps and lora.resolved_agents[0].lora_rank == 4


def test_the_view_takes_engine_old_log_probs_only_with_behaviour():
    assert view_config(build_config(BASE + ENGINES + ["--one_step_off"])).own_old_logp_from_engine
    assert not view_config(build_config(BASE + ENGINES + ["--rollout_is"])).own_old_logp_from_engine
    assert not view_config(build_config(BASE + ENGINES + ["--one_step_off", "--own_old_logp", "recompute",
                                                          "--rollout_is"])).own_old_logp_from_engine


# ------------------------------------------------------------------------------------------------ the view's columns
def test_rows_carry_the_engine_log_probs_apart_from_the_old_ones():
    own, foreign = build_learner_batch(trajectories(), 0, Tok(), view(False), eos_token_id=9).rows
    # own row: the scoring pass stays the old log-probs; the engine's per-token values on the same 3 action tokens
    assert own.old_logp.tolist() == pytest.approx(SCORED[:3])
    assert own.old_logp_mean == pytest.approx(math.fsum(SCORED[:3]) / 3, abs=1e-12)
    assert own.engine_logp.tolist() == pytest.approx(ENGINE[:3])
    assert own.engine_logp_mean == pytest.approx(math.fsum(torch.tensor(ENGINE[:3]).tolist()) / 3, abs=1e-12)
    # foreign row: 5 learner tokens, no per-token engine values; its mean is the source engine's over the SOURCE's 3
    # action tokens (a mean, not a sum: not -4.75 - 0.3)
    assert len(foreign.response_ids) == 5 and foreign.engine_logp is None and foreign.old_logp is None
    source_engine = torch.tensor([x + 0.1 for x in ENGINE]).tolist()[:3]
    assert foreign.engine_logp_mean == pytest.approx(math.fsum(source_engine) / 3, abs=1e-12)
    # with behaviour (one-step-off): the own row's old log-probs are the engine's, so its weight is exactly 1
    own_b = build_learner_batch(trajectories(), 0, Tok(), view(True), eos_token_id=9).rows[0]
    assert own_b.old_logp.tolist() == own_b.engine_logp.tolist() and own_b.old_logp_mean == own_b.engine_logp_mean
    # a response cut to generate_max_len cuts the engine's values alike; the mean stays over all L_j tokens
    own_cut = build_learner_batch(trajectories(), 0, Tok(), view(False, generate_max_len=2), eos_token_id=9).rows[0]
    assert own_cut.engine_logp.tolist() == pytest.approx(ENGINE[:2])
    assert own_cut.engine_logp_mean == own.engine_logp_mean


def test_the_loss_columns_and_the_weights_they_give():
    loss_cfg = build_config(BASE + ENGINES + ["--rollout_is", "--rollout_is_level", "token"]).algo.loss
    for from_engine in (False, True):
        batch = build_learner_batch(trajectories(), 0, Tok(), view(from_engine), eos_token_id=9)
        batch.attach(torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, dtype=torch.float64))
        assert batch.has_engine_logps
        micro = batch.packed(pad_id=0)
        assert micro.engine_logp_mean.tolist() == pytest.approx([r.engine_logp_mean for r in batch.rows])
        assert micro.engine_logp[0, :3].tolist() == pytest.approx(ENGINE[:3]) and not micro.engine_logp[1].any()
        out = get_policy_loss("hacpo")(micro.loss_input(torch.zeros_like(micro.response_mask), 0), loss_cfg)
        own_w = [math.exp(s - e) for s, e in zip(torch.tensor(SCORED[:3]).tolist(), torch.tensor(ENGINE[:3]).tolist())]
        want_own = 1.0 if from_engine else sum(min(w, 2.0) for w in own_w) / 3
        assert out.metrics["rollout_is_own_weight_mean"] == pytest.approx(want_own, rel=1e-6)
        assert out.metrics["rollout_is_own_truncated_frac"] == (0.0 if from_engine else pytest.approx(1 / 3))
        foreign = batch.rows[1]
        assert out.metrics["rollout_is_foreign_weight_mean"] == pytest.approx(
            math.exp(foreign.old_logp_mean - foreign.engine_logp_mean), rel=1e-6)
    # trajectories without the engine's values: no columns, and the loss refuses the correction naming why
    plain = build_learner_batch(trajectories(behaviour=False), 0, Tok(), view(False), eos_token_id=9)
    plain.attach(torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64))
    micro = plain.packed(pad_id=0)
    assert not plain.has_engine_logps and micro.engine_logp_mean is None and micro.engine_logp is None
    with pytest.raises(ValueError, match="with --rollout_is needs PolicyLossInput.engine_logp_mean"):
        get_policy_loss("hacpo")(micro.loss_input(torch.zeros_like(micro.response_mask), 0), loss_cfg)
