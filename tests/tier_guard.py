"""The test tiers, declared once and enforced (tests/README.md).

Every test is in exactly one tier:

* **unit** (no marker): pure functions, kernels under the Triton interpreter, config, data. Runs in one process: it
  must not start a process (``subprocess``, ``os.fork``/``posix_spawn``/``system``, ``multiprocessing``; the machine
  probes some libraries run at import, :data:`IMPORT_PROBES`, excepted), Ray, or a ``torch.distributed`` process
  group (which every DeepSpeed engine opens);
* **integration** (``@pytest.mark.integration``): one actor or one DeepSpeed engine, subprocess CLIs;
* **e2e** (``@pytest.mark.e2e``): whole runs, Ray, several processes.

This plugin fails a unit test that does what only the other tiers may: from the start of its setup (session fixtures
it is the first to request included) to the end of its teardown, the calls above raise :class:`TierViolation`, and a
Ray instance or process group that is up after the test but was not before fails it too. ``tests/conftest.py`` loads
the plugin; ``tests/test_tiers.py`` checks that it bites.
"""
from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys

import pytest

TIERS = ("unit", "integration", "e2e")
MARKED_TIERS = ("integration", "e2e")


class TierViolation(RuntimeError):
    """A unit-tier test did something only the integration or e2e tier may do."""


def tier_of(item: pytest.Item) -> str:
    """The tier of a collected test: its ``integration`` or ``e2e`` marker, else ``unit``."""
    marked = [name for name in MARKED_TIERS if item.get_closest_marker(name) is not None]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid}: marked both {marked[0]} and {marked[1]}; a test is in one tier")
    return marked[0] if marked else "unit"


def _ray_up() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _process_group_up() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


class _Refusal:
    """Stands in for a call a unit test must not make (a module-level class, so a test that pickles a reference
    to the patched function, as the checkpoint tests' malicious payloads do, still can)."""

    def __init__(self, nodeid: str, what: str) -> None:
        self.nodeid, self.what = nodeid, what

    def __call__(self, *_args, **_kwargs):
        raise TierViolation(f"{self.nodeid} is a unit test but tried to {self.what}; mark it "
                            "@pytest.mark.integration (one actor, one DeepSpeed engine, a subprocess) or "
                            "@pytest.mark.e2e (whole runs, Ray), see tests/README.md")


_refusal = _Refusal


# Machine probes that libraries run on first use (``platform.architecture()`` runs ``file``; matplotlib asks
# ``fc-list`` for fonts): not the test's own work, and allowed. So is any process a module starts while it is being
# imported (DeepSpeed's import runs ``file`` through py-cpuinfo and ``df`` to look for NFS): an import is the same
# in every tier, and a refused one would leave the module half-imported for the tests after it.
IMPORT_PROBES = frozenset({"file", "uname", "lscpu", "ldconfig", "fc-list", "fc-match"})


def _importing() -> bool:
    """True when the caller runs inside a module's import (a frame of ``importlib._bootstrap`` is on the stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _program(args) -> str:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else (list(args)[:1] or [""])[0]
    first = os.fsdecode(first)
    return os.path.basename(first.split()[0] if " " in first else first)


def _guarded_popen(nodeid: str, original):
    def popen_init(self, args, *rest, **kwargs):
        program = _program(args)
        if program in IMPORT_PROBES or _importing():
            return original(self, args, *rest, **kwargs)
        _refusal(nodeid, f"start a process (subprocess: {program})")()
    return popen_init


def _guard(item: pytest.Item) -> pytest.MonkeyPatch:
    patch = pytest.MonkeyPatch()
    nodeid = item.nodeid
    patch.setattr(subprocess.Popen, "__init__", _guarded_popen(nodeid, subprocess.Popen.__init__))
    patch.setattr(multiprocessing.process.BaseProcess, "start", _refusal(nodeid, "start a process (multiprocessing)"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            patch.setattr(os, name, _refusal(nodeid, f"start a process (os.{name})"))
    ray = sys.modules.get("ray")
    if ray is not None and hasattr(ray, "init"):
        patch.setattr(ray, "init", _refusal(nodeid, "start or join Ray (ray.init)"))
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "init_process_group"):
        patch.setattr(dist, "init_process_group",
                      _refusal(nodeid, "open a torch.distributed process group (a DeepSpeed engine)"))
    return patch


_GUARDS: dict[str, tuple[pytest.MonkeyPatch, bool, bool]] = {}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item):
    if tier_of(item) == "unit":
        _GUARDS[item.nodeid] = (_guard(item), _ray_up(), _process_group_up())
    yield


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    yield
    entry = _GUARDS.pop(item.nodeid, None)
    if entry is None:
        return
    patch, ray_before, group_before = entry
    patch.undo()
    started = [what for what, before, now in (("Ray", ray_before, _ray_up()),
                                              ("a torch.distributed process group", group_before,
                                               _process_group_up()))
               if now and not before]
    if started:
        raise TierViolation(f"{item.nodeid} is a unit test but left {' and '.join(started)} running; mark it "
                            "@pytest.mark.integration or @pytest.mark.e2e (tests/README.md)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--tier NAME`` (repeatable) keeps the tests of those tiers, in the order collected."""
    wanted = config.getoption("tier") or []
    for item in items:
        tier_of(item)  # a test marked with two tiers is a usage error, whatever is selected
    if not wanted:
        return
    kept, dropped = [], []
    for item in items:
        (kept if tier_of(item) in wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--tier", action="append", choices=TIERS, default=None,
                     help="run only the tests of this tier (repeatable): unit, integration, e2e (tests/README.md)")
