"""Whole-pipeline peak memory (text encoder → 2 denoising steps → VAE decode to pixels), one row at a time,
in a chosen order, on a CogVideoX pipeline at real size with random weights.

``python -m sixbit.bench speed --pipeline-memory`` runs the same rows (:func:`sixbit.bench.pipeline_memory`)
after the speed configurations, in the order bf16, full, bf16_lean, full_lean. On the H200 the rows after
the first two started with ~12 GiB more allocated than their own components (something from an earlier
row keeps device memory alive; not yet found — not a reference cycle: a ``gc.collect()`` before each row
did not free it), so this script runs the rows in the order you give, lean
rows first by default, and records the allocated bytes before each row. A row is clean when its encode
phase starts with only its own components resident (the text encoder for lean rows) — check
``before_row_GiB`` and the encode ``start`` column. ::

    python benchmarks/pipeline_memory.py --schedule benchmarks/results/schedule_mini.json \\
        --out benchmarks/results/pipeline_memory_h200_2b

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sixbit import bench  # noqa: E402
from sixbit.tdc import SkipSchedule  # noqa: E402

GiB = 2**30


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2b", choices=["2b", "5b"])
    ap.add_argument("--rows", nargs="+", default=["full_lean", "bf16_lean", "bf16", "full"],
                    choices=list(bench.PIPELINE_MEMORY_ROWS))
    ap.add_argument("--schedule", default=str(bench.RESULTS / "schedule_mini.json"))
    ap.add_argument("--out", default="benchmarks/results/pipeline_memory_h200_2b")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pipeline_memory.py needs a CUDA GPU")
    dev = torch.device("cuda")
    pipe = bench.random_cogvideox(args.size, dev, torch.bfloat16, text_encoder=True)
    call = bench.speed_call(args.size)
    sched = SkipSchedule.load(args.schedule) if args.schedule else None
    res = {"environment": bench.environment(dev), "command": "python " + " ".join(sys.argv), "size": args.size,
           "schedule": args.schedule, "rows": {}}
    for row in args.rows:
        before = torch.cuda.memory_allocated(dev)
        r = bench.pipeline_memory(pipe, call, dev, sched, rows=(row,))[row]
        r["before_row_bytes"] = before
        res["rows"][row] = r
        print(row, json.dumps({k: r.get(k) for k in ("peak_bytes", "phases", "error", "before_row_bytes")},
                              default=str), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    base = res["rows"].get("bf16", {}).get("peak_bytes")
    L = [f"# Whole-pipeline peak memory — CogVideoX-{args.size.upper()} size, 49×480×720, CFG, random weights", "",
         "Text encoder (T5-XXL) → 2 denoising steps → VAE decode to pixels; rows in the order run. "
         "`bf16`: diffusers as it comes, all resident. `full`: sixbit's full method, text encoder to the CPU "
         "after encoding, tiled VAE decode. `*_lean`: only the text encoder on the device while encoding, "
         "then the transformer and VAE; tiled decode; `full_lean` also with 4-bit text-encoder, modulation and "
         "embedder weights. GiB allocated at each phase's start → its peak.", "",
         "| row | allocated before the row GiB | encode | denoise | decode | peak GiB | bf16 peak ÷ this |",
         "|---|---|---|---|---|---|---|"]
    for row, r in res["rows"].items():
        if "error" in r:
            L.append(f"| {row} | | error: {r['error'][:80]} | | | | |")
            continue
        ph = r["phases"]
        cells = [f"{ph[p]['start_bytes'] / GiB:.2f} → {ph[p]['peak_bytes'] / GiB:.2f}" if p in ph else "" for p in
                 ("encode", "denoise", "decode")]
        ratio = f"{base / r['peak_bytes']:.2f}×" if base else ""
        L.append(f"| {row} | {r['before_row_bytes'] / GiB:.2f} | " + " | ".join(cells)
                 + f" | {r['peak_bytes'] / GiB:.2f} | {ratio} |")
    env = res["environment"]
    L += ["", "- " + ", ".join(f"{k}: `{env[k]}`" for k in ("gpu", "torch", "triton", "diffusers", "date") if k in env),
          f"- command: `{res['command']}`", ""]
    out.with_suffix(".md").write_text("\n".join(L))


if __name__ == "__main__":
    main()
