"""A joint checkpoint counts only once every file every rank reports writing is verified from the driver: against a
hand-made folder, every kind of bad file is named with its agent, rank, node and file; a save with a missing file
keeps the previous checkpoint as the latest, prunes nothing and removes its temporary folder."""
from __future__ import annotations

from pathlib import Path

import pytest

from openrlhf_hacpo.actors.checkpoint_files import rank_manifest
from openrlhf_hacpo.trainer.checkpoint import CheckpointManager, verify_saved_files
from openrlhf_hacpo.utils.errors import CheckpointError


def _manifest(rank: int, files: dict[str, int], node: str = "10.0.0.2 (host gpu-b, node 9be0d712)") -> dict:
    return {"rank": rank, "host": "gpu-b", "node": node, "files": files}


def _folder(root: Path) -> Path:
    """agents/llama with rank 0's model states (30 bytes), optimizer partition (20) and RNG file (5)."""
    agent = root / "agents" / "llama" / "state"
    agent.mkdir(parents=True)
    (agent / "mp_rank_00_model_states.pt").write_bytes(b"m" * 30)
    (agent / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"o" * 20)
    (root / "agents" / "llama" / "rng_rank0.pt").write_bytes(b"r" * 5)
    return root / "agents"


RANK0 = {"state/mp_rank_00_model_states.pt": 30, "state/zero_pp_rank_0_mp_rank_00_optim_states.pt": 20,
         "rng_rank0.pt": 5}


def test_a_complete_folder_has_no_problems(tmp_path):
    assert verify_saved_files(_folder(tmp_path), {"llama": [_manifest(0, RANK0)]}) == []


def test_every_bad_file_is_named_with_agent_rank_node_and_file(tmp_path):
    agents = _folder(tmp_path)
    rank1 = {"state/zero_pp_rank_1_mp_rank_00_optim_states.pt": 20, "rng_rank1.pt": 5}  # never reached the driver
    wrong_size = dict(RANK0, **{"rng_rank0.pt": 6})
    problems = verify_saved_files(agents, {"llama": [_manifest(0, wrong_size), _manifest(1, rank1)],
                                           "qwen": [_manifest(0, {"rng_rank0.pt": -1})],
                                           "mistral": [_manifest(0, {"rng_rank0.pt": 0}, node="")]})
    node = "node 10.0.0.2 (host gpu-b, node 9be0d712)"
    assert problems == [
        f"agent 'llama' rank 0 ({node}): rng_rank0.pt has 5 bytes here at {agents}/llama/rng_rank0.pt, 6 on the "
        "rank's node",
        f"agent 'llama' rank 1 ({node}): rng_rank1.pt (5 bytes on the rank's node) is missing here at "
        f"{agents}/llama/rng_rank1.pt: the checkpoint folder is not shared with that node (it must be one shared "
        "folder on every node, docs/multinode.md)",
        f"agent 'llama' rank 1 ({node}): state/zero_pp_rank_1_mp_rank_00_optim_states.pt (20 bytes on the rank's "
        f"node) is missing here at {agents}/llama/state/zero_pp_rank_1_mp_rank_00_optim_states.pt: the checkpoint "
        "folder is not shared with that node (it must be one shared folder on every node, docs/multinode.md)",
        f"agent 'qwen' rank 0 ({node}): rng_rank0.pt was not found on the rank's own node after it wrote it",
        "agent 'mistral' rank 0 (node gpu-b): rng_rank0.pt is empty on the rank's node",
    ]


def test_an_agent_or_rank_without_files_is_a_problem(tmp_path):
    agents = _folder(tmp_path)
    assert verify_saved_files(agents, {"llama": []}) == ["agent 'llama' reported no files"]
    assert verify_saved_files(agents, {"llama": [_manifest(0, {})]}) == [
        "agent 'llama' rank 0 (node 10.0.0.2 (host gpu-b, node 9be0d712)) reported no files"]


def test_a_rank_manifest_lists_sizes_relative_to_the_agent_folder(tmp_path):
    agent = _folder(tmp_path) / "llama"
    manifest = rank_manifest(0, str(agent), [str(agent / name) for name in RANK0] + [str(agent / "absent.pt")])
    assert manifest["rank"] == 0 and manifest["files"] == {**RANK0, "absent.pt": -1}


def _state(step: int) -> dict:
    return {"step": step, "agents": ["llama"]}


def test_a_save_with_a_missing_file_keeps_the_previous_checkpoint(tmp_path):
    manager = CheckpointManager(str(tmp_path / "ckpt"), max_keep=1)

    def good(tmp: Path) -> dict:
        agent = CheckpointManager.agent_dir(tmp, "llama")
        agent.mkdir(parents=True)
        (agent / "rng_rank0.pt").write_bytes(b"r" * 5)
        return {"llama": [_manifest(0, {"rng_rank0.pt": 5})]}

    first = manager.save(1, _state(1), good)
    seen: list[Path] = []

    def lost(tmp: Path) -> dict:
        good(tmp)
        return {"llama": [_manifest(0, {"rng_rank0.pt": 5}), _manifest(1, {"rng_rank1.pt": 5})]}

    with pytest.raises(CheckpointError) as info:
        manager.save(2, _state(2), lost, on_failure=seen.append)
    message = str(info.value)
    assert message.startswith("checkpoint global_step2 was not saved: agent 'llama' rank 1 (node 10.0.0.2 (host "
                              "gpu-b, node 9be0d712)): rng_rank1.pt (5 bytes on the rank's node) is missing here")
    assert message.endswith("The latest checkpoint stays global_step1")
    assert manager.latest(["llama"]) == first and manager.steps() == [1]  # max_keep=1 pruned nothing
    assert len(seen) == 1 and seen[0].name.startswith(".global_step2.") and not seen[0].exists()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["global_step1", "latest"]
