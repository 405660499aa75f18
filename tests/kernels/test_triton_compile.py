"""Every Triton kernel compiles for a real GPU target (sm_90), even on a machine without a GPU.

The interpreter used by the CPU tests accepts programs the compiler rejects (loop-carried type changes, scalar
casts, ...); compiling ahead of time down to a cubin catches those. Float hyperparameters are also compiled as fp64
arguments, which is how TorchInductor passes Python floats. The interpreter patches ``triton.language`` in the
process that enables it, so the compilation runs in a child process without ``TRITON_INTERPRET``.
"""
import importlib
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _has_nvidia_backend() -> bool:
    try:
        from triton.backends import backends

        return "nvidia" in backends
    except ImportError:
        return False


def compile_all() -> list[str]:
    """Compile every kernel variant for sm_90; returns one line per compiled variant."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    hacpo_mod = importlib.import_module("hacpo_kernels.hacpo_loss")  # the package attribute is the function
    logprobs_mod = importlib.import_module("hacpo_kernels.logprobs")

    done = []

    def build(kernel, signature, constexprs, num_warps):
        # the launch path reads constexpr-ness from the annotations (strings under `from __future__ import
        # annotations`): they must agree with what is compiled here
        declared = {p.name for p in kernel.params if p.is_constexpr}
        assert declared == set(constexprs), (kernel.__name__, declared, set(constexprs))
        sig = dict(signature)
        sig.update({name: "constexpr" for name in constexprs})
        compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs),
                                  target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
        assert len(compiled.asm["cubin"]) > 0
        done.append(f"{kernel.__name__} {constexprs}")

    for dtype in ("bf16", "fp32"):
        for with_entropy in (True, False):
            build(logprobs_mod._logprobs_fwd_kernel,
                  {"logits_ptr": f"*{dtype}", "labels_ptr": "*i64", "logp_ptr": "*fp32", "entropy_ptr": "*fp32",
                   "lse_ptr": "*fp32", "n_cols": "i32", "stride_row": "i64"},
                  {"INV_TEMP": 1 / 0.7, "WITH_ENTROPY": with_entropy, "BLOCK_V": 4096}, 8)
            build(logprobs_mod._logprobs_bwd_kernel,
                  {"logits_ptr": f"*{dtype}", "dlogits_ptr": f"*{dtype}", "labels_ptr": "*i64", "lse_ptr": "*fp32",
                   "entropy_ptr": "*fp32", "dlogp_ptr": "*fp32", "dentropy_ptr": "*fp32", "n_cols": "i32",
                   "stride_row": "i64", "stride_drow": "i64"},
                  {"INV_TEMP": 1.0, "HAS_DLOGP": True, "HAS_DENTROPY": with_entropy, "BLOCK_V": 4096}, 8)
    build(logprobs_mod._logprobs_bwd_kernel,  # entropy-only gradient
          {"logits_ptr": "*fp16", "dlogits_ptr": "*fp16", "labels_ptr": "*i64", "lse_ptr": "*fp32",
           "entropy_ptr": "*fp32", "dlogp_ptr": "*fp32", "dentropy_ptr": "*fp32", "n_cols": "i32",
           "stride_row": "i64", "stride_drow": "i64"},
          {"INV_TEMP": 2.0, "HAS_DLOGP": False, "HAS_DENTROPY": True, "BLOCK_V": 1024}, 4)
    # (token level, log-ratio clamp, float argument type, pessimistic, naive, KL, own dual clip, training-inference
    # correction mode (0 off, 1 truncate, 2 mask), per-token correction)
    variants = ((False, 1, "fp32", True, False, True, False, 0, False),
                (True, 2, "fp64", False, True, True, True, 0, False),
                (False, 0, "fp64", False, True, False, True, 0, False),
                (True, 1, "fp32", True, False, False, True, 0, False),
                (False, 1, "fp32", False, False, True, False, 1, True),
                (True, 1, "fp64", False, False, False, True, 2, True),
                (False, 1, "fp64", False, True, False, False, 2, False))
    for token_level, clip_mode, float_arg, cross_min, foreign_self, has_kl, own_dual, is_mode, is_token in variants:
        floats = {name: float_arg
                  for name in ("eps_low_arg", "eps_high_arg", "lo_arg", "hi_arg", "dual_arg", "own_dual_arg",
                               "alpha_arg", "clip_arg", "kl_limit_arg", "kl_max_arg", "is_lo_arg", "is_hi_arg")}
        fwd_sig = {name: "*fp32" for name in ("logp_ptr", "old_ptr", "ref_ptr", "adv_ptr", "old_mean_ptr",
                                              "coef_ptr", "eng_ptr", "eng_mean_ptr", "obj_ptr", "ratio_ptr",
                                              "rowg_ptr", "rowkl_ptr", "partial_ptr")}
        fwd_sig.update(mask_ptr="*u8", own_ptr="*u8", n_rows="i32", n_cols="i32", stride_lp="i32",
                       stride_mk="i32", stride_old="i32", stride_ref="i32", stride_eng="i32", **floats)
        switches = dict(TOKEN_LEVEL=token_level, CLIP_MODE=clip_mode, CROSS_CLIP=clip_mode != 0, CROSS_MIN=cross_min,
                        OWN_DUAL=own_dual, FOREIGN_SELF=foreign_self, HAS_KL=has_kl, IS_MODE=is_mode,
                        IS_TOKEN=is_token)
        build(hacpo_mod._hacpo_fwd_kernel, fwd_sig,
              dict(switches, TOKEN_MEAN=token_level, NUM_STATS=hacpo_mod.NUM_STATS, BLOCK_B=16, BLOCK_T=128), 4)
        bwd_sig = {name: "*fp32" for name in ("logp_ptr", "old_ptr", "ref_ptr", "adv_ptr", "coef_ptr", "eng_ptr",
                                              "rowg_ptr", "rowkl_ptr", "scale_ptr", "grad_ptr", "mask_ptr")}
        bwd_sig.update(own_ptr="*u8", n_rows="i32", n_cols="i32", stride_lp="i32", stride_mk="i32",
                       stride_old="i32", stride_ref="i32", stride_eng="i32", stride_g="i32", **floats)
        build(hacpo_mod._hacpo_bwd_kernel, bwd_sig, dict(switches, BLOCK_B=16, BLOCK_T=128), 4)
    return done


@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton's NVIDIA backend is not available")
@pytest.mark.integration
def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, __file__], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"compilation failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert proc.stdout.count("compiled ") == 23, proc.stdout


if __name__ == "__main__":
    for line in compile_all():
        print("compiled", line)
