"""The memory plan's gradient buffers per phase of an update (backward pass, optimizer step, between updates),
computed by hand from DeepSpeed 0.19.6's ZeRO optimizers for a small config at every stage, with and without
gradient accumulation and optimizer offload, and the peak phase a GPU row reports."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from openrlhf_hacpo.actors.agent_plan import plan_agents
from openrlhf_hacpo.config import AgentConfig, TrainConfig
from openrlhf_hacpo.trainer.memory_layout import AgentLayout, agent_layouts
from openrlhf_hacpo.trainer.memory_rows import plan_agent, policy_phases
from openrlhf_hacpo.trainer.memory_sizes import ALLOCATOR_OVERHEAD, CUDA_CONTEXT_BYTES, ModelShape

# The small llama of tests/trainer/test_memory_plan.py: vocabulary 1000, hidden 64, 2 layers, 4 heads of 16, 2 KV
# heads, MLP 128, tied: P = 138048 parameters; its largest tensor is the 1000 x 64 embedding (64000 elements).
P = 138048
SHARD = P // 4  # dp 4: 34512 elements per rank
BUCKET_ELEMENTS = 10_000


def _shape() -> ModelShape:
    return ModelShape.from_config(SimpleNamespace(
        model_type="llama", vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True))


def _layout(**changes) -> AgentLayout:
    values = dict(name="small", shape=_shape(), dp=4, bf16=True, micro_batch=2, prompt_len=8, response_len=8,
                  reference=True, bucket_elements=BUCKET_ELEMENTS)
    values.update(changes)
    return AgentLayout(**values)


def _phase(parts, name):
    d = getattr(parts, name)
    return d["weights"], d["master"], d["gradients"], d["bucket"], d["optimizer"], d["gathered"]


def test_largest_parameter_by_hand():
    shape = _shape()
    # embedding 1000 x 64 = 64000 against the layers' largest matrices (gate / up / down 64 x 128 = 8192)
    assert shape.largest_parameter() == 64000
    # LoRA r = 8 on every linear layer: rank x max(in, out), largest for gate / up / down: 8 x 128
    assert _layout(lora_rank=8).largest_trainable == 1024
    assert _layout(lora_rank=8, target_modules="k_proj,v_proj").largest_trainable == 8 * 64


# bf16 (w = 2), dp 4, bucket 10,000 elements (20,000 bytes): per stage (weights, master, gradients, bucket, Adam,
# gathered) between updates, in the backward pass and at the optimizer step.
HELD = {  # weights, master, Adam, gathered
    0: (2 * P, 4 * P, 8 * P, 0),
    1: (2 * P, 4 * SHARD, 8 * SHARD, 0),
    2: (2 * P, 4 * SHARD, 8 * SHARD, 0),
    3: (2 * SHARD, 4 * SHARD, 8 * SHARD, 2 * (2 * 36992 + 64000)),
}
GRADIENTS = {  # stage: (kept, backward, step) gradient bytes and (kept, backward, step) bucket bytes
    # ZeRO-0: every gradient (2P); the step adds AdamW's fp32 denominator 4P
    0: ((0, 2 * P, 2 * P + 4 * P), (0, 0, 0)),
    # ZeRO-1: the unsharded gradients 2P in the backward pass with the bucket; the step holds the partition 2P/4,
    # its flat copy 2P/4 and the fp32 copy 4P/4 = 8P/4 (or the fp32 copy and AdamW's temporary, also 8P/4)
    1: ((0, 2 * P, 8 * SHARD), (0, 20_000, 0)),
    # ZeRO-2: the partition 2P/4 with the bucket; the same 8P/4 at the step
    2: ((0, 2 * SHARD, 8 * SHARD), (0, 20_000, 0)),
    # ZeRO-3: the flat partition 2P/4 and the bucket are kept; the step adds the fp32 copy and AdamW's temporary
    3: ((2 * SHARD, 2 * SHARD, 2 * SHARD + 8 * SHARD), (20_000, 20_000, 20_000)),
}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_gradient_buffers_per_phase_by_hand(stage):
    parts = policy_phases(_layout(zero_stage=stage))
    weights, master, optimizer, gathered = HELD[stage]
    grads, bucket = GRADIENTS[stage]
    for i, phase in enumerate(("kept", "backward", "step")):
        assert _phase(parts, phase) == (weights, master, grads[i], bucket[i], optimizer, gathered), phase
    assert parts.host == 0


@pytest.mark.parametrize("stage, backward", [(1, 2 * 2 * P), (2, 2 * 2 * SHARD), (3, 2 * SHARD)])
def test_accumulation_keeps_the_earlier_micro_batches_partition(stage, backward):
    """ZeRO-1/2 add each micro-batch's new partition into the kept one (``all_grad_tensors``): two partitions in
    the backward pass once a = 2; ZeRO-3 accumulates in place into its flat buffer; the step is unchanged."""
    one, two = (policy_phases(_layout(zero_stage=stage, accumulation_steps=a)) for a in (1, 2))
    assert two.backward["gradients"] == backward
    assert two.step == one.step and two.kept == one.kept
    assert policy_phases(_layout(zero_stage=stage, accumulation_steps=64)).backward == two.backward


def test_fp32_step_buffers_are_eight_bytes_per_updated_weight():
    """fp32 ZeRO-2: the flat copy of the partition is already fp32 (4 + 4 bytes with the partition), then the fp32
    gradient and AdamW's temporary (4 + 4)."""
    parts = policy_phases(_layout(zero_stage=2, bf16=False))
    assert parts.backward["gradients"] == 4 * SHARD and parts.backward["bucket"] == 4 * BUCKET_ELEMENTS
    assert parts.step["gradients"] == 8 * SHARD and parts.step["bucket"] == 0
    assert parts.step["master"] == 4 * SHARD  # ZeRO-2's fp32 clone of the partition


def test_offload_gradient_buffers_by_hand():
    # ZeRO-2: the device keeps the largest parameter's copy buffer (2 x 64000) and the bucket in the backward pass;
    # the host holds master 4P/4, Adam 8P/4, fp32 gradients 4P/4, the bf16 copy-back buffer 2P/4 and its own copy
    # buffer of the largest parameter 2 x 64000; with accumulation also the accumulated bf16 partition 2P/4
    zero2 = policy_phases(_layout(zero_stage=2, adam_offload=True))
    assert _phase(zero2, "backward") == (2 * P, 0, 128_000, 20_000, 0, 0)
    assert _phase(zero2, "step") == _phase(zero2, "kept") == (2 * P, 0, 128_000, 0, 0, 0)
    assert zero2.host == 4 * SHARD + 8 * SHARD + 4 * SHARD + 2 * SHARD + 128_000
    accumulated = policy_phases(_layout(zero_stage=2, adam_offload=True, accumulation_steps=2))
    assert accumulated.host == zero2.host + 2 * SHARD
    # ZeRO-3: the flat bf16 gradient partition moves to the host; the bucket stays on the device
    zero3 = policy_phases(_layout(zero_stage=3, adam_offload=True))
    gathered = 2 * (2 * 36992 + 64000)
    for phase in ("kept", "backward", "step"):
        assert _phase(zero3, phase) == (2 * SHARD, 0, 0, 20_000, 0, gathered), phase
    assert zero3.host == 4 * SHARD + 8 * SHARD + 4 * SHARD + 2 * SHARD


def test_lora_buffers_are_the_adapters():
    adapters = 2 * 8 * (128 + 96 + 96 + 128 + 192 + 192 + 192)  # rank 8 x (in + out) per module, 2 layers
    parts = policy_phases(_layout(zero_stage=2, lora_rank=8))
    assert parts.backward["gradients"] == 2 * (adapters // 4)
    assert parts.step["gradients"] == 8 * (adapters // 4)
    assert parts.backward["bucket"] == 20_000  # DeepSpeed sizes the bucket by its setting, not the model


def test_a_row_reports_its_peak_phase():
    # ZeRO-0 on one rank with a 2-row micro-batch: the step (gradients 2P + AdamW's 4P) outweighs the backward
    # pass (gradients 2P + activations 139264 + log-prob head 38144)
    layout = _layout(zero_stage=0, dp=1)
    (row,) = plan_agent(layout, None)
    assert row.phase == "step" and (row.activations, row.logprobs) == (0, 0)
    assert row.gradients == 6 * P
    tensors = 2 * P + 4 * P + 6 * P + 8 * P + 2 * P  # weights, master, step gradients, Adam, reference
    assert row.total == int(tensors * ALLOCATOR_OVERHEAD) + CUDA_CONTEXT_BYTES
    # 16 rows: the backward pass is the peak
    (row,) = plan_agent(_layout(zero_stage=0, dp=1, micro_batch=16), None)
    assert row.phase == "train" and row.gradients == 2 * P and row.activations == 8 * 2 * 69632


def test_accumulation_steps_from_the_run_config():
    configs = {"a": SimpleNamespace(model_type="llama", vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    intermediate_size=128, tie_word_embeddings=True)}
    for batch, micro, dp, steps in ((512, 4, 2, 64), (8, 8, 1, 1), (16, 8, 1, 2)):
        cfg = TrainConfig.of(agents=[AgentConfig(name="a", pretrain="models/a", dp_size=dp)], prompt_data="p.jsonl",
                          train_batch_size=batch, micro_train_batch_size=micro)
        (layout,) = agent_layouts(cfg, plan_agents(cfg, on_gpu=True), configs)
        assert layout.accumulation_steps == steps, (batch, micro, dp)


def test_bad_accumulation_or_bucket_is_named():
    with pytest.raises(ValueError, match="agent 'small': accumulation_steps must be >= 1"):
        _layout(accumulation_steps=0)
    with pytest.raises(ValueError, match="agent 'small'.*bucket_elements >= 0"):
        _layout(bucket_elements=-1)


def test_zero3_steps_one_sub_group_at_a_time():
    """Qwen3-8B (published config: 8,190,735,360 parameters, largest tensor the 151936 x 4096 embedding) on 2 ranks:
    a rank's 4,095,367,680 elements are stepped in sub-groups that close once they reach 1e9 elements, so the step's
    fp32 copy and AdamW temporary cover at most 1e9 + 622,329,856 / 2 elements."""
    shape = ModelShape.from_config(SimpleNamespace(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False))
    assert shape.parameters() == 8_190_735_360 and shape.largest_parameter() == 151936 * 4096
    parts = policy_phases(AgentLayout("q8", shape, dp=2, zero_stage=3))
    assert parts.kept["gradients"] == 2 * 4_095_367_680  # the bf16 flat partition
    assert parts.step["gradients"] == 2 * 4_095_367_680 + 8 * (1_000_000_000 + 311_164_928)
