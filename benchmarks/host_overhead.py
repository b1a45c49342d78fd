"""Host (CPU) time of sixbit's launch wrappers per ``ops.linear`` call, with the Triton launches stubbed out.

What a benchmark loop pays in Python around the kernels, separately from Triton's own launch path and from
the GPU: ``ops.linear`` → fused quantize wrapper → GEMM wrapper (descriptors, scales, output), every
``kernel[grid](...)`` replaced by a no-op. Runs anywhere (CPU; the interpreter is imported but never runs)::

    python -m benchmarks host_overhead --out benchmarks/results/host_overhead_cpu

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, environment, parse

#: the Triton launches replaced by no-ops, per kernel module (``sixbit_kernels.<module>``)
STUBBED = {"hadamard_quant": ["_rows_kernel", "_nvfp4_kernel"],
           "gemm_w8a8": ["_gemm_w8a8_kernel"],
           "gemm_w4": ["_gemm_w4_kernel", "_gemm_dense_w_kernel", "_decode_w_kernel"]}


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks host_overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default=str(RESULTS / "host_overhead_cpu"))
    args = parse(ap, argv)
    cmd = args.command
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first imported
    from sixbit.linear import ops as kernel_ops

    ops = kernel_ops()
    for name, names in STUBBED.items():
        mod = importlib.import_module(f"sixbit_kernels.{name}")
        for n in names:
            if hasattr(mod, n):
                setattr(mod, n, _NoLaunch())
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
    env = {**environment("cpu", cmd), "cpu_count": os.cpu_count()}
    res = {"environment": env, "command": cmd, "calls": args.calls, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    L = ["# Host time of sixbit's launch wrappers per `ops.linear` call (Triton launches stubbed out)", "",
         f"`{cmd}`; 4096×1920 bf16 input, 1920→1920 layer, mean of {args.calls} calls.", "",
         "| route | µs per call |", "|---|---|", *[f"| {r['route']} | {r['us_per_call']:.1f} |" for r in rows], "",
         "- " + ", ".join(f"{k}: `{v}`" for k, v in env.items())]
    out.with_suffix(".md").write_text("\n".join(L) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
