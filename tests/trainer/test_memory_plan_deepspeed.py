"""The gradient buffers the memory plan counts are the ones DeepSpeed's ZeRO optimizers allocate: a policy engine
built the project's way (``build_policy_engine``: fp32, gloo, world size 1, two micro-batches per update) is
watched through one update (ZeRO-2, ZeRO-3, ZeRO-2 with ``adam_offload``), and the sizes of its reduce bucket,
gradient partitions, the fp32 gradient its optimizer steps on and the offload copy buffers are compared with the
plan's terms for the same run configuration."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]


def _engine(tiny_agents, tmp_path, *flags):
    from gpu_stack.stack_fixtures import init_gloo_world, worker_config
    from transformers import AutoConfig

    from openrlhf_hacpo.actors.agent_plan import LoraPlan, plan_agents
    from openrlhf_hacpo.actors.deepspeed_setup import build_policy_engine
    from openrlhf_hacpo.trainer.memory_layout import agent_layouts

    init_gloo_world()
    cfg = worker_config(tiny_agents["llama"], tmp_path, "--micro_train_batch_size", "2", "--lr_scheduler",
                        "constant", "--actor_learning_rate", "1e-3", *flags)
    built = build_policy_engine(cfg, cfg.resolved_agents[0], LoraPlan(), total_updates=2)
    config = AutoConfig.from_pretrained(tiny_agents["llama"])
    (layout,) = agent_layouts(cfg, plan_agents(cfg, on_gpu=True), {"qwen": config})
    return built, config, layout


def _update(engine, vocab: int) -> None:
    for seed in (0, 1):  # one update of two micro-batches
        ids = torch.randint(3, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()


def test_zero2_gradient_buffers_match_the_plan(tiny_agents, tmp_path):
    from openrlhf_hacpo.trainer.memory_rows import policy_phases

    built, config, layout = _engine(tiny_agents, tmp_path, "--zero_stage", "2")
    engine, opt = built.engine, built.engine.optimizer
    trainable = sum(p.numel() for p in engine.module.parameters() if p.requires_grad)
    assert layout.accumulation_steps == 2 and layout.trainable == trainable

    seen: dict[str, list] = {"bucket": [], "partition": [], "kept_while_copying": [], "step_grads": []}
    setup_buckets, copy_grads = opt.setup_buckets, opt.copy_grads_in_partition

    def watch_setup_buckets():  # called at every gradient; allocates at the first of a backward pass
        fresh = not opt.ready_for_gradients
        setup_buckets()
        if fresh:
            seen["bucket"] += [(b.numel(), b.element_size()) for bucket in opt.ipg_buckets.values()
                               for b in bucket.buffer]

    def watch_copy(param):
        fresh = opt.grads_in_partition is None
        copy_grads(param)
        if fresh:  # a new partition for this micro-batch, next to the earlier micro-batches' sum if any
            new = opt.grads_in_partition
            seen["partition"].append((new.numel(), new.element_size(), new.untyped_storage().data_ptr()))
            kept = opt.all_grad_tensors.get(0)
            seen["kept_while_copying"].append(
                None if kept is None else {t.untyped_storage().data_ptr() for t in kept})

    opt.setup_buckets, opt.copy_grads_in_partition = watch_setup_buckets, watch_copy
    phases = policy_phases(layout)
    client = opt.optimizer  # the client AdamW, stepped once per parameter group (its step is wrapped per instance)
    assert client is built.client_optimizer
    client_step = client.step

    def watch_step(*args, **kwargs):
        for group in client.param_groups:
            for p in group["params"]:
                seen["step_grads"].append((p.grad.numel(), p.grad.element_size()))
        return client_step(*args, **kwargs)

    client.step = watch_step
    _update(engine, config.vocab_size)

    # one bucket of DeepSpeed's default 5e8 fp32 elements per backward pass: the plan's bucket term
    assert seen["bucket"] == [(500_000_000, 4)] * 2
    assert phases.backward["bucket"] == 500_000_000 * 4
    # a new partition of every trainable gradient (world size 1) per micro-batch; during the second one the first
    # micro-batch's partition is still held (another storage): the plan's two partitions with accumulation
    (n1, size1, ptr1), (n2, size2, ptr2) = seen["partition"]
    assert n1 == n2 == trainable and size1 == size2 == 4
    assert seen["kept_while_copying"][0] is None and seen["kept_while_copying"][1] == {ptr1} and ptr2 != ptr1
    assert phases.backward["gradients"] == 2 * 4 * trainable
    # the optimizer steps on a flat fp32 copy per parameter group, together every trainable weight: 4 bytes of the
    # plan's 8 per weight at the step (the other 4 are the flat copy's source, or AdamW's temporary)
    assert sum(n for n, _ in seen["step_grads"]) == trainable and {s for _, s in seen["step_grads"]} == {4}
    assert phases.step["gradients"] == 8 * trainable and phases.step["bucket"] == 0


def test_zero3_gradient_buffers_match_the_plan(tiny_agents, tmp_path):
    """ZeRO-3 keeps its bucket and a flat gradient partition (world size 1: every trainable gradient) from its
    initialisation on; its client optimizer steps on an fp32 gradient of the sub-group (here one)."""
    from openrlhf_hacpo.trainer.memory_rows import policy_phases

    built, config, layout = _engine(tiny_agents, tmp_path, "--zero_stage", "3")
    opt = built.engine.optimizer
    trainable = layout.trainable
    buckets = [(b.buffer.numel(), b.buffer.element_size()) for b in opt.ipg_buckets.values()]
    flat = opt.grad_partitions_flat_buffer
    assert buckets == [(500_000_000, 4)] and (flat.numel(), flat.element_size()) == (trainable, 4)
    phases = policy_phases(layout)
    assert phases.kept["bucket"] == phases.backward["bucket"] == phases.step["bucket"] == 500_000_000 * 4
    assert phases.kept["gradients"] == phases.backward["gradients"] == 4 * trainable
    step_grads = []
    client, client_step = opt.optimizer, opt.optimizer.step

    def watch_step(*args, **kwargs):
        step_grads.extend((p.grad.numel(), p.grad.element_size()) for g in client.param_groups for p in g["params"])
        return client_step(*args, **kwargs)

    client.step = watch_step
    _update(built.engine, config.vocab_size)
    assert sum(n for n, _ in step_grads) == trainable and {s for _, s in step_grads} == {4}
    assert opt.grad_partitions_flat_buffer is flat  # kept across the update
    # the kept partition 4P, the fp32 copy 4P and AdamW's temporary 4P (one sub-group)
    assert phases.step["gradients"] == 12 * trainable


def test_zero2_offload_host_buffers_match_the_plan(tiny_agents, tmp_path):
    """ZeRO-2 with adam_offload: the copy-back buffer of the updated weights, the accumulated gradients of the
    earlier micro-batches and the copy buffers of the largest parameter are DeepSpeed's, of the sizes the plan
    counts (host and device are the same memory here; the plan places them)."""
    from openrlhf_hacpo.trainer.memory_rows import policy_phases

    built, config, layout = _engine(tiny_agents, tmp_path, "--zero_stage", "2", "--adam_offload")
    opt = built.engine.optimizer
    trainable, largest = layout.trainable, layout.largest_trainable
    assert largest == max(p.numel() for p in built.engine.module.parameters() if p.requires_grad)
    _update(built.engine, config.vocab_size)
    copy_back = sum(b.numel() for b in opt.param_buffer_of_bit16_for_cpu_offload_groups)
    accumulated = sum(t.numel() for t in opt.accumulated_grads_in_cpu.values())
    fp32_grads = sum(p.grad.numel() for p in opt.single_partition_of_fp32_groups)
    assert copy_back == accumulated == fp32_grads == trainable
    assert opt.temp_grad_buffer_for_cpu_offload.numel() == opt.temp_grad_buffer_for_gpu_offload.numel() == largest
    phases = policy_phases(layout)
    # host: fp32 master 4P + Adam 8P + fp32 gradients 4P + copy-back 4P + accumulated 4P + the CPU copy buffer 4E
    assert phases.host == (4 + 8 + 4 + 4 + 4) * trainable + 4 * largest
    assert phases.backward["gradients"] == 4 * largest and phases.backward["bucket"] == 500_000_000 * 4
