"""The agents shipped with the package: files against their manifests, loading with the Auto classes, the accuracy
their manifests record, tamper detection, which folders the main job gets, and (slow) that a rebuild on this
machine still lands inside each agent's accuracy band."""
import dataclasses
import hashlib
import json
import shutil
import struct

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from openrlhf_hacpo.data.arithmetic import make_splits
from openrlhf_hacpo.zoo import AGENTS, PRESETS, build_agent, build_zoo, evaluate_accuracy, read_meta, spec_hash
from openrlhf_hacpo.zoo import __main__ as zoo_cli
from openrlhf_hacpo.zoo import shipped
from openrlhf_hacpo.zoo.shipped import (
    MANIFEST_FILE,
    SHIPPED_DIR,
    ShippedAgentError,
    agent_folders,
    agent_record,
    read_manifest,
    ship_agents,
    verify_folder,
)

PROMPT = [{"role": "user", "content": "Q: 347+285=?"}]
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _safetensors_dtypes(path):
    """dtype of every tensor, read from the safetensors header (8-byte little-endian length, then JSON)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    return {name: entry["dtype"] for name, entry in header.items() if name != "__metadata__"}


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_shipped_files_match_their_manifest(name):
    folder = SHIPPED_DIR / name
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    on_disk = {p.name for p in folder.iterdir() if p.name != MANIFEST_FILE}
    assert on_disk == set(manifest["files"])
    for file, entry in manifest["files"].items():
        assert _sha256(folder / file) == entry["sha256"], file
        assert (folder / file).stat().st_size == entry["bytes"], file
    assert manifest["fingerprint"] == _sha256(folder / "model.safetensors")[:12]
    for needed in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "zoo_meta.json"):
        assert needed in on_disk
    # the recipe is the current spec of that agent, so the main job takes the shipped folder for it
    spec = AGENTS[name]
    assert manifest["recipe"]["spec"] == json.loads(json.dumps(dataclasses.asdict(spec)))
    assert manifest["spec_hash"] == spec_hash(spec) == read_meta(folder)["spec_hash"]
    assert {"torch", "transformers", "tokenizers", "python"} <= set(manifest["built_with"])
    lo, hi = spec.warm_start.target_band
    assert manifest["warm_start"]["stop_reason"] == "band" and lo <= manifest["warm_start"]["probe_accuracy"] <= hi
    assert verify_folder(folder) == manifest


def test_shipped_agents_are_small():
    total = sum(p.stat().st_size for p in SHIPPED_DIR.rglob("*") if p.is_file())
    assert sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()) == sorted(AGENTS)
    assert total < 10 * 2**20, total


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_shipped_agents_load_with_auto_classes_in_float32(name):
    folder = SHIPPED_DIR / name
    assert set(_safetensors_dtypes(folder / "model.safetensors").values()) == {"F32"}
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == ARCHITECTURES[AGENTS[name].model.family]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert "Q: 347+285=?" in prompt


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_shipped_agents_reach_the_accuracy_their_manifest_records(name):
    folder = SHIPPED_DIR / name
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    result = evaluate_accuracy(model, tokenizer, make_splits().test)
    # greedy decoding may flip a rare near-tie on another machine: allow 4 of 400 problems
    assert abs(result.accuracy - read_manifest(folder)["test_accuracy"]) <= 4 / 400


def test_verify_names_the_agent_and_file_at_fault(tmp_path):
    copy = tmp_path / "qwenM"
    shutil.copytree(SHIPPED_DIR / "qwenM", copy)
    assert verify_folder(copy)["name"] == "qwenM"

    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ShippedAgentError, match=r"'qwenM'.*model\.safetensors has sha256"):
        verify_folder(copy)
    shutil.copy2(SHIPPED_DIR / "qwenM" / "model.safetensors", weights)

    (copy / "tokenizer.json").unlink()
    with pytest.raises(ShippedAgentError, match=r"tokenizer\.json is missing"):
        verify_folder(copy)
    shutil.copy2(SHIPPED_DIR / "qwenM" / "tokenizer.json", copy / "tokenizer.json")

    (copy / "notes.txt").write_text("x")
    with pytest.raises(ShippedAgentError, match="notes.txt"):
        verify_folder(copy)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_gets_the_shipped_agents_without_a_build(preset, monkeypatch, tmp_path):
    def no_build(*args, **kwargs):
        raise AssertionError("built an agent although it ships")

    monkeypatch.setattr(shipped, "build_zoo", no_build)
    folders = agent_folders(preset, tmp_path / "cache", progress=False)
    assert folders == {name: SHIPPED_DIR / name for name in PRESETS[preset].agent_names}
    for name, folder in folders.items():
        record = agent_record(folder)
        assert record["source"] == "shipped"
        assert record["fingerprint"] == record["shipped_fingerprint"] == _sha256(folder / "model.safetensors")[:12]
    assert not (tmp_path / "cache").exists()


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_rebuild_builds_and_names_the_agent_by_its_own_fingerprint(tmp_path, make_tiny_spec, capsys):
    root, cache = tmp_path / "shipped", tmp_path / "cache"
    spec = make_tiny_spec("llamaS", steps=2)
    first = build_agent(spec, tmp_path / "first", progress=False)
    ship_agents({"llamaS": first}, root)
    assert verify_folder(root / "llamaS")["fingerprint"] == _sha256(first / "model.safetensors")[:12]

    # default: the shipped folder, no build
    assert agent_folders([spec], cache, progress=False, shipped_root=root) == {"llamaS": root / "llamaS"}
    assert not cache.exists()
    # rebuild: built into the cache; the same recipe and seed on one machine give the same weights
    rebuilt = agent_folders([spec], cache, rebuild=True, progress=False, shipped_root=root)["llamaS"]
    assert rebuilt.parent == cache and rebuilt.name == f"llamaS-{spec_hash(spec)}"
    assert agent_record(rebuilt, root)["source"] == "shipped"

    # an agent of that name with other weights is named by its own fingerprint, apart from the shipped one
    other_spec = make_tiny_spec("llamaS", steps=3)
    other = agent_folders([other_spec], cache, shipped_root=root)["llamaS"]
    assert "the shipped agent was built from another spec" in capsys.readouterr().err
    record = agent_record(other, root)
    assert record["source"] == "built" and record["fingerprint"] == _sha256(other / "model.safetensors")[:12]
    assert record["fingerprint"] != record["shipped_fingerprint"] == read_manifest(root / "llamaS")["fingerprint"]


@pytest.mark.integration  # builds and warm-starts zoo agents (seconds each)
def test_zoo_cli_verify_and_ship(tmp_path, capsys, make_tiny_spec, monkeypatch):
    assert zoo_cli.main(["verify"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in AGENTS)
    assert zoo_cli.main(["ship", "--agents", "llamaS", "--cache-dir", str(tmp_path / "empty"),
                         "--dest", str(tmp_path / "dest")]) == 2
    assert "not built" in capsys.readouterr().err
    tiny = (make_tiny_spec("qwenS", steps=2),)
    monkeypatch.setattr(zoo_cli, "resolve_agents", lambda selection: tiny)
    assert zoo_cli.main(["build", "--cache-dir", str(tmp_path / "c")]) == 0
    assert zoo_cli.main(["ship", "--cache-dir", str(tmp_path / "c"), "--dest", str(tmp_path / "dest")]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["agent"] == "qwenS" and row["fingerprint"] == _sha256(tmp_path / "dest/qwenS/model.safetensors")[:12]
    assert zoo_cli.main(["verify", "--dest", str(tmp_path / "dest")]) == 0


# An agent whose recipe equals another's but for a lower band is checked on the other's build: the warm start's
# probes do not depend on the band until it stops, so the lower band's build is the first part of the other's.
REPLAYED_ON = {"qwenM-early": "qwenM"}


def _stop_of(probes, band):
    """Where the warm start's stopping rule ends on this probe history: the first probe inside ``band`` ("band"),
    or above it first ("overshoot"), else "max_steps"."""
    lo, hi = band
    for step, accuracy in probes:
        if lo <= accuracy <= hi:
            return "band", step
        if accuracy > hi:
            return "overshoot", step
    return "max_steps", None


def test_replayed_agents_share_their_recipe_but_the_band():
    for early, source in REPLAYED_ON.items():
        a, b = AGENTS[early], AGENTS[source]
        assert a.warm_start.target_band[1] < b.warm_start.target_band[0], (early, source)
        same_band = dataclasses.replace(a.warm_start, target_band=b.warm_start.target_band)
        assert dataclasses.replace(a, name=source, warm_start=same_band) == b, (early, source)


def test_the_shipped_builds_show_the_replay_holds():
    """The shipped lower-band agent's recorded probes and losses are the start of the other agent's: one build of
    the other answers for both."""
    for early, source in REPLAYED_ON.items():
        a, b = read_meta(SHIPPED_DIR / early)["warm_start"], read_meta(SHIPPED_DIR / source)["warm_start"]
        assert a["probes"] == b["probes"][:len(a["probes"])] and len(a["probes"]) < len(b["probes"])
        assert a["losses"] == b["losses"][:len(a["losses"])]
        assert _stop_of(b["probes"], AGENTS[early].warm_start.target_band) == ("band", a["steps"])


def test_the_stopping_rule_replay_by_hand():
    probes = [(100, 0.02), (125, 0.04), (150, 0.09), (175, 0.22)]
    assert _stop_of(probes, (0.05, 0.15)) == ("band", 150)
    assert _stop_of(probes, (0.20, 0.35)) == ("band", 175)
    assert _stop_of(probes, (0.01, 0.015)) == ("overshoot", 100)
    assert _stop_of(probes[:2], (0.05, 0.15)) == ("max_steps", None)


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> dict:
    """Every agent that is not replayed, rebuilt from its recipe on this machine, each in its own process with one
    torch thread, as ``python -m openrlhf_hacpo.zoo build --jobs N`` builds them. All at once: the builds take about
    the same CPU time, so on two cores three processes finish sooner than two at a time with the third alone after
    them (a build's weights do not depend on what runs beside it: one thread, a fixed seed, a stop by accuracy)."""
    names = sorted(set(AGENTS) - set(REPLAYED_ON))
    return build_zoo(names, tmp_path_factory.mktemp("rebuilt"), progress=False, jobs=len(names))


@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(set(AGENTS) - set(REPLAYED_ON)))
def test_a_rebuild_on_this_machine_lands_inside_the_band(name, rebuilt):
    spec = AGENTS[name]
    meta = read_meta(rebuilt[name])
    lo, hi = spec.warm_start.target_band
    ws = meta["warm_start"]
    assert ws["stop_reason"] == "band" and ws["band_hit"], ws["probes"]
    assert lo <= ws["probe_accuracy"] <= hi
    assert _stop_of(ws["probes"], spec.warm_start.target_band) == ("band", ws["steps"])
    for early in (e for e, source in REPLAYED_ON.items() if source == name):
        # the lower band's build would have stopped inside its band, before this one
        verdict, step = _stop_of(ws["probes"], AGENTS[early].warm_start.target_band)
        assert verdict == "band" and step < ws["steps"], (early, ws["probes"])
