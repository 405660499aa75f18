"""The agent cache: loadable HF folders, reuse, rebuild on spec change, atomic builds, cache location."""
import json
import os
import pickle
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from openrlhf_hacpo.data.arithmetic import make_splits
from openrlhf_hacpo.zoo import build_agent, build_zoo, default_cache_dir, is_built, read_meta, spec_hash
from openrlhf_hacpo.zoo import cache as cache_mod


PROMPT = [{"role": "user", "content": "Q: 347+285=?"}]


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_built_agents_load_with_auto_classes(tiny_zoo, tiny_specs):
    cache, paths = tiny_zoo
    assert set(paths) == {"llamaS", "qwenM"}
    for spec in tiny_specs:
        path = paths[spec.name]
        assert path.parent == cache and path.name == f"{spec.name}-{spec_hash(spec)}"
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "zoo_meta.json"):
            assert (path / f).is_file(), f
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert type(model).__name__ == {"llamaS": "LlamaForCausalLM", "qwenM": "Qwen3ForCausalLM"}[spec.name]
        prompt = tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
        assert "Q: 347+285=?" in prompt
        assert model.generation_config.eos_token_id == tok.eos_token_id
        assert model.config.vocab_size == len(tok)
        meta = read_meta(path)
        assert meta["spec_hash"] == spec_hash(spec) and meta["name"] == spec.name
        assert meta["warm_start"]["steps"] == 20 and meta["warm_start"]["stop_reason"] == "steps"
        assert meta["test"]["num_problems"] == len(make_splits().test) == 400
        assert 0.0 <= meta["test"]["accuracy"] <= 1.0
        assert meta["spec"]["warm_start"]["steps"] == 20


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_unchanged_spec_reuses_cache(tiny_zoo, tiny_specs, monkeypatch):
    cache, paths = tiny_zoo
    stamps = {n: (p / "zoo_meta.json").stat().st_mtime_ns for n, p in paths.items()}
    def no_training(*args, **kwargs):
        raise AssertionError("an unchanged spec must not be trained again")

    monkeypatch.setattr("openrlhf_hacpo.zoo.cache.warm_start", no_training)
    again = build_zoo(tiny_specs, cache, progress=False)
    assert again == paths
    assert {n: (p / "zoo_meta.json").stat().st_mtime_ns for n, p in again.items()} == stamps


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_changed_spec_builds_new_folder(tiny_zoo, make_tiny_spec):
    cache, paths = tiny_zoo
    changed = make_tiny_spec("llamaS", steps=3)
    assert spec_hash(changed) != spec_hash(make_tiny_spec("llamaS"))
    path = build_agent(changed, cache, progress=False)
    assert path != paths["llamaS"] and is_built(path, changed)
    assert read_meta(path)["warm_start"]["steps"] == 3
    assert is_built(paths["llamaS"], make_tiny_spec("llamaS")), "the other build is untouched"
    assert not is_built(paths["llamaS"], changed)


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch, make_tiny_spec):
    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_mod, "warm_start", killed)
    spec = make_tiny_spec("llamaS", steps=2)
    with pytest.raises(KeyboardInterrupt):
        build_agent(spec, tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == [f".{spec.name}-{spec_hash(spec)}.lock"]  # the lock file only


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_incomplete_folder_and_dead_temp_dirs_are_replaced(tmp_path, make_tiny_spec):
    spec = make_tiny_spec("llamaS", steps=2)
    final = tmp_path / f"{spec.name}-{spec_hash(spec)}"
    final.mkdir()
    (final / "config.json").write_text("{}")  # half an agent, no zoo_meta.json
    dead = tmp_path / f".{final.name}.abc123.tmp"  # left by a build killed two days ago
    dead.mkdir()
    os.utime(dead, (time.time() - 2 * 86400,) * 2)
    recent = tmp_path / f".{final.name}.def456.tmp"  # may belong to a build still running
    recent.mkdir()
    assert not is_built(final, spec)
    assert build_agent(spec, tmp_path, progress=False) == final
    assert is_built(final, spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, recent.name, f".{final.name}.lock"])


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_force_rebuilds(tmp_path, make_tiny_spec):
    spec = make_tiny_spec("llamaS", steps=2)
    path = build_agent(spec, tmp_path, progress=False)
    first = read_meta(path)["built_at"], (path / "zoo_meta.json").stat().st_mtime_ns
    assert build_agent(spec, tmp_path, progress=False, force=True) == path
    assert (path / "zoo_meta.json").stat().st_mtime_ns != first[1]
    with open(path / "zoo_meta.json") as f:
        assert json.load(f)["spec_hash"] == spec_hash(spec)


def test_callers_at_once_build_once_and_force_builds_again(tmp_path, monkeypatch, make_tiny_spec):
    """Three callers ask for a missing agent at once (threads stand in for processes: each takes the lock file with
    its own descriptor); the build is a slow stand-in that writes what ``is_built`` reads. One build, and every
    caller gets its folder; ``force`` builds again under the same lock."""
    spec = make_tiny_spec("llamaS", steps=2)
    builds: list[str] = []

    def slow_build(out, spec, task, log):
        builds.append(out.name)
        time.sleep(0.3)  # long enough for every other caller to reach the lock meanwhile
        (out / cache_mod.META_FILE).write_text(json.dumps({"spec_hash": spec_hash(spec, task)}))

    monkeypatch.setattr(cache_mod, "_build_into", slow_build)
    with ThreadPoolExecutor(3) as pool:
        folders = list(pool.map(lambda _: build_agent(spec, tmp_path, progress=False), range(3)))
    final = tmp_path / f"{spec.name}-{spec_hash(spec)}"
    assert len(builds) == 1 and folders == [final] * 3 and is_built(final, spec)
    assert build_agent(spec, tmp_path, progress=False) == final and len(builds) == 1  # cached
    assert build_agent(spec, tmp_path, progress=False, force=True) == final and len(builds) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, f".{final.name}.lock"])


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HACPO_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "zoo"
    monkeypatch.delenv("HACPO_CACHE_DIR")
    repo = Path(cache_mod.__file__).resolve().parents[2]
    assert default_cache_dir() == repo / ".cache" / "zoo"
    assert ".cache/" in (repo / ".gitignore").read_text().split()


def test_read_meta_on_plain_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a built zoo agent"):
        read_meta(tmp_path)


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_parallel_build_dispatch(tmp_path, monkeypatch, make_tiny_spec):
    """``jobs=2`` hands each missing agent to the pool (threads stand in for spawned processes here); the specs
    it sends must survive pickling, as a process pool needs."""
    submitted = []

    class ThreadPool(ThreadPoolExecutor):
        def __init__(self, max_workers, mp_context):
            assert mp_context.get_start_method() == "spawn"
            super().__init__(max_workers)

        def submit(self, fn, spec, *args, **kwargs):
            assert pickle.loads(pickle.dumps(spec)) == spec
            submitted.append(spec.name)
            return super().submit(fn, spec, *args, **kwargs)

    monkeypatch.setattr(cache_mod, "ProcessPoolExecutor", ThreadPool)
    specs = [make_tiny_spec("llamaS", steps=2), make_tiny_spec("qwenS", steps=2)]
    build_agent(specs[0], tmp_path, progress=False)
    specs.append(make_tiny_spec("qwenM-early", steps=2))
    paths = build_zoo(specs, tmp_path, progress=False, jobs=2)
    assert sorted(submitted) == ["qwenM-early", "qwenS"], "cached agents are not rebuilt"
    assert all(is_built(paths[s.name], s) for s in specs)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".") and not n.endswith(".lock")]  # no temp folder
    with pytest.raises(ValueError, match="jobs"):
        build_zoo(specs, tmp_path, progress=False, jobs=0)
