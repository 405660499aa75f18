"""Hypothesis profiles of the input fuzzing tests in this folder.

* ``ci`` (the default): ``derandomize=True`` (the examples are a fixed function of each test, so every run tries the
  same inputs), a bounded ``max_examples`` so the whole folder runs in well under a minute on two cores, no deadline
  and no example database.
* ``deep``: many more, random examples, for a search before a release:
  ``HYPOTHESIS_PROFILE=deep python -m pytest tests/fuzz``.

The profile is chosen by the ``HYPOTHESIS_PROFILE`` environment variable and applied to the tests of this folder
only (each test takes its settings from :data:`fuzz_support.FUZZ`), so other property tests keep their own settings.
"""
import os

from hypothesis import HealthCheck, settings

_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", derandomize=True, max_examples=20, deadline=None, database=None,
                          suppress_health_check=_CHECKS, print_blob=True)
settings.register_profile("deep", derandomize=False, max_examples=1500, deadline=None,
                          suppress_health_check=_CHECKS, print_blob=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("ci", "deep"):
    raise ValueError(f"HYPOTHESIS_PROFILE={PROFILE!r}: tests/fuzz has the profiles 'ci' and 'deep'")
