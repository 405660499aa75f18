"""The tier guard (tests/tier_guard.py) bites: an unmarked test that starts a process, Ray or a process group fails
with ``TierViolation``; the same test marked ``integration`` or ``e2e`` is left alone; ``--tier`` selects tiers.

Each case runs a small generated test file in this process (``pytester.runpytest_inprocess``), so nothing here
starts a process itself.
"""
from __future__ import annotations

import pytest

PLUGIN = ["-p", "tier_guard", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"]

# one test per thing a unit test must not do; each would succeed if nothing stopped it
FORBIDDEN = {
    "subprocess": "import subprocess\n    subprocess.run(['true'])",
    "fork": "import os\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)",
    "system": "import os\n    os.system('true')",
    "multiprocessing": "import multiprocessing\n    p = multiprocessing.Process(target=int)\n    p.start()\n    p.join()",
    "process_group": ("import torch.distributed as dist\n    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:1',"
                      " rank=0, world_size=1, timeout=__import__('datetime').timedelta(seconds=1))"),
}


def _test_file(marker: str | None) -> str:
    decorator = f"@pytest.mark.{marker}\n" if marker else ""
    body = "import pytest\n\n"
    for name, code in FORBIDDEN.items():
        body += f"{decorator}def test_{name}():\n    {code}\n\n"
    return body


@pytest.fixture
def guarded(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\nmarkers =\n    integration: x\n    e2e: x\n")
    return pytester


def test_unit_tests_that_start_processes_fail(guarded):
    guarded.makepyfile(test_unit=_test_file(None))
    result = guarded.runpytest_inprocess(*PLUGIN, "-k", "not process_group")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == len(FORBIDDEN) - 1, result.stdout.str()
    assert "passed" not in outcomes
    text = result.stdout.str()
    for what in ("subprocess: true", "os.fork", "os.system", "multiprocessing"):
        assert f"tried to start a process ({what})" in text, what
    assert "mark it @pytest.mark.integration" in text


def test_unit_test_that_opens_a_process_group_fails(guarded):
    guarded.makepyfile(test_unit=_test_file(None))
    result = guarded.runpytest_inprocess(*PLUGIN, "-k", "process_group")
    assert result.parseoutcomes().get("failed") == 1, result.stdout.str()
    assert "open a torch.distributed process group" in result.stdout.str()


@pytest.mark.integration  # the generated tests really start processes
@pytest.mark.parametrize("marker", ["integration", "e2e"])
def test_marked_tests_may_start_processes(guarded, marker):
    guarded.makepyfile(test_marked=_test_file(marker))
    # the process group case needs a listening rendezvous; the four process cases are enough here
    result = guarded.runpytest_inprocess(*PLUGIN, "-k", "not process_group")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == len(FORBIDDEN) - 1 and "failed" not in outcomes, result.stdout.str()


def test_import_probes_are_allowed(guarded):
    guarded.makepyfile(test_probe="""
import platform

def test_probe():
    platform._syscmd_file(__file__, default="")  # what platform.architecture() runs: `file -b <path>`
""")
    result = guarded.runpytest_inprocess(*PLUGIN)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and "failed" not in outcomes, result.stdout.str()


def test_tier_option_selects_tiers(guarded):
    guarded.makepyfile(test_mixed="""
import pytest

def test_a_unit():
    pass

@pytest.mark.integration
def test_b_integration():
    pass

@pytest.mark.e2e
def test_c_e2e():
    pass
""")
    for tiers, expected in ((["unit"], ["test_a_unit"]), (["integration"], ["test_b_integration"]),
                            (["unit", "e2e"], ["test_a_unit", "test_c_e2e"])):
        args = [a for t in tiers for a in ("--tier", t)]
        result = guarded.runpytest_inprocess(*PLUGIN, "-v", *args)
        ran = sorted(line.split("::")[1].split()[0] for line in result.stdout.lines if "PASSED" in line)
        assert ran == expected, (tiers, result.stdout.str())


def test_two_tiers_on_one_test_is_an_error(guarded):
    guarded.makepyfile(test_both="""
import pytest

@pytest.mark.integration
@pytest.mark.e2e
def test_both():
    pass
""")
    result = guarded.runpytest_inprocess(*PLUGIN)
    assert result.ret != 0
    assert "marked both integration and e2e" in result.stdout.str() + result.stderr.str()
