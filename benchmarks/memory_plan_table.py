"""Which layouts of two and three agents fit 8 x 80 GB GPUs, by the memory plan (`openrlhf_hacpo.trainer.memory_plan`):
Qwen3-1.7B, Qwen3-4B, Qwen3-8B and Llama-3.1-8B (their published configs, written below; nothing is downloaded),
full-parameter ZeRO-2 / ZeRO-3 at several data-parallel sizes, dedicated and colocated vLLM engines, and the memory
options one after another. Estimates, not measurements. Writes ``benchmarks/results/memory_plan.md``.

    python benchmarks/memory_plan_table.py [--out benchmarks/results/memory_plan.md]

Setting of the paper's launcher (``examples/scripts/train_table1.sh``): bf16, micro-batch 4 rows of 1024 prompt +
8196 response tokens, 512 rows per update (so gradient accumulation over 512 / (4 x dp) micro-batches), the fused
log-prob head, a KL reference model, flash / sdpa attention, DeepSpeed's default reduce bucket; engines at vLLM's
default utilisation (0.95 dedicated, 0.5 colocated with sleep mode).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from openrlhf_hacpo.trainer.memory_layout import AgentLayout  # noqa: E402
from openrlhf_hacpo.trainer.memory_plan import plan_run  # noqa: E402
from openrlhf_hacpo.trainer.memory_sizes import GIB, ModelShape  # noqa: E402

GPU_BYTES = 81559 * 2**20
"""An 80 GB H100 / A100 as ``nvidia-smi --query-gpu=memory.total`` reports it (81559 MiB = 79.6 GiB)."""
NODE_GPUS = 8

_QWEN3 = dict(model_type="qwen3", vocab_size=151936, num_key_value_heads=8, head_dim=128)
MODELS = {  # the models' config.json values that the plan reads
    "Qwen3-1.7B": dict(_QWEN3, hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                       intermediate_size=6144, tie_word_embeddings=True),
    "Qwen3-4B": dict(_QWEN3, hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     intermediate_size=9728, tie_word_embeddings=True),
    "Qwen3-8B": dict(_QWEN3, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     intermediate_size=12288, tie_word_embeddings=False),
    "Llama-3.1-8B": dict(model_type="llama", vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
}
SETTING = dict(bf16=True, micro_batch=4, prompt_len=1024, response_len=8196, logprob_path="fused",
               attn_implementation="flash_attention_2", reference=True)
TRAIN_BATCH_SIZE = 512
"""The launcher's ``--train_batch_size``: rows per optimizer update over an agent's ranks."""
# per agent: (label, dp, ZeRO stage, engines (TP 1), colocated)
LAYOUTS = {
    2: [("dp 2 + 2 engines", 2, 2, 2, False), ("dp 2 + 2 engines", 2, 3, 2, False),
        ("dp 3 + 1 engine", 3, 3, 1, False), ("colocated dp 4, 4 engines", 4, 2, 4, True),
        ("colocated dp 4, 4 engines", 4, 3, 4, True)],
    3: [("dp 1 + 1 engine", 1, 2, 1, False), ("colocated dp 2, 2 engines", 2, 2, 2, True),
        ("colocated dp 2, 2 engines", 2, 3, 2, True)],
}
OPTIONS = [  # (column, layout changes), each column adds to the previous one except LoRA, which replaces offload
    ("none", {}),
    ("+ gradient checkpointing", {"gradient_checkpointing": True}),
    ("+ adam_offload", {"gradient_checkpointing": True, "adam_offload": True}),
    ("+ param_offload (ZeRO-3)", {"gradient_checkpointing": True, "adam_offload": True, "param_offload": True}),
    ("checkpointing + LoRA r=64", {"gradient_checkpointing": True, "lora_rank": 64}),
]


def shape(model: str) -> ModelShape:
    return ModelShape.from_config(SimpleNamespace(**MODELS[model]))


def cell(layout: AgentLayout, change: dict) -> str:
    """The peak GiB of the agent's fullest policy GPU, whether every GPU of the agent fits (engine GPUs take their
    0.95 share whatever the model), and its host memory when offloading."""
    if change.get("param_offload") and layout.zero_stage != 3:
        return "n/a"
    plan = plan_run([dataclasses.replace(layout, **change)], GPU_BYTES)
    peak = max(r.total for r in plan.rows if "policy" in r.role)
    host = sum(r.host for r in plan.rows)
    text = f"{peak / GIB:.0f} {'yes' if plan.fits else '**no**'}"
    return text + (f" (host {host / GIB:.0f})" if host and (change.get("adam_offload") or change.get("param_offload"))
                   else "")


def render() -> str:
    lines = ["# Memory plan: which layouts fit 8 x 80 GB GPUs (estimates)", "",
             "Written by `python benchmarks/memory_plan_table.py` from the memory plan "
             "(`openrlhf_hacpo/trainer/memory_plan.py`); **estimates, not measured on a GPU**. Per cell: the peak "
             f"GiB of the agent's fullest policy GPU (of {GPU_BYTES / GIB:.1f} GiB), whether every GPU of the agent "
             "fits (a dedicated engine GPU holds 0.95 of its memory), and with offload the "
             "agent's host memory in GiB. bf16, micro-batch 4 x (1024 + 8196) tokens, "
             f"{TRAIN_BATCH_SIZE} rows per update (gradient accumulation), DeepSpeed's gradient buffers and its "
             "default reduce bucket (5e8 elements, 0.93 GiB in bf16), fused log-prob head, KL "
             "reference on policy GPU 0 (none with LoRA), engines TP 1 at 0.95 (dedicated) or 0.5 with sleep mode "
             "(colocated). Each agent of a team has the same layout; a team of three uses 6 of the 8 GPUs.", "",
             "| agents | model | parameters | per agent | ZeRO | " + " | ".join(c for c, _ in OPTIONS) + " |",
             "|---|---|---|---|---|" + "---|" * len(OPTIONS)]
    for agents, layouts in LAYOUTS.items():
        for model in MODELS:
            for label, dp, stage, engines, colocated in layouts:
                gpus = max(dp, engines) if colocated else dp + engines
                assert agents * gpus <= NODE_GPUS, (agents, label)
                layout = AgentLayout(model, shape(model), dp=dp, zero_stage=stage, engines=engines,
                                     colocated=colocated, engine_utilization=0.5 if colocated else 0.95,
                                     engine_sleep=colocated, **SETTING,
                                     accumulation_steps=max(1, TRAIN_BATCH_SIZE // (SETTING["micro_batch"] * dp)))
                cells = [cell(layout, change) for _, change in OPTIONS]
                lines.append(f"| {agents} | {model} | {layout.shape.parameters() / 1e9:.2f} B | {label} | {stage} | "
                             + " | ".join(cells) + " |")
    lines += ["", "Host memory: `adam_offload` keeps the fp32 master weights, Adam moments and fp32 gradient "
              "partition (16 bytes per parameter, over the agent's ranks) in host RAM, and DeepSpeed's bf16 "
              "buffers beside them (ZeRO-2: the copy-back buffer and the accumulated gradients, 4 bytes per "
              "parameter; ZeRO-3: the gradient partition, 2 bytes); `param_offload` adds the bf16 "
              "weights; colocated engines asleep keep their weights there. A node holds every agent's share.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "memory_plan.md")
    args = parser.parse_args(argv)
    from openrlhf_hacpo.utils.atomic import atomic_write_text

    text = render()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, text)
    print(text)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
