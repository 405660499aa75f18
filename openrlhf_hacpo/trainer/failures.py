"""A lost or hung worker, in one line: agent, worker (role and rank), node, phase, the last complete checkpoint and
how to resume.

:func:`worker_failure` turns :class:`~openrlhf_hacpo.actors.pending.AgentWorkerDied` or
:class:`~openrlhf_hacpo.actors.pending.AgentPhaseTimeout` into the :class:`TrainingError` that stops the run, for
example::

    step 5 failed: agent 'llama', policy rank 1, node 10.0.0.2 (host gpu-b, node 9be0d712), phase update: the
    worker died (The actor is dead because its worker process has died.). Last complete checkpoint:
    runs/x/checkpoints/global_step4; resume with: python -m openrlhf_hacpo.cli.train_hacpo ... --resume

(one line). The command line prints it, appends it to ``<save_path>/train.log`` and exits with status 2.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

from openrlhf_hacpo.actors.pending import AgentPhaseTimeout, AgentWorkerDied, WorkerRef

__all__ = ["CLI_PROGRAM", "TrainingError", "resume_advice", "resume_command", "worker_failure"]

CLI_PROGRAM = ("python", "-m", "openrlhf_hacpo.cli.train_hacpo")
"""How :func:`resume_command` starts the trainer."""


class TrainingError(RuntimeError):
    """A step could not complete; the message says what failed, for which agent, and where to resume from.

    Attributes (None when the failure is not a worker's): ``agent``, ``role``, ``rank`` (policy rank or engine
    index), ``node``, ``phase`` and ``checkpoint`` (the last complete checkpoint).
    """

    def __init__(self, message: str, agent: str | None = None, role: str | None = None, rank: int | None = None,
                 node: str | None = None, phase: str | None = None, checkpoint: Path | None = None) -> None:
        super().__init__(message)
        self.agent, self.role, self.rank, self.node, self.phase = agent, role, rank, node, phase
        self.checkpoint = checkpoint


def resume_command(argv: Sequence[str], resume: bool = True) -> str:
    """The command that continues a run started with ``argv`` (``--overwrite`` dropped, ``--resume`` added), or with
    ``resume=False`` the one that starts it over (``--resume`` dropped, ``--overwrite`` added)."""
    drop, add = ("--overwrite", "--resume") if resume else ("--resume", "--overwrite")
    args = [a for a in argv if a != drop]
    if add not in args:
        args.append(add)
    return shlex.join([*CLI_PROGRAM, *args])


def resume_advice(checkpoint: Path | None, checkpoint_dir: str, argv: Sequence[str] | None = None) -> str:
    """Where the run stands and the command to go on: resume from ``checkpoint``, or start over without one."""
    if checkpoint is not None:
        how = resume_command(argv) if argv is not None else "the same command with --resume"
        return f"Last complete checkpoint: {checkpoint}; resume with: {how}"
    how = resume_command(argv, resume=False) if argv is not None else "the same command with --overwrite"
    return f"No complete checkpoint yet (checkpoint folder {checkpoint_dir}); start over with: {how}"


def worker_failure(what: str, err: AgentWorkerDied | AgentPhaseTimeout, checkpoint: Path | None,
                   checkpoint_dir: str, argv: Sequence[str] | None = None) -> TrainingError:
    """The one-line :class:`TrainingError` for a worker that died or hung while the driver was doing ``what``
    (``step 5``, ``saving the checkpoint of step 4`` ...)."""
    worker = WorkerRef(err.role, err.rank)
    if isinstance(err, AgentPhaseTimeout):
        cause = (f"no result within {err.timeout_s:g} s (--step_timeout): hung, stopped or much slower than "
                 "expected")
    else:
        cause = f"the worker died ({err.detail})"
    line = (f"{what} failed: agent {err.agent!r}, {worker.name}, node {err.node or 'unknown'}, phase "
            f"{err.phase or 'unknown'}: {cause}. {resume_advice(checkpoint, checkpoint_dir, argv)}")
    return TrainingError(line.replace("\n", " "), agent=err.agent, role=err.role, rank=err.rank, node=err.node,
                         phase=err.phase, checkpoint=checkpoint)
