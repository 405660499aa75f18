"""A micro-batch of the update, and one of the probe, read the device at most 4 times outside the model's forward.

Every Python-level read of a tensor's values (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool``, ``float``, ``int``)
is counted while the learner's public steps run; on a GPU each such read waits for the device. The loop is rank 0 of
two data-parallel ranks (``torch.distributed.all_reduce`` leaves each value as this rank's, as if the other rank
agreed), so the decisions all ranks take alike (how many micro-batches, whether any rank's loss was not finite) are
counted as the reads they are in a multi-rank run. Counted:

* an update whose share of a global mini-batch packs into one micro-batch (KL term on, own and foreign rows):
  :meth:`~openrlhf_hacpo.actors.update_loop.UpdateLoop.backward` up to its optimizer step, packing included;
* the probe of a share whose foreign rows pack into one micro-batch:
  :meth:`~openrlhf_hacpo.actors.update_loop.UpdateLoop.rows_to_train`;
* a whole update (probe, update, optimizer step, its records) per forward, and the step's records.

Reads inside the forward (``UpdateLoop.forward``: transformers' check of the padding mask, the log-prob kernel's
label check) and inside the engine's optimizer step (``engine.step``: torch's AdamW reads its step counters) are
counted apart: they are the model's and the optimizer's, the same for every caller.
"""
from __future__ import annotations

import math
import traceback

import pytest
import torch

from openrlhf_hacpo.actors.step_state import StepRecords
from openrlhf_hacpo.utils.weighted import WeightedMeans
from skipping_rig import Row, learner_batch, make_config, make_loop, make_model, mean_logps

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
# rank 0's share is the first 6 rows: 2 own, 4 foreign (s = 0.9 and 1.0 with A > 0 lie inside [0.8, 1]; s = 0.5 and
# s = 1.3 outside the window); rank 1's the other 6
ROWS = [Row(0, 0, True, 0.0, 0.8), Row(1, 1, True, 0.0, -0.6), Row(2, 2, False, math.log(0.9), 1.2),
        Row(3, 3, False, math.log(0.5), 0.9), Row(0, 4, False, math.log(1.3), -0.7), Row(1, 5, False, 0.0, 0.4)]
ROWS = ROWS + ROWS
MICRO = 6


@pytest.fixture
def reads(monkeypatch):
    """``start(loop)`` begins counting; it returns the reads outside the forward and the optimizer step (each as
    its method and the innermost line of the package that made it) and a one-item list counting the forwards."""
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, *args, **kwargs: None)
    outside: list[str] = []
    forwards = [0]
    depth = [0]

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if not depth[0]:
                frames = [f for f in traceback.extract_stack()[:-1] if "openrlhf_hacpo" in f.filename]
                where = f"{frames[-1].filename.rsplit('openrlhf_hacpo', 1)[-1]}:{frames[-1].lineno}" if frames else "?"
                outside.append(f"{name} at {where}")
            return original(self, *args, **kwargs)
        return read

    def apart(function, count=None):
        def call(*args, **kwargs):
            depth[0] += 1
            if count is not None:
                count[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                depth[0] -= 1
        return call

    def start(loop):
        monkeypatch.setattr(loop, "forward", apart(loop.forward, forwards))
        monkeypatch.setattr(loop.engine, "step", apart(loop.engine.step))
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, counting(name))
        return outside, forwards

    return start


def _rank0(kl: bool):
    """Rank 0 of two, one global mini-batch of ``ROWS`` and the reference log-probs of rank 0's own rows."""
    model = make_model()
    extra = ("--init_kl_coef", "0.01") if kl else ()
    loop = make_loop(model, make_config("torch", True, "clamp", micro=MICRO, extra=extra), lr=1e-2, world_size=2)
    batch = learner_batch(ROWS, mean_logps(model))
    ref = {i: torch.full((len(r.response_ids),), -2.0) for i, r in enumerate(batch.rows[:MICRO]) if r.is_own} \
        if kl else {}
    return loop, batch, ref


def test_an_update_micro_batch_reads_the_device_at_most_four_times(reads):
    loop, batch, ref = _rank0(kl=True)
    update = loop.begin_update(batch, 0, ref, WeightedMeans(), [])
    assert update.share.row_ids == list(range(MICRO)) and update.totals.num_seqs == len(ROWS)
    outside, forwards = reads(loop)
    loop.backward(update, update.share, boundary=True)
    assert forwards[0] == 1 and update.work.rows_backward == MICRO and not update.nonfinite
    assert len(outside) <= 4, outside
    assert len(loop.engine.step_grads) == 1 and float(loop.engine.step_grads[0].abs().max()) > 0


def test_a_probe_micro_batch_reads_the_device_at_most_four_times(reads):
    loop, batch, _ = _rank0(kl=False)
    update = loop.begin_update(batch, 0, {}, WeightedMeans(), [])
    foreign = [i for i, row in enumerate(update.share.rows) if not row.is_own]
    outside, forwards = reads(loop)
    rows = loop.rows_to_train(update, foreign)
    assert forwards[0] == 1 and update.work.positions_probe > 0
    assert len(outside) <= 4, outside
    assert rows == [0, 1, 2, 5] and not update.nonfinite  # own rows 0, 1; foreign rows inside the window 2, 5


def test_an_update_and_the_steps_records_read_the_device_at_most_four_times_per_micro_batch(reads):
    loop, batch, ref = _rank0(kl=True)
    stats, records = WeightedMeans(), StepRecords(skipped_before=0)
    outside, forwards = reads(loop)
    records.add(*loop.run_update(batch, 0, 1, ref, stats, records.foreign_ratios, None, records.work))
    assert forwards[0] == 2 and records.work.rows_backward == 4  # one probe and one update micro-batch
    assert len(outside) <= 4 * forwards[0], outside
    update_reads = len(outside)
    records.record(stats, loop.world_size, loop.device)
    assert len(outside) - update_reads <= 1, outside[update_reads:]  # the median foreign ratio
    assert "policy/foreign_ratio_median" in stats.state()


def test_a_loss_call_without_metrics_reads_nothing_and_gives_the_same_loss_and_gradient(reads):
    """The probe's gradient call (``metrics=False``): the loss and its gradient are those of the call with metrics."""
    loop, batch, _ = _rank0(kl=False)
    update = loop.begin_update(batch, 0, {}, WeightedMeans(), [])
    micro = update.share.packed(loop.pad_token_id, loop.device)
    logp = loop.forward(micro).logp.detach()
    outs, grads = [], []
    for metrics in (True, False):
        x = logp.clone().requires_grad_(True)
        if not metrics:
            outside, _ = reads(loop)
        outs.append(loop.loss_fn(micro.loss_input(x, 0, update.totals), loop.cfg.algo.loss,
                                 backend=loop.cfg.compute.kernel_backend, params=update.params, check=False,
                                 metrics=metrics))
        grads += torch.autograd.grad(outs[-1].loss, x)
    assert outside == [] and outs[1].metrics == {} and outs[0].metrics
    assert torch.equal(outs[1].loss, outs[0].loss) and torch.equal(grads[1], grads[0])
    assert torch.equal(outs[1].ratios, outs[0].ratios)
