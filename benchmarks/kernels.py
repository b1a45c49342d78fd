"""Kernel benchmark: fused quantize, NVFP4/INT8 GEMMs and quantize+GEMM against bf16 cuBLAS.

Run on a CUDA GPU (written for the H200, sm_90) from the repository root::

    python -m benchmarks.kernels --tune --out benchmarks/results/kernels_h200

Sections live in ``benchmarks/kernels_*.py`` (common, tune, quant, gemm, linear, engine, report); tuning hands
its picks on as explicit ``Target`` config overrides (``sixbit_kernels.targets``), never through kernel
module state.

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
import platform
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
import triton

from benchmarks.kernels_common import Run, ceilings, ops, sk
from benchmarks.kernels_engine import bench_bookkeeping, bench_norm
from benchmarks.kernels_gemm import bench_gemms
from benchmarks.kernels_linear import bench_linear
from benchmarks.kernels_quant import bench_quantize
from benchmarks.kernels_report import write_md
from benchmarks.kernels_tune import TUNE, tune, validate_ptx


def smoke_run(args) -> Run:
    """CPU + interpreter, tiny shapes: exercises the script, measures nothing."""
    shapes = [("2B", "qkv (fused)", 128, 384), ("2B", "attn out", 128, 128), ("5B", "ff out", 768, 192)]
    return Run(dev="cpu", M=min(args.M, 40), rep=args.rep, hb=args.hb, shapes=shapes, tune_shapes=[shapes[0]],
               row_shapes={"rows": [("2B", "qkv", 128, 0)], "rows_long": [("5B", "ff out", 768, 0)]},
               tune_lists={name: (mode, cands[:1]) for name, (mode, cands) in TUNE.items()})


def main(argv=None):
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
    args = ap.parse_args(argv)
    if args.smoke:
        if not sk._common.interpreting():
            sys.exit("--smoke needs TRITON_INTERPRET=1 set before the start")
        run = smoke_run(args)
    elif not torch.cuda.is_available():
        sys.exit("python -m benchmarks.kernels needs a CUDA GPU (or --smoke)")
    else:
        run = Run(M=args.M, rep=args.rep, hb=args.hb)
    torch.manual_seed(0)
    cuda = run.dev == "cuda"
    results = {
        "env": {"gpu": torch.cuda.get_device_name() if cuda else "CPU (smoke run, interpreter)",
                "capability": list(torch.cuda.get_device_capability()) if cuda else None,
                "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "command": "python -m benchmarks.kernels " + " ".join(sys.argv[1:] if argv is None else argv),
                "compute_path": ops.compute_path(run.dev)},
        "M": run.M, "hb": run.hb, "rep_ms": run.rep, "shapes": run.shapes, "errors": [],
    }
    if args.tests_log and Path(args.tests_log).exists():
        lines = Path(args.tests_log).read_text().splitlines()
        keep = [ln for ln in lines if ln.startswith(("FAILED", "ERROR")) or " passed" in ln or " failed" in ln]
        results["tests"] = "\n".join(keep[-40:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
        write_md(results, out.with_suffix(".md"))

    steps = [("ceilings", lambda: results.__setitem__("ceilings", ceilings(run))),
             ("ptx", lambda: validate_ptx(run, results))]
    if args.tune:
        steps.append(("tune", lambda: tune(run, results)))
    secs = args.sections.split(",")
    sections = {"linear": lambda: bench_linear(run, results),
                "quantize": lambda: bench_quantize(run, results["ceilings"]["copy_GBps"], results),
                "norm": lambda: bench_norm(run, results), "bookkeeping": lambda: bench_bookkeeping(run, results),
                "gemm": lambda: bench_gemms(run, results)}
    steps += [(name, fn) for name, fn in sections.items() if name in secs]
    for name, fn in steps:
        t0 = time.time()
        try:
            fn()
        except Exception:
            results["errors"].append(f"{name}: {traceback.format_exc()[-1500:]}")
            run.log(f"section {name} FAILED:\n{traceback.format_exc()}")
        run.log(f"section {name} done in {time.time() - t0:.1f} s")
        results["final_target"] = asdict(run.target)
        save()
    results["log"] = run.lines
    save()


if __name__ == "__main__":
    main()
