"""Rollouts shared between agents: tokenizer-neutral trajectories, the store, learner views and batches, rewards."""
from openrlhf_hacpo.rollout.learner_batch import LearnerBatch, LearnerRow, MicroBatch
from openrlhf_hacpo.rollout.reward_fns import RewardFunction, RewardFunctionError, get_reward_fn, register_reward_fn
from openrlhf_hacpo.rollout.reward_runner import RewardRunner, RewardTimeoutError
from openrlhf_hacpo.rollout.store import RolloutStore
from openrlhf_hacpo.rollout.trajectory import Trajectory, apply_eos_policy, make_trajectory
from openrlhf_hacpo.rollout.verifiers import boxed_math, exact_match
from openrlhf_hacpo.rollout.views import (
    LearnerViewConfig,
    build_learner_batch,
    encode_response,
    render_prompt_ids,
    render_prompt_text,
)

__all__ = [
    "LearnerBatch",
    "LearnerRow",
    "LearnerViewConfig",
    "MicroBatch",
    "RewardFunction",
    "RewardFunctionError",
    "RewardRunner",
    "RewardTimeoutError",
    "RolloutStore",
    "Trajectory",
    "apply_eos_policy",
    "boxed_math",
    "build_learner_batch",
    "encode_response",
    "exact_match",
    "get_reward_fn",
    "make_trajectory",
    "register_reward_fn",
    "render_prompt_ids",
    "render_prompt_text",
]
