"""A HACPO policy update of a zoo agent on one device, without Ray or DeepSpeed: both kernel backends, a skipped
non-finite update, time and peak memory.

The agent is the zoo's Qwen3 architecture with its byte-level BPE tokenizer (random weights, built locally; the
``--hidden``/``--layers`` flags scale it), in bf16 on CUDA (fp32 on CPU). One synthetic learner batch (half own,
half foreign rows, ragged prompt and response lengths, KL to a frozen reference) is trained for ``--updates``
optimizer updates m = 0, 1, ... exactly as the policy worker computes them: log-probs through
:func:`openrlhf_hacpo.models.response_logprobs` (fused LM-head path), the registered ``hacpo`` loss, AdamW. At
update ``--nan_update`` (>= 2) the log-probs are made non-finite; the update must be skipped: no parameter moves and
no Adam step counter advances. The run is repeated with ``--kernel_backend triton`` and ``torch`` from the same
initial weights and the per-update losses and final weights are compared.

    python benchmarks/gpu_policy_update.py                        # CUDA if available
    python benchmarks/gpu_policy_update.py --device cpu --quick   # a small CPU run (torch twin + interpreter)
"""
from __future__ import annotations

import argparse
import math
import os
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for entry in (ROOT, ROOT / "benchmarks"):
    if str(entry) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(entry))

from openrlhf_hacpo.algorithms import PolicyLossConfig, PolicyLossInput, get_policy_loss  # noqa: E402
from openrlhf_hacpo.models import response_logprobs  # noqa: E402
from openrlhf_hacpo.utils.padding import pack_rows  # noqa: E402
from openrlhf_hacpo.zoo.models import ModelSpec, build_model  # noqa: E402
from openrlhf_hacpo.zoo.tokenizers import build_tokenizer  # noqa: E402
from results_io import RESULTS_DIR, save_results  # noqa: E402



def make_batch(vocab: int, rows: int, prompt_len: int, response_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(rows):
        p = int(torch.randint(prompt_len // 2, prompt_len + 1, (), generator=gen))
        r = int(torch.randint(response_len // 4, response_len + 1, (), generator=gen))
        prompts.append(torch.randint(3, vocab, (p,), generator=gen).tolist())
        responses.append(torch.randint(3, vocab, (r,), generator=gen).tolist())
    padded = pack_rows(prompts, responses, 0)
    is_own = torch.arange(rows) % 2 == 0
    advantages = torch.randn(rows, generator=gen)
    coef = torch.where(is_own, 1.0, 0.5 + torch.rand(rows, generator=gen))
    return padded, is_own, advantages, coef


def run(backend: str, args, device: torch.device, dtype: torch.dtype) -> dict:
    torch.manual_seed(0)
    tokenizer = build_tokenizer("bpe")
    spec = ModelSpec("qwen3", hidden_size=args.hidden, num_layers=args.layers, num_heads=args.hidden // 64 or 1,
                     head_dim=64, max_position_embeddings=args.prompt_len + args.response_len + 8)
    model = build_model(spec, tokenizer, seed=0).to(device=device, dtype=dtype).train()
    reference = build_model(spec, tokenizer, seed=0).to(device=device, dtype=dtype).eval().requires_grad_(False)
    padded, is_own, advantages, coef = make_batch(len(tokenizer), args.rows, args.prompt_len, args.response_len, 1)
    padded = padded.to(device)
    mask = padded["response_mask"]
    with torch.no_grad():
        # old policy = the initial weights, nudged so that the ratios spread over the clip windows
        old = response_logprobs(model, padded, 1.0, path="fused", backend=backend).logp.float()
        old_mean = (old * mask).sum(1) / mask.sum(1) + 0.05 * torch.randn(args.rows, device=device)
        ref = response_logprobs(reference, padded, 1.0, path="fused", backend=backend).logp.float()
    cfg = PolicyLossConfig.of(kl_coef=0.001)
    loss_fn = get_policy_loss("hacpo")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    losses, times, skipped = [], [], []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    for m in range(args.updates):
        t0 = time.perf_counter()
        scored = response_logprobs(model, padded, 1.0, with_entropy=True, path="fused", backend=backend)
        logp = scored.logp
        if m == args.nan_update:
            logp = logp * float("nan")
        if bool(torch.isfinite(logp.detach()[mask > 0]).all()):
            out = loss_fn(PolicyLossInput(logp=logp, mask=mask, advantages=advantages.to(device),
                                          old_logp_mean=old_mean, is_own=is_own.to(device), coef=coef.to(device),
                                          update_index=m, ref_logp=ref), cfg, backend=backend)
            out.loss.backward()
            optimizer.step()
            losses.append(float(out.loss))
        else:
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            steps = [float(optimizer.state[p]["step"]) for p in model.parameters() if p in optimizer.state]
            (torch.nan_to_num(logp, nan=0.0) * 0.0).sum().backward()  # the worker's zero loss
            # skipped: no optimizer.step()
            moved = max(float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters())
            steps_after = [float(optimizer.state[p]["step"]) for p in model.parameters() if p in optimizer.state]
            skipped.append({"update": m, "max_param_change": moved, "adam_steps_unchanged": steps == steps_after})
            losses.append(float("nan"))
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device.type == "cuda" else None
    return {"losses": losses, "seconds": times, "skipped": skipped, "peak_mib": peak,
            "tokens": int(mask.sum()), "weights": {n: p.detach().float().cpu() for n, p in model.named_parameters()},
            "parameters": sum(p.numel() for p in model.parameters())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a small model and batch")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--prompt_len", type=int, default=64)
    parser.add_argument("--response_len", type=int, default=None)
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--nan_update", type=int, default=2)
    parser.add_argument("--out", default=None, help="markdown path (default benchmarks/results/policy_update_<device>.md)")
    args = parser.parse_args(argv)
    if args.nan_update < 2 or args.nan_update >= args.updates:
        parser.error("--nan_update must be >= 2 and < --updates (a skip after the Adam moments are non-zero)")
    device = torch.device(args.device)
    quick = args.quick or device.type == "cpu"
    args.hidden = args.hidden or (64 if quick else 1024)
    args.layers = args.layers or (2 if quick else 8)
    args.rows = args.rows or (8 if quick else 64)
    args.response_len = args.response_len or (32 if quick else 1024)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backends = ("triton", "torch") if (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1") \
        else ("torch",)
    results = {b: run(b, args, device, dtype) for b in backends}

    lines = [f"# Policy update of a zoo agent on {device.type}"
             f"{' (' + torch.cuda.get_device_name() + ')' if device.type == 'cuda' else ''}", "",
             f"Command: `python benchmarks/gpu_policy_update.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             "", f"Qwen3 (zoo BPE tokenizer), hidden {args.hidden}, {args.layers} layers, "
             f"{results[backends[0]]['parameters'] / 1e6:.1f} M parameters, {dtype}; {args.rows} rows (half foreign), "
             f"{results[backends[0]]['tokens']} response tokens; hacpo loss with KL 0.001; AdamW; fused log-prob path.",
             "", "| backend | losses per update | median s / update | peak MiB above the model | skipped update |",
             "|---|---|---|---|---|"]
    ok = True
    for b, r in results.items():
        skip = r["skipped"][0] if r["skipped"] else None
        skip_ok = bool(skip) and skip["max_param_change"] == 0.0 and skip["adam_steps_unchanged"]
        ok &= skip_ok
        lines.append(f"| {b} | {', '.join('nan' if math.isnan(x) else f'{x:.5f}' for x in r['losses'])} | "
                     f"{statistics.median(r['seconds'][1:] or r['seconds']):.4f} | "
                     f"{'-' if r['peak_mib'] is None else round(r['peak_mib'])} | "
                     f"m={skip['update'] if skip else '-'}: params moved {skip['max_param_change'] if skip else '-'}, "
                     f"Adam steps unchanged {skip['adam_steps_unchanged'] if skip else '-'} |")
    if len(results) == 2:
        a, b = results["triton"], results["torch"]
        loss_diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]) if not math.isnan(x))
        num = sum(float(((a["weights"][k] - b["weights"][k]) ** 2).sum()) for k in a["weights"]) ** 0.5
        den = sum(float((b["weights"][k] ** 2).sum()) for k in b["weights"]) ** 0.5
        lines += ["", f"triton vs torch: largest per-update loss difference {loss_diff:.2e}; final weights differ by "
                  f"{num / den:.2e} of their norm."]
    lines += ["", f"Skipped non-finite update left every parameter and Adam counter unchanged: {ok}."]
    text = "\n".join(lines) + "\n"
    print(text)
    out = pathlib.Path(args.out) if args.out else RESULTS_DIR / f"policy_update_{device.type}.md"
    save_results(out.stem, {b: {k: v for k, v in r.items() if k != "weights"} for b, r in results.items()}, text,
                 out.parent)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
