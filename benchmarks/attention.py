"""Attention benchmark: sixbit's 8-bit attention against cuDNN and flash SDPA (bf16), same run, same inputs.

Run on a CUDA GPU (written for the H200) from the repository root::

    python -m benchmarks.attention --out benchmarks/results/attention_h200

Shapes: CogVideoX-2B and -5B joint attention (B = 2 with CFG batched, 30 / 48 heads, S = 17,776 =
17,550 video + 226 text tokens, head dim 64) and a Wan2.1-1.3B 480p self-attention (B = 1, 12 heads,
S = 32,760, head dim 128). Per shape, ``triton.testing.do_bench`` medians (after warm-up) of cuDNN SDPA,
flash SDPA, the 8-bit attention end to end (K/V pass + attention, Q quantized inside), the attention
kernel alone on pre-quantized K/V and the K/V pass alone; TFLOP/s = 4·B·H·S²·D / time; relative L2
error against fp32 attention on 256 random query rows (all keys), on N(0, 1) inputs and with 5 K channels
scaled ×20. ``--sweep`` first times a grid of tile configs (BLOCK_M, BLOCK_N, warps, stages) and the
speed options on the 2B shape (and a smaller grid at head dim 128) and uses the fastest.

``--variants`` instead times only the kernel's speed variants (:data:`SPEED_VARIANTS`: the polynomial
``exp2`` on the FMA units, ``exp2_poly``, and tile sizes / stages / warps) at the 2B shape against cuDNN SDPA
in the same run and on the same inputs — the kernel alone on pre-quantized K/V, the whole call, and the
relative L2 error vs fp32 of each — in about two minutes on an H200::

    python -m benchmarks.attention --variants --out benchmarks/results/attention_variants_h200

``--variants tiles`` times :data:`TILE_VARIANTS` instead (256-key tiles, the pipelined loop, the 16 bf16 K channels
at the new tile; session 21: ``attention_variants_h200_s21``), with the compiled kernel's registers and spills and the
relative L2 with K outlier channels too. ``--variants terms`` times :data:`TERMS_VARIANTS` (session 39: the second e4m3
terms, ``residual_channels`` / ``v_residual``, at today's tile and at tiles that need less shared memory).

``--rounds R`` (default 1) times every row of a shape R times, interleaved (round 1 times each row once, then
round 2, …; from round 2 on, each round in its own seeded shuffled order): a row's ms is the median of its R do_bench
medians and its × cuDNN the median of the R paired ratios (min–max shown) — on the H100s of sessions 36–37 one
do_bench median of the same call moved ±3–10 % between rounds (power capping), and in a fixed order the position
of a row in the round shaped its number (``hopper_probe.py pvorder``).

Writes ``<out>.json`` and ``<out>.md`` (device, versions, command); a section that fails is recorded.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import sixbit_kernels as sk
from sixbit import formats as spec

fa = sk.attention_fp8

SHAPES = [("CogVideoX-2B", 2, 30, 17776, 64), ("CogVideoX-5B", 2, 48, 17776, 64),
          ("Wan2.1-1.3B 480p", 1, 12, 32760, 128)]
#: the 8-bit variants timed at every shape: (name, qk, rotate, hi_channels)
VARIANTS = [("fp8", "fp8", False, 0), ("int8+rot QK", "int8", True, 0),
            ("fp8 + 16 K channels bf16", "fp8", False, 16)]
ERR_ROWS = 256
#: ``--variants``: (name, (BLOCK_M, BLOCK_N, num_warps, num_stages), tma, exp2_poly); the first is the default
_TILES = [("", (128, 128, 4, 3), True), (", 2 stages", (128, 128, 4, 2), True), (", 4 stages", (128, 128, 4, 4), True),
          (", BN 64", (128, 64, 4, 3), True), (", BM 64", (64, 128, 4, 3), True)]
SPEED_VARIANTS = [(f"exp2 1/{poly} poly{t}" if poly else f"exp2 MUFU{t}", cfg, tma, poly)
                  for poly in (0, 4, 2, 1) for t, cfg, tma in (_TILES if poly in (0, 4, 2) else _TILES[:1])]
#: ``--variants tiles``: key blocks of 256 and the software-pipelined loop (docs/ATTENTION.md, session 21); rows as
#: SPEED_VARIANTS plus a dict of further ``attention_fp8`` options. In the sm_90 SASS the default tile's 12 wgmma
#: per key block each wait for the previous (255 registers); the 256-key tiles keep them in flight (244–247)
TILE_VARIANTS = [("(128, 128) tile of sessions 9-20", (128, 128, 4, 3), True, 0, {}),
                 ("BN 256, BM 64, 2 stages", (64, 256, 4, 2), True, 0, {}),
                 ("BN 256, BM 64, 3 stages (default since session 21)", (64, 256, 4, 3), True, 0, {}),
                 ("BN 256, BM 64, 3 stages, pointer loads", (64, 256, 4, 3), False, 0, {}),
                 ("BN 256, BM 64, 3 stages, exp2 1/4 poly", (64, 256, 4, 3), True, 4, {}),
                 ("BN 256, BM 64, 3 stages, exp2 1/2 poly", (64, 256, 4, 3), True, 2, {}),
                 ("BN 256, BM 64, 3 stages, 16 K channels bf16", (64, 256, 4, 3), True, 0, {"hi_channels": 16}),
                 ("BN 256, BM 128 on 8 warps, 3 stages", (128, 256, 8, 3), True, 0, {}),
                 ("BM 64, pipelined loop", (64, 128, 4, 3), True, 0, {"pipelined": True})]
#: ``--variants terms``: second e4m3 terms (session 39, docs/ATTENTION.md "Session 39"): K's 16 / 32 largest channels
#: in QKᵀ and V's residual in P·V, at the default tile and at tiles with fewer stages or keys (each stage holds two
#: more operand tiles: 64 KB per 256-key stage with 32 channels and V's residual, against 32; cross-compiled for sm_90,
#: the 3-stage 256-key tile needs 205 KB of shared memory — one program per SM —, the 128-key one 107 KB, like today's)
_RES = {"residual_channels": 32, "v_residual": True}
_RES16 = {"residual_channels": 16, "v_residual": True}
TERMS_VARIANTS = [("default (one term)", (64, 256, 4, 3), True, 0, {}),
                  ("32 K channels + V residual", (64, 256, 4, 3), True, 0, _RES),
                  ("32 K channels + V residual, 2 stages", (64, 256, 4, 2), True, 0, _RES),
                  ("32 K channels + V residual, BN 128", (64, 128, 4, 3), True, 0, _RES),
                  ("16 K channels + V residual", (64, 256, 4, 3), True, 0, _RES16),
                  ("16 K channels + V residual, BN 128", (64, 128, 4, 3), True, 0, _RES16),
                  ("16 K channels (the QKᵀ term's cost)", (64, 256, 4, 3), True, 0, {"residual_channels": 16}),
                  ("V residual (the P·V term's cost)", (64, 256, 4, 3), True, 0, {"v_residual": True}),
                  ("16 K channels + V residual on the heads with K outliers (residual_ratio 3)", (64, 256, 4, 3), True,
                   0, {**_RES16, "residual_ratio": 3.0})]
VARIANT_SETS = {"exp2": SPEED_VARIANTS, "tiles": TILE_VARIANTS, "terms": TERMS_VARIANTS}
#: a variant row's options that belong to the K/V pass (``quantize_kv``), not to ``attention_fp8``
KV_OPTIONS = ("hi_channels", "residual_channels", "v_residual", "residual_ratio")


def _ms(fn, *args, **kwargs):
    """do_bench median of ``fn(*args, **kwargs)`` in ms, after one untimed call (compiles)."""
    fn(*args, **kwargs)
    torch.cuda.synchronize()
    return do_bench(lambda: fn(*args, **kwargs), warmup=25, rep=100, return_mode="median")


def _tflops(B, H, S, D, ms):
    return 4 * B * H * S * S * D / (ms * 1e-3) / 1e12


def _inputs(B, H, S, D, outliers: bool, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, device=device, dtype=torch.bfloat16, generator=g) for _ in range(3))
    if outliers:
        k[..., :5] *= 20
    return q, k, v


def _fp32_rows(q, k, v, rows):
    """fp32 attention of the query rows ``rows`` over all keys, head by head."""
    out = torch.empty(q.shape[0], q.shape[1], len(rows), q.shape[3], device=q.device)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = q[b, h, rows].float() @ k[b, h].float().T / q.shape[-1] ** 0.5
            out[b, h] = torch.softmax(s, -1) @ v[b, h].float()
    return out


def _sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def sweep(B, H, S, D, grid, log):
    """Time the fp8 kernel (pre-quantized K/V) over ``grid`` (config + tma); returns (rows, fastest row)."""
    q, k, v = _inputs(B, H, S, D, False)
    rows, kvs = [], {}
    for *cfg, tma in grid:
        cfg = tuple(cfg)
        try:
            kv = kvs.setdefault(cfg[1], fa.quantize_kv(k, v, block_n=cfg[1]))
            ms = _ms(fa.attention_fp8, q, kv, config=cfg, tma=tma)
            rows.append({"config": list(cfg), "tma": tma, "ms": ms, "tflops": _tflops(B, H, S, D, ms)})
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: recorded, not fatal
            rows.append({"config": list(cfg), "tma": tma, "error": f"{type(e).__name__}: {str(e)[:200]}"})
        log(f"  sweep D={D} {rows[-1]}")
    best = min((r for r in rows if "ms" in r), key=lambda r: r["ms"])
    return rows, best


def variants(name, B, H, S, D, grid, log, *, device="cuda", timer=_ms, baseline=None):
    """Each speed variant of ``grid`` (:data:`SPEED_VARIANTS` / :data:`TILE_VARIANTS` rows) at one shape against
    ``baseline`` (default cuDNN SDPA bf16), same inputs, same run: the kernel alone on pre-quantized K/V, the whole
    call (K/V pass + attention), × baseline for both, and the relative L2 error of the whole call vs fp32 on ERR_ROWS
    rows, on N(0, 1) inputs and with 5 K channels ×20. A row's options dict may hold K/V-pass options
    (:data:`KV_OPTIONS`) besides ``attention_fp8``'s. A variant that fails (compile, shared memory) is recorded, the
    others run."""
    baseline = baseline or _sdpa(SDPBackend.CUDNN_ATTENTION)
    q, k, v = _inputs(B, H, S, D, False, device=device)
    qo, ko, vo = _inputs(B, H, S, D, True, device=device)
    idx = torch.randperm(S, generator=torch.Generator().manual_seed(1))[:ERR_ROWS].sort().values.to(device)
    ref, ref_o = _fp32_rows(q, k, v, idx), _fp32_rows(qo, ko, vo, idx)
    base_ms = timer(baseline, q, k, v)
    res = {"shape": name, "B": B, "H": H, "S": S, "D": D, "baseline": "cuDNN SDPA bf16", "baseline_ms": base_ms,
           "baseline_tflops": _tflops(B, H, S, D, base_ms),
           "baseline_rel_l2": float(spec.relative_error(baseline(q, k, v)[:, :, idx], ref)), "rows": []}
    for vname, cfg, tma, poly, *more in grid:
        extra = dict(more[0]) if more else {}
        kvo = {key: extra.pop(key) for key in KV_OPTIONS if key in extra}
        row = {"variant": vname, "config": list(cfg), "tma": tma, "exp2_poly": poly, "hi_channels": 0, **kvo,
               **extra}
        try:
            opts = dict(config=tuple(cfg), tma=tma, exp2_poly=poly, **extra)
            kv = fa.quantize_kv(k, v, block_n=cfg[1], **kvo)
            row["kernel_ms"] = timer(fa.attention_fp8, q, kv, **opts)
            compiled = fa.LAST_LAUNCH.get("kernel")
            for key in ("n_regs", "n_spills"):
                if isinstance(getattr(compiled, key, None), int):
                    row[key] = getattr(compiled, key)
            row["whole_ms"] = timer(fa.fp8_attention, q, k, v, **kvo, **opts)
            row["rel_l2"] = float(spec.relative_error(fa.fp8_attention(q, k, v, **kvo, **opts)[:, :, idx], ref))
            row["rel_l2_outliers"] = float(spec.relative_error(
                fa.fp8_attention(qo, ko, vo, **kvo, **opts)[:, :, idx], ref_o))
            row.update(kernel_tflops=_tflops(B, H, S, D, row["kernel_ms"]), kernel_x=base_ms / row["kernel_ms"],
                       whole_x=base_ms / row["whole_ms"])
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        res["rows"].append(row)
        log(f"  variants {name}: {row}")
    return res


def variants_markdown(res):
    lines = [f"## Speed variants at {res['shape']} (B={res['B']}, H={res['H']}, S={res['S']}, D={res['D']})", "",
             f"Baseline {res['baseline']}: {res['baseline_ms']:.2f} ms, {res['baseline_tflops']:.0f} TFLOP/s, rel. L2 "
             f"{res['baseline_rel_l2']:.2%}. *kernel*: the attention kernel on pre-quantized K/V; *whole*: K/V pass + "
             "attention (what the processor calls); × = baseline ms / variant ms.", "",
             "| variant | config (BM, BN, warps, stages) | tma | exp2_poly | kernel ms | kernel TFLOP/s | kernel × | "
             "whole ms | whole × | rel. L2 | rel. L2 K outliers | registers (spills) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            cells = [f"failed: `{r['error'][:80]}`"] + ["—"] * 7
        else:
            cells = [f"{r['kernel_ms']:.2f}", f"{r['kernel_tflops']:.0f}", f"{r['kernel_x']:.2f}", f"{r['whole_ms']:.2f}",
                     f"**{r['whole_x']:.2f}**", f"{r['rel_l2']:.2%}",
                     f"{r['rel_l2_outliers']:.2%}" if "rel_l2_outliers" in r else "—",
                     f"{r['n_regs']} ({r.get('n_spills', 0)})" if "n_regs" in r else "—"]
        lines.append(f"| {r['variant']} | {tuple(r['config'])} | {r['tma']} | {r['exp2_poly']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _torch_stats(k, v):
    """The K/V statistics as sessions ≤ 22 computed them: the spec's torch reductions, then V's scales."""
    mean, vamax = spec.attention_kv_stats(k, v)
    return mean, vamax, spec.attention_scale(vamax, "fp8")[1].reshape(-1, vamax.shape[-1]).contiguous()


def kv_pass_parts(name, k, v, block_n, log, timer=_ms):
    """The fp8 K/V pass taken apart (same inputs, same run): its statistics by the torch reductions of sessions
    ≤ 22 and by ``kv_stats`` (also V alone, what is left once K's sums come from elsewhere), the quantize kernel
    given the statistics, and the whole pass with the torch statistics."""
    parts = {"K/V statistics, torch (sessions ≤ 22)": lambda: _torch_stats(k, v),
             "K/V statistics, kernel": lambda: fa.kv_stats(k, v),
             "V statistics alone, kernel (no smoothing)": lambda: fa.kv_stats(k, v, smooth=False),
             "quantize kernel alone (given statistics)": lambda st=fa.kv_stats(k, v): fa.quantize_kv(
                 k, v, block_n=block_n, stats=st),
             "K/V pass with the torch statistics (sessions ≤ 22)": lambda: fa.quantize_kv(
                 k, v, block_n=block_n, stats=_torch_stats(k, v))}
    rows = []
    for part, fn in parts.items():
        row = {"method": f"8-bit fp8: {part}"}
        try:
            row["ms"] = timer(fn)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        log(f"  {name}: {row}")
    return rows


def _raises(e):
    def fn():
        raise e
    return fn


def _time_rounds(jobs, rounds, log, name):
    """``jobs`` = [(row, fn)]: each row gets ``ms`` (the median over ``rounds`` interleaved do_bench medians) and
    ``ms_rounds``, or ``error``; every fn runs once (compiles) before the first round."""
    live = []
    for row, fn in jobs:
        try:
            fn()
            live.append((row, fn))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    torch.cuda.synchronize()
    for row, _ in live:
        row["ms_rounds"] = []
    for r in range(rounds):
        order = list(live)
        if r:
            random.Random(r).shuffle(order)
        for row, fn in order:
            row["ms_rounds"].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        log(f"  {name}: round {r + 1}/{rounds} done")
    for row, _ in live:
        row["ms"] = statistics.median(row["ms_rounds"])


def measure_shape(name, B, H, S, D, best, log, rounds=1):
    cfg = tuple(best["config"])
    opts = dict(tma=best["tma"])
    res = {"shape": name, "B": B, "H": H, "S": S, "D": D, "config": list(cfg), **opts, "rows": []}
    g = torch.Generator().manual_seed(1)
    rows_idx = torch.randperm(S, generator=g)[:ERR_ROWS].sort().values.cuda()
    methods = {"cuDNN SDPA bf16": _sdpa(SDPBackend.CUDNN_ATTENTION),
               "flash SDPA bf16": _sdpa(SDPBackend.FLASH_ATTENTION)}
    vcfg = {vname: fa.default_config(D, int8_rotate=True) if qk == "int8" and rot else cfg
            for vname, qk, rot, _ in VARIANTS}  # int8 + rotation keeps 128-key tiles (attention_fp8.INT8_ROTATE_CONFIGS)
    for vname, qk, rot, hi in VARIANTS:
        methods[f"8-bit {vname} (K/V pass + attention)"] = (
            lambda q, k, v, qk=qk, rot=rot, hi=hi, c=vcfg[vname]: fa.fp8_attention(q, k, v, qk=qk, rotate=rot, config=c,
                                                                                   hi_channels=hi, **opts))
    errors = {m: {} for m in methods}
    for outl in (False, True):
        q, k, v = _inputs(B, H, S, D, outl)
        ref = _fp32_rows(q, k, v, rows_idx)
        for m, fn in methods.items():
            try:
                errors[m]["K outliers" if outl else "normal"] = float(spec.relative_error(fn(q, k, v)[:, :, rows_idx], ref))
            except Exception as e:  # noqa: BLE001
                errors[m]["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        del ref
    q, k, v = _inputs(B, H, S, D, False)
    jobs = []
    for m, fn in methods.items():
        row = {"method": m, **errors[m]}
        jobs.append((row, lambda fn=fn: fn(q, k, v)))
    for vname, qk, rot, hi in VARIANTS:
        c, kvo = vcfg[vname], dict(block_n=vcfg[vname][1], qk=qk, rotate=rot, hi_channels=hi)
        try:
            kv = fa.quantize_kv(k, v, **kvo)

            def alone(kv=kv, c=c):
                return fa.attention_fp8(q, kv, config=c, **opts)
        except Exception as e:  # noqa: BLE001  (recorded by _time_rounds)
            alone = _raises(e)
        jobs.append(({"method": f"8-bit {vname}: attention kernel alone"}, alone))
        jobs.append(({"method": f"8-bit {vname}: K/V pass alone"}, lambda kvo=kvo: fa.quantize_kv(k, v, **kvo)))
    _time_rounds(jobs, rounds, log, name)
    for row, _ in jobs:
        if "ms" in row and "K/V pass alone" not in row["method"]:
            row["tflops"] = _tflops(B, H, S, D, row["ms"])
        res["rows"].append(row)
        log(f"  {name}: { {kk: vv for kk, vv in row.items() if kk != 'ms_rounds'} }")
    res["rows"] += kv_pass_parts(name, k, v, vcfg["fp8"][1], log)
    base = next(r for r in res["rows"] if r["method"].startswith("cuDNN"))
    for r in res["rows"]:
        if "ms" in r and "ms" in base:
            r["speedup_vs_cudnn"] = base["ms"] / r["ms"]
            if len(r.get("ms_rounds", ())) > 1 and len(base.get("ms_rounds", ())) == len(r["ms_rounds"]):
                ratios = [c / t for c, t in zip(base["ms_rounds"], r["ms_rounds"])]
                r["speedup_vs_cudnn"] = statistics.median(ratios)
                r["speedup_range"] = [min(ratios), max(ratios)]
    return res


def _cell(row, key, fmt):
    cell = fmt.format(row[key]) if key in row else "—"
    if key == "speedup_vs_cudnn" and "speedup_range" in row:
        cell += " ({:.2f}–{:.2f})".format(*row["speedup_range"])
    return cell


def _rounds_note(report):
    r = report.get("rounds", 1)
    return (f", each row the median of {r} interleaved rounds (shuffled order from the second) and × cuDNN the median "
            f"of the {r} paired ratios (min–max)") if r > 1 else ""


def to_markdown(report):
    lines = [f"# 8-bit attention vs SDPA on {report['device']}", "",
             f"`{report['command']}` — torch {report['torch']}, triton {report['triton']}, CUDA "
             f"{report['cuda']}, {report['date']}", "",
             f"do_bench medians{_rounds_note(report)}; TFLOP/s = 4·B·H·S²·D / time; rel. L2 vs fp32 attention on "
             f"{ERR_ROWS} random query rows (all keys); 'K outliers' = 5 K channels ×20.", ""]
    for s in report["shapes"]:
        if "error" in s:
            lines += [f"## {s['shape']}: failed", "", f"`{s['error']}`", ""]
            continue
        lines += [f"## {s['shape']} (B={s['B']}, H={s['H']}, S={s['S']}, D={s['D']}; 8-bit config "
                  f"{tuple(s['config'])}, tma={s['tma']})", "",
                  "| method | ms | TFLOP/s | × cuDNN | rel. L2 normal | rel. L2 K outliers |",
                  "|---|---|---|---|---|---|"]
        for r in s["rows"]:
            cells = [_cell(r, key, fmt) for key, fmt in (("ms", "{:.2f}"), ("tflops", "{:.0f}"),
                     ("speedup_vs_cudnn", "{:.2f}"), ("normal", "{:.2%}"), ("K outliers", "{:.2%}"))]
            lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
        lines.append("")
    for v in report.get("variants", []):
        lines += [variants_markdown(v)] if "error" not in v else [f"## Speed variants {v['shape']}: failed", "",
                                                                  f"`{v['error']}`", ""]
    if report.get("sweep"):
        lines += ["## Tile sweep (attention kernel alone, pre-quantized K/V)", "",
                  "| D | config (BM, BN, warps, stages) | tma | ms | TFLOP/s |", "|---|---|---|---|---|"]
        for d, rows in report["sweep"].items():
            for r in rows:
                ms = f"{r['ms']:.2f} | {r['tflops']:.0f}" if "ms" in r else f"{r.get('error', '')[:60]} | —"
                lines.append(f"| {d} | {tuple(r['config'])} | {r.get('tma', '')} | {ms} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output path without extension (writes .json and .md)")
    ap.add_argument("--sweep", action="store_true", help="tune tile configs and options first")
    ap.add_argument("--shapes", default="all", help="comma-separated shape indices (default all)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each shape's rows in this many interleaved rounds (median; module docstring)")
    ap.add_argument("--variants", nargs="?", const="exp2", choices=sorted(VARIANT_SETS),
                    help="only the kernel's speed variants at the 2B shape against cuDNN: 'exp2' (SPEED_VARIANTS, "
                         "the default), 'tiles' (TILE_VARIANTS) or 'terms' (TERMS_VARIANTS)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.attention needs a CUDA GPU")
    report = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
              "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
              "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": "python -m benchmarks.attention " + " ".join(argv if argv is not None else sys.argv[1:]),
              "rounds": args.rounds, "sweep": {}, "shapes": []}

    def save():
        with open(args.out + ".json", "w") as fh:
            json.dump(report, fh, indent=1)
        with open(args.out + ".md", "w") as fh:
            fh.write(to_markdown(report))

    def log(msg):
        print(msg, flush=True)

    if args.variants:
        name, B, H, S, D = SHAPES[0]
        try:
            report["variants"] = [variants(name, B, H, S, D, VARIANT_SETS[args.variants], log)]
        except Exception:  # noqa: BLE001
            report["variants"] = [{"shape": name, "error": traceback.format_exc()[-500:]}]
        save()
        print(to_markdown(report))
        return
    idx = range(len(SHAPES)) if args.shapes == "all" else [int(i) for i in args.shapes.split(",")]
    # around the fastest of the first run (attention_h200_first.md): 4 warps per 128 rows; 8 warps only
    # as two warpgroups of 128 rows each (BLOCK_M 256)
    grids = {64: [(128, 128, 4, 3, False), (128, 128, 4, 3, True), (128, 128, 4, 4, False), (64, 128, 4, 3, False),
                  (256, 128, 8, 2, False)],
             128: [(128, 128, 8, 2, False), (128, 128, 8, 2, True), (256, 128, 8, 2, False)]}
    for D, sweep_shape in ((64, (2, 30, 17776)), (128, (1, 12, 32760))):
        best = {"config": list(fa.CONFIGS[D]), "tma": fa.TMA[D]}
        if args.sweep:
            try:
                report["sweep"][str(D)], best = sweep(*sweep_shape, D, grids[D], log)
            except Exception:  # noqa: BLE001
                report["sweep"][str(D)] = [{"config": [], "error": traceback.format_exc()[-300:]}]
            save()
        for i in idx:
            name, B, H, S, d = SHAPES[i]
            if d != D:
                continue
            try:
                report["shapes"].append(measure_shape(name, B, H, S, D, best, log, rounds=args.rounds))
            except Exception:  # noqa: BLE001
                report["shapes"].append({"shape": name, "error": traceback.format_exc()[-500:]})
            save()
            torch.cuda.empty_cache()
    print(to_markdown(report))


if __name__ == "__main__":
    main()
