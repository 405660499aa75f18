"""Tokenizer-neutral trajectories: what one agent's rollout leaves in the shared store.

A trajectory carries everything another agent needs to learn from it without the source's tokenizer: the prompt
(chat messages or raw text), the response *text*, the verified reward, the source agent index and the source
policy's old log-probability of its own response, summarised as ``source_logp_sum`` over ``source_num_tokens``
action tokens. For learner k and source j the cross-agent ratio of eq. 11 uses
``old_logp_mean = source_logp_sum / source_num_tokens``, normalised by the source's own token count L_j
(docs/algorithm.md §5, item 7).

The source's raw token ids and per-token log-probs are kept too, so the source itself can train on its own rows with
its original ids, as the official v1 code does. The per-token log-probs stay a float32 tensor (the scorer's own values)
from scoring to the learner view; only :meth:`Trajectory.to_dict` (the rollout dump and
:meth:`~openrlhf_hacpo.rollout.RolloutStore.state_dict`; no checkpoint holds trajectories) writes them as a list of
floats, which :meth:`Trajectory.from_dict` turns back into the same float32 tensor (float32 -> float -> float32 is
exact).

End-of-sequence handling (the paper is silent; docs/algorithm.md §5, item 8) is fixed when the trajectory is created:

* ``"drop"`` (default, the official v1 code): the terminal EOS is not an action. It is excluded from
  ``source_logp_sum`` / ``source_num_tokens`` and from every learner view, so EOS emission is never trained. An
  EOS-only response stays a single EOS action, so no row is empty.
* ``"keep"``: the terminal EOS is an action; learner views append the *learner's* EOS id to foreign responses that
  finished.
* ``"text"`` (the official main code, which produced the paper's numbers): the terminal EOS is an action, as under
  ``"keep"``; other agents read the response decoded *with* its special tokens (``foreign_text``), so a finished
  response carries the source's EOS string, which each learner's tokenizer re-tokenizes: the learner's id of that
  token when its vocabulary has it (a same-family pair), the string's plain pieces otherwise.

``source_token_ids`` / ``source_logp`` always hold the ids as generated, EOS included when one was emitted;
:meth:`Trajectory.action_token_ids` / :meth:`Trajectory.action_logp` apply the trajectory's EOS policy.
``response_text`` never contains the terminal EOS.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Sequence, Union

import torch

Messages = list[dict[str, Any]]
Prompt = Union[str, Messages]

EOS_POLICIES = ("drop", "keep", "text")

__all__ = [
    "EOS_POLICIES",
    "Messages",
    "Prompt",
    "Trajectory",
    "apply_eos_policy",
    "make_trajectory",
    "validate_prompt",
]


def _check_eos_policy(policy: str, where: str = "eos_policy") -> None:
    if policy not in EOS_POLICIES:
        raise ValueError(f"{where} must be one of {EOS_POLICIES}, got {policy!r}")


def _eos_set(eos_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_id is None:
        return frozenset()
    if isinstance(eos_id, int):
        return frozenset((eos_id,))
    return frozenset(int(e) for e in eos_id)


def apply_eos_policy(
    ids: Sequence[int],
    logps: Sequence[float] | None,
    eos_id: int | Sequence[int] | None,
    policy: str,
) -> tuple[list[int], list[float] | None]:
    """Return the action tokens (and their log-probs) of a generated response under an EOS policy.

    ``policy="drop"`` removes one terminal EOS (any id in ``eos_id``) unless it is the only token: an EOS-only
    response is kept as a single EOS action. ``"keep"`` and ``"text"`` return the ids unchanged. ``logps``, when
    given, must be aligned with ``ids`` and is cut the same way.
    """
    _check_eos_policy(policy)
    ids = [int(i) for i in ids]
    if logps is not None:
        logps = [float(x) for x in logps]
        if len(logps) != len(ids):
            raise ValueError(f"apply_eos_policy: {len(logps)} log-probs for {len(ids)} token ids")
    if policy == "drop" and len(ids) > 1 and ids[-1] in _eos_set(eos_id):
        ids = ids[:-1]
        if logps is not None:
            logps = logps[:-1]
    return ids, logps


def _logp_tensor(values: Any, where: str) -> torch.Tensor:
    """Per-token log-probs as a 1-D float32 CPU tensor: a tensor keeps its values (float32 is left as is), a sequence
    of floats (e.g. read from JSON) becomes one. A view into a larger tensor is copied, so pickling a trajectory
    (Ray) never carries the rest of that tensor."""
    if isinstance(values, torch.Tensor):
        out = values.detach().to(device="cpu", dtype=torch.float32)
        if out.dim() != 1:
            raise ValueError(f"{where} must be a 1-D tensor of per-token log-probs, got shape {list(out.shape)}")
        if out.untyped_storage().nbytes() != out.numel() * out.element_size() or not out.is_contiguous():
            out = out.clone()
        return out
    return torch.tensor([float(x) for x in values], dtype=torch.float32)


def validate_prompt(prompt: Any, where: str = "prompt") -> Prompt:
    """Check that a prompt is a string or a list of chat messages ``{"role": str, "content": str}``."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not prompt:
        raise ValueError(f"{where} must be a string or a non-empty list of chat messages, got {type(prompt).__name__}")
    for i, msg in enumerate(prompt):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or "content" not in msg:
            raise ValueError(f"{where}[{i}] must be a dict with a string 'role' and a 'content', got {msg!r}")
    return prompt


_TENSOR_FIELDS = ("source_logp", "behaviour_logp")


@dataclass(eq=False)  # __eq__ below: a tensor field has no truth value for the generated one
class Trajectory:
    """One verified response of one agent to one prompt, independent of any tokenizer.

    Fields:
        prompt_id: canonical id of the prompt, shared by every agent's responses to it (the advantage group key).
        prompt: chat messages (list of ``{"role", "content"}``) or raw prompt text.
        label: ground-truth answer for the verifier, or None.
        response_text: the response decoded without special tokens and without the terminal EOS.
        source: index of the agent that generated the response.
        source_token_ids: the response ids as generated by the source, EOS included when one was emitted.
        source_logp: per-token log-probs of ``source_token_ids`` under the source's old policy at the rollout
            temperature (the scorer's recompute, :mod:`openrlhf_hacpo.actors.scoring`),
            aligned with ``source_token_ids``: a 1-D float32 CPU tensor (a list of floats given to the constructor,
            e.g. by :meth:`from_dict`, is converted); empty when per-token values are not kept.
        source_logp_sum: sum of the old log-probs over the action tokens (after the EOS policy); None until the
            source's learner has scored them (``old_logp_from_update``: its first update's forward, see
            :meth:`set_old_logps`).
        source_num_tokens: number of action tokens L_j (after the EOS policy), >= 1.
        finished: True when the response ended with the source's EOS (the last id of ``source_token_ids``).
        eos_policy: the EOS policy the action tokens were defined with (``"drop"`` | ``"keep"`` | ``"text"``).
        reward: verified scalar reward, None until verified.
        step: training step that produced the trajectory.
        finish_reason: the engine's stop reason (``"stop"``, ``"length"``, ...), informational.
        metadata: JSON-safe extras (e.g. ``prompt_text``, the prompt as rendered by the source).
        foreign_text: what other agents re-tokenize when it differs from ``response_text``: under ``eos_policy
            "text"`` the response decoded with its special tokens, terminal EOS included; None otherwise.
        policy_version: the weights version of the policy that generated the response: the number of training
            steps those weights had taken (0: the initial weights). A learner at version v training the row sees it
            ``v - policy_version`` versions stale (0 in synchronous training, 1 with ``--one_step_off``).
        behaviour_logp: per-token log-probs of ``source_token_ids`` under the behaviour policy, as the engine that
            sampled them computed them (temperature 1, untruncated: ``SamplingConfig.return_logprobs``), aligned
            like ``source_logp``; empty unless the run keeps them (``TrainConfig.keeps_engine_logps``:
            ``--own_old_logp behaviour`` or ``--rollout_is``). With ``--own_old_logp behaviour`` the source's own
            rows take them as old log-probs (decoupled PPO); other learners still divide by ``old_logp_mean`` (the
            scoring pass). Every learner row of the trajectory also carries them apart from the old log-probs, for
            the training-inference correction (``LearnerRow.engine_logp`` / ``engine_logp_mean``).

    Equality (``==``) compares every field, ``source_logp`` and ``behaviour_logp`` by value (:func:`torch.equal`:
    same length, same float32 values), so a trajectory equals its JSON round trip.
    """

    prompt_id: str
    prompt: Prompt
    label: str | None
    response_text: str
    source: int
    source_token_ids: list[int]
    source_logp: torch.Tensor
    source_logp_sum: float | None
    source_num_tokens: int
    finished: bool
    eos_policy: str = "drop"
    reward: float | None = None
    step: int = 0
    finish_reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    foreign_text: str | None = None
    policy_version: int = 0
    behaviour_logp: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.float32))

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_id, str) or not self.prompt_id:
            raise ValueError(f"Trajectory.prompt_id must be a non-empty string, got {self.prompt_id!r}")
        where = f"Trajectory({self.prompt_id!r}, source={self.source})"
        validate_prompt(self.prompt, f"{where}.prompt")
        if self.label is not None and not isinstance(self.label, str):
            raise ValueError(f"{where}.label must be a string or None, got {type(self.label).__name__}")
        if not isinstance(self.response_text, str):
            raise ValueError(f"{where}.response_text must be a string")
        if self.foreign_text is not None and not isinstance(self.foreign_text, str):
            raise ValueError(f"{where}.foreign_text must be a string or None")
        if not isinstance(self.source, int) or isinstance(self.source, bool) or self.source < 0:
            raise ValueError(f"{where}.source must be a non-negative int agent index")
        _check_eos_policy(self.eos_policy, f"{where}.eos_policy")
        if self.eos_policy == "text" and self.foreign_text is None:
            raise ValueError(f"{where}: eos_policy 'text' needs foreign_text (the response decoded with its special "
                             f"tokens)")
        self.source_token_ids = [int(i) for i in self.source_token_ids]
        self.source_logp = _logp_tensor(self.source_logp, f"{where}.source_logp")
        if not self.source_token_ids:
            raise ValueError(f"{where}.source_token_ids is empty; a response has at least one token")
        if len(self.source_logp) and len(self.source_logp) != len(self.source_token_ids):
            raise ValueError(
                f"{where}.source_logp has {len(self.source_logp)} values for {len(self.source_token_ids)} token ids"
            )
        self.behaviour_logp = _logp_tensor(self.behaviour_logp, f"{where}.behaviour_logp")
        if len(self.behaviour_logp) and len(self.behaviour_logp) != len(self.source_token_ids):
            raise ValueError(f"{where}.behaviour_logp has {len(self.behaviour_logp)} values for "
                             f"{len(self.source_token_ids)} token ids")
        if (not isinstance(self.policy_version, int) or isinstance(self.policy_version, bool)
                or self.policy_version < 0):
            raise ValueError(f"{where}.policy_version must be a non-negative int, got {self.policy_version!r}")
        n_actions = len(self.action_token_ids())
        if self.source_num_tokens != n_actions:
            raise ValueError(
                f"{where}.source_num_tokens={self.source_num_tokens} but the response has {n_actions} action tokens "
                f"under eos_policy={self.eos_policy!r} (finished={self.finished})"
            )
        if self.source_logp_sum is None:
            if len(self.source_logp):
                raise ValueError(f"{where}: per-token log-probs without their sum (source_logp_sum is None)")
        else:
            self._check_sum(where)
        if self.reward is not None:
            self.reward = _finite_reward(self.reward, where)
        if not isinstance(self.metadata, dict):
            raise ValueError(f"{where}.metadata must be a dict")

    def _check_sum(self, where: str) -> None:
        self.source_logp_sum = float(self.source_logp_sum)
        if not math.isfinite(self.source_logp_sum):
            raise ValueError(f"{where}.source_logp_sum must be finite, got {self.source_logp_sum}")
        if len(self.source_logp):
            expected = math.fsum(self.action_logp().tolist())
            if not math.isclose(expected, self.source_logp_sum, rel_tol=1e-5, abs_tol=1e-4):
                raise ValueError(
                    f"{where}.source_logp_sum={self.source_logp_sum} does not match the sum of the action "
                    f"log-probs ({expected})"
                )

    def set_old_logps(self, action_logps: Sequence[float] | torch.Tensor) -> None:
        """Record the source's old log-probs of the action tokens (:meth:`action_token_ids`), computed by its
        learner (``old_logp_from_update``): ``source_logp_sum`` becomes their sum; the per-token values stay with
        that learner (``source_logp`` is left empty)."""
        values = action_logps.tolist() if isinstance(action_logps, torch.Tensor) else [float(x) for x in action_logps]
        self.set_old_logp_sum(math.fsum(values), len(values))

    def set_old_logp_sum(self, total: float, count: int) -> None:
        """:meth:`set_old_logps` given the sum of the ``count`` action tokens' old log-probs (what a learner sends)."""
        where = f"Trajectory({self.prompt_id!r}, source={self.source})"
        if count != self.source_num_tokens:
            raise ValueError(f"{where}: {count} old log-probs for {self.source_num_tokens} action tokens")
        self.source_logp = torch.empty(0, dtype=torch.float32)
        self.source_logp_sum = float(total)
        self._check_sum(where)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if not (torch.equal(mine, theirs) if f.name in _TENSOR_FIELDS else mine == theirs):
                return False
        return True

    # ----------------------------------------------------------------------------------------------------------
    def _drops_terminal_eos(self) -> bool:
        return self.eos_policy == "drop" and self.finished and len(self.source_token_ids) > 1

    def action_token_ids(self) -> list[int]:
        """The source's own action tokens: ``source_token_ids`` with the EOS policy applied."""
        return self.source_token_ids[:-1] if self._drops_terminal_eos() else list(self.source_token_ids)

    def action_logp(self) -> torch.Tensor:
        """Per-token old log-probs of :meth:`action_token_ids`: a float32 view of ``source_logp`` (empty when
        per-token values were not kept)."""
        if not len(self.source_logp):
            return self.source_logp
        return self.source_logp[:-1] if self._drops_terminal_eos() else self.source_logp

    def action_behaviour_logp(self) -> torch.Tensor:
        """:attr:`behaviour_logp` of the action tokens (the EOS policy applied); empty when none were kept."""
        if not len(self.behaviour_logp):
            return self.behaviour_logp
        return self.behaviour_logp[:-1] if self._drops_terminal_eos() else self.behaviour_logp

    @property
    def old_logp_mean(self) -> float:
        """``source_logp_sum / source_num_tokens``: the source side of eq. 11, normalised by L_j."""
        if self.source_logp_sum is None:
            raise ValueError(f"Trajectory({self.prompt_id!r}, source={self.source}) has no old log-probs yet")
        return self.source_logp_sum / self.source_num_tokens

    @property
    def truncated(self) -> bool:
        """True when generation stopped at the length limit (``finish_reason == "length"``; without a recorded
        reason: when no EOS was emitted)."""
        return self.finish_reason == "length" if self.finish_reason is not None else not self.finished

    @property
    def is_verified(self) -> bool:
        return self.reward is not None

    @property
    def text_for_others(self) -> str:
        """The text another agent's tokenizer turns into its response ids: ``foreign_text`` when set, else
        ``response_text``."""
        return self.response_text if self.foreign_text is None else self.foreign_text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (lists and scalars only; ``source_logp`` as a list of floats, each exactly its float32
        value); :meth:`from_dict` inverts it."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["prompt"] = self.prompt if isinstance(self.prompt, str) else [dict(m) for m in self.prompt]
        out["source_token_ids"] = list(self.source_token_ids)
        out["source_logp"] = self.source_logp.tolist()
        out["behaviour_logp"] = self.behaviour_logp.tolist()
        out["metadata"] = dict(self.metadata)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trajectory":
        """A trajectory from :meth:`to_dict`'s dict (``source_logp`` back to a float32 tensor)."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"Trajectory.from_dict: unknown field(s) {sorted(unknown)}")
        return cls(**data)


def _finite_reward(value: Any, where: str) -> float:
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}.reward must be a number, got {value!r}") from None
    if not math.isfinite(reward):
        raise ValueError(f"{where}.reward must be finite, got {reward}")
    return reward


def make_trajectory(
    *,
    prompt_id: str,
    prompt: Prompt,
    label: str | None,
    source: int,
    step: int,
    token_ids: Sequence[int],
    token_logps: torch.Tensor | Sequence[float] | None,
    eos_token_id: int | Sequence[int] | None,
    eos_policy: str = "drop",
    response_text: str | None = None,
    tokenizer: Any = None,
    finish_reason: str | None = None,
    keep_token_logps: bool = True,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """Build a trajectory from a raw generation and the source policy's per-token old log-probs.

    ``token_logps`` is the scorer's float32 tensor (kept as the trajectory's ``source_logp``, values unchanged) or a
    sequence of floats (stored as float32); None leaves the trajectory unscored (``source_logp_sum`` None). ``finished`` is True when the last generated id is an EOS id. The action
    tokens follow ``eos_policy`` (:func:`apply_eos_policy`); ``source_logp_sum`` / ``source_num_tokens`` cover exactly
    those tokens (the sum is taken over the values as given).
    ``response_text`` defaults to ``tokenizer.decode(ids without the terminal EOS, skip_special_tokens=True)``.
    Under ``eos_policy="text"`` the ``tokenizer`` is required: ``foreign_text`` is ``tokenizer.decode(ids,
    skip_special_tokens=False)``, the main-branch code's decoding of a response for the other agents.
    """
    ids = [int(i) for i in token_ids]
    scored = token_logps is not None
    if not scored:  # the source's learner records them later (Trajectory.set_old_logps)
        token_logps, keep_token_logps = [0.0] * len(ids), False
    logps = token_logps.tolist() if isinstance(token_logps, torch.Tensor) else [float(x) for x in token_logps]
    if not ids:
        raise ValueError(f"make_trajectory({prompt_id!r}, source={source}): empty generation")
    if len(logps) != len(ids):
        raise ValueError(f"make_trajectory({prompt_id!r}, source={source}): {len(logps)} log-probs for {len(ids)} ids")
    finished = ids[-1] in _eos_set(eos_token_id)
    action_ids, action_logps = apply_eos_policy(ids, logps, eos_token_id, eos_policy)
    if response_text is None:
        if tokenizer is None:
            raise ValueError(f"make_trajectory({prompt_id!r}): pass response_text or a tokenizer to decode the ids")
        text_ids = ids[:-1] if finished else ids
        response_text = tokenizer.decode(text_ids, skip_special_tokens=True)
    foreign_text = None
    if eos_policy == "text":
        if tokenizer is None:
            raise ValueError(f"make_trajectory({prompt_id!r}): eos_policy 'text' needs the source's tokenizer")
        foreign_text = tokenizer.decode(ids, skip_special_tokens=False)
    return Trajectory(
        prompt_id=prompt_id,
        prompt=prompt,
        label=label,
        response_text=response_text,
        source=source,
        source_token_ids=ids,
        source_logp=token_logps if keep_token_logps else [],  # Trajectory stores either form as float32
        source_logp_sum=math.fsum(action_logps or []) if scored else None,
        source_num_tokens=len(action_ids),
        finished=finished,
        eos_policy=eos_policy,
        step=step,
        finish_reason=finish_reason,
        metadata=dict(metadata or {}),
        foreign_text=foreign_text,
    )
