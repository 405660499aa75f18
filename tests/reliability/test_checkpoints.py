"""Checkpoint faults: pruning, a broken ``latest``, interrupted saves, corrupt files, a full disk, and files that
would run code when loaded."""
from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from openrlhf_hacpo.trainer import checkpoint as checkpoint_module
from openrlhf_hacpo.trainer.checkpoint import CheckpointManager
from openrlhf_hacpo.utils.rng import capture_rng_state, restore_rng_state
from openrlhf_hacpo.utils import disk
from openrlhf_hacpo.utils.errors import CheckpointError, DiskSpaceError
from openrlhf_hacpo.utils.safe_load import load_torch_file


def _state(step: int) -> dict:
    return {"step": step, "agents": ["llama"], "tracker": {"history": [[0.5]]}, "rng": capture_rng_state(cuda=False)}


def _write_agent(tmp: Path) -> None:
    folder = CheckpointManager.agent_dir(tmp, "llama")
    folder.mkdir(parents=True)
    (folder / "shard.pt").write_bytes(b"x" * 1000)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    """An earlier run left steps 5-7; saving step 2 with max_keep=3 keeps step 2 and points latest at it."""
    manager = CheckpointManager(str(tmp_path), max_keep=3)
    for step in (5, 6, 7):
        manager.save(step, _state(step), _write_agent)
    final = manager.save(2, _state(2), _write_agent)
    assert final.is_dir() and manager.latest(["llama"]) == final
    assert manager.steps() == [2, 6, 7]


@pytest.mark.parametrize("pointer, message", [
    ("global_step9\n", r"names global_step9, which does not exist .*dangling"),
    ("../../elsewhere\n", r"names '\.\./\.\./elsewhere', not a checkpoint folder"),
    ("/etc\n", r"names '/etc', not a checkpoint folder"),
])
def test_a_broken_latest_is_a_clear_error(tmp_path, pointer, message):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _state(1), _write_agent)
    (tmp_path / "latest").write_text(pointer)
    with pytest.raises(CheckpointError, match=message):
        manager.latest()


def test_latest_naming_an_incomplete_checkpoint_is_a_clear_error(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _state(1), _write_agent)
    (tmp_path / "global_step1" / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match="global_step1 is incomplete: it has no trainer_state.pt"):
        manager.latest()
    manager.save(2, _state(2), _write_agent)
    with pytest.raises(CheckpointError, match="has no state for agent 'qwen'"):
        manager.latest(["llama", "qwen"])


def test_stale_leftovers_of_killed_saves_are_cleaned(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    manager.save(2, _state(2), _write_agent)
    half = tmp_path / ".global_step3.k2j1.tmp"
    (half / "agents").mkdir(parents=True)
    (tmp_path / ".latest.q8w.tmp").write_text("global_step3")
    aside_done = tmp_path / ".global_step2.old-ab12"
    aside_done.mkdir()
    only_copy = tmp_path / ".global_step1.old-cd34"
    only_copy.mkdir()
    (only_copy / "trainer_state.pt").write_bytes(b"kept")
    removed = manager.clean_stale()
    assert sorted(p.name for p in removed) == [".global_step2.old-ab12", ".global_step3.k2j1.tmp", ".latest.q8w.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step1", "global_step2", "latest"]
    assert (tmp_path / "global_step1" / "trainer_state.pt").read_bytes() == b"kept"


def test_corrupt_trainer_state_names_the_file(tmp_path):
    manager = CheckpointManager(str(tmp_path))
    final = manager.save(1, _state(1), _write_agent)
    state_file = final / "trainer_state.pt"
    state_file.write_bytes(state_file.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"trainer state .*{state_file}.* is corrupt or truncated"):
        manager.load_trainer_state(final)


def test_corrupt_agent_shard_names_the_agent_and_file(tmp_path):
    shard = tmp_path / "rng_rank0.pt"
    shard.write_bytes(b"\x80\x02garbage that is no torch file")
    with pytest.raises(CheckpointError, match=rf"agent 'llama': checkpoint file {shard} is corrupt"):
        load_torch_file(shard, "agent 'llama'")


class _Payload:
    """Pickles to a call of os.system: loading it with weights_only=False would run the command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "trainer_state.pt"
    torch.save({"step": 1, "x": _Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match="refused without running them"):
        CheckpointManager(str(tmp_path)).load_trainer_state(tmp_path)
    assert not marker.exists()
    with pytest.raises(CheckpointError):
        load_torch_file(evil, "agent 'llama'")
    assert not marker.exists()


def test_project_checkpoints_load_weights_only_and_restore_rng(tmp_path):
    """What the project writes loads with weights_only=True, and the restored RNG states replay the same draws."""
    manager = CheckpointManager(str(tmp_path))
    final = manager.save(1, _state(1), _write_agent)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    loaded = torch.load(final / "trainer_state.pt", weights_only=True)
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    restore_rng_state(loaded["rng"])
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected


def test_the_drivers_rng_capture_does_not_touch_cuda(monkeypatch):
    """The driver's checkpoint must not create CUDA contexts: with a (pretended) GPU visible, the trainer state
    is captured without calling into torch.cuda's RNG."""
    from openrlhf_hacpo.cli.train_hacpo import build_config
    from openrlhf_hacpo.data.prompts import PromptDataLoader, PromptRecord
    from openrlhf_hacpo.trainer.controller import HACPOController

    def forbidden(*args, **kwargs):
        raise AssertionError("the driver called torch.cuda.get_rng_state_all")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", forbidden)
    cfg = build_config(["--agent", "name=a,pretrain=/m", "--prompt_data", "x.jsonl", "--n_samples_per_prompt", "2",
                        "--rollout_batch_size", "1", "--train_batch_size", "2", "--micro_train_batch_size", "2"])
    controller = HACPOController(cfg)
    controller.dataloader = PromptDataLoader([PromptRecord("p0", "1+1", "2")], 1)
    state = controller.trainer_state()
    assert "cuda" not in state["rng"]


def test_full_disk_says_no_space_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _state(1), _write_agent)
    before = _tree(tmp_path)

    def failing_save(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . basic_ios::clear: iostream error")

    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 2**20)
    with pytest.raises(DiskSpaceError, match=rf"no space left on device while writing checkpoint global_step2 to "
                                             rf"{tmp_path}"):
        manager.save(2, _state(2), lambda tmp: (tmp / "agents" / "llama").mkdir())
    assert _tree(tmp_path) == before
    assert manager.latest() == tmp_path / "global_step1"


def test_enospc_from_a_write_hook_is_reported_with_the_path(tmp_path):
    manager = CheckpointManager(str(tmp_path))

    def write_agents(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "agents" / "llama" / "shard.pt"))

    with pytest.raises(DiskSpaceError, match="no space left on device while writing checkpoint global_step1"):
        manager.save(1, _state(1), write_agents)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_writing(tmp_path, monkeypatch):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, _state(1), _write_agent)
    before = _tree(tmp_path)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 100)
    with pytest.raises(DiskSpaceError, match=r"no space left on device for checkpoint global_step2: it needs about "
                                             r".* only 100 B are free"):
        manager.save(2, _state(2), _write_agent)
    assert _tree(tmp_path) == before


def test_atomic_folders_fsync_their_files_before_the_rename(tmp_path, monkeypatch):
    """Every file of an atomic checkpoint folder reaches the disk (fsync) before the folder is renamed into place."""
    from openrlhf_hacpo.utils import atomic

    synced: list[str] = []
    renamed_at: list[int] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    def replace(src, dst):
        renamed_at.append(len(synced))
        return real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    final = tmp_path / "global_step1"
    with atomic.atomic_dir(final) as tmp:
        (tmp / "agents" / "llama").mkdir(parents=True)
        (tmp / "agents" / "llama" / "shard.pt").write_bytes(b"w" * 10)
        (tmp / "trainer_state.pt").write_bytes(b"s")
        tmp_name = tmp.name
    before_rename = [Path(p).relative_to(tmp_path / tmp_name) for p in synced[: renamed_at[0]]
                     if p.startswith(str(tmp_path / tmp_name))]
    assert {str(p) for p in before_rename} >= {"agents/llama/shard.pt", "trainer_state.pt"}


def test_library_checkpoint_failures_name_the_agent_and_folder(tmp_path):
    """What a policy worker wraps around DeepSpeed's load and save: the agent and the folder are named, and a save
    on a full disk says so."""
    from openrlhf_hacpo.utils.safe_load import checkpoint_io

    folder = tmp_path / "agents" / "llama"
    with pytest.raises(CheckpointError, match=rf"agent 'llama': cannot load the checkpoint under {folder} "
                                              r"\(RuntimeError: PytorchStreamReader failed"):
        with checkpoint_io("agent 'llama'", folder, "load"):
            raise RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory")
    with pytest.raises(DiskSpaceError, match=rf"no space left on device while writing the checkpoint of agent "
                                             rf"'llama' to {folder}"):
        with checkpoint_io("agent 'llama'", folder, "save"):
            raise OSError(errno.ENOSPC, "No space left on device")


def test_rng_states_in_numpys_own_form_still_load(tmp_path):
    """Checkpoints written before the numpy state was stored as a tensor hold numpy's tuple with a uint32 array."""
    path = tmp_path / "rng_rank0.pt"
    np.random.seed(5)
    expected = float(np.random.rand())
    np.random.seed(5)
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}, path)
    np.random.seed(0)
    restore_rng_state(load_torch_file(path, "agent 'llama'"))
    assert float(np.random.rand()) == expected
