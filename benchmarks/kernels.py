"""Kernel benchmark: fused quantize, NVFP4/INT8 GEMMs and quantize+GEMM against bf16 cuBLAS.

Run on a CUDA GPU (written for the H200, sm_90) from the repository root::

    python benchmarks/kernels.py --tune --out benchmarks/results/kernels_h200

What it measures (``triton.testing.do_bench`` medians after warm-up; do_bench flushes L2 between runs):

* device-to-device copy bandwidth (bytes read + written) and an 8192³ bf16 matmul, the two ceilings;
* optionally (``--tune``) a few tile configs per kernel on two shapes, keeping the fastest for the rest;
* every fused quantize kernel at each K (Hadamard block ``--hb``; without the per-layer outlier count, the
  default since ``trace_linear_outliers`` is off, plus rows with it): time, GB/s over the
  bytes it must move (read x once + write its outputs) and over the bytes it does move (the NVFP4
  pre-pass reads x a second time), and the fraction of copy bandwidth;
* every GEMM at the CogVideoX linear shapes (M = 35,552 = 2 × 17,776 tokens, CFG batched): bf16 cuBLAS
  ``F.linear`` (with bias), W8A8, W4A4 (packed 4-bit activations, and activations carried as exact fp16),
  W4A8 (INT8 codes in-kernel, and as fp16), W4A16 (bf16 activations, and the rotated fp32 split); the
  4-bit-weight GEMMs with the weight decoded per K tile and decoded once per call (``decode=``), the
  decode alone, and cuBLAS on the decoded operands as the ceiling of the decode-once form;
* quantize + GEMM end to end through ``sixbit_kernels.ops.linear`` for every route, ratio to bf16;
* a correctness spot check of every GEMM at the full shape (first 256 rows, fp32 output) and the
  weight bytes per parameter.

Writes ``<out>.json`` and ``<out>.md``. Sections that fail are recorded, not fatal.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from sixbit import formats as F  # noqa: E402
from sixbit._kernels import kernels as sk  # noqa: E402

ops, g4, g8, hq, common = sk.ops, sk.gemm_w4, sk.gemm_w8a8, sk.hadamard_quant, sk._common

# (model, layer, K, N)
SHAPES = [
    ("2B", "qkv (fused)", 1920, 5760),
    ("2B", "attn out", 1920, 1920),
    ("2B", "ff in", 1920, 7680),
    ("2B", "ff out", 7680, 1920),
    ("5B", "qkv (fused)", 3072, 9216),
    ("5B", "attn out", 3072, 3072),
    ("5B", "ff in", 3072, 12288),
    ("5B", "ff out", 12288, 3072),
]
TUNE_SHAPES = [("2B", "qkv (fused)", 1920, 5760), ("5B", "ff out", 12288, 3072)]
#: the activation widths each token-resident quantize config serves (N unused)
ROW_SHAPES = {"rows": [("2B", "qkv", 1920, 0)],
              "rows_long": [("5B", "qkv", 3072, 0), ("2B", "ff out", 7680, 0), ("5B", "ff out", 12288, 0)]}

TUNE = {
    "w4_dense": (g4.A_DENSE, [(256, 128, 64, 8, 8, 4, True), (256, 128, 128, 8, 8, 2, True),
                              (256, 128, 64, 8, 8, 5, True)]),
    "w4_decoded_once": (None, [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3),
                               (256, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4), (128, 256, 128, 8, 8, 2)]),
    "w8a8": (None, [(128, 256, 128, 8, 8, 3), (256, 128, 128, 8, 8, 3), (128, 128, 128, 8, 4, 3),
                    (128, 128, 128, 8, 4, 2)]),
    "w8a8_tma": (None, [(128, 256, 128, 8, 8, 3), (256, 128, 128, 8, 8, 3), (128, 128, 64, 8, 4, 5),
                        (128, 128, 128, 4, 4, 3), (128, 128, 128, 8, 4, 3), (128, 128, 128, 16, 4, 3)]),
    # token-resident quantize: short rows (K 1920) and long rows (3072, 7680, 12288)
    "rows": (None, [(64, 8, 4), (128, 8, 2), (64, 4, 4), (128, 4, 4), (64, 4, 8), (32, 4, 8)]),
    "rows_long": (None, [(256, 4, 2), (256, 4, 4), (256, 8, 2), (256, 8, 4), (128, 4, 4), (128, 4, 8)]),
    "nvfp4_tiles": (None, [(64, 4, 4), (64, 8, 4), (128, 8, 2), (32, 4, 8), (32, 2, 8), (64, 2, 8), (64, 4, 8),
                           (128, 4, 4), (128, 4, 2), (256, 8, 2)]),
}

#: vendor 8-bit GEMMs at the same shapes, for scale: what cuBLAS does with the same operand sizes
CUBLAS_INT8 = "  reference: cuBLAS int8 torch._int_mm (int32 out; no scales, no bias)"
CUBLAS_FP8 = "  reference: cuBLAS fp8 e4m3 torch._scaled_mm, row/column scales, bias, bf16 out"
TMA_GEMM = "W8A8 int8 GEMM (TMA descriptors)"
Q_INT8 = "int8 (codes int8)"

LOG: list[str] = []
DEV = "cuda"  # --smoke: "cpu" (triton interpreter, tiny shapes; checks the script, measures nothing)


def log(msg: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    LOG.append(line)
    print(line, flush=True)


def bench(fn, rep: int) -> float:
    fn()
    if DEV == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return float(do_bench(fn, warmup=max(10, rep // 4), rep=rep, return_mode="median"))


def _with(mod, name, value, fn, *args, **kw):
    """``fn(*args, **kw)`` with ``mod.name`` set to ``value`` for the call (variant rows of one kernel)."""
    old = getattr(mod, name)
    setattr(mod, name, value)
    try:
        return fn(*args, **kw)
    finally:
        setattr(mod, name, old)


def _host_ms(fn, n=None):
    """CPU time per call of ``fn`` (launches queued, no synchronisation inside the loop): when it exceeds the
    GPU time, a benchmark loop — unlike the model, whose GPU queue runs ahead — measures the host."""
    n = n or (50 if DEV == "cuda" else 1)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e3
    if DEV == "cuda":
        torch.cuda.synchronize()
    return host


def _empty_cache():
    if DEV == "cuda":
        torch.cuda.empty_cache()


def gen(shape, seed, dtype=torch.bfloat16, outlier_cols=()):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=DEV, dtype=torch.float32)
    for c in outlier_cols:
        x[..., c] *= 30.0
    return x.to(dtype)


def rel(y, ref) -> float:
    return float(F.relative_error(y.float(), ref.float()))


# ------------------------------------------------------------------------------------------ ceilings


def ceilings(rep):
    n = (1 << 29) if DEV == "cuda" else (1 << 20)  # 1 GiB of bf16
    src = torch.randn(n // 2, device=DEV).to(torch.bfloat16).repeat(2)
    dst = torch.empty_like(src)
    t = bench(lambda: dst.copy_(src), rep)
    copy_gbs = 2 * src.numel() * 2 / (t * 1e-3) / 1e9
    d = 8192 if DEV == "cuda" else 256
    a = torch.randn(d, d, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(d, d, device=DEV, dtype=torch.bfloat16)
    tm = bench(lambda: a @ b, rep)
    return {"copy_GBps": copy_gbs, "copy_ms_1GiB": t, "bf16_8192_TFLOPs": 2 * d**3 / (tm * 1e-3) / 1e12}


# -------------------------------------------------------------------------------------------- tuning


def _gemm_case(M, K, N, seed=0):
    x = gen((M, K), seed, outlier_cols=(7, K // 2))
    w = gen((N, K), seed + 1, torch.float32) / math.sqrt(K)
    b = gen((N,), seed + 2, torch.float32)
    return x, w, b


def tune(M, rep, hb, results):
    out = {}
    for name, (mode, cands) in TUNE.items():
        rows = []
        for cfg in cands:
            tot = 0.0
            per = {}
            try:
                for _, _, K, N in ROW_SHAPES.get(name, TUNE_SHAPES):
                    x, w, b = _gemm_case(M, K, max(N, 16))
                    if name in ROW_SHAPES:
                        fn = lambda x=x, cfg=cfg: hq.quantize_int8_act(x, hb, config=cfg)  # noqa: E731
                    elif name == "nvfp4_tiles":
                        fn = lambda x=x, cfg=cfg: hq.quantize_nvfp4_act(x, hb, config=cfg)  # noqa: E731
                    elif name == "w4_decoded_once":
                        (v, bs, ts), _ = hq.quantize_nvfp4_act(x, hb, dense=True)
                        a = g4.DenseAct(v, "nvfp4", tensor_scale=ts)
                        w4 = F.quantize_nvfp4(w)
                        fn = lambda a=a, w4=w4, b=b, cfg=cfg: g4.gemm_w4(a, w4, b, config=cfg, decode="once")  # noqa: E731
                    elif name in ("w8a8", "w8a8_tma"):
                        q8, _ = hq.quantize_int8_act(x, hb)
                        w8 = F.quantize_int8(w)
                        fn = lambda q8=q8, w8=w8, b=b, cfg=cfg, t=name == "w8a8_tma": g8.gemm_w8a8(  # noqa: E731
                            q8, w8, b, config=cfg, tma=t)
                    else:
                        w4 = F.quantize_nvfp4(w)
                        if mode == g4.A_DENSE:
                            (v, bs, ts), _ = hq.quantize_nvfp4_act(x, hb, dense=True)
                            a = g4.DenseAct(v, "nvfp4", tensor_scale=ts)
                        elif mode == g4.A_NVFP4:
                            a, _ = hq.quantize_nvfp4_act(x, hb)
                        elif mode == g4.A_INT8:
                            a, _ = hq.quantize_int8_act(x, hb)
                        else:
                            a, _ = hq.rotate_split(x, hb)
                        fn = lambda a=a, w4=w4, b=b, cfg=cfg: g4.gemm_w4(a, w4, b, config=cfg, decode="tile")  # noqa: E731
                    t = bench(fn, rep)
                    per[f"{K}->{N}"] = t
                    tot += t
                    del x, w, b
                rows.append({"config": list(cfg), "ms": per, "total_ms": tot})
                log(f"tune {name} {cfg}: {per}")
            except Exception as e:  # a config that fails to compile or run is skipped
                rows.append({"config": list(cfg), "error": f"{type(e).__name__}: {str(e)[:300]}"})
                log(f"tune {name} {cfg}: FAILED {type(e).__name__}: {str(e)[:200]}")
            _empty_cache()
        ok = [r for r in rows if "total_ms" in r]
        if ok:
            best = tuple(min(ok, key=lambda r: r["total_ms"])["config"])
            if name == "rows":
                hq.CUDA_ROWS_CONFIG = best
            elif name == "rows_long":
                hq.CUDA_ROWS_CONFIG_LONG = best
            elif name == "nvfp4_tiles":
                hq.CUDA_NVFP4_CONFIG = best
            elif name == "w8a8":
                g8.CUDA_CONFIG = best
            elif name == "w8a8_tma":
                g8.CUDA_TMA_CONFIG = best
                plain = out.get("w8a8", {}).get("best_total_ms")
                g8.TMA = plain is None or min(r["total_ms"] for r in ok) < plain  # the faster kernel by default
                log(f"tune w8a8: TMA kernel {'on' if g8.TMA else 'off'} by default")
            elif name == "w4_decoded_once":
                g4.CUDA_DENSE_W_CONFIG = best
            else:
                g4.CUDA_CONFIGS[mode] = best
            out[name] = {"best": list(best), "best_total_ms": min(r["total_ms"] for r in ok), "candidates": rows}
            log(f"tune {name}: best {best}")
        else:
            out[name] = {"best": None, "candidates": rows}
    results["tuning"] = out


# --------------------------------------------------------------------------------------- validation


def validate_ptx(results):
    """Check the inline-PTX decode on this GPU; fall back to the portable decode if it is wrong."""
    x, w, b = _gemm_case(77, 256, 192, seed=5)
    w4 = F.quantize_nvfp4(w)
    ref = x.float() @ w4.dequantize(torch.float32).T + b
    errs = {}
    for ptx in (True, False):
        common.PTX_DECODE = ptx
        errs[ptx] = rel(g4.gemm_w4(x, w4, b, torch.float32), ref)
    ok = errs[True] <= 1e-3
    common.PTX_DECODE = ok
    results["ptx_decode"] = {"ok": ok, "rel_err_ptx": errs[True], "rel_err_portable": errs[False]}
    log(f"PTX decode check: {results['ptx_decode']}")


# ---------------------------------------------------------------------------------------- quantize


def bench_quantize(M, rep, hb, copy_gbs, results):
    rows = []
    for K in sorted({s[2] for s in SHAPES}):
        _quantize_at(M, K, rep, hb, copy_gbs, rows)
        _empty_cache()
    results["quantize"] = rows


def _quantize_at(M, K, rep, hb, copy_gbs, rows):
    x = gen((M, K), 11, outlier_cols=(3, K // 3))
    e = M * K
    cases = [
        (Q_INT8, lambda: hq.quantize_int8_act(x, hb), 2 * e + e + 4 * M, None),
        ("int8 (codes int8), one padded tile per token (no two-tile split)",
         lambda: _with(hq, "ROWS_SPLIT", False, hq.quantize_int8_act, x, hb), 2 * e + e + 4 * M, None),
        ("int8 (codes int8) + outlier count", lambda: hq.quantize_int8_act(x, hb, 8.0), 2 * e + e + 4 * M, None),
        ("int8 (codes as fp16, Hopper W4A8 operand)", lambda: hq.quantize_int8_act(x, hb, dense=True),
         2 * e + 2 * e + 4 * M, None),
        ("nvfp4 amax pre-pass", lambda: hq.nvfp4_amax(x, hb), 2 * e, None),
        ("nvfp4 (packed codes), pre-pass + quantize", lambda: hq.quantize_nvfp4_act(x, hb),
         2 * e + e // 2 + e // 16, 2 * e + 2 * e + e // 2 + e // 16),
        ("nvfp4 (values as fp16, Hopper W4A4 operand), pre-pass + quantize",
         lambda: hq.quantize_nvfp4_act(x, hb, dense=True),
         2 * e + 2 * e + e // 16, 2 * e + 2 * e + 2 * e + e // 16),
        ("nvfp4 (values as fp16), pre-pass + quantize + outlier count",
         lambda: hq.quantize_nvfp4_act(x, hb, 8.0, dense=True),
         2 * e + 2 * e + e // 16, 2 * e + 2 * e + 2 * e + e // 16),
        ("w4a16 rotate → bf16 [hi|lo]", lambda: hq.rotate_split(x, hb), 2 * e + 4 * e, None),
        ("w4a16 rotate → fp16 scaled per token", lambda: hq.scale16_act(x, hb), 2 * e + 2 * e + 4 * M, None),
        ("outlier count only", lambda: hq.outlier_count(x, 8.0), 2 * e, None),
        ("torch eager: per-token int8 (no rotation)", lambda: F.quantize_int8(x, check_finite=False),
         2 * e + e + 4 * M, None),
    ]
    for name, fn, need, moved in cases:
        try:
            t = min(bench(fn, rep) for _ in range(3))  # ~0.1 ms kernels: best of 3 medians
            r = {"K": K, "kernel": name, "ms": t, "GBps_required_bytes": need / (t * 1e-3) / 1e9}
            r["frac_of_copy"] = r["GBps_required_bytes"] / copy_gbs
            if moved:
                r["GBps_moved_bytes"] = moved / (t * 1e-3) / 1e9
                r["frac_of_copy_moved"] = r["GBps_moved_bytes"] / copy_gbs
            rows.append(r)
            log(f"quant K={K} {name}: {t:.4f} ms, {r['GBps_required_bytes']:.0f} GB/s ({r['frac_of_copy']:.0%} of copy)")
        except Exception as e:
            rows.append({"K": K, "kernel": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            log(f"quant K={K} {name}: FAILED {e}")


# -------------------------------------------------------------------------------------------- GEMMs


def bench_gemms(M, rep, hb, results):
    rows = []
    checks = []
    for model, layer, K, N in SHAPES:
        _gemms_at(M, model, layer, K, N, rep, hb, rows, checks)
        _empty_cache()
    results["gemm"] = rows
    results["gemm_checks"] = checks


def _gemms_at(M, model, layer, K, N, rep, hb, rows, checks):
    x, w, b = _gemm_case(M, K, N, seed=K + N)
    flops = 2.0 * M * N * K
    wb, bb = w.to(torch.bfloat16), b.to(torch.bfloat16)
    w4 = F.quantize_nvfp4(w)
    w8 = F.quantize_int8(w)
    qa, _ = hq.quantize_nvfp4_act(x, hb)
    (v, bs, ts), _ = hq.quantize_nvfp4_act(x, hb, dense=True)
    da4 = g4.DenseAct(v, "nvfp4", tensor_scale=ts)
    q8, _ = hq.quantize_int8_act(x, hb)
    d8, _ = hq.quantize_int8_act(x, hb, dense=True)
    da8 = g4.DenseAct(d8.data, "int8", row_scale=d8.scale)
    split, _ = hq.rotate_split(x, hb)
    s16, _ = hq.scale16_act(x, hb)
    wdec = g4.decode_weight(w4)
    x8, w8t = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    ones_m, ones_n = torch.ones(M, 1, device=DEV), torch.ones(1, N, device=DEV)
    cases = [
        ("bf16 cuBLAS F.linear", lambda: torch.nn.functional.linear(x, wb, bb), None),
        ("W8A8 int8 GEMM", lambda: g8.gemm_w8a8(q8, w8, b, tma=False), (q8, w8)),
        ("W8A8 int8 GEMM (TMA descriptors)", lambda: g8.gemm_w8a8(q8, w8, b, tma=True), (q8, w8)),
        ("  W8A8 int8 GEMM (TMA loads, pointer-store epilogue)",
         lambda: _with(g8, "TMA_STORE", False, g8.gemm_w8a8, q8, w8, b, tma=True), None),
        (CUBLAS_INT8, lambda: torch._int_mm(q8.data, w8.data.t()), None),
        (CUBLAS_FP8, lambda: torch._scaled_mm(x8, w8t, scale_a=ones_m, scale_b=ones_n, bias=bb,
                                              out_dtype=torch.bfloat16), None),
        ("W4A4 (packed 4-bit A, decoded in-kernel)", lambda: g4.gemm_w4(qa, w4, b), (qa, w4)),
        ("W4A4 (A as exact fp16, W decoded per tile)", lambda: g4.gemm_w4(da4, w4, b, decode="tile"), (da4, w4)),
        ("W4A4 (A as exact fp16, W decoded once)", lambda: g4.gemm_w4(da4, w4, b, decode="once"), (da4, w4, "once")),
        ("W4A8 (int8 A, converted in-kernel)", lambda: g4.gemm_w4(q8, w4, b), (q8, w4)),
        ("W4A8 (A codes as fp16, W decoded per tile)", lambda: g4.gemm_w4(da8, w4, b, decode="tile"), (da8, w4)),
        ("W4A8 (A codes as fp16, W decoded once)", lambda: g4.gemm_w4(da8, w4, b, decode="once"), (da8, w4, "once")),
        ("W4A16 (bf16 A, W decoded per tile)", lambda: g4.gemm_w4(x, w4, b, decode="tile"), (x, w4)),
        ("W4A16 (bf16 A, W decoded once)", lambda: g4.gemm_w4(x, w4, b, decode="once"), (x, w4, "once")),
        ("W4A16 (rotated fp32 A as bf16 hi|lo, W decoded once)", lambda: g4.gemm_w4(split, w4, b), (split, w4, "once")),
        ("W4A16 (rotated A as fp16 scaled per token, W decoded once)", lambda: g4.gemm_w4(s16, w4, b), (s16, w4, "once")),
        ("  decode_weight alone (packed → fp16 [N, K])", lambda: g4.decode_weight(w4), None),
        ("  reference: cuBLAS fp16 on the decoded operands (no scales, no bias)", lambda: torch.mm(v, wdec.T), None),
    ]
    t_ref = None
    for name, fn, chk in cases:
        try:
            t = bench(fn, rep)
            t_ref = t if t_ref is None else t_ref
            r = {"model": model, "layer": layer, "K": K, "N": N, "M": M, "kernel": name, "ms": t,
                 "TFLOPs": flops / (t * 1e-3) / 1e12, "speed_vs_bf16": t_ref / t}
            rows.append(r)
            log(f"gemm {model} {K}->{N} {name}: {t:.4f} ms {r['TFLOPs']:.0f} TFLOP/s {r['speed_vs_bf16']:.2f}x")
            if chk is not None and (K, N) in {(k, n) for *_, k, n in TUNE_SHAPES}:
                checks.append(_check(name, chk, b, K, N))
        except Exception as e:
            rows.append({"model": model, "layer": layer, "K": K, "N": N, "kernel": name,
                         "error": f"{type(e).__name__}: {str(e)[:300]}"})
            log(f"gemm {model} {K}->{N} {name}: FAILED {e}")


def _check(name, chk, b, K, N):
    a, wq, decode = (*chk, "auto")[:3]
    n = 256
    if isinstance(a, F.NVFP4Tensor):
        a_s = F.NVFP4Tensor(a.data[:n], a.scales[:n], a.tensor_scale, a.orig_dtype)
        ref_a = a_s.dequantize(torch.float32)
    elif isinstance(a, F.Int8Tensor):
        a_s = F.Int8Tensor(a.data[:n], a.scale[:n], a.orig_dtype)
        ref_a = a_s.dequantize(torch.float32)
    elif isinstance(a, g4.DenseAct):
        a_s = g4.DenseAct(a.values[:n], a.fmt, a.tensor_scale, None if a.row_scale is None else a.row_scale[:n])
        ref_a = a_s.dequantize(torch.float32)
    elif isinstance(a, g4.SplitAct):
        a_s = g4.SplitAct(a.hilo[:n])
        ref_a = a_s.value()
    else:
        a_s = a[:n]
        ref_a = a_s.float()
    if isinstance(wq, F.NVFP4Tensor):
        y = g4.gemm_w4(a_s, wq, b, torch.float32, decode=decode)
    else:
        y = g8.gemm_w8a8(a_s, wq, b, torch.float32)
    ref = ref_a @ wq.dequantize(torch.float32).T + b
    e = rel(y, ref)
    log(f"check {name} {K}->{N}: rel err {e:.2e}")
    return {"kernel": name, "K": K, "N": N, "rows": n, "rel_err": e, "ok": e <= 1e-3}


def bench_norm(M, rep, results):
    """The attention's per-head q/k LayerNorm on the strided [B, heads, S, 64] view, PyTorch vs sixbit."""
    rows = []
    for model, heads in (("2B", 30), ("5B", 48)):
        S = M // 2
        x = gen((2, S, heads * 64), 11).view(2, S, heads, 64).transpose(1, 2)
        ln = torch.nn.LayerNorm(64, eps=1e-6).to(DEV, torch.bfloat16)
        t_ref = bench(lambda x=x, ln=ln: ln(x), rep)
        t = bench(lambda x=x, ln=ln: sk.layernorm.layer_norm_rows(x, ln.weight, ln.bias, 1e-6), rep)
        e = rel(sk.layernorm.layer_norm_rows(x, ln.weight, ln.bias, 1e-6), ln(x).float())
        gbs = 2 * 2 * x.numel() / (t * 1e-3) / 1e9
        rows.append({"model": model, "shape": list(x.shape), "torch_ms": t_ref, "sixbit_ms": t, "speedup": t_ref / t,
                     "GBps": gbs, "rel_err_vs_torch": e})
        log(f"norm {model} {list(x.shape)}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x, {gbs:.0f} GB/s), "
            f"rel err {e:.1e}")
        # + the rotary embedding of the video tokens, as CogVideoX's attention processor does it
        from diffusers.models.embeddings import apply_rotary_emb

        text = min(226, S // 4)  # CogVideoX: 226 text tokens first
        ang = gen((S - text, 32), 12).float()
        cos = ang.cos().repeat_interleave(2, -1).contiguous()
        sin = ang.sin().repeat_interleave(2, -1).contiguous()

        def torch_chain(x=x, ln=ln, cos=cos, sin=sin, text=text):
            y = ln(x)
            y[:, :, text:] = apply_rotary_emb(y[:, :, text:], (cos, sin))
            return y

        def fused(x=x, ln=ln, cos=cos, sin=sin, text=text):
            return sk.layernorm.layer_norm_rows(x, ln.weight, ln.bias, 1e-6, rope=(cos, sin, text))

        t_ref = bench(torch_chain, rep)
        t = bench(fused, rep)
        e = rel(fused(), torch_chain().float())
        gbs = 2 * 2 * x.numel() / (t * 1e-3) / 1e9
        rows.append({"model": model, "shape": list(x.shape), "op": "layernorm+rotary", "torch_ms": t_ref, "sixbit_ms": t,
                     "speedup": t_ref / t, "GBps": gbs, "rel_err_vs_torch": e})
        log(f"norm+rope {model}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x, {gbs:.0f} GB/s), rel err {e:.1e}")
    results["norm"] = rows


def bench_bookkeeping(M, rep, results):
    """The engine's per-computed-block statistics: Δ, Γ's sums, the delta change (TDC) and PDR's outlier
    count — the torch reference against block_stats / the outlier-count kernel, at CogVideoX sizes."""
    from sixbit import formats as SF
    from sixbit.dmpq import gamma_sums
    from sixbit.tdc import delta_change_sums

    rows = []
    for model, width in (("2B", 1920), ("5B", 3072)):
        text = min(226, M // 8)
        video = M // 2 - text
        ins = [gen((2, video, width), 21), gen((2, text, width), 22)]
        outs = [i + 0.1 * gen(i.shape, 23 + k) for k, i in enumerate(ins)]
        olds = [o - i + 0.01 * gen(i.shape, 25 + k) for k, (o, i) in enumerate(zip(outs, ins))]

        def ref(outs=outs, ins=ins, olds=olds):
            d = [o - i for o, i in zip(outs, ins)]
            return d, torch.stack([*gamma_sums(d[0], ins[0]), *delta_change_sums(d, olds)])

        def fused(outs=outs, ins=ins, olds=olds):
            return sk.ops.block_stats(outs, ins, olds)

        t_ref, t = bench(ref, rep), bench(fused, rep)
        e = rel(fused()[1], ref()[1].double())
        nbytes = sum(4 * t_.numel() * t_.element_size() for t_ in ins)  # read out, in, old; write Δ
        rows.append({"model": model, "op": "Δ + Γ sums + delta change (2 streams)", "torch_ms": t_ref, "sixbit_ms": t,
                     "speedup": t_ref / t, "GBps": nbytes / (t * 1e-3) / 1e9, "rel_err_vs_torch": e})
        log(f"bookkeeping {model}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x)")
        t_ref = bench(lambda ins=ins: [SF.outlier_count(s, 8.0) for s in ins], rep)
        t = bench(lambda ins=ins: [sk.ops.outlier_count(s, 8.0) for s in ins], rep)
        same = all(int(a[0]) == int(b[0]) for a, b in zip([SF.outlier_count(s, 8.0) for s in ins],
                                                         [sk.ops.outlier_count(s, 8.0) for s in ins]))
        nbytes = sum(s.numel() * s.element_size() for s in ins)
        rows.append({"model": model, "op": "PDR outlier count (2 streams)", "torch_ms": t_ref, "sixbit_ms": t,
                     "speedup": t_ref / t, "GBps": nbytes / (t * 1e-3) / 1e9, "rel_err_vs_torch": 0.0 if same else 1.0})
        log(f"outlier count {model}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x), equal counts {same}")
        del ins, outs, olds
        _empty_cache()
    results["bookkeeping"] = rows


# -------------------------------------------------------------------------------------- end to end


def bench_linear(M, rep, hb, results):
    rows = []
    for model, layer, K, N in SHAPES:
        _linear_at(M, model, layer, K, N, rep, hb, rows)
        _empty_cache()
    results["linear"] = rows


def _linear_at(M, model, layer, K, N, rep, hb, rows):
    x, w, b = _gemm_case(M, K, N, seed=3 * K + N)
    wb, bb = w.to(torch.bfloat16), b.to(torch.bfloat16)
    p = ops.pack_linear(w, bb, formats=("nvfp4", "int8"), hadamard_block=hb)
    t_ref = bench(lambda: torch.nn.functional.linear(x, wb, bb), rep)
    flops = 2.0 * M * N * K
    rows.append({"model": model, "layer": layer, "K": K, "N": N, "route": "bf16 cuBLAS", "ms": t_ref,
                 "TFLOPs": flops / (t_ref * 1e-3) / 1e12, "speed_vs_bf16": 1.0})
    variants = [(r, True) for r in ("w8a8", "nvfp4", "int8", "w4a16")] + [("nvfp4", False), ("int8", False)]
    for route, dense in variants:
        label = route + ("" if dense or route in ("w8a8", "w4a16") else " (packed A: 4-bit/int8 decoded in-kernel)")
        try:
            ops.HOPPER_DENSE_ACTIVATIONS = dense
            fn = lambda route=route: ops.linear(x, p, route, backend="triton")  # noqa: E731
            t = bench(fn, rep)
            r = {"model": model, "layer": layer, "K": K, "N": N, "route": label, "ms": t,
                 "TFLOPs": flops / (t * 1e-3) / 1e12, "speed_vs_bf16": t_ref / t, "host_ms": _host_ms(fn)}
            rows.append(r)
            log(f"linear {model} {K}->{N} {label}: {t:.4f} ms {r['speed_vs_bf16']:.2f}x")
        except Exception as e:
            rows.append({"model": model, "K": K, "N": N, "route": label, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            log(f"linear {model} {K}->{N} {label}: FAILED {e}")
        finally:
            ops.HOPPER_DENSE_ACTIVATIONS = True
    bits = {"nvfp4_bits_per_weight": p.bits_per_weight("nvfp4"), "int8_bits_per_weight": p.bits_per_weight("int8")}
    rows[-1 - len(variants)].update(bits)


# ------------------------------------------------------------------------------------------ report


def write_md(results, path: Path):
    env = results["env"]
    L = [f"# Kernel benchmark — {env['gpu']}", ""]
    L += [f"- command: `{env['command']}`", f"- torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}, "
          f"python {env['python']}; date {env['date']}",
          f"- M = {results['M']} rows (CogVideoX 49×480×720, CFG batched), Hadamard block {results['hb']}, "
          f"`do_bench` medians ({results['rep_ms']} ms rep), L2 flushed per run", ""]
    c = results.get("ceilings", {})
    if c:
        L += [f"Ceilings: device copy {c['copy_GBps']:.0f} GB/s (read + write); bf16 8192³ matmul "
              f"{c['bf16_8192_TFLOPs']:.0f} TFLOP/s.", ""]
    if "ptx_decode" in results:
        L += [f"Inline-PTX NVFP4 decode validated on this GPU: {results['ptx_decode']['ok']}.", ""]
    if results.get("tests"):
        L += ["## Kernel tests on this GPU", "", "```", results["tests"].strip(), "```", ""]
    if "linear" in results:
        L += ["## Quantize + GEMM end to end (`ops.linear`, no per-layer outlier count: the default) vs bf16 cuBLAS", "",
              "*host ms*: CPU time per `ops.linear` call (launches queued, not synchronised); where it nears *ms* the "
              "row measures the host, not the GPU.", "",
              "| model | K→N | route | ms | TFLOP/s | × bf16 speed | host ms |", "|---|---|---|---|---|---|---|"]
        for r in results["linear"]:
            if "error" in r:
                L.append(f"| {r['model']} | {r['K']}→{r['N']} | {r['route']} | error: {r['error'][:80]} | | | |")
            else:
                host = f"{r['host_ms']:.3f}" if "host_ms" in r else ""
                L.append(f"| {r['model']} | {r['K']}→{r['N']} | {r['route']} | {r['ms']:.3f} | {r['TFLOPs']:.0f} | "
                         f"{r['speed_vs_bf16']:.2f} | {host} |")
        L.append("")
    if "gemm" in results:
        L += ["## GEMMs alone (inputs already quantized)", "",
              "| model | K→N | kernel | ms | TFLOP/s | × bf16 speed |", "|---|---|---|---|---|---|"]
        for r in results["gemm"]:
            if "error" in r:
                L.append(f"| {r['model']} | {r['K']}→{r['N']} | {r['kernel']} | error: {r['error'][:80]} | | |")
            else:
                L.append(f"| {r['model']} | {r['K']}→{r['N']} | {r['kernel']} | {r['ms']:.3f} | {r['TFLOPs']:.0f} | {r['speed_vs_bf16']:.2f} |")
        L.append("")
        if results.get("gemm_checks"):
            L += ["Full-shape spot checks (first 256 rows, fp32 out, vs dequantized reference): "
                  + ", ".join(f"{c['kernel']} {c['K']}→{c['N']}: {c['rel_err']:.1e}" for c in results["gemm_checks"]), ""]
    L += _w8a8_bound(results)
    if "quantize" in results:
        L += ["## Fused quantize (Hadamard + quantize; rows marked + outlier count also count outliers, k_sigma 8)", "",
              "Best of three `do_bench` medians per kernel (single ~0.1 ms medians varied by up to 1.5× between runs). "
              "GB/s over the bytes the op must move (read x once, write outputs); for NVFP4 also over the bytes it "
              "does move (its amax pre-pass reads x a second time).", "",
              "| K | kernel | ms | GB/s (required) | % copy | GB/s (moved) | % copy (moved) |", "|---|---|---|---|---|---|---|"]
        for r in results["quantize"]:
            if "error" in r:
                L.append(f"| {r['K']} | {r['kernel']} | error: {r['error'][:80]} | | | | |")
            else:
                mv = f"{r['GBps_moved_bytes']:.0f} | {r['frac_of_copy_moved']:.0%}" if "GBps_moved_bytes" in r else " | "
                L.append(f"| {r['K']} | {r['kernel']} | {r['ms']:.4f} | {r['GBps_required_bytes']:.0f} | {r['frac_of_copy']:.0%} | {mv} |")
        L.append("")
    if results.get("norm"):
        L += ["## Per-head q/k LayerNorm (strided `[2, heads, S, 64]` bf16 view, as in CogVideoX's attention)", "",
              "| model | shape | PyTorch `nn.LayerNorm` ms | sixbit `layer_norm_rows` ms | speed-up | GB/s | rel. err |",
              "|---|---|---|---|---|---|---|"]
        L += [f"| {r['model']} | {r['shape']}{' + rotary' if r.get('op') else ''} | {r['torch_ms']:.3f} | "
              f"{r['sixbit_ms']:.3f} | {r['speedup']:.1f}× | {r['GBps']:.0f} | {r['rel_err_vs_torch']:.1e} |"
              for r in results["norm"]]
        L += ["", "(rows \"+ rotary\": PyTorch's LayerNorm then diffusers' `apply_rotary_emb` on the video tokens, "
              "against `layer_norm_rows(..., rope=...)`)", ""]
    if results.get("bookkeeping"):
        L += ["## Engine bookkeeping per computed block (torch reference vs kernels)", "",
              "Video stream [2, S, width] + text stream [2, 226, width], bf16; relative error of the sums "
              "(outlier count: 0 = equal counts).", "",
              "| model | op | torch ms | sixbit ms | speed-up | GB/s | rel. err |", "|---|---|---|---|---|---|---|"]
        L += [f"| {r['model']} | {r['op']} | {r['torch_ms']:.3f} | {r['sixbit_ms']:.3f} | {r['speedup']:.1f}× | "
              f"{r['GBps']:.0f} | {r['rel_err_vs_torch']:.1e} |" for r in results["bookkeeping"]]
        L.append("")
    bits = [r for r in results.get("linear", []) if "nvfp4_bits_per_weight" in r]
    if bits:
        L += ["## Weight storage", "", "| K→N | NVFP4 bits/weight (codes + e4m3 scales + fp32 tensor scale) | INT8 bits/weight |",
              "|---|---|---|"]
        L += [f"| {r['K']}→{r['N']} | {r['nvfp4_bits_per_weight']:.6f} | {r['int8_bits_per_weight']:.6f} |" for r in bits]
        L.append("")
    if "tuning" in results:
        L += ["## Tile configs tried (`--tune`; ms on 1920→5760 and 12288→3072; rows: K 1920; rows_long: "
              "K 3072, 7680, 12288)", ""]
        for name, t in results["tuning"].items():
            cands = "; ".join(
                f"{tuple(c['config'])}: " + (", ".join(f"{v:.3f}" for v in c["ms"].values()) if "ms" in c else c["error"][:60])
                for c in t["candidates"])
            L.append(f"- {name}: best {tuple(t['best']) if t['best'] else None} — {cands}")
        L.append("")
    if results.get("errors"):
        L += ["## Errors", "", "```", *results["errors"], "```", ""]
    path.write_text("\n".join(L))


def _w8a8_bound(results):
    """W8A8 end to end against what its two parts allow: the GEMM alone plus the INT8 quantize, measured and
    at device-copy speed (the least a separate pass over the activations can take)."""
    lin = {(r["K"], r["N"], r["route"]): r for r in results.get("linear", []) if "ms" in r}
    gem = {(r["K"], r["N"], r["kernel"]): r for r in results.get("gemm", []) if "ms" in r}
    qnt = {r["K"]: r for r in results.get("quantize", []) if r.get("kernel") == Q_INT8 and "ms" in r}
    rows = []
    for model, _, K, N in SHAPES:
        try:
            bf, e2e = lin[(K, N, "bf16 cuBLAS")]["ms"], lin[(K, N, "w8a8")]["ms"]
            g, q = gem[(K, N, TMA_GEMM)]["ms"], qnt[K]["ms"]
        except KeyError:
            continue
        qc = q * qnt[K]["frac_of_copy"]  # its required bytes at copy speed (frac_of_copy = bytes / t / copy)
        fp8 = gem.get((K, N, CUBLAS_FP8), {}).get("ms")
        rows.append(f"| {model} | {K}→{N} | {bf:.3f} | {e2e:.3f} ({bf / e2e:.2f}×) | {g:.3f} | {q:.3f} | {qc:.3f} | "
                    f"{bf / (g + qc):.2f}× | {f'{fp8:.3f}' if fp8 else ''} |")
    if not rows:
        return []
    return ["## W8A8: end to end against its parts", "",
            "bf16 and W8A8 end to end from the first table; GEMM alone (TMA) and INT8 quantize from their own "
            "sections (same run). *Bound*: bf16 ÷ (GEMM alone + the quantize's bytes at device-copy speed) — the "
            "most a separate quantize pass in front of this GEMM can give.", "",
            "| model | K→N | bf16 ms | W8A8 q+GEMM ms | GEMM alone ms | quantize ms | quantize at copy speed ms | "
            "bound | cuBLAS fp8 GEMM ms |", "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--M", type=int, default=35552)
    ap.add_argument("--hb", type=int, default=64, help="Hadamard block size")
    ap.add_argument("--rep", type=int, default=100, help="do_bench rep (ms)")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--sections", default="linear,quantize,norm,bookkeeping,gemm")
    ap.add_argument("--tests-log", default=None, help="pytest log whose summary goes into the markdown")
    ap.add_argument("--out", default="benchmarks/results/kernels_h200")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU + TRITON_INTERPRET=1, tiny shapes: exercises the script, measures nothing")
    args = ap.parse_args()
    global DEV, SHAPES, TUNE_SHAPES
    if args.smoke:
        if not common.interpreting():
            sys.exit("--smoke needs TRITON_INTERPRET=1 set before the start")
        DEV = "cpu"
        SHAPES = [("2B", "qkv (fused)", 128, 384), ("2B", "attn out", 128, 128), ("5B", "ff out", 768, 192)]
        TUNE_SHAPES = [SHAPES[0]]
        ROW_SHAPES.update(rows=[("2B", "qkv", 128, 0)], rows_long=[("5B", "ff out", 768, 0)])
        args.M = min(args.M, 40)
        for name in TUNE:
            TUNE[name] = (TUNE[name][0], TUNE[name][1][:1])
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/kernels.py needs a CUDA GPU (or --smoke)")
    torch.manual_seed(0)
    results = {
        "env": {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "CPU (smoke run, interpreter)",
                "capability": list(torch.cuda.get_device_capability()) if DEV == "cuda" else None,
                "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "command": "python " + " ".join(sys.argv), "compute_path": ops.compute_path(DEV)},
        "M": args.M, "hb": args.hb, "rep_ms": args.rep, "errors": [],
    }
    if args.tests_log and Path(args.tests_log).exists():
        lines = Path(args.tests_log).read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("FAILED", "ERROR")) or " passed" in ln or " failed" in ln]
        results["tests"] = "\n".join(keep[-40:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.with_suffix(".json").write_text(json.dumps(results, indent=1))
        write_md(results, out.with_suffix(".md"))

    steps = [("ceilings", lambda: results.__setitem__("ceilings", ceilings(args.rep))),
             ("ptx", lambda: validate_ptx(results))]
    if args.tune:
        steps.append(("tune", lambda: tune(args.M, max(40, args.rep // 2), args.hb, results)))
    secs = args.sections.split(",")
    if "linear" in secs:
        steps.append(("linear", lambda: bench_linear(args.M, args.rep, args.hb, results)))
    if "quantize" in secs:
        steps.append(("quantize", lambda: bench_quantize(args.M, args.rep, args.hb, results["ceilings"]["copy_GBps"], results)))
    if "norm" in secs:
        steps.append(("norm", lambda: bench_norm(args.M, args.rep, results)))
    if "bookkeeping" in secs:
        steps.append(("bookkeeping", lambda: bench_bookkeeping(args.M, args.rep, results)))
    if "gemm" in secs:
        steps.append(("gemm", lambda: bench_gemms(args.M, args.rep, args.hb, results)))
    for name, fn in steps:
        t0 = time.time()
        try:
            fn()
        except Exception:
            results["errors"].append(f"{name}: {traceback.format_exc()[-1500:]}")
            log(f"section {name} FAILED:\n{traceback.format_exc()}")
        log(f"section {name} done in {time.time() - t0:.1f} s")
        results["final_configs"] = {"w4": {str(k): list(v) for k, v in g4.CUDA_CONFIGS.items()},
                                    "w4_decoded_once": list(g4.CUDA_DENSE_W_CONFIG),
                                    "w8a8": list(g8.CUDA_CONFIG), "w8a8_tma": list(g8.CUDA_TMA_CONFIG),
                                    "w8a8_tma_default": g8.TMA, "rows": list(hq.CUDA_ROWS_CONFIG),
                                    "nvfp4_tiles": list(hq.CUDA_NVFP4_CONFIG), "ptx_decode": common.PTX_DECODE}
        save()
    results["log"] = LOG
    save()


if __name__ == "__main__":
    main()
