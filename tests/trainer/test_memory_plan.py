"""The memory plan: parameter counts against models transformers builds, byte totals computed by hand for a small
config at each ZeRO stage, the directions the options move the estimate, and the refusal's advice re-planned."""
from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch

from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.trainer.memory_check import detect_gpu_bytes, launch_memory_plan
from openrlhf_hacpo.trainer.memory_layout import AgentLayout
from openrlhf_hacpo.trainer.memory_plan import fitting_options, plan_run
from openrlhf_hacpo.trainer.memory_rows import plan_agent
from openrlhf_hacpo.trainer.memory_sizes import ALLOCATOR_OVERHEAD, CUDA_CONTEXT_BYTES, GIB, ModelShape

H100_BYTES = 81559 * 2**20  # nvidia-smi's memory.total of an 80 GB H100


# ------------------------------------------------------------------------------------------ parameter counts
def _tiny_configs():
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=48, max_position_embeddings=64)
    return {
        "llama tied": LlamaConfig(**common, tie_word_embeddings=True),
        "llama untied, biases": LlamaConfig(**common, tie_word_embeddings=False, attention_bias=True, mlp_bias=True),
        "llama untied, head_dim 16": LlamaConfig(**common, head_dim=16, tie_word_embeddings=False),
        "qwen2 tied": Qwen2Config(**common, tie_word_embeddings=True),
        "qwen2 untied": Qwen2Config(**common, tie_word_embeddings=False),
        "qwen3 tied": Qwen3Config(**common, head_dim=16, tie_word_embeddings=True),
        "qwen3 untied, attention bias": Qwen3Config(**common, head_dim=8, tie_word_embeddings=False,
                                                    attention_bias=True),
    }


@pytest.mark.parametrize("name", list(_tiny_configs()))
def test_parameter_count_equals_the_built_model(name):
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in model.parameters())  # a tied embedding is one parameter
    shape = ModelShape.from_config(config)
    assert shape.exact
    assert shape.parameters() == expected
    assert shape.tied == ("untied" not in name)


def test_lora_parameter_count_by_hand():
    """rank x (in + out) per targeted module and layer of the small shape below."""
    shape = _small_shape()
    # per layer: q 64->64, k 64->32, v 64->32, o 64->64, gate 64->128, up 64->128, down 128->64
    per_layer = 8 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64) + (64 + 128) + (64 + 128) + (128 + 64))
    assert shape.lora_parameters(8, "all-linear") == 2 * per_layer
    assert shape.lora_parameters(8, "q_proj,v_proj") == 2 * 8 * ((64 + 64) + (64 + 32))
    with pytest.raises(ValueError, match="lm_head"):
        shape.lora_parameters(8, "q_proj,lm_head")


@pytest.mark.parametrize("targets", ["all-linear", "q_proj,v_proj"])
def test_lora_parameter_count_equals_peft(targets):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    config = _tiny_configs()["qwen3 untied, attention bias"]
    model = peft.get_peft_model(AutoModelForCausalLM.from_config(config),
                                peft.LoraConfig(r=4, target_modules=targets if targets == "all-linear"
                                                else targets.split(",")))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert ModelShape.from_config(config).lora_parameters(4, targets) == trainable


def test_mixture_of_experts_is_named():
    config = SimpleNamespace(model_type="qwen3_moe", num_experts=8, hidden_size=8, num_attention_heads=2,
                             vocab_size=10, num_hidden_layers=1, intermediate_size=8)
    with pytest.raises(ValueError, match="agent 'moe'.*mixture of experts"):
        ModelShape.from_config(config, "agent 'moe'")


# ------------------------------------------------------------------------------------------ bytes by hand
def _small_shape() -> ModelShape:
    config = SimpleNamespace(model_type="llama", vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
                             tie_word_embeddings=True)
    return ModelShape.from_config(config)


def _small_layout(**changes) -> AgentLayout:
    values = dict(name="small", shape=_small_shape(), dp=4, bf16=True, gradient_checkpointing=False, micro_batch=2,
                  prompt_len=8, response_len=8, logprob_path="fused", reference=True)
    values.update(changes)
    return AgentLayout(**values)


def test_small_config_parameters_by_hand():
    # q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12288; gate, up, down 3 x 64x128 = 24576; two norms 128
    per_layer = 4096 + 2048 + 2048 + 4096 + 3 * 8192 + 128
    assert per_layer == 36992
    assert _small_shape().parameters() == 1000 * 64 + 2 * per_layer + 64 == 138048


# P = 138048 parameters, bf16 (2 bytes), dp 4: weights 2P = 276096, master 4P = 552192, gradients 2P = 276096,
# Adam 8P = 1104384, each divided by 4 where the stage shards it (ZeRO-3 also gathers 2 x (2 layers x 36992 +
# 64000 embedding) = 275968 bytes in flight). During the backward pass ZeRO-1/2/3 also hold DeepSpeed's reduce
# bucket, 5e8 elements x 2 bytes (tests/trainer/test_memory_plan_gradients.py counts every phase's buffers).
BUCKET = 500_000_000 * 2
HAND = {  # stage: (weights, master, gradients, bucket, optimizer, gathered) of the backward pass
    0: (276096, 552192, 276096, 0, 1104384, 0),
    1: (276096, 138048, 276096, BUCKET, 276096, 0),
    2: (276096, 138048, 69024, BUCKET, 276096, 0),
    3: (69024, 138048, 69024, BUCKET, 276096, 275968),
}
# one micro-batch: 2 rows x 16 tokens = 32 tokens; 17 values x 32 tokens x 64 hidden x 2 bytes = 69632 per layer
ACTIVATIONS = 2 * 69632
# fused head: 16 response tokens, one tile of 16 x 1000 bf16 logits + 16 x 64 x (4 + 2) bytes
LOGPROBS = 16 * 1000 * 2 + 16 * 64 * 6
REFERENCE = 276096
# a micro-batch of 16 rows x 16 tokens = 256 tokens (8 x the above; the backward pass is then every stage's peak)
ACTIVATIONS_16 = 8 * ACTIVATIONS
LOGPROBS_16 = 128 * 1000 * 2 + 128 * 64 * 6


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bytes_at_each_zero_stage_by_hand(stage):
    rows = plan_agent(_small_layout(zero_stage=stage, micro_batch=16), 80 * GIB)
    assert [r.gpu for r in rows] == [0, 1, 2, 3]
    weights, master, gradients, bucket, optimizer, gathered = HAND[stage]
    for row in rows:
        assert (row.weights, row.master, row.gradients, row.bucket, row.optimizer, row.gathered) == HAND[stage]
        assert (row.activations, row.logprobs, row.phase) == (ACTIVATIONS_16, LOGPROBS_16, "train")
        reference = REFERENCE if row.gpu == 0 else 0
        assert row.reference == reference
        tensors = (weights + master + gradients + bucket + optimizer + gathered + ACTIVATIONS_16 + LOGPROBS_16
                   + reference)
        assert row.total == int(tensors * ALLOCATOR_OVERHEAD) + CUDA_CONTEXT_BYTES
        assert row.host == 0 and row.fits


# fp32 host buffers of adam_offload besides master, Adam and fp32 gradients: ZeRO-3 the flat gradient partition
# 4P / 4 = 138048; ZeRO-2 the copy-back buffer 4P / 4 = 138048 and the CPU copy buffer of the largest parameter
# (the 1000 x 64 embedding) 4 x 64000 = 256000
@pytest.mark.parametrize("stage, offload, device_master, host_master, host_buffers", [
    (0, False, 0, 0, 0),                # fp32 ZeRO-0: the optimizer steps the weights themselves
    (1, False, 138048, 0, 0),           # ZeRO-1/2 clone the fp32 partition they update: 4P / dp 4 = P bytes
    (2, False, 138048, 0, 0),
    (3, False, 0, 0, 0),                # fp32 ZeRO-3 on the device updates the weights' own partition
    (3, True, 0, 138048, 138048),       # ... but the host copy of adam_offload is a clone
    (2, True, 0, 138048, 138048 + 256000),
])
def test_fp32_master_copy_by_stage(stage, offload, device_master, host_master, host_buffers):
    row = plan_agent(_small_layout(zero_stage=stage, bf16=False, adam_offload=offload), None)[0]
    assert row.master == device_master
    # with offload the host also holds Adam 8P / 4 and the fp32 gradient partition 4P / 4
    assert row.host == (host_master + 2 * 138048 + 138048 + host_buffers if offload else 0)


def test_checkpointing_and_logits_path_by_hand():
    row = plan_agent(_small_layout(zero_stage=2, gradient_checkpointing=True, logprob_path="logits"), None)[0]
    # the other layer's input (32 x 64 x 2 bytes) + one layer recomputed (69632)
    assert row.activations == 32 * 64 * 2 + 69632
    # 16 response tokens x 1000 vocabulary x (2 bytes bf16 logits + 4 bytes fp32)
    assert row.logprobs == 16 * 1000 * 6
    assert row.fits is None


def test_offload_and_lora_placement_by_hand():
    row = plan_agent(_small_layout(zero_stage=3, adam_offload=True, param_offload=True), None)[0]
    assert (row.weights, row.master, row.optimizer) == (0, 0, 0)
    # host: master 138048 + Adam 276096 + fp32 gradients 4P/4 = 138048, + the bf16 flat gradient partition 2P/4 =
    # 69024, + the bf16 weight shard 69024
    assert row.host == 138048 + 276096 + 138048 + 69024 + 69024
    lora = plan_agent(_small_layout(zero_stage=2, lora_rank=8), None)[0]
    adapters = 2 * 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert lora.weights == 2 * (138048 + adapters)  # frozen base + adapters, bf16
    assert (lora.master, lora.gradients, lora.optimizer) == (4 * adapters // 4, 2 * adapters // 4, 8 * adapters // 4)
    assert lora.reference == 0  # the base model with the adapters off is the reference
    offloaded_ref = plan_agent(_small_layout(ref_reward_offload=True), None)[0]
    assert offloaded_ref.reference == 0 and offloaded_ref.host == REFERENCE


def test_engines_dedicated_and_colocated():
    gpu = 80 * GIB
    dedicated = plan_agent(_small_layout(engines=2, tensor_parallel=2, engine_utilization=0.9), gpu)
    assert [r.role for r in dedicated][4:] == ["vLLM"] * 4
    assert all(r.engine == int(0.9 * gpu) and r.total == int(0.9 * gpu) for r in dedicated[4:])
    colocated = plan_agent(_small_layout(engines=2, colocated=True, engine_utilization=0.5, engine_sleep=True), gpu)
    assert [r.role for r in colocated] == ["policy + ref + vLLM", "policy + vLLM", "policy", "policy"]
    # generation is the peak of a GPU shared with an engine: held states x overhead + policy context + 0.5 G;
    # ZeRO-2 holds no gradient buffer between updates
    weights, master, _, _, optimizer, _ = HAND[2]
    held = weights + master + optimizer + REFERENCE
    assert colocated[0].phase == "generate"
    assert colocated[0].total == int(held * ALLOCATOR_OVERHEAD) + CUDA_CONTEXT_BYTES + int(0.5 * gpu)
    # a sleeping engine's weights wait in host memory
    assert colocated[1].host == 2 * 138048


# ------------------------------------------------------------------------------------------ directions
def _eight_b() -> ModelShape:  # Qwen3-8B's published config
    return ModelShape.from_config(SimpleNamespace(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False))


def _layouts():
    for stage in (0, 1, 2, 3):
        for gc in (False, True):
            for colocated in (False, True):
                yield AgentLayout("q8", _eight_b(), dp=2, zero_stage=stage, gradient_checkpointing=gc, micro_batch=4,
                                  prompt_len=1024, response_len=4096, engines=2, colocated=colocated,
                                  engine_utilization=0.5 if colocated else 0.95, engine_sleep=colocated)


def _totals(layout):
    return [r.total for r in plan_agent(layout, H100_BYTES)]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_more_dp_never_increases_per_gpu_bytes(stage):
    for base in (lay for lay in _layouts() if lay.zero_stage == stage):
        peaks = [max(_totals(dataclasses.replace(base, dp=dp))) for dp in (1, 2, 4, 8)]
        assert peaks == sorted(peaks, reverse=True), (base, peaks)
        policy = [plan_agent(dataclasses.replace(base, dp=dp), H100_BYTES)[0] for dp in (1, 2, 4, 8)]
        for field in ("weights", "master", "gradients", "optimizer"):
            values = [getattr(r, field) for r in policy]
            assert values == sorted(values, reverse=True), (field, values)


def test_checkpointing_offload_and_lora_never_increase_gpu_bytes():
    for base in _layouts():
        before = _totals(base)
        changes = [{"gradient_checkpointing": True}, {"lora_rank": 64}, {"ref_reward_offload": True},
                   {"deepspeed_enable_sleep": True}]
        if base.zero_stage >= 1:
            changes.append({"adam_offload": True})
        if base.zero_stage == 3:
            changes += [{"param_offload": True}, {"param_offload": True, "adam_offload": True}]
        for change in changes:
            after = _totals(dataclasses.replace(base, **change))
            assert all(a <= b for a, b in zip(after, before)), (base, change, after, before)
        assert _totals(dataclasses.replace(base, gradient_checkpointing=True)) < before or base.gradient_checkpointing


# ------------------------------------------------------------------------------------------ refusal
_REPLAN = {  # the refusal's option text -> the layout change it names
    r"--gradient_checkpointing": lambda lay: {"gradient_checkpointing": True},
    r"zero_stage 3": lambda lay: {"zero_stage": 3},
    r"dp_size (\d+)( with zero_stage (\d))?": None,
    r"--adam_offload": lambda lay: {"adam_offload": True},
    r"(zero_stage 3 with )?--param_offload": lambda lay: {"zero_stage": 3, "param_offload": True},
    r"--lora_rank 64": lambda lay: {"lora_rank": 64},
}


def _replanned(layout: AgentLayout, option: str) -> AgentLayout:
    if " + " in option:  # options applied together
        for part in option.split(" + "):
            layout = _replanned(layout, part)
        return layout
    dp = re.fullmatch(r"dp_size (\d+)(?: with zero_stage (\d))?", option)
    if dp:
        return dataclasses.replace(layout, dp=int(dp.group(1)), zero_stage=int(dp.group(2) or layout.zero_stage))
    for pattern, change in _REPLAN.items():
        if change is not None and re.fullmatch(pattern, option):
            return dataclasses.replace(layout, **change(layout))
    raise AssertionError(f"unknown option text {option!r}")


def test_refusal_names_agent_size_estimate_and_an_option_that_fits():
    layout = AgentLayout("qwen8b", _eight_b(), dp=2, zero_stage=2, gradient_checkpointing=True, micro_batch=4,
                         prompt_len=1024, response_len=8192, engines=2)
    plan = plan_run([layout], H100_BYTES)
    assert not plan.fits
    with pytest.raises(ValueError) as err:
        plan.check()
    message = str(err.value)
    peak = plan.peak("qwen8b")
    assert "agent 'qwen8b'" in message and "79.6 GiB" in message and f"{peak.total / GIB:.1f} GiB" in message
    options = message.split("options that fit, each re-planned: ")[1].split(" | ")
    assert options and options == fitting_options(layout, H100_BYTES)
    for option in options:
        assert plan_run([_replanned(layout, option)], H100_BYTES).fits, option
    # ZeRO-3 alone does not fit here: the fp32 master weights and Adam moments of 2 ranks stay too large
    assert "zero_stage 3" not in options and "--adam_offload" in options


def test_refusal_combines_options_when_none_fits_alone():
    layout = AgentLayout("qwen8b", _eight_b(), dp=1, zero_stage=2, micro_batch=8, prompt_len=1024,
                         response_len=8192, engines=1)
    gpu = 48 * GIB
    options = fitting_options(layout, gpu)
    assert len(options) == 1 and " + " in options[0]
    assert plan_run([_replanned(layout, options[0])], gpu).fits


def test_engine_that_cannot_hold_its_weights_is_refused():
    layout = AgentLayout("big", _eight_b(), dp=8, zero_stage=3, gradient_checkpointing=True, bf16=False, engines=1,
                         engine_utilization=0.3)
    plan = plan_run([layout], H100_BYTES)
    with pytest.raises(ValueError, match="agent 'big': its vLLM engine needs more"):
        plan.check()
    assert "vllm_tensor_parallel_size 2" in fitting_options(layout, H100_BYTES)


def test_agents_without_ray_add_up_on_one_gpu():
    pair = [_small_layout(name="a", dp=1), _small_layout(name="b", dp=1)]
    alone = plan_agent(pair[0], None)[0]
    # weights 2P + master 4P + gradients 2P + reduce bucket + Adam 8P + activations + head + reference 2P, per agent
    per_agent = 18 * 138048 + BUCKET + ACTIVATIONS + LOGPROBS
    assert alone.allocated == per_agent
    together = int(2 * per_agent * ALLOCATOR_OVERHEAD) + CUDA_CONTEXT_BYTES
    gpu = together - 1  # each agent fits alone, not both
    assert plan_run(pair, gpu).fits
    shared = plan_run(pair, gpu, shared_gpu=True)
    assert shared.shared_total == together and not shared.fits
    with pytest.raises(ValueError, match=r"agents \['a', 'b'\] share one GPU without Ray"):
        shared.check()


def test_table_lists_every_gpu():
    table = plan_run([_small_layout(engines=1)], 80 * GIB).format_table()
    lines = table.splitlines()
    assert "80.0 GiB" in lines[0]
    assert [line.split()[:2] for line in lines[3:8]] == [["small", str(i)] for i in range(5)]
    assert "138,048 parameters" in table


# ------------------------------------------------------------------------------------------ launch
def _config(**extra) -> TrainConfig:
    return TrainConfig.of(agents=[AgentConfig(name="q8", pretrain="models/q8")], prompt_data="p.jsonl",
                       rollout_backend="vllm", vllm_num_engines=2, actor_num_gpus_per_node=2, zero_stage=3,
                       bf16=True, micro_train_batch_size=4, **extra)


def _launch(cfg: TrainConfig, model_configs, **kw):
    """The launch's memory plan of ``cfg``'s agents planned for GPUs, as the driver plans them."""
    return launch_memory_plan(cfg, plan_agents(cfg, on_gpu=True), model_configs, **kw)


def _q8_config():
    return SimpleNamespace(model_type="qwen3", vocab_size=151936, hidden_size=4096, num_hidden_layers=36,
                           num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                           tie_word_embeddings=False)


def test_launch_refuses_unless_told_not_to():
    lines = []
    with pytest.raises(ValueError, match="agent 'q8'.*options that fit"):
        _launch(_config(generate_max_len=8192), {"q8": _q8_config()}, log=lines.append, detect=lambda: H100_BYTES)
    assert "memory plan per GPU" in lines[0]
    lines.clear()
    plan = _launch(_config(generate_max_len=8192, memory_check=False), {"q8": _q8_config()},
                   log=lines.append, detect=lambda: H100_BYTES)
    assert not plan.fits and "--no_memory_check" in lines[-1]


def test_launch_reads_the_run_settings_and_the_gpu_size_flag():
    cfg = _config(gpu_memory_gb=141.0, gradient_checkpointing=True, adam_offload=True, colocate_all_models=True)
    plan = _launch(cfg, {"q8": _q8_config()}, log=lambda _: None, detect=lambda: 1)
    assert plan.gpu_bytes == 141 * GIB and plan.fits
    (layout,) = plan.layouts
    assert (layout.dp, layout.zero_stage, layout.engines, layout.colocated, layout.engine_utilization) == \
        (2, 3, 2, True, 0.5)
    assert layout.adam_offload and layout.gradient_checkpointing and layout.reference  # default --init_kl_coef
    assert all(r.master == 0 and r.optimizer == 0 for r in plan.rows)
    unknown = []
    assert _launch(_config(), {"q8": _q8_config()}, log=unknown.append, detect=lambda: None).fits
    assert "GPU size unknown" in unknown[-1]


def test_launch_skips_a_model_it_cannot_count():
    moe = SimpleNamespace(model_type="qwen3_moe", num_experts=8)
    lines = []
    assert _launch(_config(), {"q8": moe}, log=lines.append, detect=lambda: H100_BYTES) is None
    assert lines == ["memory plan skipped: agent 'q8': the memory plan counts dense decoders only; 'qwen3_moe' is a "
                     "mixture of experts"]


def test_detect_gpu_bytes_reads_nvidia_smi():
    def smi(args, **kwargs):
        assert args[0] == "nvidia-smi"
        return SimpleNamespace(returncode=0, stdout="81559\n40960\n")

    def missing(args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    assert detect_gpu_bytes(smi) == 40960 * 2**20
    assert detect_gpu_bytes(missing) is None


def test_gpu_preflight_prints_and_applies_the_plan(tmp_path, caplog):
    from openrlhf_hacpo.trainer.preflight import run_gpu_stack_preflight

    _tiny_configs()["qwen3 tied"].save_pretrained(tmp_path)
    agents = [AgentConfig(name="tiny", pretrain=str(tmp_path))]
    # fp32: the 1 GiB CUDA context and DeepSpeed's reduce bucket of 5e8 x 4 bytes (1.86 GiB, x 1.1) are most of it
    fits = TrainConfig.of(agents=agents, prompt_data="p.jsonl", use_ray=False, gpu_memory_gb=3.5)
    with caplog.at_level("INFO", logger="openrlhf_hacpo"):
        run_gpu_stack_preflight(fits, plan_agents(fits, on_gpu=True), cluster_gpus=None)
    assert "memory plan per GPU" in caplog.text and "GPU size 3.5 GiB" in caplog.text
    tight = TrainConfig.of(agents=agents, prompt_data="p.jsonl", use_ray=False, gpu_memory_gb=0.5)
    with pytest.raises(ValueError, match="agent 'tiny'.*0.5 GiB"):  # 1 GiB of CUDA context alone exceeds it
        run_gpu_stack_preflight(tight, plan_agents(tight, on_gpu=True), cluster_gpus=None)
    run_gpu_stack_preflight(tight, plan_agents(tight, on_gpu=False), cluster_gpus=None)  # CPU runs: no plan
