"""Seeds derived from the run seed, so every random stream of a run (a step's sampling, a prompt's vLLM request, an
evaluation pass, a learner's shuffle) is reproducible and unrelated to its neighbours."""
from __future__ import annotations

import hashlib

__all__ = ["derive_seed"]

_SEED_MODULUS = 2**31 - 1


def derive_seed(base_seed: int, *keys: int | str) -> int:
    """A deterministic seed in [0, 2^31 - 1) derived from ``base_seed`` and ``keys`` (e.g. the step, the prompt index):
    the first 8 bytes of BLAKE2b("base_seed/key_1/.../key_n"), read little-endian, modulo 2^31 - 1.

    Hash-based, so nearby inputs give unrelated seeds: ``derive_seed(s, step)`` for consecutive steps does not make
    correlated random streams, and the result does not depend on Python's per-process hash randomisation.
    """
    text = "/".join(str(part) for part in (base_seed, *keys))
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % _SEED_MODULUS
