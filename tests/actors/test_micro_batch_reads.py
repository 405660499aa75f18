"""A micro-batch of the update, and one of the probe, read the device at most 4 times outside the model's forward.

Every Python-level read of a tensor's values (``item``, ``tolist``, ``cpu``, ``numpy``, ``bool``, ``float``, ``int``)
is counted while one micro-batch is packed and goes through forward, loss, records and backward (KL term on, own and
foreign rows), and while the probe decides one micro-batch of foreign rows; on a GPU each such read waits for the
device. Reads inside the forward (``UpdateLoop.forward``: transformers' check of the padding mask, the log-prob
kernel's label check) are counted apart: they are the model's, the same for every caller.
"""
from __future__ import annotations

import math

import pytest
import torch

from openrlhf_hacpo.utils.weighted import WeightedMeans
from skipping_rig import Row, learner_batch, make_config, make_loop, make_model, mean_logps

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
ROWS = [Row(0, 0, True, 0.0, 0.8), Row(1, 1, True, 0.0, -0.6), Row(2, 2, False, math.log(0.9), 1.2),
        Row(3, 3, False, math.log(0.5), 0.9), Row(0, 4, False, math.log(1.3), -0.7), Row(1, 5, False, 0.0, 0.4)]


@pytest.fixture
def reads(monkeypatch):
    """``start(loop)`` begins counting; it returns (reads outside the forward, reads inside it), lists of names."""
    outside: list[str] = []
    inside: list[str] = []
    depth = [0]

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            (inside if depth[0] else outside).append(name)
            return original(self, *args, **kwargs)
        return read

    def start(loop):
        forward = loop.forward

        def counted_forward(*args, **kwargs):
            depth[0] += 1
            try:
                return forward(*args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(loop, "forward", counted_forward)
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, counting(name))
        return outside, inside

    return start


def _update(kl: bool):
    model = make_model()
    extra = ("--init_kl_coef", "0.01") if kl else ()
    loop = make_loop(model, make_config("torch", True, "clamp", micro=6, extra=extra), lr=1e-2)
    batch = learner_batch(ROWS, mean_logps(model))
    ref = {i: torch.full((len(r.response_ids),), -2.0) for i, r in enumerate(batch.rows) if r.is_own} if kl else {}
    return loop, loop.begin_update(batch, 0, ref, WeightedMeans(), [])


def test_an_update_micro_batch_reads_the_device_at_most_four_times(reads):
    loop, update = _update(kl=True)
    micro = update.share.packed(loop.pad_token_id, loop.device, update.ref_logp)
    assert micro.ref_logp is not None and micro.rows == tuple(range(len(ROWS)))
    outside, inside = reads(loop)
    loop.backward(update, update.share, boundary=False)
    assert len(outside) <= 4, outside
    assert update.work.rows_backward == len(ROWS) and not update.nonfinite
    assert any(p.grad is not None and float(p.grad.abs().max()) > 0 for p in loop.engine.module.parameters())


def test_a_probe_micro_batch_reads_the_device_at_most_four_times(reads):
    loop, update = _update(kl=False)
    foreign = [i for i, row in enumerate(ROWS) if not row.own]
    outside, inside = reads(loop)
    result = loop.probe.run(update.share, foreign, 0, update.totals, update.params, update.stats,
                            update.foreign_ratios, update.terms)
    assert len(outside) <= 4, outside
    # s = 0.9 (A > 0) and s = 1.0 (A > 0) lie inside [0.8, 1]; s = 0.5 and s = 1.3 are outside the window
    assert result.keep == [2, 5] and result.finite

