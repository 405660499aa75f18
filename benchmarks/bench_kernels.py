"""Micro-benchmark of the log-prob / entropy kernels against plain PyTorch paths.

For every (N tokens, V vocabulary) shape with bf16 logits it measures, per path:

* median forward time and forward+backward time (``triton.testing.do_bench`` on GPU, a ``time.perf_counter``
  loop on CPU);
* achieved GB/s against the bytes a perfect kernel must move: forward reads the logits once (2·N·V bytes),
  forward+backward additionally reads them again and writes ``d logits`` once (3 x 2·N·V bytes in total);
* peak extra memory: ``torch.cuda.max_memory_allocated`` above the inputs on GPU; on CPU the process's peak
  resident set (VmHWM, reset through ``/proc/self/clear_refs``) above the resident set before the call.

Paths: ``naive`` (``logits.float().log_softmax(-1)`` + gather + entropy, autograd), ``chunked_torch`` (the same on
1024-row chunks), ``torch_twin`` and ``triton`` / ``triton_inplace`` (:func:`kernels.logprobs_from_logits`),
plus Liger-Kernel and flash-attn cross entropy (log-prob only) when importable. The fused-linear section compares
``hidden @ W.T`` followed by the Triton log-prob kernel with :func:`kernels.fused_linear_logprobs`.

The loss section times the HACPO policy loss on ``[B, T]`` fp32 token log-probs (sequence-level ratios, half the
rows foreign, k3 KL on own tokens) forward and forward+backward: ``triton`` (:func:`kernels.hacpo_loss`, CUDA
only), ``torch_twin`` (the same function on the torch backend) and ``unfused`` (:func:`unfused_hacpo_loss`, the
formulas as plain torch ops under autograd). Its HBM floor is the bytes a perfect kernel must move: forward reads
``logp``, ``mask`` and ``ref_logp`` (4 bytes each per token) and the four per-row inputs and writes the per-row
objective (17 bytes per row); forward+backward also writes ``d logp`` (4 bytes per token).

Results go to ``benchmarks/results/<stem>.json`` and ``.md`` (written atomically); the table is printed last.
A run that fails or is cut short leaves those files as they were and its figures so far in ``<stem>.failed.md``.

    python benchmarks/bench_kernels.py                 # GPU: full sweep; CPU: --cpu-small
    python benchmarks/bench_kernels.py --quick         # GPU: N in {4k, 16k}, V = 151936
    python benchmarks/bench_kernels.py --shapes 4096x32000,16384x151936 --out kernels_h100
    python benchmarks/bench_kernels.py --only loss     # the loss section alone (results in kernels_<device>_loss)
    python benchmarks/bench_kernels.py --no-loss       # every section but the loss
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for entry in (ROOT, ROOT / "benchmarks"):
    if str(entry) not in sys.path:  # run as a script from anywhere
        sys.path.insert(0, str(entry))

from results_io import RESULTS_DIR, ResultWriter, device_name, run_facts  # noqa: E402
from hacpo_kernels import (  # noqa: E402
    LossParams,
    cross_clip_lower_bound,
    fused_linear_logprobs,
    hacpo_loss,
    logprobs_from_logits,
)

FULL_SHAPES = [(n, v) for n in (4096, 16384, 65536) for v in (32000, 128256, 151936)]
QUICK_SHAPES = [(4096, 151936), (16384, 151936)]
CPU_SHAPES = [(512, 32000), (2048, 32000)]
LOSS_SHAPES = [(b, t) for t in (512, 2048) for b in (4096 // t, 16384 // t, 65536 // t)]  # B·T in {4k, 16k, 64k}
LOSS_SHAPES_CUDA_LARGE = [(256, 4096), (1024, 4096), (4096, 4096)]
"""B·T in {1M, 4M, 16M}, added on CUDA: below ~1M units the loss is bound by launch and host overhead, not HBM."""
HBM_PEAK_TBS = {"H100": 3.35, "H200": 4.8}
MIB = 1024 * 1024


def hbm_peak_tbs(gpu_name: str) -> float | None:
    """HBM bandwidth (TB/s) of a GPU named in :data:`HBM_PEAK_TBS`, else None."""
    return next((tbs for key, tbs in HBM_PEAK_TBS.items() if key in gpu_name), None)


@dataclass
class Row:
    section: str  # "logits", "fused_linear" or "loss"
    path: str
    n: int  # tokens (loss section: B·T)
    v: int  # vocabulary (loss section: T)
    h: int | None = None
    fwd_ms: float | None = None
    step_ms: float | None = None
    fwd_gbps: float | None = None
    step_gbps: float | None = None
    step_tflops: float | None = None
    peak_fwd_mib: float | None = None
    peak_step_mib: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------------
# timing and memory
# --------------------------------------------------------------------------------------------------------------
def cuda_kernel_ms(fn, reps: int = 20, grad_to_none=None) -> dict[str, float]:
    """Mean GPU milliseconds per call of ``fn`` for each CUDA kernel it launches, by kernel name (torch.profiler;
    one warm-up call first; ``grad_to_none`` tensors get ``.grad = None`` before each call)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for t in grad_to_none or ():
                t.grad = None
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            out[e.name] = out.get(e.name, 0.0) + e.time_range.elapsed_us() / reps / 1e3
    return out


class Meter:
    """Median time and peak extra memory of a callable, on CUDA or CPU."""

    def __init__(self, device: str, cpu_reps: int):
        self.device = device
        self.cpu_reps = cpu_reps

    def time_ms(self, fn, grad_to_none=None) -> float:
        if self.device == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=10, rep=60, grad_to_none=grad_to_none,
                                                 return_mode="median"))
        times = []
        for i in range(self.cpu_reps + 1):
            if grad_to_none:
                for t in grad_to_none:
                    t.grad = None
            t0 = time.perf_counter()
            fn()
            if i:  # the first call is a warm-up
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def gpu_ms(self, fn, grad_to_none=None, reps: int = 20) -> float | None:
        """Mean GPU time of one call: the summed durations of the CUDA kernels it launches (torch.profiler), without
        the host time between launches that wall-clock timing of small inputs measures. ``None`` off CUDA."""
        if self.device != "cuda":
            return None
        total = sum(cuda_kernel_ms(fn, reps, grad_to_none).values())
        return total if total > 0 else None

    def peak_mib(self, fn) -> float | None:
        """Peak memory above what is allocated before ``fn`` runs (outputs that stay alive are included)."""
        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - base) / MIB
        if not _reset_peak_rss():
            return None
        base = _status_kib("VmRSS")
        fn()
        return (_status_kib("VmHWM") - base) / 1024


def _status_kib(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _pin_malloc_to_mmap() -> None:
    """Make glibc serve every large buffer with mmap and unmap it on free, so the RSS peak tracks live tensors.

    By default glibc raises its mmap threshold after the first large free and then keeps freed buffers in the
    heap, which hides later allocations from an RSS-based measurement. No-op where glibc is not available.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (fixing it also disables the dynamic adjustment)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        _LIBC[0] = libc
    except (OSError, AttributeError):
        pass


_LIBC: list = [None]


def _reset_peak_rss() -> bool:
    if _LIBC[0] is not None:
        _LIBC[0].malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


# --------------------------------------------------------------------------------------------------------------
# paths: (logits, labels) -> (logp, entropy | None)
# --------------------------------------------------------------------------------------------------------------
def naive_path(logits, labels):
    lp = logits.float().log_softmax(dim=-1)
    logp = lp.gather(1, labels.unsqueeze(1)).squeeze(1)
    entropy = -(lp.exp() * lp).sum(dim=-1)
    return logp, entropy


def chunked_torch_path(logits, labels, rows=1024):
    outs = [naive_path(logits[s:s + rows], labels[s:s + rows]) for s in range(0, logits.shape[0], rows)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def make_logits_paths(device: str) -> dict:
    paths = {
        "naive": naive_path,
        "chunked_torch": chunked_torch_path,
        "torch_twin": lambda x, y: logprobs_from_logits(x, y, return_entropy=True, backend="torch"),
    }
    if device == "cuda":
        paths["triton"] = lambda x, y: logprobs_from_logits(x, y, return_entropy=True, backend="triton")
        paths["triton_inplace"] = lambda x, y: logprobs_from_logits(x, y, return_entropy=True, backend="triton",
                                                                    inplace_backward=True)
        try:
            from liger_kernel.transformers.functional import liger_cross_entropy

            paths["liger_ce (logp only)"] = lambda x, y: (-liger_cross_entropy(x, y, reduction="none"), None)
        except Exception:  # noqa: BLE001 - optional comparison
            pass
        try:
            from flash_attn.ops.triton.cross_entropy import cross_entropy_loss

            paths["flash_attn_ce (logp only)"] = lambda x, y: (-cross_entropy_loss(x, y, inplace_backward=True)[0],
                                                               None)
        except Exception:  # noqa: BLE001 - optional comparison
            pass
    return paths


def bench_logits(meter: Meter, device: str, shapes) -> list[Row]:
    rows = []
    for n, v in shapes:
        fwd_bytes = 2 * n * v
        step_bytes = 3 * fwd_bytes
        for name, path in make_logits_paths(device).items():
            row = Row("logits", name, n, v)
            logits = labels = g = h = None
            try:
                gen = torch.Generator(device=device).manual_seed(0)
                logits = torch.randn(n, v, device=device, generator=gen, dtype=torch.bfloat16).mul_(2)
                labels = torch.randint(0, v, (n,), device=device, generator=gen)
                g = torch.randn(n, device=device, generator=gen)
                h = torch.randn(n, device=device, generator=gen)

                def fwd():
                    with torch.no_grad():
                        return path(logits, labels)

                row.fwd_ms = meter.time_ms(fwd)
                row.peak_fwd_mib = meter.peak_mib(fwd)
                row.fwd_gbps = fwd_bytes / row.fwd_ms / 1e6
                logits.requires_grad_(True)

                def step():
                    logp, ent = path(logits, labels)
                    outs, grads = [logp], [g]
                    if ent is not None:
                        outs.append(ent)
                        grads.append(h)
                    torch.autograd.backward(outs, grads)

                row.step_ms = meter.time_ms(step, grad_to_none=[logits])
                logits.grad = None
                row.peak_step_mib = meter.peak_mib(step)
                row.step_gbps = step_bytes / row.step_ms / 1e6
                if "inplace" in name:
                    row.note = "d logits written into the logits buffer"
            except Exception as exc:  # noqa: BLE001 - an OOM or a missing optional kernel is a result too
                row.note = "OOM" if _is_oom(exc) else f"error: {type(exc).__name__}: {str(exc)[:120]}"
            finally:
                del logits, labels, g, h
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(f"  {row.section:12s} {row.path:26s} N={n:6d} V={v:6d} fwd={_fmt(row.fwd_ms)} ms "
                  f"step={_fmt(row.step_ms)} ms peak={_fmt(row.peak_step_mib)} MiB {row.note}", flush=True)
    return rows


def bench_fused_linear(meter: Meter, device: str, shapes, h_dim: int, chunk_size: int | None) -> list[Row]:
    rows = []
    for n, v in shapes:
        full_logits_mib = 2 * n * v / MIB
        flops = 6 * n * h_dim * v  # forward GEMM + d hidden + d weight, without the recompute
        variants = {
            "full_logits+logprobs": None,
            "fused_linear": "triton" if device == "cuda" else None,
            "fused_linear_twin": "torch",
        }
        for name, backend in variants.items():
            if name == "fused_linear" and backend is None:
                continue
            row = Row("fused_linear", name, n, v, h=h_dim)
            hidden = weight = labels = g = None
            try:
                gen = torch.Generator(device=device).manual_seed(1)
                hidden = torch.randn(n, h_dim, device=device, generator=gen).to(torch.bfloat16).requires_grad_()
                weight = (torch.randn(v, h_dim, device=device, generator=gen) * h_dim**-0.5).to(torch.bfloat16)
                weight.requires_grad_()
                labels = torch.randint(0, v, (n,), device=device, generator=gen)
                g = torch.randn(n, device=device, generator=gen)
                lp_backend = "triton" if device == "cuda" else "torch"

                def step():
                    if backend is None:
                        logits = hidden @ weight.t()
                        logp, ent = logprobs_from_logits(logits, labels, return_entropy=True, backend=lp_backend,
                                                         inplace_backward=True)
                    else:
                        chunking = {"chunk_size": chunk_size} if chunk_size else {}
                        logp, ent = fused_linear_logprobs(hidden, weight, labels, return_entropy=True,
                                                          backend=backend, **chunking)
                    torch.autograd.backward([logp, ent], [g, g])

                row.step_ms = meter.time_ms(step, grad_to_none=[hidden, weight])
                row.step_tflops = flops / row.step_ms / 1e9
                hidden.grad = weight.grad = None
                peak = meter.peak_mib(step)
                if peak is not None:
                    grads_mib = (hidden.numel() + weight.numel()) * 2 / MIB
                    row.peak_step_mib = peak - grads_mib  # the gradients themselves are not "extra"
                    row.extra["extra_vs_full_logits_pct"] = 100 * row.peak_step_mib / full_logits_mib
                row.note = f"full bf16 logits = {full_logits_mib:.0f} MiB"
                if backend is not None and chunk_size:
                    row.note += f"; chunk_size={chunk_size}"
            except Exception as exc:  # noqa: BLE001
                row.note = "OOM" if _is_oom(exc) else f"error: {type(exc).__name__}: {str(exc)[:120]}"
            finally:
                del hidden, weight, labels, g
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(f"  {row.section:12s} {row.path:26s} N={n:6d} V={v:6d} H={h_dim} step={_fmt(row.step_ms)} ms "
                  f"peak extra={_fmt(row.peak_step_mib)} MiB {row.note}", flush=True)
    return rows


# --------------------------------------------------------------------------------------------------------------
# loss: HACPO policy loss on [B, T] token log-probs
# --------------------------------------------------------------------------------------------------------------
LOSS_HP = dict(update_index=1, eps_low=3e-4, eps_high=4e-4, delta=0.2, delta_step=0.025, alpha=1.0,
               log_ratio_clip=10.0, kl_coef=0.01)
"""Benchmark configuration: HACPO defaults, second optimizer step of the training step (foreign window
``[0.825, 1]``), k3 KL on."""


@dataclass
class LossInputs:
    """One micro-batch of the loss: ``logp``/``mask``/``ref_logp`` [B, T] fp32, per-row vectors [B]."""

    logp: torch.Tensor
    mask: torch.Tensor
    ref_logp: torch.Tensor
    advantages: torch.Tensor
    old_logp_mean: torch.Tensor
    is_own: torch.Tensor
    coef: torch.Tensor

    def floor_bytes(self, backward: bool) -> int:
        """Bytes a perfect two-pass kernel moves (an autograd op: the forward reads once, the backward reads once and writes):
        the forward reads logp, mask, ref_logp and the row vectors; the backward reads them again and writes
        ``d logp``. A kernel that wrote the gradient during the forward would move ``4 n`` bytes per element less
        (see :meth:`one_read_bytes`)."""
        n = self.logp.numel()
        rows = self.logp.shape[0] * (4 * 4 + 1)  # advantages, old mean, coef, objective (fp32) + is_own (bool)
        read = 3 * 4 * n + rows
        return read + (read + 4 * n if backward else 0)

    def one_read_bytes(self) -> int:
        """Forward+backward bytes of a single-pass design: read the inputs once, write ``d logp``."""
        n = self.logp.numel()
        return 3 * 4 * n + self.logp.shape[0] * (4 * 4 + 1) + 4 * n


def make_loss_inputs(b: int, t: int, device: str, seed: int = 0) -> LossInputs:
    """Ragged rows (lengths uniform in [T/4, T]), every other row foreign, log-probs near the old policy's so that
    ratios fall on both sides of the clip windows."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (b,), device=device, generator=gen)
    mask = (torch.arange(t, device=device)[None, :] < lengths[:, None]).float()
    old = -torch.rand(b, t, device=device, generator=gen) * 3.0
    logp = old + 0.02 * torch.randn(b, t, device=device, generator=gen)
    ref_logp = old + 0.05 * torch.randn(b, t, device=device, generator=gen)
    old_mean = (old * mask).sum(-1) / mask.sum(-1)
    is_own = torch.arange(b, device=device) % 2 == 0
    coef = torch.where(is_own, torch.ones(b, device=device), 0.5 + torch.rand(b, device=device, generator=gen))
    adv = torch.randn(b, device=device, generator=gen)
    return LossInputs(logp.requires_grad_(), mask, ref_logp, adv, old_mean, is_own, coef)


def unfused_hacpo_loss(x: LossInputs, *, update_index: int, eps_low: float, eps_high: float, delta: float,
                       delta_step: float, alpha: float, log_ratio_clip: float, kl_coef: float) -> torch.Tensor:
    r"""The op-by-op baseline: HACPO sequence-level loss with k3 KL, plain torch ops, autograd for the gradient.

    ``\ell_i = \mathrm{clamp}(\frac{1}{L_i}\sum_t m_{it}\log\pi_{it} - \overline{\log\pi_{old}}_i, \pm C)``,
    ``s_i = e^{\ell_i}``; own rows ``\min(s A, \mathrm{clip}(s, 1-\epsilon_l, 1+\epsilon_h) A)`` (eqs. 47-49),
    foreign rows ``c\,\mathrm{sg}(c)^\alpha\omega A`` with ``c = \mathrm{clamp}(s, lo_m, 1)`` (eqs. 10-14);
    ``loss = -\frac{1}{\#rows}\sum_i obj_i + \beta\frac{1}{\#own}\sum_{i\ own}\frac{1}{L_i}\sum_t m_{it}
    (e^{d} - d - 1)``, ``d = \mathrm{clamp}(\log\pi_{ref} - \log\pi, \pm 20)``.
    """
    length = x.mask.sum(-1)
    ell = ((x.logp * x.mask).sum(-1) / length.clamp(min=1) - x.old_logp_mean).clamp(-log_ratio_clip, log_ratio_clip)
    s = ell.exp()
    own_obj = torch.minimum(s * x.advantages, s.clamp(1 - eps_low, 1 + eps_high) * x.advantages)
    c = s.clamp(cross_clip_lower_bound(delta, delta_step, update_index), 1.0)
    foreign_obj = c * c.detach().pow(alpha) * x.coef * x.advantages
    obj = torch.where(x.is_own, own_obj, foreign_obj)
    pg_loss = -obj.sum() / (length > 0).sum().clamp(min=1)
    d = (x.ref_logp - x.logp).clamp(-20.0, 20.0)
    own_tokens = x.mask * x.is_own[:, None]
    k3 = ((d.exp() - d - 1) * own_tokens).sum(-1) / length.clamp(min=1)
    kl = k3.sum() / ((length > 0) & x.is_own).sum().clamp(min=1)
    return pg_loss + kl_coef * kl


def make_loss_paths(device: str) -> dict:
    def kernel(backend):
        return lambda x: hacpo_loss(x.logp, x.mask, x.advantages, x.old_logp_mean, x.is_own, x.coef,
                                    LossParams(**LOSS_HP), ref_logp=x.ref_logp, backend=backend).loss

    paths = {"unfused": lambda x: unfused_hacpo_loss(x, **LOSS_HP), "torch_twin": kernel("torch")}
    if device == "cuda":
        paths["triton"] = kernel("triton")
    return paths


def bench_loss(meter: Meter, device: str, shapes, peak_tbs: float | None) -> list[Row]:
    rows = []
    for b, t in shapes:
        for name, path in make_loss_paths(device).items():
            row = Row("loss", name, b * t, t)
            x = None
            try:
                x = make_loss_inputs(b, t, device)

                def fwd():
                    with torch.no_grad():
                        return path(x)

                def step():
                    path(x).backward()

                row.fwd_ms = meter.time_ms(fwd)
                row.peak_fwd_mib = meter.peak_mib(fwd)
                row.step_ms = meter.time_ms(step, grad_to_none=[x.logp])
                x.logp.grad = None
                row.peak_step_mib = meter.peak_mib(step)
                if row.peak_step_mib is not None:
                    row.peak_step_mib -= x.logp.numel() * 4 / MIB  # d logp itself is an output, not extra
                fwd_gpu = meter.gpu_ms(fwd)
                step_gpu = meter.gpu_ms(step, grad_to_none=[x.logp])
                x.logp.grad = None
                row.extra.update(rows=b, fwd_gpu_ms=fwd_gpu, step_gpu_ms=step_gpu)
                fwd_t = fwd_gpu or row.fwd_ms  # bandwidth from GPU time where there is one
                step_t = step_gpu or row.step_ms
                row.fwd_gbps = x.floor_bytes(False) / fwd_t / 1e6
                row.step_gbps = x.floor_bytes(True) / step_t / 1e6
                if peak_tbs:
                    row.extra["fwd_x_floor"] = fwd_t / (x.floor_bytes(False) / (peak_tbs * 1e9))
                    row.extra["step_x_floor"] = step_t / (x.floor_bytes(True) / (peak_tbs * 1e9))
                    row.extra["step_x_one_read"] = step_t / (x.one_read_bytes() / (peak_tbs * 1e9))
            except Exception as exc:  # noqa: BLE001 - an OOM is a result too
                row.note = "OOM" if _is_oom(exc) else f"error: {type(exc).__name__}: {str(exc)[:120]}"
            finally:
                del x
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
            rows.append(row)
            print(f"  {row.section:12s} {row.path:26s} B={b:4d} T={t:5d} fwd={_fmt(row.fwd_ms, 3)} ms "
                  f"step={_fmt(row.step_ms, 3)} ms peak={_fmt(row.peak_step_mib)} MiB {row.note}", flush=True)
    return rows


# --------------------------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------------------------
def _fmt(x, digits=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return "-"
    return f"{x:.{digits}f}"


def summarize(rows: list[Row], peak_tbs: float | None) -> list[str]:
    """Ratios the targets in docs/kernels.md are stated in."""
    lines = []
    by_key = {(r.section, r.path, r.n, r.v): r for r in rows}
    for (section, path, n, v), r in sorted(by_key.items()):
        if section != "logits" or path not in ("triton", "triton_inplace", "torch_twin"):
            continue
        naive = by_key.get(("logits", "naive", n, v))
        if not naive or r.step_ms is None:
            continue
        parts = [f"{path} N={n} V={v}:"]
        if naive.step_ms:
            parts.append(f"{naive.step_ms / r.step_ms:.1f}x faster than naive (fwd+bwd)")
        if naive.peak_step_mib and r.peak_step_mib:
            parts.append(f"{naive.peak_step_mib / r.peak_step_mib:.1f}x less peak memory")
        if peak_tbs:
            floor_ms = 3 * 2 * n * v / (peak_tbs * 1e9)
            parts.append(f"{r.step_ms / floor_ms:.2f}x the HBM floor ({floor_ms:.2f} ms)")
        lines.append(" ".join(parts))
    for r in rows:
        if r.section != "loss" or r.path == "unfused" or r.step_ms is None:
            continue
        base = by_key.get(("loss", "unfused", r.n, r.v))
        parts = [f"loss {r.path} B={r.extra['rows']} T={r.v}:"]
        if base and base.step_ms and base.fwd_ms:
            parts.append(f"time unfused/{r.path} = {base.fwd_ms / r.fwd_ms:.2f} (fwd), "
                         f"{base.step_ms / r.step_ms:.2f} (fwd+bwd);")
        if base and base.peak_step_mib and r.peak_step_mib:
            parts.append(f"peak memory unfused/{r.path} = {base.peak_step_mib / r.peak_step_mib:.2f} (fwd+bwd);")
        if "step_x_floor" in r.extra:
            parts.append(f"{r.extra['fwd_x_floor']:.2f}x (fwd) / {r.extra['step_x_floor']:.2f}x (fwd+bwd; "
                         f"{r.extra['step_x_one_read']:.2f}x a single-pass floor) "
                         "the HBM floor")
        lines.append(" ".join(parts))
    for r in rows:
        if r.section == "fused_linear" and "extra_vs_full_logits_pct" in r.extra:
            lines.append(f"{r.path} N={r.n} V={r.v} H={r.h}: peak extra memory "
                         f"{r.extra['extra_vs_full_logits_pct']:.1f}% of the full bf16 logits")
    return lines


def markdown(meta: dict, rows: list[Row], summary: list[str]) -> str:
    out = [f"# Kernel benchmark ({meta['device_name']})", "",
           f"Command: `{meta['command']}`  ", f"torch {meta['torch']}, triton {meta['triton']}, "
           f"{meta['platform']}; times are medians, memory is peak extra over the inputs.", ""]
    if not meta.get("complete", True):
        out += ["**Partial run** (stopped before every shape was measured).", ""]
    logits_rows = [r for r in rows if r.section == "logits"]
    if logits_rows:
        out += ["## logits [N, V] bf16 -> logp + entropy", "",
                "| path | N | V | fwd ms | fwd GB/s | fwd peak MiB | fwd+bwd ms | fwd+bwd GB/s "
                "| fwd+bwd peak MiB | note |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in logits_rows:
            out.append(f"| {r.path} | {r.n} | {r.v} | {_fmt(r.fwd_ms)} | {_fmt(r.fwd_gbps, 1)} | "
                       f"{_fmt(r.peak_fwd_mib, 0)} | {_fmt(r.step_ms)} | {_fmt(r.step_gbps, 1)} | "
                       f"{_fmt(r.peak_step_mib, 0)} | {r.note} |")
        out.append("")
    fl_rows = [r for r in rows if r.section == "fused_linear"]
    if fl_rows:
        out += ["## fused linear: hidden [N, H] @ W[V, H] -> logp + entropy (fwd+bwd)", "",
                "| path | N | H | V | fwd+bwd ms | TFLOP/s (6NHV) | peak extra MiB | % of full logits | note |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in fl_rows:
            out.append(f"| {r.path} | {r.n} | {r.h} | {r.v} | {_fmt(r.step_ms)} | {_fmt(r.step_tflops, 2)} | "
                       f"{_fmt(r.peak_step_mib, 0)} | {_fmt(r.extra.get('extra_vs_full_logits_pct'), 1)} | "
                       f"{r.note} |")
        out.append("")
    loss_rows = [r for r in rows if r.section == "loss"]
    if loss_rows:
        peak = meta.get("hbm_peak_tbs")
        out += ["## loss: HACPO on logp [B, T] fp32 (sequence ratios, half the rows foreign, k3 KL on)", "",
                "ms = wall-clock median (host launch overhead included); GPU ms = summed duration of the CUDA kernels "
                "of one call (torch.profiler). GB/s and x floor use the GPU time where there is one. "
                "GB/s = the HBM floor's bytes over the time. Floor bytes: the forward reads logp, mask, ref_logp and "
                "the row vectors once; fwd+bwd is a forward and a backward pass, the backward reading the inputs again "
                "and writing d logp (a single-pass design that wrote d logp during the forward would need 16 instead "
                "of 28 bytes per unit: the summary gives that ratio too)"
                + (f"; x floor = time over floor bytes at {peak} TB/s." if peak else ".")
                + " Below about 1M units (B·T) every path is bound by kernel-launch and host overhead, not by HBM.", "",
                "| path | B | T | B·T | fwd ms | fwd GPU ms | fwd GB/s | fwd x floor | fwd peak MiB | fwd+bwd ms "
                "| fwd+bwd GPU ms | fwd+bwd GB/s | fwd+bwd x floor | fwd+bwd peak MiB | note |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in loss_rows:
            out.append(f"| {r.path} | {r.extra.get('rows', '-')} | {r.v} | {r.n} | {_fmt(r.fwd_ms, 3)} | "
                       f"{_fmt(r.extra.get('fwd_gpu_ms'), 3)} | {_fmt(r.fwd_gbps, 1)} | "
                       f"{_fmt(r.extra.get('fwd_x_floor'))} | {_fmt(r.peak_fwd_mib, 1)} | "
                       f"{_fmt(r.step_ms, 3)} | {_fmt(r.extra.get('step_gpu_ms'), 3)} | {_fmt(r.step_gbps, 1)} | "
                       f"{_fmt(r.extra.get('step_x_floor'))} | {_fmt(r.peak_step_mib, 1)} | {r.note} |")
        out.append("")
    if summary:
        out += ["## summary", ""] + [f"- {line}" for line in summary] + [""]
    return "\n".join(out)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        try:
            n, v = item.lower().split("x")
            shapes.append((int(n), int(v)))
        except ValueError:
            raise SystemExit(f"--shapes: expected NxV[,NxV...], got {item!r}") from None
    return shapes


def parse_loss_shapes(text: str) -> list[tuple[int, int]]:
    try:
        return [(b, t) for b, t in parse_shapes(text)]
    except SystemExit:
        raise SystemExit(f"--loss-shapes: expected BxT[,BxT...], got {text!r}") from None


SECTIONS = ("logits", "fused_linear", "loss")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=parse_shapes, help="comma-separated NxV logits shapes")
    parser.add_argument("--quick", action="store_true", help="fewer shapes (GPU) / fewer repetitions (CPU)")
    parser.add_argument("--cpu-small", action="store_true",
                        help="small CPU shapes, torch paths only (the default without CUDA)")
    parser.add_argument("--hidden", type=int, default=None, help="H of the fused-linear section (GPU 4096)")
    parser.add_argument("--no-fused-linear", action="store_true", help="skip the fused-linear section")
    parser.add_argument("--only", choices=SECTIONS, help="run this section alone")
    parser.add_argument("--no-loss", action="store_true", help="skip the loss section")
    parser.add_argument("--loss-shapes", type=parse_loss_shapes, help="comma-separated BxT shapes of the loss section")
    parser.add_argument("--out", default=None, help="file stem under benchmarks/results (default kernels_<device>)")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() and not args.cpu_small else "cpu"
    if device == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        _pin_malloc_to_mmap()
    if device == "cuda":
        shapes = args.shapes or (QUICK_SHAPES if args.quick else FULL_SHAPES)
        fl_shapes = [(4096, 151936)] if args.quick else [(4096, 151936), (16384, 151936)]
        h_dim = args.hidden or 4096
        fl_chunk = None  # library defaults
        peak_tbs = hbm_peak_tbs(device_name(device))
    else:
        shapes = args.shapes or CPU_SHAPES
        fl_shapes = [(4096, 32000)]
        h_dim = args.hidden or 256
        fl_chunk = 256  # several token chunks at this small N
        peak_tbs = None
    meter = Meter(device, cpu_reps=2 if args.quick else 3)
    meta = run_facts(device, argv, hbm_peak_tbs=peak_tbs)
    loss_shapes = args.loss_shapes or (LOSS_SHAPES + LOSS_SHAPES_CUDA_LARGE if device == "cuda" else LOSS_SHAPES)
    if args.only and (args.no_loss or args.no_fused_linear):
        parser.error("--only cannot be combined with --no-loss / --no-fused-linear")
    skipped = {name for name, skip in (("loss", args.no_loss), ("fused_linear", args.no_fused_linear)) if skip}
    sections = {args.only} if args.only else set(SECTIONS) - skipped
    stem = args.out or ("kernels_cpu" if device == "cpu" else "kernels_gpu") + (f"_{args.only}" if args.only else "")
    rows: list[Row] = []

    def tables(complete: bool) -> tuple[dict, str]:
        summary = summarize(rows, peak_tbs)
        meta["complete"] = complete
        return {"meta": meta, "rows": [asdict(r) for r in rows], "summary": summary}, markdown(meta, rows, summary)

    print(f"benchmark on {meta['device_name']}: sections {sorted(sections)}", flush=True)
    # the figures so far go to <stem>.failed.md after every shape (a run cut short keeps them there); the committed
    # <stem>.json / .md are replaced only by a finished run
    with ResultWriter(stem, RESULTS_DIR, command=meta["command"], name="bench_kernels") as out:
        if "logits" in sections:
            for shape in shapes:
                rows += bench_logits(meter, device, [shape])
                out.progress(tables(complete=False)[1])
        if "loss" in sections:
            for shape in loss_shapes:
                rows += bench_loss(meter, device, [shape], peak_tbs)
                out.progress(tables(complete=False)[1])
        if "fused_linear" in sections:
            for shape in fl_shapes:
                rows += bench_fused_linear(meter, device, [shape], h_dim, fl_chunk)
                out.progress(tables(complete=False)[1])
        payload, md = tables(complete=True)
        out.commit({".json": json.dumps(payload, indent=2) + "\n", ".md": md})
    print(f"\nwrote {RESULTS_DIR / stem}.json and .md\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
