"""The RNG capture of a checkpoint reads only the current CUDA device's generator (reading every visible device
would create a CUDA context on each; with Ray's NOSET variables every GPU of the node is visible), and restores it
to that device. A stand-in ``torch.cuda`` records the calls, so this runs without a GPU."""
from __future__ import annotations

import random

import pytest
import torch

from openrlhf_hacpo.utils import rng


class FakeCuda:
    """Per-device generator states, and a log of which devices were read or written."""

    def __init__(self, devices: int, current: int) -> None:
        self.states = {d: torch.tensor([d, 7, 7], dtype=torch.uint8) for d in range(devices)}
        self.current = current
        self.read: list[int] = []
        self.written: list[tuple[int, list[int]]] = []

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_rng_state)

        def every_device(*_a, **_k):
            raise AssertionError("the RNG capture read every CUDA device")

        monkeypatch.setattr(torch.cuda, "get_rng_state_all", every_device)
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", every_device)

    def get_rng_state(self, device="cuda"):
        index = self.current if device == "cuda" else int(device)
        self.read.append(index)
        return self.states[index].clone()

    def set_rng_state(self, state, device="cuda"):
        index = self.current if device == "cuda" else int(device)
        self.written.append((index, state.tolist()))


def test_capture_reads_only_the_current_device(monkeypatch):
    cuda = FakeCuda(devices=4, current=2)
    cuda.install(monkeypatch)
    state = rng.capture_rng_state()
    assert cuda.read == [2]
    assert state["cuda"].tolist() == [2, 7, 7] and state["cuda_device"] == 2


def test_the_driver_reads_no_cuda_state(monkeypatch):
    cuda = FakeCuda(devices=2, current=0)
    cuda.install(monkeypatch)
    state = rng.capture_rng_state(cuda=False)
    assert cuda.read == [] and "cuda" not in state


def test_restore_writes_only_the_current_device_and_the_host_generators(monkeypatch):
    cuda = FakeCuda(devices=4, current=3)
    cuda.install(monkeypatch)
    random.seed(5)
    torch.manual_seed(5)
    state = rng.capture_rng_state()
    expected = (random.random(), float(torch.rand(())))
    random.seed(99)
    torch.manual_seed(99)
    rng.restore_rng_state(state)
    assert (random.random(), float(torch.rand(()))) == expected
    assert cuda.written == [(3, [3, 7, 7])]


def test_a_per_device_list_of_earlier_checkpoints_restores_the_current_entry(monkeypatch):
    cuda = FakeCuda(devices=2, current=1)
    cuda.install(monkeypatch)
    state = rng.capture_rng_state(cuda=False)
    state["cuda"] = [torch.tensor([10], dtype=torch.uint8), torch.tensor([11], dtype=torch.uint8)]
    rng.restore_rng_state(state)
    assert cuda.written == [(1, [11])]
    cuda.current = 5
    with pytest.raises(ValueError, match="cover 2 device.*device 5"):
        rng.restore_rng_state(state)
