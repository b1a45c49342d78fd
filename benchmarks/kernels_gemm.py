"""Kernel benchmark, GEMM section: every GEMM at the CogVideoX linear shapes on already-quantized inputs
(both W8A8 variants, cuBLAS int8/fp8 for scale, W4A4/W4A8/W4A16 decoded per tile and once), with a
full-shape spot check of each against the dequantized reference."""

from __future__ import annotations

import torch

from benchmarks.kernels_common import CUBLAS_FP8, CUBLAS_INT8, Run, g4, g8, hq, rel, spec


def bench_gemms(run: Run, results):
    rows = []
    checks = []
    for model, layer, K, N in run.shapes:
        _gemms_at(run, run.M, model, layer, K, N, run.rep, run.hb, rows, checks)
        run.empty_cache()
    results["gemm"] = rows
    results["gemm_checks"] = checks


def _gemms_at(run, M, model, layer, K, N, rep, hb, rows, checks):
    tg = run.target
    hopper, portable = run.variant("hopper"), run.variant("portable")
    x, w, b = run.gemm_case(M, K, N, seed=K + N)
    flops = 2.0 * M * N * K
    wb, bb = w.to(torch.bfloat16), b.to(torch.bfloat16)
    w4 = spec.quantize_nvfp4(w)
    w8 = spec.quantize_int8(w)
    qa, _ = hq.quantize_nvfp4_act(x, hb, target=tg)
    (v, bs, ts), _ = hq.quantize_nvfp4_act(x, hb, dense=True, target=tg)
    da4 = g4.DenseAct(v, "nvfp4", tensor_scale=ts)
    q8, _ = hq.quantize_int8_act(x, hb, target=tg)
    d8, _ = hq.quantize_int8_act(x, hb, dense=True, target=tg)
    da8 = g4.DenseAct(d8.data, "int8", row_scale=d8.scale)
    split, _ = hq.rotate_split(x, hb, target=tg)
    s16, _ = hq.scale16_act(x, hb, target=tg)
    wdec = g4.decode_weight(w4, target=tg)
    x8, w8t = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
    ones_m, ones_n = torch.ones(M, 1, device=run.dev), torch.ones(1, N, device=run.dev)
    cases = [
        ("bf16 cuBLAS F.linear", lambda: torch.nn.functional.linear(x, wb, bb), None),
        ("W8A8 int8 GEMM", lambda: g8.gemm_w8a8(q8, w8, b, target=portable), (q8, w8)),
        ("W8A8 int8 GEMM (TMA descriptors)", lambda: g8.gemm_w8a8(q8, w8, b, target=hopper), (q8, w8)),
        ("  W8A8 int8 GEMM (TMA loads, pointer-store epilogue)",
         lambda: g8.gemm_w8a8(q8, w8, b, target=hopper, tma_store=False), None),
        (CUBLAS_INT8, lambda: torch._int_mm(q8.data, w8.data.t()), None),
        (CUBLAS_FP8, lambda: torch._scaled_mm(x8, w8t, scale_a=ones_m, scale_b=ones_n, bias=bb,
                                              out_dtype=torch.bfloat16), None),
        ("W4A4 (packed 4-bit A, decoded in-kernel)", lambda: g4.gemm_w4(qa, w4, b, target=tg), (qa, w4)),
        ("W4A4 (A as exact fp16, W decoded per tile)", lambda: g4.gemm_w4(da4, w4, b, decode="tile", target=tg), (da4, w4)),
        ("W4A4 (A as exact fp16, W decoded once)", lambda: g4.gemm_w4(da4, w4, b, decode="once", target=tg), (da4, w4, "once")),
        ("W4A8 (int8 A, converted in-kernel)", lambda: g4.gemm_w4(q8, w4, b, target=tg), (q8, w4)),
        ("W4A8 (A codes as fp16, W decoded per tile)", lambda: g4.gemm_w4(da8, w4, b, decode="tile", target=tg), (da8, w4)),
        ("W4A8 (A codes as fp16, W decoded once)", lambda: g4.gemm_w4(da8, w4, b, decode="once", target=tg), (da8, w4, "once")),
        ("W4A16 (bf16 A, W decoded per tile)", lambda: g4.gemm_w4(x, w4, b, decode="tile", target=tg), (x, w4)),
        ("W4A16 (bf16 A, W decoded once)", lambda: g4.gemm_w4(x, w4, b, decode="once", target=tg), (x, w4, "once")),
        ("W4A16 (rotated fp32 A as bf16 hi|lo, W decoded once)", lambda: g4.gemm_w4(split, w4, b, target=tg), (split, w4, "once")),
        ("W4A16 (rotated A as fp16 scaled per token, W decoded once)", lambda: g4.gemm_w4(s16, w4, b, target=tg), (s16, w4, "once")),
        ("  decode_weight alone (packed → fp16 [N, K])", lambda: g4.decode_weight(w4, target=tg), None),
        ("  reference: cuBLAS fp16 on the decoded operands (no scales, no bias)", lambda: torch.mm(v, wdec.T), None),
    ]
    t_ref = None
    for name, fn, chk in cases:
        try:
            t = run.bench(fn, rep)
            t_ref = t if t_ref is None else t_ref
            r = {"model": model, "layer": layer, "K": K, "N": N, "M": M, "kernel": name, "ms": t,
                 "TFLOPs": flops / (t * 1e-3) / 1e12, "speed_vs_bf16": t_ref / t}
            rows.append(r)
            run.log(f"gemm {model} {K}->{N} {name}: {t:.4f} ms {r['TFLOPs']:.0f} TFLOP/s {r['speed_vs_bf16']:.2f}x")
            if chk is not None and (K, N) in {(k, n) for *_, k, n in run.tune_shapes}:
                checks.append(_check(run, name, chk, b, K, N))
        except Exception as e:
            rows.append({"model": model, "layer": layer, "K": K, "N": N, "kernel": name,
                         "error": f"{type(e).__name__}: {str(e)[:300]}"})
            run.log(f"gemm {model} {K}->{N} {name}: FAILED {e}")


def _check(run, name, chk, b, K, N):
    tg = run.target
    a, wq, decode = (*chk, "auto")[:3]
    n = 256
    if isinstance(a, spec.NVFP4Tensor):
        a_s = spec.NVFP4Tensor(a.data[:n], a.scales[:n], a.tensor_scale, a.orig_dtype)
        ref_a = a_s.dequantize(torch.float32)
    elif isinstance(a, spec.Int8Tensor):
        a_s = spec.Int8Tensor(a.data[:n], a.scale[:n], a.orig_dtype)
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
    if isinstance(wq, spec.NVFP4Tensor):
        y = g4.gemm_w4(a_s, wq, b, torch.float32, decode=decode, target=tg)
    else:
        y = g8.gemm_w8a8(a_s, wq, b, torch.float32, target=tg)
    ref = ref_a @ wq.dequantize(torch.float32).T + b
    e = rel(y, ref)
    run.log(f"check {name} {K}->{N}: rel err {e:.2e}")
    return {"kernel": name, "K": K, "N": N, "rows": n, "rel_err": e, "ok": e <= 1e-3}
