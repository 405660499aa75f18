"""The agent plan (openrlhf_hacpo/actors/agent_plan.py): each decision the driver makes once about an agent's layout,
against values worked out by hand from the rules (bundles, GPU shares, reference, LoRA, engine settings), and the
readers (node plan, memory plan) taking the plan's values instead of deriving them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from openrlhf_hacpo.actors.agent_plan import AgentPlan, LoraPlan, owns_reference_model, plan_agents, with_nodes
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.engines.node_plan import AgentDemand, AgentPlacement
from openrlhf_hacpo.engines.settings import CoreShare, EngineSettings
from openrlhf_hacpo.trainer.memory_layout import agent_layouts


def _cfg(*agents: AgentConfig, **kw) -> TrainConfig:
    values = dict(prompt_data="d.jsonl", rollout_backend="vllm", rollout_batch_size=2, n_samples_per_prompt=2,
                  train_batch_size=4, micro_train_batch_size=1)
    values.update(kw)
    return TrainConfig.of(agents=list(agents), **values)


@pytest.mark.parametrize("kl, rank, expected", [(True, 0, True), (True, 8, False), (False, 0, False), (False, 8, False)])
def test_a_reference_model_of_its_own_exactly_with_a_kl_term_and_no_adapter(kl, rank, expected):
    assert owns_reference_model(kl, rank) is expected
    plan = AgentPlan("a", 0, dp=1, kl=kl, lora=LoraPlan(rank=rank))
    assert plan.has_reference is expected
    assert plan.adapter_reference is (kl and rank > 0)  # the policy's own model with the adapter off


def test_the_plan_reads_the_resolved_settings_of_every_agent():
    cfg = _cfg(AgentConfig("q", "/m/q", dp_size=2, vllm_num_engines=2, node="nodeB", lora_rank=4),
               AgentConfig("l", "/m/l", dp_size=4, vllm_tensor_parallel_size=2, adam_offload=True),
               lora_alpha=32, ref_reward_offload=True, zero_stage=3, param_offload=True, rollout_batch_size=4,
               train_batch_size=8)
    q, l = plan_agents(cfg, on_gpu=True)
    assert (q.name, q.index, q.dp, q.vllm_engines, q.tp, q.node) == ("q", 0, 2, 2, 1, "nodeB")
    assert (l.name, l.index, l.dp, l.vllm_engines, l.tp, l.node) == ("l", 1, 4, 1, 2, None)
    assert q.lora == LoraPlan(4, 32, 0.0, "all-linear") and l.lora == LoraPlan(0, 32, 0.0, "all-linear")
    assert (q.adam_offload, l.adam_offload, q.param_offload, q.ref_reward_offload) == (False, True, True, True)
    assert q.kl and not q.has_reference and l.has_reference  # the default --init_kl_coef 0.001
    assert q.engine_settings == EngineSettings(False, 0.95, False)  # dedicated GPU engines
    assert q.run_dp == (2, 4) and q.run_vllm_engines == (2, 1)


def test_bundles_and_gpu_shares_dedicated_colocated_and_on_cpus():
    agent = AgentConfig("a", "/m/a", dp_size=2, vllm_num_engines=3, vllm_tensor_parallel_size=2)
    (dedicated,) = plan_agents(_cfg(agent), on_gpu=True)
    # 2 policy GPUs (the reference takes half of GPU 0's share: policy and reference split each bundle), 3 x 2 engines
    assert (dedicated.policy_bundles, dedicated.engine_bundles, dedicated.policy_gpus) == (2, 6, 0.5)
    assert dedicated.demand == AgentDemand("a", dp=2, engines=3, tp=2, colocated=False, reference=True)
    (colocated,) = plan_agents(_cfg(agent, colocate_all_models=True), on_gpu=True)
    # max(2, 3 x 2) = 6 bundles shared by policy, reference and engines: a third of a GPU each
    assert (colocated.policy_bundles, colocated.engine_bundles) == (6, 0)
    assert colocated.policy_gpus == pytest.approx(1 / 3) and colocated.colocated
    assert colocated.engine_settings == EngineSettings(False, 0.5, True) and colocated.weight_sync_mode == "object_store"
    no_kl_cfg = _cfg(agent, colocate_all_models=True)
    no_kl_cfg.algo.loss = no_kl_cfg.algo.loss.replaced({"kl_coef": 0.0})
    (no_kl,) = plan_agents(no_kl_cfg, on_gpu=True)
    assert no_kl.policy_gpus == 0.5 and not no_kl.has_reference
    (cpu,) = plan_agents(_cfg(agent, colocate_all_models=True), on_gpu=False)
    # CPU engines always have their own bundles; CPU workers take bundles only when pinned to nodes
    assert (cpu.colocated, cpu.policy_bundles, cpu.engine_bundles, cpu.bundle_kind) == (False, 2, 6, "CPU")
    assert cpu.policy_gpus == 0.0 and not cpu.takes_bundles and cpu.engine_settings == EngineSettings(True, 0.95, False)
    (hf,) = plan_agents(_cfg(agent, rollout_backend="hf"), on_gpu=True)
    assert (hf.vllm_engines, hf.policy_bundles, hf.engine_bundles, hf.engine_settings, hf.has_engines) == \
        (0, 2, 0, None, False)


def test_layouts_no_worker_could_start_in_are_refused_when_planned():
    with pytest.raises(ValueError, match="agent 'a': --rollout_backend hf_engine runs its engine on CPU cores"):
        plan_agents(_cfg(AgentConfig("a", "/m/a"), rollout_backend="hf_engine"), on_gpu=True)
    with pytest.raises(ValueError, match="--vllm_enable_sleep needs GPU engines"):
        plan_agents(_cfg(AgentConfig("a", "/m/a"), vllm_enable_sleep=True), on_gpu=False)


def test_cpu_cores_from_every_agents_counts():
    cfg = _cfg(AgentConfig("a", "/m/a", dp_size=2), AgentConfig("b", "/m/b"), rollout_backend="hf_engine")
    a, b = plan_agents(cfg, on_gpu=False)
    assert (a.has_engines, a.engine_role) == (True, "HF engine")
    # processes per agent: dp ranks + 1 engine = 3 and 2; b's engine is its process 1
    assert b.core_share(1) == CoreShare((3, 2), agent=1, process=1)


def test_nodes_are_attached_in_agent_order_only():
    a, b = plan_agents(_cfg(AgentConfig("a", "/m/a"), AgentConfig("b", "/m/b")), on_gpu=False)
    placed = with_nodes([a, b], [AgentPlacement("a", ("n1",), ("n1",)), AgentPlacement("b", ("n2",), ("n2",))])
    assert [p.nodes.policy for p in placed] == [("n1",), ("n2",)] and placed[0].takes_bundles
    assert with_nodes([a, b], None) == [a, b]
    with pytest.raises(ValueError, match="placements for"):
        with_nodes([a, b], [AgentPlacement("b", ("n2",), ()), AgentPlacement("a", ("n1",), ())])


def test_the_memory_layout_takes_the_plans_values():
    config = SimpleNamespace(model_type="llama", vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                             tie_word_embeddings=True)
    cfg = _cfg(AgentConfig("full", "/m/f", dp_size=2, vllm_num_engines=3),
               AgentConfig("lora", "/m/l", lora_rank=8, target_modules="q_proj"), colocate_all_models=True,
               deepspeed_enable_sleep=True)
    full, lora = agent_layouts(cfg, plan_agents(cfg, on_gpu=True), {"full": config, "lora": config})
    assert (full.dp, full.engines, full.tensor_parallel, full.colocated, full.policy_gpus) == (2, 3, 1, True, 3)
    assert (full.engine_utilization, full.engine_sleep, full.deepspeed_enable_sleep) == (0.5, True, True)
    assert full.has_reference and not lora.has_reference  # the LoRA agent's reference is its adapter-off model
    assert (lora.lora_rank, lora.target_modules) == (8, "q_proj")


def test_the_engines_precision_is_the_policys_unless_set():
    """``--engine_dtype`` auto: the policy's precision; set run-wide or per agent, it holds for the engines alone
    (AgentConfig.resolved_engine_dtype, copied into the plan); refused where no engine actor runs."""
    cfg = _cfg(AgentConfig("q", "/m/q"), AgentConfig("l", "/m/l", bf16=True), AgentConfig("s", "/m/s",
               engine_dtype="float32", bf16=True), rollout_batch_size=6, train_batch_size=12)
    assert [p.engine_dtype for p in plan_agents(cfg, on_gpu=False)] == ["float32", "bfloat16", "float32"]
    cfg = _cfg(AgentConfig("q", "/m/q"), AgentConfig("l", "/m/l", engine_dtype="float32"), engine_dtype="bfloat16")
    assert [p.engine_dtype for p in plan_agents(cfg, on_gpu=False)] == ["bfloat16", "float32"]
    assert [a.bf16 for a in cfg.resolved_agents] == [False, False]  # the learners stay in fp32
    with pytest.raises(ValueError, match=r"--engine_dtype \(agent 'q'\).*--rollout_backend hf generates inside"):
        _cfg(AgentConfig("q", "/m/q"), engine_dtype="bfloat16", rollout_backend="hf")
    with pytest.raises(ValueError, match=r"engine_dtype"):
        _cfg(AgentConfig("q", "/m/q", engine_dtype="float16"))


def test_the_engines_precision_is_fingerprinted_only_where_it_is_not_the_policys():
    from openrlhf_hacpo.trainer.fingerprint import config_fingerprint

    same = config_fingerprint(_cfg(AgentConfig("q", "/m/q"), engine_dtype="float32"))
    assert not any("engine_dtype" in key for key in same)  # float32 engines of a float32 policy: as before
    other = config_fingerprint(_cfg(AgentConfig("q", "/m/q"), AgentConfig("l", "/m/l", bf16=True),
                                    engine_dtype="bfloat16", rollout_batch_size=4, train_batch_size=8))
    assert other["agent.q.engine_dtype"] == "bfloat16" and "agent.l.engine_dtype" not in other
