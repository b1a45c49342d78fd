"""Kernel benchmark, end-to-end section: quantize + GEMM through ``ops.linear`` for every route (and the
packed-activation forms) against bf16 cuBLAS, with the host time per call and the weight bytes."""

from __future__ import annotations

import torch

from benchmarks.kernels_common import Run, ops


def bench_linear(run: Run, results):
    rows = []
    for model, layer, K, N in run.shapes:
        _linear_at(run, run.M, model, layer, K, N, run.rep, run.hb, rows)
        run.empty_cache()
    results["linear"] = rows


def _linear_at(run, M, model, layer, K, N, rep, hb, rows):
    x, w, b = run.gemm_case(M, K, N, seed=3 * K + N)
    wb, bb = w.to(torch.bfloat16), b.to(torch.bfloat16)
    p = ops.pack_linear(w, bb, formats=("nvfp4", "int8"), hadamard_block=hb)
    t_ref = run.bench(lambda: torch.nn.functional.linear(x, wb, bb), rep)
    flops = 2.0 * M * N * K
    rows.append({"model": model, "layer": layer, "K": K, "N": N, "route": "bf16 cuBLAS", "ms": t_ref,
                 "TFLOPs": flops / (t_ref * 1e-3) / 1e12, "speed_vs_bf16": 1.0})
    variants = ([(r, True) for r in ("w8a8", "nvfp4", "int8", "w4a8_requant", "w4a16")]
                + [("nvfp4", False), ("int8", False)])
    for route, dense in variants:
        label = route + ("" if dense or route in ("w8a8", "w4a16") else " (packed A: 4-bit/int8 decoded in-kernel)")
        opts = ops.KernelOptions(dense_activations=dense, target=run.target)
        try:
            fn = lambda route=route, opts=opts: ops.linear(x, p, route, backend="triton", options=opts)  # noqa: E731
            t = run.bench(fn, rep)
            r = {"model": model, "layer": layer, "K": K, "N": N, "route": label, "ms": t,
                 "TFLOPs": flops / (t * 1e-3) / 1e12, "speed_vs_bf16": t_ref / t, "host_ms": run.host_ms(fn)}
            rows.append(r)
            run.log(f"linear {model} {K}->{N} {label}: {t:.4f} ms {r['speed_vs_bf16']:.2f}x")
        except Exception as e:
            rows.append({"model": model, "K": K, "N": N, "route": label, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            run.log(f"linear {model} {K}->{N} {label}: FAILED {e}")
    bits = {"nvfp4_bits_per_weight": p.bits_per_weight("nvfp4"), "int8_bits_per_weight": p.bits_per_weight("int8")}
    rows[-1 - len(variants)].update(bits)
