"""Small helpers shared across the package."""
from openrlhf_hacpo.utils.atomic import (
    atomic_dir,
    atomic_torch_save,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)

__all__ = ["atomic_dir", "atomic_torch_save", "atomic_write_bytes", "atomic_write_json", "atomic_write_text"]
