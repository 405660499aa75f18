"""A lost or hung worker in one line: the fields of the error (agent, worker, node, phase, last checkpoint, the
command that resumes), how Ray's actor-death messages are read, and how an actor id is traced to its worker."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from openrlhf_hacpo.actors.pending import (AgentPhaseTimeout, AgentWorkerDied, WorkerRef, death_error,
                                           identify_worker)
from openrlhf_hacpo.trainer.failures import TrainingError, resume_command, worker_failure

NODE_B = "10.0.0.2 (host gpu-b, node 9be0d712)"
ARGV = ["--agent", "name=llama,pretrain=/models/my llama", "--save_path", "runs/x", "--overwrite"]


def test_a_dead_rank_names_every_field_and_the_exact_resume_command():
    died = AgentWorkerDied("llama", "policy", "its node died", rank=1, node=NODE_B, phase="update")
    err = worker_failure("step 5", died, Path("runs/x/checkpoints/global_step4"), "runs/x/checkpoints", ARGV)
    assert isinstance(err, TrainingError)
    assert str(err) == (
        f"step 5 failed: agent 'llama', policy rank 1, node {NODE_B}, phase update: the worker died (its node "
        "died). Last complete checkpoint: runs/x/checkpoints/global_step4; resume with: python -m "
        "openrlhf_hacpo.cli.train_hacpo --agent 'name=llama,pretrain=/models/my llama' --save_path runs/x --resume")
    assert (err.agent, err.role, err.rank, err.node, err.phase) == ("llama", "policy", 1, NODE_B, "update")
    assert err.checkpoint == Path("runs/x/checkpoints/global_step4")
    assert "\n" not in str(err)


def test_a_hung_engine_without_a_checkpoint_says_how_to_start_over():
    hung = AgentPhaseTimeout("qwen", "vLLM engine", "generate", 30.0, rank=0, node=None)
    err = worker_failure("step 1", hung, None, "runs/x/checkpoints", ["--save_path", "runs/x", "--resume"])
    assert str(err) == (
        "step 1 failed: agent 'qwen', vLLM engine 0, node unknown, phase generate: no result within 30 s "
        "(--step_timeout): hung, stopped or much slower than expected. No complete checkpoint yet (checkpoint folder "
        "runs/x/checkpoints); start over with: python -m openrlhf_hacpo.cli.train_hacpo --save_path runs/x "
        "--overwrite")


def test_without_the_command_line_the_advice_names_the_flag():
    died = AgentWorkerDied("llama", "reference", "killed", phase="update")
    assert str(worker_failure("step 2", died, Path("c/global_step1"), "c")).endswith(
        "Last complete checkpoint: c/global_step1; resume with: the same command with --resume")
    assert str(died) == "the reference of agent 'llama' died during update: killed"


def test_resume_command_is_idempotent():
    assert resume_command(["--resume", "--seed", "3"]) == "python -m openrlhf_hacpo.cli.train_hacpo --resume --seed 3"


def test_worker_names():
    assert [WorkerRef("policy", 2).name, WorkerRef("HF engine", 1).name, WorkerRef("reference").name] == [
        "policy rank 2", "HF engine 1", "reference"]


class _ActorId:
    def __init__(self, text: str) -> None:
        self.text = text

    def hex(self) -> str:
        return self.text


def _actor(text: str):
    return SimpleNamespace(_actor_id=_ActorId(text))


def _group():
    return SimpleNamespace(name="llama", policies=[_actor("p0"), _actor("p1")], reference=_actor("ref"),
                           engines=[_actor("e0")], plan=SimpleNamespace(engine_role="HF engine"),
                           worker_nodes={"p1": NODE_B, "e0": "10.0.0.1 (host gpu-a, node 4f2a9c01)"})


def test_an_actor_id_is_traced_to_its_role_rank_and_node():
    group = _group()
    assert identify_worker(group, actor_id="p1") == WorkerRef("policy", 1, NODE_B)
    assert identify_worker(group, group.reference) == WorkerRef("reference", None, None)
    assert identify_worker(group, actor_id="e0").node.startswith("10.0.0.1")
    assert identify_worker(group, actor_id="e0").role == "HF engine"  # the engines' name from the agent's plan
    assert identify_worker(group, actor_id="zz") is None


def test_rays_death_message_gives_the_reason_and_the_address():
    from ray.exceptions import RayActorError

    message = ("The actor died unexpectedly before finishing this task.\n\tclass_name: PolicyWorker\n\tactor_id: p1\n"
               "\tpid: 4242\n\tip: 10.0.0.2\nThe actor is dead because its worker process has died. Worker exit type: "
               "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. There are "
               "some potential root causes. (1) The process is killed by SIGKILL by OOM killer.\n")
    died = death_error(_group(), WorkerRef("policy"), RayActorError("p1", message), "update")
    assert (died.agent, died.role, died.rank, died.node, died.phase) == ("llama", "policy", 1, NODE_B, "update")
    assert died.detail == "The actor is dead because its worker process has died."  # the first sentence
    unknown = death_error(_group(), WorkerRef("policy"), RayActorError("zz", message), "save")
    assert (unknown.rank, unknown.node) == (None, "10.0.0.2")  # not a worker of this group: the message's address


def test_the_engines_timing_call_belongs_to_the_generate_phase():
    from openrlhf_hacpo.actors.pending import phase_of

    # asked right after the outputs: an engine that dies there is reported as dying during generate
    assert phase_of("last_generate_seconds") == phase_of("generate") == "generate"
