"""Kernel benchmark, report: the markdown written next to the JSON."""

from __future__ import annotations

from pathlib import Path

from benchmarks.kernels_common import CUBLAS_FP8, Q_INT8, TMA_GEMM


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
    if "w8a8_tma_faster" in results:
        L += [f"W8A8 TMA variant faster than pointer loads in the tune: {results['w8a8_tma_faster']}.", ""]
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
    for model, _, K, N in results["shapes"]:
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
