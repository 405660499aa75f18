"""Atomic writes: the destination is either the old or the new complete version; failures leave the old one."""
import json
import os
import stat

import pytest
import torch

from openrlhf_hacpo.utils import atomic_dir, atomic_torch_save, atomic_write_json, atomic_write_text
from openrlhf_hacpo.utils.atomic import atomic_write_bytes


def listing(path):
    return sorted(p.name for p in path.iterdir())


def test_writes_create_parents_and_replace(tmp_path):
    target = tmp_path / "a" / "b" / "note.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    atomic_write_json(tmp_path / "x.json", {"k": [1, 2]})
    assert json.loads((tmp_path / "x.json").read_text()) == {"k": [1, 2]}
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    atomic_torch_save({"w": torch.arange(3)}, tmp_path / "t.pt")
    assert torch.equal(torch.load(tmp_path / "t.pt")["w"], torch.arange(3))
    assert listing(tmp_path) == ["a", "b.bin", "t.pt", "x.json"]


def test_file_mode_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        mode = stat.S_IMODE(atomic_write_text(tmp_path / "m.txt", "x").stat().st_mode)
    finally:
        os.umask(old)
    assert mode == 0o666 & ~old


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_failed_writes_keep_the_previous_file(tmp_path):
    target = tmp_path / "state.pt"
    atomic_torch_save({"step": 1}, target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        atomic_torch_save({"step": 2, "w": torch.zeros(1000), "bad": Unpicklable()}, target)  # fails mid-stream
    assert target.read_bytes() == before and listing(tmp_path) == ["state.pt"]

    js = tmp_path / "m.json"
    atomic_write_json(js, {"ok": True})
    with pytest.raises(ValueError, match=r"cannot write .*m\.json.* as JSON"):
        atomic_write_json(js, {"bad": float("nan")})
    with pytest.raises(ValueError, match="as JSON"):
        atomic_write_json(js, {"bad": object()})
    assert json.loads(js.read_text()) == {"ok": True}
    assert listing(tmp_path) == ["m.json", "state.pt"]


def test_atomic_dir_replaces_only_after_success(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target and not target.exists()
        (tmp / "a.txt").write_text("v1")
    assert listing(target) == ["a.txt"]

    with pytest.raises(KeyError):
        with atomic_dir(target) as tmp:
            (tmp / "b.txt").write_text("v2")
            raise KeyError("failed half-way")
    assert listing(target) == ["a.txt"] and (target / "a.txt").read_text() == "v1"
    assert listing(tmp_path) == ["ckpt"]  # the temporary sibling is gone

    with atomic_dir(target) as tmp:
        (tmp / "b.txt").write_text("v2")
    assert listing(target) == ["b.txt"]  # old content fully replaced, not merged
    assert listing(tmp_path) == ["ckpt"]


def test_atomic_dir_replaces_a_file(tmp_path):
    target = tmp_path / "out"
    target.write_text("a file")
    with atomic_dir(target) as tmp:
        (tmp / "x").write_text("1")
    assert target.is_dir() and listing(target) == ["x"]
