"""Kernel benchmark, quantize section: every fused Hadamard + quantize kernel at each K (time, GB/s over the
bytes it must move and over the bytes it does move, fraction of device-copy bandwidth)."""

from __future__ import annotations

from benchmarks.kernels_common import Q_INT8, Run, hq, spec


def bench_quantize(run: Run, copy_gbs, results):
    rows = []
    for K in sorted({s[2] for s in run.shapes}):
        _quantize_at(run, run.M, K, run.rep, run.hb, copy_gbs, rows)
        run.empty_cache()
    results["quantize"] = rows


def _quantize_at(run, M, K, rep, hb, copy_gbs, rows):
    tg = run.target
    x = run.gen((M, K), 11, outlier_cols=(3, K // 3))
    e = M * K
    cases = [
        (Q_INT8, lambda: hq.quantize_int8_act(x, hb, target=tg), 2 * e + e + 4 * M, None),
        ("int8 (codes int8), one padded tile per token (no two-tile split)",
         lambda: hq.quantize_int8_act(x, hb, split=False, target=tg), 2 * e + e + 4 * M, None),
        ("int8 (codes int8) + outlier count", lambda: hq.quantize_int8_act(x, hb, 8.0, target=tg), 2 * e + e + 4 * M, None),
        ("int8 (codes as fp16, Hopper W4A8 operand)", lambda: hq.quantize_int8_act(x, hb, dense=True, target=tg),
         2 * e + 2 * e + 4 * M, None),
        ("nvfp4 amax pre-pass", lambda: hq.nvfp4_amax(x, hb, target=tg), 2 * e, None),
        ("nvfp4 (packed codes), pre-pass + quantize", lambda: hq.quantize_nvfp4_act(x, hb, target=tg),
         2 * e + e // 2 + e // 16, 2 * e + 2 * e + e // 2 + e // 16),
        ("nvfp4 (values as fp16, Hopper W4A4 operand), pre-pass + quantize",
         lambda: hq.quantize_nvfp4_act(x, hb, dense=True, target=tg),
         2 * e + 2 * e + e // 16, 2 * e + 2 * e + 2 * e + e // 16),
        ("nvfp4 (values as fp16), pre-pass + quantize + outlier count",
         lambda: hq.quantize_nvfp4_act(x, hb, 8.0, dense=True, target=tg),
         2 * e + 2 * e + e // 16, 2 * e + 2 * e + 2 * e + e // 16),
        ("w4a16 rotate → bf16 [hi|lo]", lambda: hq.rotate_split(x, hb, target=tg), 2 * e + 4 * e, None),
        ("w4a16 rotate → fp16 scaled per token", lambda: hq.scale16_act(x, hb, target=tg), 2 * e + 2 * e + 4 * M, None),
        ("outlier count only", lambda: hq.outlier_count(x, 8.0, target=tg), 2 * e, None),
        ("torch eager: per-token int8 (no rotation)", lambda: spec.quantize_int8(x, check_finite=False),
         2 * e + e + 4 * M, None),
    ]
    for name, fn, need, moved in cases:
        try:
            t = min(run.bench(fn, rep) for _ in range(3))  # ~0.1 ms kernels: best of 3 medians
            r = {"K": K, "kernel": name, "ms": t, "GBps_required_bytes": need / (t * 1e-3) / 1e9}
            r["frac_of_copy"] = r["GBps_required_bytes"] / copy_gbs
            if moved:
                r["GBps_moved_bytes"] = moved / (t * 1e-3) / 1e9
                r["frac_of_copy_moved"] = r["GBps_moved_bytes"] / copy_gbs
            rows.append(r)
            run.log(f"quant K={K} {name}: {t:.4f} ms, {r['GBps_required_bytes']:.0f} GB/s ({r['frac_of_copy']:.0%} of copy)")
        except Exception as e:
            rows.append({"K": K, "kernel": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            run.log(f"quant K={K} {name}: FAILED {e}")
