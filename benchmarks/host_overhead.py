"""Host (CPU) time of sixbit's launch wrappers per ``ops.linear`` call, with the Triton launches stubbed out.

What a benchmark loop pays in Python around the kernels, separately from Triton's own launch path and from
the GPU: ``ops.linear`` → fused quantize wrapper → GEMM wrapper (descriptors, scales, output), every
``kernel[grid](...)`` replaced by a no-op. Runs anywhere (CPU; the interpreter is imported but never runs)::

    python benchmarks/host_overhead.py --out benchmarks/results/host_overhead_cpu

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sixbit import bench  # noqa: E402
from sixbit._kernels import kernels as sk  # noqa: E402

STUBBED = {sk.hadamard_quant: ["_rows_kernel", "_nvfp4_kernel"],
           sk.gemm_w8a8: ["_gemm_w8a8_kernel"],
           sk.gemm_w4: ["_gemm_w4_kernel", "_gemm_dense_w_kernel", "_decode_w_kernel"]}


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default="benchmarks/results/host_overhead_cpu")
    args = ap.parse_args()
    for mod, names in STUBBED.items():
        for n in names:
            if hasattr(mod, n):
                setattr(mod, n, _NoLaunch())
    ops = sk.ops
    x = torch.randn(4096, 1920).to(torch.bfloat16)
    w = torch.randn(1920, 1920) / 44
    p = ops.pack_linear(w, torch.randn(1920).to(torch.bfloat16), formats=("nvfp4", "int8"), hadamard_block=64)
    rows = []
    for route in ("w8a8", "nvfp4", "int8", "w4a16"):
        fn = lambda route=route: ops.linear(x, p, route, backend="triton")  # noqa: E731
        for _ in range(50):
            fn()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        us = (time.perf_counter() - t0) / args.calls * 1e6
        rows.append({"route": route, "us_per_call": us})
        print(f"{route}: {us:.1f} us per ops.linear call (launches stubbed)", flush=True)
    cmd = "python benchmarks/host_overhead.py " + " ".join(sys.argv[1:])
    env = {**bench.environment(torch.device("cpu")), "command": cmd, "cpu_count": os.cpu_count()}
    res = {"environment": env, "command": cmd, "calls": args.calls, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    L = ["# Host time of sixbit's launch wrappers per `ops.linear` call (Triton launches stubbed out)", "",
         f"`{cmd}`; 4096×1920 bf16 input, 1920→1920 layer, mean of {args.calls} calls.", "",
         "| route | µs per call |", "|---|---|", *[f"| {r['route']} | {r['us_per_call']:.1f} |" for r in rows], "",
         "- " + ", ".join(f"{k}: `{v}`" for k, v in env.items())]
    out.with_suffix(".md").write_text("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
