"""A learner's batch: its rows (:class:`LearnerRow`, one trajectory in the learner's tokens), the per-row tensors the
trainer attaches (advantages, coefficients, row numbers), the split into the updates' mini-batches and micro-batches,
and the packing into :class:`MicroBatch`, the model inputs and the loss's columns.

:func:`~openrlhf_hacpo.rollout.views.build_learner_batch` makes the rows from the step's trajectories.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from openrlhf_hacpo.algorithms.losses import PolicyLossInput
from openrlhf_hacpo.utils.padding import PackedRows, micro_batch_groups, pack_rows, pad_values
from openrlhf_hacpo.utils.partition import split_evenly

__all__ = ["LearnerBatch", "LearnerRow", "MicroBatch", "MINIBATCH_ORDERS"]

MINIBATCH_ORDERS = ("own_first", "stratified", "shuffle")


# ------------------------------------------------------------------------------------------------------ rows
@dataclass
class LearnerRow:
    """One trajectory in one learner's tokens."""

    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    is_own: bool
    source: int
    reward: float
    old_logp_mean: float
    # own rows: float32 tensor of per-token old log-probs aligned with response_ids (a view of the trajectory's
    # source_logp, shared: never modified in place); foreign rows and trajectories without per-token values: None
    old_logp: Any
    prompt_truncated: bool = False
    response_truncated: bool = False
    source_num_tokens: int = 0  # the response's length in its source agent's tokens (L_j)
    # the sampling engine's log-probs (trajectories that carry them, Trajectory.behaviour_logp), kept apart from the
    # old ones for the training-inference correction: the source engine's mean over its L_j action tokens (NaN when
    # none), and on own rows the per-token float32 values aligned with response_ids (None elsewhere)
    engine_logp_mean: float = math.nan
    engine_logp: Any = None


# ------------------------------------------------------------------------------------------------------ batch
def _balanced_chunks(items: list[int], num: int) -> list[list[int]]:
    """Split into ``num`` contiguous chunks whose sizes differ by at most one (larger chunks first)."""
    return [items[r.start:r.stop] for r in split_evenly(len(items), num)]


@dataclass
class LearnerBatch:
    """A learner's rows plus, once the trainer attaches them (:meth:`attach`), three per-row tensors.

    * ``advantages`` [N] float64: A of each row (eqs. 6–8);
    * ``coef`` [N] float64: ω^(j,k) of each row's source (eq. 10; 1 on own rows);
    * ``row_index`` [N] long: the row's position in the learner's full batch (keys its reference log-probs).

    Rows are shared, not copied, between a batch and the batches made from it by :meth:`select`,
    :meth:`split_minibatches` and :meth:`micro_batches`; the tensors are sliced with the rows.
    """

    learner: int
    rows: list[LearnerRow]
    advantages: Any = None
    coef: Any = None
    row_index: Any = None
    row_ids: list[int] | None = None  # ``row_index`` as host ints (read without a tensor read)

    def __len__(self) -> int:
        return len(self.rows)

    # -------------------------------------------------------------------------------------------- row tensors
    def attach(self, advantages: Any, coef: Any) -> None:
        """Attach the advantages and coefficients (1-D tensors, one value per row) and number the rows."""
        for name, values in (("advantages", advantages), ("coef", coef)):
            if not isinstance(values, torch.Tensor) or values.dim() != 1 or len(values) != len(self.rows):
                got = list(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
                raise ValueError(f"LearnerBatch.attach: {name} must be a 1-D tensor of {len(self.rows)} values, "
                                 f"got {got}")
        self.advantages = advantages.detach().cpu().to(torch.float64)
        self.coef = coef.detach().cpu().to(torch.float64)
        self.row_index = torch.arange(len(self.rows))
        self.row_ids = list(range(len(self.rows)))

    def _require_attached(self) -> None:
        if self.advantages is None:
            raise ValueError("LearnerBatch: advantages and coefficients are not attached (call attach first)")

    # -------------------------------------------------------------------------------------------- statistics
    @property
    def num_response_tokens(self) -> int:
        return sum(len(r.response_ids) for r in self.rows)

    def prompt_index(self) -> list[int]:
        """Group index of each row: rows of the same prompt share an index (first appearance order)."""
        index: dict[str, int] = {}
        return [index.setdefault(r.prompt_id, len(index)) for r in self.rows]

    def stats(self) -> dict[str, float]:
        """Truncation fractions and sizes, for logging."""
        n = len(self.rows)
        if n == 0:
            return {"num_rows": 0.0}
        p = sum(r.prompt_truncated for r in self.rows)
        r_ = sum(r.response_truncated for r in self.rows)
        both = sum(r.prompt_truncated or r.response_truncated for r in self.rows)
        return {
            "num_rows": float(n),
            "num_own_rows": float(sum(r.is_own for r in self.rows)),
            "prompt_truncated_fraction": p / n,
            "response_truncated_fraction": r_ / n,
            "truncated_fraction": both / n,
            "response_tokens_mean": self.num_response_tokens / n,
        }

    @property
    def truncated_fraction(self) -> float:
        """Fraction of rows whose prompt or response was truncated."""
        return self.stats().get("truncated_fraction", 0.0)

    # -------------------------------------------------------------------------------------------- splitting
    def select(self, indices: Sequence[int]) -> "LearnerBatch":
        idx = list(indices)
        index = torch.tensor(idx, dtype=torch.long)

        def take(x):
            return None if x is None else x[index]

        return LearnerBatch(learner=self.learner, rows=[self.rows[i] for i in idx], advantages=take(self.advantages),
                            coef=take(self.coef), row_index=take(self.row_index),
                            row_ids=None if self.row_ids is None else [self.row_ids[i] for i in idx])

    def split_minibatches(
        self, num: int, order: str = "own_first", seed: int = 0, dp_chunks: int = 1
    ) -> list["LearnerBatch"]:
        """Split into ``num`` mini-batches, one per optimizer step m = 0..num-1 (eq. 14; docs/algorithm.md §5,
        item 11).

        Orders:
            ``"own_first"`` (official v1 code): own rows first, then foreign rows, each in their current order; the
                sequence is cut into ``dp_chunks`` contiguous chunks (v1's data-parallel ranks) and mini-batch m
                takes the m-th contiguous slice of every chunk. ``dp_chunks=1`` puts all own rows in the first
                mini-batches; v1's 8-rank run (``dp_chunks=8``) gives every mini-batch half own, half foreign rows
                with two agents.
            ``"stratified"``: every source's rows (own first, then foreign sources ascending) are cut into ``num``
                contiguous slices and mini-batch m takes slice m of each: each optimizer step sees the same share
                of every source, as both official runs do in effect.
            ``"shuffle"``: a seeded random permutation cut into ``num`` contiguous slices.
        Mini-batch sizes differ by at most one row per chunk when the rows do not divide evenly.
        """
        n = len(self.rows)
        if not isinstance(num, int) or num < 1:
            raise ValueError(f"split_minibatches: num must be a positive int, got {num!r}")
        if order not in MINIBATCH_ORDERS:
            raise ValueError(f"split_minibatches: order must be one of {MINIBATCH_ORDERS}, got {order!r}")
        if not isinstance(dp_chunks, int) or dp_chunks < 1:
            raise ValueError(f"split_minibatches: dp_chunks must be a positive int, got {dp_chunks!r}")
        if num > n:
            raise ValueError(f"split_minibatches: cannot split {n} rows into {num} non-empty mini-batches")
        own = [i for i, r in enumerate(self.rows) if r.is_own]
        foreign = [i for i, r in enumerate(self.rows) if not r.is_own]
        if order == "own_first":
            parts: list[list[int]] = [[] for _ in range(num)]
            for chunk in _balanced_chunks(own + foreign, dp_chunks):
                for m, piece in enumerate(_balanced_chunks(chunk, num)):
                    parts[m].extend(piece)
        elif order == "stratified":
            sources = sorted({self.rows[i].source for i in foreign})
            groups = [own] + [[i for i in foreign if self.rows[i].source == s] for s in sources]
            parts = [[] for _ in range(num)]
            for group in groups:
                for m, piece in enumerate(_balanced_chunks(group, num)):
                    parts[m].extend(piece)
        else:
            perm = list(range(n))
            random.Random(seed).shuffle(perm)
            parts = _balanced_chunks(perm, num)
        if any(not p for p in parts):
            sizes = [len(p) for p in parts]
            raise ValueError(
                f"split_minibatches: {n} rows with order={order!r}, dp_chunks={dp_chunks} leave an empty "
                f"mini-batch (sizes {sizes})"
            )
        return [self.select(p) for p in parts]

    def micro_batches(self, size: int, *, group_by_length: bool = False,
                      max_tokens: int | None = None) -> list["LearnerBatch"]:
        """Chunks of at most ``size`` rows (gradient accumulation within one mini-batch): consecutive rows, or, with
        ``group_by_length``, rows of similar length (:func:`openrlhf_hacpo.utils.padding.length_grouped`, also
        bounded by ``max_tokens`` packed positions), so packing them computes little padding."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"micro_batches: size must be a positive int, got {size!r}")
        groups = micro_batch_groups([len(r.prompt_ids) for r in self.rows], [len(r.response_ids) for r in self.rows],
                                    size, group_by_length, max_tokens)
        return [self.select(g) for g in groups]

    # -------------------------------------------------------------------------------------------- tensors
    @property
    def has_engine_logps(self) -> bool:
        """Whether every row carries its sampling engine's log-probs (``engine_logp_mean``)."""
        return bool(self.rows) and all(math.isfinite(r.engine_logp_mean) for r in self.rows)

    def _loss_columns(self, width: int) -> dict[str, Any]:
        """The loss's per-row columns, as a :class:`MicroBatch` holds them: ``advantages``, ``coef``,
        ``old_logp_mean`` [N] float32, ``is_own`` [N] bool, ``old_logp`` [N, width] float32 (0 past a row's values);
        when every row carries its engine's log-probs (:attr:`has_engine_logps`), ``engine_logp_mean`` [N] and
        ``engine_logp`` [N, width] float32 (own rows' values, 0 elsewhere), else None."""
        engine = self.has_engine_logps
        return dict(
            advantages=self.advantages.to(torch.float32),
            coef=self.coef.to(torch.float32),
            old_logp_mean=torch.tensor([r.old_logp_mean for r in self.rows], dtype=torch.float32),
            old_logp=pad_values([r.old_logp for r in self.rows], width),
            is_own=torch.tensor([r.is_own for r in self.rows], dtype=torch.bool),
            engine_logp_mean=torch.tensor([r.engine_logp_mean for r in self.rows], dtype=torch.float32)
            if engine else None,
            engine_logp=pad_values([r.engine_logp for r in self.rows], width) if engine else None,
        )

    def _require_rows(self, where: str) -> None:
        if not self.rows:
            raise ValueError(f"LearnerBatch.{where}: the batch is empty")
        self._require_attached()

    def packed(self, pad_id: int, device: Any = None, ref_logp: Any = None) -> "MicroBatch":
        """The rows as one :class:`MicroBatch` for a forward and the loss (on ``device``). ``ref_logp`` maps a row
        index to its reference log-probs (own rows, the KL term); the micro-batch then carries them as [B, R]
        (0 on other rows and on padding)."""
        self._require_rows("packed")
        packed = pack_rows([r.prompt_ids for r in self.rows], [r.response_ids for r in self.rows], pad_id)
        width = packed.response_ids.shape[1]
        ids = self.row_ids if self.row_ids is not None else self.row_index.tolist()
        ref = None
        if ref_logp is not None:
            ref = pad_values([ref_logp.get(i) if r.is_own else None for i, r in zip(ids, self.rows)], width)
        micro = MicroBatch(packed=packed, row_index=self.row_index.clone(), ref_logp=ref, rows=tuple(ids),
                           own=tuple(r.is_own for r in self.rows),
                           prompt_lengths=tuple(len(r.prompt_ids) for r in self.rows),
                           response_lengths=tuple(len(r.response_ids) for r in self.rows),
                           **self._loss_columns(width))
        return micro if device is None else micro.to(device)

    def whole_loss_input(self) -> PolicyLossInput:
        """The whole batch as one :class:`~openrlhf_hacpo.algorithms.PolicyLossInput` built from its columns, without
        packing the token ids: zero log-probs [N, R] (R = the longest response), the response mask (1 on each row's
        response tokens), the per-row columns and the per-token old log-probs, the same values :meth:`packed` gives
        the loss. What :func:`~openrlhf_hacpo.algorithms.losses.check_policy_input` checks once per learner batch."""
        self._require_rows("whole_loss_input")
        lengths = torch.tensor([len(r.response_ids) for r in self.rows], dtype=torch.long)
        width = int(lengths.max())
        mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.float32)
        return PolicyLossInput(logp=torch.zeros_like(mask), mask=mask, update_index=0,
                               **self._loss_columns(width))


@dataclass(frozen=True)
class MicroBatch:
    """One packed micro-batch of a learner's rows: the model inputs and the loss's per-row columns.

    * ``packed``: :class:`~openrlhf_hacpo.utils.padding.PackedRows`, the model inputs, ``[B, P+R]``;
    * ``advantages`` [B], ``coef`` [B], ``old_logp_mean`` [B] float32; ``is_own`` [B] bool; ``row_index`` [B] long;
    * ``old_logp`` [B, R] float32: own rows' per-token old log-probs on the learner's tokens, 0 on foreign rows and
      padding;
    * ``ref_logp`` [B, R] float32 or None: reference log-probs of own rows (the KL term), 0 elsewhere;
    * ``engine_logp_mean`` [B] and ``engine_logp`` [B, R] float32 or None: the sampling engines' log-probs (the
      training-inference correction; :meth:`LearnerBatch._loss_columns`);
    * on the host, so the update reads no tensor for them: ``rows`` (the row indices), ``own`` (the ``is_own``
      flags), ``prompt_lengths`` and ``response_lengths`` (hence :attr:`num_tokens`, :attr:`positions`,
      :attr:`real_positions`).
    """

    packed: PackedRows
    advantages: Any
    coef: Any
    old_logp_mean: Any
    old_logp: Any
    is_own: Any
    row_index: Any
    ref_logp: Any = None
    engine_logp_mean: Any = None
    engine_logp: Any = None
    rows: tuple[int, ...] = ()
    own: tuple[bool, ...] = ()
    prompt_lengths: tuple[int, ...] = ()
    response_lengths: tuple[int, ...] = ()

    def __len__(self) -> int:
        return int(self.is_own.shape[0])

    @property
    def response_mask(self):
        """[B, R] float32, 1 on the response tokens the loss counts."""
        return self.packed.response_mask

    @property
    def num_tokens(self) -> int:
        """Response tokens of these rows (the loss's tokens)."""
        return sum(self.response_lengths)

    @property
    def positions(self) -> int:
        """Token positions a forward of the pack computes, B·(P+R)."""
        return int(self.packed.input_ids.shape[0] * self.packed.input_ids.shape[1])

    @property
    def real_positions(self) -> int:
        """The real (prompt and response) tokens among :attr:`positions`."""
        return sum(self.prompt_lengths) + sum(self.response_lengths)

    def to(self, device: Any) -> "MicroBatch":
        tensors = {name: getattr(self, name) for name in _MICRO_TENSORS}
        return dataclasses.replace(self, packed=self.packed.to(device),
                                   **{k: None if v is None else v.to(device) for k, v in tensors.items()})

    def select(self, indices: Sequence[int]) -> "MicroBatch":
        """These rows restricted to ``indices`` (positions in this micro-batch): model inputs, loss columns and host
        fields sliced alike (the pack keeps its width)."""
        idx = list(indices)
        index = torch.tensor(idx, dtype=torch.long, device=self.is_own.device)
        packed = PackedRows(**{f.name: getattr(self.packed, f.name)[index] for f in dataclasses.fields(self.packed)})
        tensors = {name: getattr(self, name) for name in _MICRO_TENSORS}
        return dataclasses.replace(self, packed=packed, **{k: None if v is None else v[index]
                                                          for k, v in tensors.items()},
                                   **{name: tuple(getattr(self, name)[i] for i in idx) for name in _MICRO_HOST})

    def loss_input(self, logp: Any, update_index: int, totals: Any = None, *, ref_logp: Any = None,
                   token_level: bool = False) -> PolicyLossInput:
        """The :class:`~openrlhf_hacpo.algorithms.PolicyLossInput` of these rows for log-probs ``logp`` [B, R]; the
        per-token old log-probs go with token-level ratios and with the engine's (a per-token correction reads
        both)."""
        per_token_old = token_level or self.engine_logp is not None
        return PolicyLossInput(logp=logp, mask=self.response_mask, advantages=self.advantages,
                               old_logp_mean=self.old_logp_mean, is_own=self.is_own, coef=self.coef,
                               update_index=update_index, old_logp=self.old_logp if per_token_old else None,
                               ref_logp=ref_logp, totals=totals, engine_logp_mean=self.engine_logp_mean,
                               engine_logp=self.engine_logp)


_MICRO_TENSORS = ("advantages", "coef", "old_logp_mean", "old_logp", "is_own", "row_index", "ref_logp",
                  "engine_logp_mean", "engine_logp")
_MICRO_HOST = ("rows", "own", "prompt_lengths", "response_lengths")
