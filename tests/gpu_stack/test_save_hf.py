"""A saved agent reloads with the pretrained checkpoint's tensors, dtype and size: tied weights are stored once,
in the checkpoint's own dtype (bf16 here) although the policy trains in fp32."""
from __future__ import annotations

import json
import os

import pytest
import torch
from stack_fixtures import worker_config
from safetensors import safe_open

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def _tensors(folder) -> dict[str, torch.Tensor]:
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}


@pytest.mark.parametrize("zero_stage", ["2", "3"])
def test_saved_agent_reloads_equal_in_its_original_dtype(bf16_tied_agent, tmp_path, zero_stage):
    from transformers import AutoModelForCausalLM

    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker

    cfg = worker_config(bf16_tied_agent, tmp_path, "--zero_stage", zero_stage)
    worker = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0])
    worker.setup()
    assert next(worker.model.parameters()).dtype == torch.float32  # trains in fp32
    out = worker.save_hf(str(tmp_path / "hf"))

    original, saved = _tensors(bf16_tied_agent), _tensors(out)
    assert "lm_head.weight" not in saved and set(saved) == set(original)  # the tie is stored once
    for name, tensor in original.items():
        assert saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], tensor), name
    payload = sum(t.numel() * t.element_size() for t in original.values())
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    assert payload <= size <= payload + 16 * 1024  # tensors plus the safetensors header
    assert json.loads(open(os.path.join(out, "config.json")).read())["dtype"] == "bfloat16"

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16 and model.lm_head.weight is model.model.embed_tokens.weight

    fp32 = worker.save_hf(str(tmp_path / "hf32"), dtype="float32")
    assert all(t.dtype == torch.float32 and torch.equal(t, original[n].float()) for n, t in _tensors(fp32).items())
    with pytest.raises(ValueError, match="'qwen'.*int8"):
        worker.save_hf(str(tmp_path / "bad"), dtype="int8")


class _Receiver:
    """An engine stand-in: ``receive_broadcast_weights.remote(specs)`` receives on a gloo group in a thread and
    returns the thread (``ray.get`` is patched to join it)."""

    def __init__(self, port: int):
        import threading
        from types import SimpleNamespace

        self.received: dict[str, torch.Tensor] = {}
        self.group = None
        self.receive_broadcast_weights = SimpleNamespace(remote=self._receive)
        self._joining = threading.Thread(target=self._join, args=(port,))
        self._joining.start()

    def _join(self, port):
        from openrlhf_hacpo.engines.weight_sync import create_weight_sync_group

        self.group = create_weight_sync_group("127.0.0.1", port, 1, 2, "sync_test", backend="gloo", timeout_s=60)

    def _receive(self, specs):
        import threading

        from openrlhf_hacpo.engines.weight_sync import receive_broadcast_tensors

        def run():
            stream = receive_broadcast_tensors(self.group, specs, torch.device("cpu"))
            self.received.update((n, t.clone()) for n, t in stream)

        thread = threading.Thread(target=run)
        thread.start()
        return thread


def test_zero3_broadcast_sends_every_name_in_small_buckets(bf16_tied_agent, tmp_path, monkeypatch):
    import ray

    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker
    from openrlhf_hacpo.engines.weight_sync import create_weight_sync_group
    from openrlhf_hacpo.utils.network import free_port

    cfg = worker_config(bf16_tied_agent, tmp_path, "--zero_stage", "3")
    worker = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0])
    worker.setup()
    worker.io.weight_bucket_bytes = 8 * 1024  # many buckets: each is gathered, sent and released in turn
    port = free_port()
    engine = _Receiver(port)
    worker.io._engine_group = create_weight_sync_group("127.0.0.1", port, 0, 2, "sync_test", backend="gloo",
                                                    timeout_s=60)
    engine._joining.join()
    monkeypatch.setattr(ray, "get", lambda threads, **kw: [t.join(timeout=60) for t in threads])
    sent = worker.sync_weights_to_engines([engine], mode="broadcast")

    original = _tensors(bf16_tied_agent)
    assert sent == len(original) + 1 and set(engine.received) == set(original) | {"lm_head.weight"}
    assert torch.equal(engine.received["lm_head.weight"], engine.received["model.embed_tokens.weight"])
    for name, tensor in original.items():
        assert engine.received[name].dtype == torch.float32 and torch.equal(engine.received[name], tensor.float())
