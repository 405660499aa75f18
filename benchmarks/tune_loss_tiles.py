"""Tile sweep of the HACPO loss kernels on CUDA: GPU time of the forward and the backward kernel per launch tile.

The forward kernel gives each program ``BLOCK_B`` rows and walks their tokens ``BLOCK_T`` at a time (a row's
sequence ratio needs all of its tokens before its objective); the backward kernel is a 2-D grid of
``BLOCK_B x BLOCK_T`` tiles of ``d logp``. This script times each candidate tile (``kernels.hacpo_loss.FWD_TILE`` /
``BWD_TILE``) by the summed duration of that kernel's launches (torch.profiler), checks every candidate's loss and
gradient against the torch twin, and writes ``benchmarks/results/loss_tiles_cuda.{md,json}``:

    python benchmarks/tune_loss_tiles.py
"""
from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for entry in (ROOT, ROOT / "benchmarks"):
    if str(entry) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(entry))

from bench_kernels import LOSS_HP, cuda_kernel_ms, hbm_peak_tbs, make_loss_inputs  # noqa: E402
from results_io import run_facts, save_results  # noqa: E402
from hacpo_kernels import LossParams, hacpo_loss  # noqa: E402

loss_module = importlib.import_module("hacpo_kernels.hacpo_loss")  # the package re-exports the function's name

FWD_TILES = [(16, 128, 4), (8, 256, 4), (4, 512, 4), (2, 1024, 4), (1, 2048, 4), (4, 1024, 8), (2, 2048, 8),
             (1, 4096, 8)]
BWD_TILES = [(16, 128, 4), (8, 256, 4), (4, 512, 4), (4, 1024, 8), (2, 1024, 4), (1, 2048, 8), (16, 256, 8),
             (8, 512, 8)]
SHAPES = [(64, 2048), (1024, 4096), (4096, 4096)]


def kernel_ms(fn, names: tuple[str, ...], reps: int = 20) -> dict[str, float]:
    """Mean GPU milliseconds per call of each named kernel (every launch whose name contains it)."""
    times = cuda_kernel_ms(fn, reps)
    return {name: sum(ms for kernel, ms in times.items() if name in kernel) for name in names}


def run_case(x, fwd_tile, bwd_tile) -> dict:
    loss_module.FWD_TILE, loss_module.BWD_TILE = fwd_tile, bwd_tile

    def call(backend):
        return hacpo_loss(x.logp, x.mask, x.advantages, x.old_logp_mean, x.is_own, x.coef, LossParams(**LOSS_HP),
                          ref_logp=x.ref_logp, backend=backend).loss

    def step():
        x.logp.grad = None
        call("triton").backward()

    step()
    got_loss, got_grad = call("triton").detach(), x.logp.grad.clone()
    x.logp.grad = None
    call("torch").backward()
    ok = bool(torch.allclose(got_loss, call("torch").detach(), rtol=1e-4, atol=1e-6)
              and torch.allclose(got_grad, x.logp.grad, rtol=1e-3, atol=1e-7))
    times = kernel_ms(step, ("_hacpo_fwd_kernel", "_hacpo_bwd_kernel"))
    return {"fwd_ms": times["_hacpo_fwd_kernel"], "bwd_ms": times["_hacpo_bwd_kernel"], "matches_twin": ok}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="loss_tiles_cuda", help="file stem under benchmarks/results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_loss_tiles: needs a CUDA device")
        return 0
    name = torch.cuda.get_device_name()
    peak = hbm_peak_tbs(name)
    default_fwd, default_bwd = loss_module.FWD_TILE, loss_module.BWD_TILE
    results = []
    for b, t in SHAPES:
        x = make_loss_inputs(b, t, "cuda")
        n = b * t
        read = 3 * 4 * n  # logp, mask, ref_logp (fp32); the row vectors are negligible here
        for kind, tiles in (("fwd", FWD_TILES), ("bwd", BWD_TILES)):
            for tile in tiles:
                fwd_tile, bwd_tile = (tile, default_bwd) if kind == "fwd" else (default_fwd, tile)
                try:
                    r = run_case(x, fwd_tile, bwd_tile)
                    ms = r[f"{kind}_ms"]
                    floor_ms = (read + (4 * n if kind == "bwd" else 0)) / (peak * 1e9) if peak else None
                    row = {"kernel": kind, "B": b, "T": t, "tile": list(tile), "ms": ms,
                           "x_floor": ms / floor_ms if floor_ms else None, "matches_twin": r["matches_twin"]}
                except Exception as exc:  # noqa: BLE001 - a tile the compiler rejects is a result too
                    row = {"kernel": kind, "B": b, "T": t, "tile": list(tile), "ms": None, "x_floor": None,
                           "matches_twin": None, "note": f"{type(exc).__name__}: {str(exc)[:100]}"}
                results.append(row)
                print(json.dumps(row), flush=True)
        del x
        torch.cuda.empty_cache()
    loss_module.FWD_TILE, loss_module.BWD_TILE = default_fwd, default_bwd

    lines = [f"# HACPO loss kernel tiles ({name})", "", "Command: `python benchmarks/tune_loss_tiles.py`  ",
             f"torch {torch.__version__}; GPU ms per launch from torch.profiler (mean of 20); x floor = time over "
             f"the kernel's own bytes (forward: read logp, mask, ref_logp; backward: the same + write d logp) at "
             f"{peak} TB/s. Current tiles: forward {default_fwd}, backward {default_bwd} (rows, tokens, warps).", "",
             "| kernel | B | T | tile (rows, tokens, warps) | GPU ms | x floor | matches twin | note |",
             "|---|---:|---:|---|---:|---:|---|---|"]
    for r in results:
        ms = f"{r['ms']:.4f}" if r["ms"] is not None else "-"
        xf = f"{r['x_floor']:.2f}" if r["x_floor"] is not None else "-"
        lines.append(f"| {r['kernel']} | {r['B']} | {r['T']} | {tuple(r['tile'])} | {ms} | {xf} | "
                     f"{r['matches_twin']} | {r.get('note', '')} |")
    save_results(args.out, {"meta": run_facts("cuda", argv), "rows": results}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
