"""Host work of a regated ``"magnitude"`` skip: PyTorch operations per skipped block, per-stream vs stacked factors.

A skipped block on the GPU is host-bound (a 2B skip moves ~5–10 ms of bytes in ~60 ms): its cost is the number of
operations Python issues. This counts them (``torch.profiler``, every ``aten::`` op, nested ones included) and times
the host on a tiny CogVideoX (30 blocks, CPU, one thread), skipping every step after the third (the regated 20-step
default's reuse), with ``tdc.magnitude_ratios`` as it is (the streams' factors as one stacked chain) against the
per-stream formula it replaced (kept here as the baseline) — same run, same skips::

    python -m benchmarks skip_host_ops --out benchmarks/results

Writes ``skip_host_ops_cpu.json`` / ``.md``. The GPU saving is predicted from it, not measured here.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, env_md, environment, parse, write_results


def per_stream(delta, prev, step, last_step, prev_step, sizes=None):
    """``tdc.magnitude_ratios`` before session 28: one chain of small ops per stream."""
    from sixbit import tdc

    s = (step - last_step) / (last_step - prev_step)
    lo, hi = tdc.MAGNITUDE_CLAMP
    sizes = [tdc.l1_size(d) for d in delta] if sizes is None else sizes
    return [(a / tdc.l1_size(p).clamp_min(1e-30)).clamp(lo, hi).pow(s) for a, p in zip(sizes, prev)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks skip_host_ops", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--blocks", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = parse(ap, argv)
    import sixbit
    from sixbit import SixBitConfig, tdc
    from sixbit.testing import generate, tiny_cogvideox_pipeline

    torch.set_num_threads(1)
    stacked = tdc.magnitude_ratios
    cfg = SixBitConfig.preset("tdc_only", tdc_probe_threshold=float("inf"), tdc_first=3, tdc_last=1)
    rows = {}
    try:
        for _ in range(args.repeats):
            for name, fn in (("per_stream", per_stream), ("stacked", stacked)):
                tdc.magnitude_ratios = fn
                pipe = tiny_cogvideox_pipeline(seed=0, num_layers=args.blocks)
                h = sixbit.apply(pipe, cfg)
                generate(pipe, num_inference_steps=args.steps)  # warm
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    generate(pipe, num_inference_steps=args.steps)
                ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
                t0 = time.perf_counter()
                generate(pipe, num_inference_steps=args.steps)
                dt = time.perf_counter() - t0
                skipped = sum(b["skipped"] for st in h.trace.to_dict()["steps"] for b in st["blocks"])
                h.remove()
                r = rows.setdefault(name, {"aten_ops": ops, "skipped_blocks": skipped, "seconds": []})
                r["seconds"].append(dt)
    finally:
        tdc.magnitude_ratios = stacked
    a, b = rows["per_stream"], rows["stacked"]
    saved = (a["aten_ops"] - b["aten_ops"]) / b["skipped_blocks"]
    payload = {"environment": environment("cpu", args.command), "blocks": args.blocks, "steps": args.steps,
               "rows": rows, "ops_saved_per_skipped_block": saved}
    md = ["# Host work of a regated magnitude skip (tiny CogVideoX, CPU)", "",
          f"{args.blocks} blocks, {args.steps} steps, every step after the third skipped; `torch.profiler` counts of "
          "`aten::` ops over one run (nested included) and its host seconds (min of the repeats).", "",
          "| `tdc.magnitude_ratios` | aten ops per run | skipped blocks | host s (min) |", "|---|---|---|---|"]
    for name, r in rows.items():
        md.append(f"| {name} | {r['aten_ops']} | {r['skipped_blocks']} | {min(r['seconds']):.3f} |")
    md += ["", f"**{saved:.1f} fewer ops per skipped block.**", "", env_md(payload["environment"]), ""]
    write_results("skip_host_ops_cpu", payload, "\n".join(md), Path(args.out))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
