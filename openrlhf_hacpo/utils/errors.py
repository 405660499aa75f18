"""Error types a person can act on: each message names the file, the agent or the flag at fault.

The command line turns every type listed in :data:`USER_ERRORS` into a one-line message and exit status 2
(``--debug`` keeps the traceback).
"""
from __future__ import annotations

__all__ = ["CheckpointError", "DiskSpaceError", "RunFolderError", "USER_ERRORS"]


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read, written or trusted (corrupt file, broken ``latest``, other configuration)."""


class DiskSpaceError(OSError):
    """Not enough free space for a write; the message says "no space left on device", the path and the sizes."""


class RunFolderError(ValueError):
    """The run folder holds an earlier run (or another run is using it) and no flag says what to do with it."""


# OSError covers FileNotFoundError, PermissionError, TimeoutError and DiskSpaceError
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, CheckpointError, ImportError)
