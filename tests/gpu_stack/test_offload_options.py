"""The memory options' configuration, DeepSpeed config, the skip protocol on a plain torch model and the reference
worker's offload (unit tier: no process group, no DeepSpeed engine; the engines are in test_offload.py)."""
from __future__ import annotations

import pytest
import torch

from openrlhf_hacpo.actors.deepspeed_setup import SkipAwareScheduler, SkippableAdamW, build_ds_config
from stack_fixtures import worker_config


def _config(*flags: str, agent: str = ""):
    from openrlhf_hacpo.cli.train_hacpo import build_config

    spec = "name=qwen,pretrain=/m/qwen" + (f",{agent}" if agent else "")
    return build_config(["--agent", spec, "--prompt_data", "unused.jsonl", "--rollout_batch_size", "2",
                         "--n_samples_per_prompt", "2", "--train_batch_size", "4", "--micro_train_batch_size", "4",
                         "--no_ray", *flags])


@pytest.mark.parametrize("flags, agent, message", [
    (("--param_offload",), "", "agents['qwen'].param_offload (--param_offload) needs zero_stage=3, got zero_stage=2"),
    (("--zero_stage", "1"), "param_offload=true", "agents['qwen'].param_offload (--param_offload) needs zero_stage=3"),
    (("--zero_stage", "0", "--adam_offload"), "", "agents['qwen'].adam_offload (--adam_offload) needs zero_stage >= 1"),
    (("--zero_stage", "3", "--deepspeed_enable_sleep"), "",
     "agents['qwen'].deepspeed_enable_sleep (--deepspeed_enable_sleep) needs zero_stage 1 or 2, got zero_stage=3"),
    (("--deepspeed_enable_sleep",), "zero_stage=0",
     "deepspeed_enable_sleep (--deepspeed_enable_sleep) needs zero_stage 1 or 2, got zero_stage=0"),
])
def test_offload_options_outside_their_zero_stages_are_refused_naming_agent_and_field(flags, agent, message):
    with pytest.raises(ValueError) as err:
        _config(*flags, agent=agent)
    assert message in str(err.value)


def test_agents_inherit_the_run_wide_memory_options_unless_they_set_their_own():
    cfg = _config("--zero_stage", "3", "--param_offload", "--adam_offload", "--ref_reward_offload",
                  agent="adam_offload=false")
    agent = cfg.resolved_agents[0]
    assert (agent.adam_offload, agent.param_offload, agent.deepspeed_enable_sleep, agent.ref_reward_offload) == \
        (False, True, False, True)
    allowed = [("1", ("--adam_offload", "--deepspeed_enable_sleep")), ("2", ("--adam_offload",)),
               ("3", ("--adam_offload", "--param_offload"))]
    for stage, flags in allowed:
        _config("--zero_stage", stage, *flags)  # accepted


def test_ds_config_offloads_the_optimizer_and_zero3_parameters_to_pinned_cpu_memory(tmp_path):
    for stage, flags, optimizer, params in [("2", (), False, False), ("2", ("--adam_offload",), True, False),
                                            ("3", ("--adam_offload", "--param_offload"), True, True)]:
        cfg = worker_config("/m/qwen", tmp_path, "--zero_stage", stage, *flags)
        zero = build_ds_config(cfg, cfg.resolved_agents[0])["zero_optimization"]
        assert zero["stage"] == int(stage)
        assert zero.get("offload_optimizer") == ({"device": "cpu", "pin_memory": True} if optimizer else None)
        assert zero.get("offload_param") == ({"device": "cpu", "pin_memory": True} if params else None)


def test_skip_flag_leaves_parameters_moments_and_counters_and_the_next_step_is_hand_computed_adamw():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    lr, wd, eps = 1e-2, 0.1, 1e-8
    optimizer = SkippableAdamW(model.parameters(), lr=lr, weight_decay=wd, eps=eps)
    scheduler = SkipAwareScheduler(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0 / (n + 1)), optimizer)

    def grads_of(x: torch.Tensor) -> None:
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()

    grads_of(torch.ones(1, 3))
    optimizer.skip_next_step = True
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    scheduler.step()
    optimizer.skip_next_step = False
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert not optimizer.state and scheduler.get_last_lr() == [lr]

    # first applied AdamW step, by hand: m_hat = g, v_hat = g^2, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps)
    grads = [p.grad.detach().double().clone() for p in model.parameters()]
    optimizer.step()
    scheduler.step()
    for p0, g, p1 in zip(before, grads, model.parameters()):
        want = p0.double() * (1 - lr * wd) - lr * g / (g.abs() + eps)
        assert torch.allclose(p1.double(), want, rtol=0, atol=1e-7)
    assert scheduler.get_last_lr() == [pytest.approx(lr / 2)]

    moments = [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]
    after_one = [p.detach().clone() for p in model.parameters()]
    grads_of(torch.full((1, 3), 2.0))
    optimizer.skip_next_step = True
    optimizer.step()
    scheduler.step()
    optimizer.skip_next_step = False
    assert all(torch.equal(b, p) for b, p in zip(after_one, model.parameters()))
    for saved, now in zip(moments, optimizer.state.values()):
        assert all(torch.equal(saved[k], now[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
        assert float(now["step"]) == 1.0
    assert scheduler.get_last_lr() == [pytest.approx(lr / 2)]


@pytest.mark.parametrize("offload", [False, True])
def test_reference_offload_rests_on_cpu_and_scores_like_the_resident_model(offload, monkeypatch):
    import transformers

    from openrlhf_hacpo.actors.reference import ReferenceWorker
    from openrlhf_hacpo.zoo.models import ModelSpec, build_model
    from openrlhf_hacpo.zoo.tokenizers import build_tokenizer

    # a tiny Qwen3 built in memory (saving one would import DeepSpeed, which starts a process)
    spec = ModelSpec(family="qwen3", hidden_size=32, num_layers=1, num_heads=2, head_dim=16, num_kv_heads=1,
                     intermediate_size=32)
    tokenizer = build_tokenizer("bpe")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *args, **kwargs: build_model(spec, tokenizer, seed=2))
    resident = ReferenceWorker("tiny-qwen3", device="cpu")
    resident.setup()
    worker = ReferenceWorker("tiny-qwen3", device="cpu", offload=offload)
    worker.setup()
    moves: list[str] = []
    original_to = type(worker.model).to

    def recording_to(self, *args, **kwargs):
        moves.append(str(args[0] if args else kwargs.get("device")))
        return original_to(self, *args, **kwargs)

    monkeypatch.setattr(type(worker.model), "to", recording_to)
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    got = worker.compute_logprobs(prompts, responses, temperature=1.0)
    want = resident.compute_logprobs(prompts, responses, temperature=1.0)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    # offload: to the scoring device for the forward, back to the CPU afterwards (both "cpu" on this machine)
    assert moves == (["cpu", "cpu"] if offload else [])
    assert all(p.device.type == "cpu" for p in worker.model.parameters())
