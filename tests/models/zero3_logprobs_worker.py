"""One rank of the ZeRO-3 log-prob check (started by torch.distributed.run from test_response_logprobs.py).

Both ranks build the same tiny Qwen3 model, wrap it in a DeepSpeed ZeRO-3 engine (gloo), compute the response
log-probs of the same batch through the fused path and the full-logits path, and backpropagate the same weighted
sum; rank 0 writes the log-probs and the full (gathered) gradients of the LM head and the embedding to a JSON file.
"""
from __future__ import annotations

import json
import sys

import deepspeed
import torch
from deepspeed.utils import safe_get_full_grad

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_response_logprobs import padded_batch, tiny_model  # noqa: E402

from openrlhf_hacpo.models import response_logprobs  # noqa: E402


def main(out_path: str) -> None:
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "SGD", "params": {"lr": 0.0}}, "zero_allow_untested_optimizer": True,
              "steps_per_print": 10**9}
    result = {}
    for path in ("fused", "logits"):
        model = tiny_model("qwen3", tied=False, bias=False, seed=3)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        padded = padded_batch()
        out = response_logprobs(engine, padded, 0.9, path=path)
        weights = torch.linspace(-1.0, 1.0, out.logp.numel()).view_as(out.logp)
        engine.backward((out.logp * weights).sum())
        grads = {}
        for name, param in engine.module.named_parameters():
            if name in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"):
                grads[name] = safe_get_full_grad(param).tolist()
        result[path] = {"logp": out.logp.detach().tolist(), "grads": grads}
        engine.destroy()
    if torch.distributed.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
