"""The demo's two runs on a CPU, at the demo's defaults: baseline vs 6Bit, and where the 6Bit time goes.

Runs the app's own pipeline call (``app._run_pipeline``: the embedded sixbit-mini, 17 frames 64×64, 20 steps,
guidance 3, the balanced preset) alternately for the baseline and 6Bit, ``--reps`` times each after one
warm-up pair, and reports wall time and the process's CPU time (user + system; on a shared machine the
CPU time is the steadier number). ``--legacy`` puts back the simulated path as it was before issue 16 — the
packed weight dequantized on every call, the activations' E2M1 codes packed and unpacked — so the same run
shows both. One profiled 6Bit run (cProfile, process time) splits the quantized linears' time into the GEMM,
the activations' simulated quantization and the weight dequantization::

    python -m benchmarks app_cpu --threads 1 --reps 3 --out benchmarks/results/app_cpu

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import app  # noqa: E402  (the repository root is on sys.path under `python -m benchmarks`)
import sixbit  # noqa: E402
import sixbit_kernels as sk  # noqa: E402
from benchmarks.common import environment  # noqa: E402
from sixbit import formats as fmt  # noqa: E402

PROMPT = "a red circle moving right on a black background"
#: profile rows: (label, function name pattern in cProfile's "file:line(name)")
PARTS = (("quantized linears (all)", "ops.py", "_linear_torch"),
         ("  activations: Hadamard + simulated quantize", "ops.py", "_act_torch"),
         ("    of which the block Hadamard", "formats.py", "block_hadamard"),
         ("  NVFP4 dequantize (weights; with --legacy also activations)", "formats.py", "dequantize_nvfp4"),
         ("plain nn.Linear calls (F.linear)", "~", "<built-in method torch._C._nn.linear>"),
         ("transformer (denoising, all steps)", "cogvideox_transformer_3d.py", "forward"))


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def legacy_path() -> None:
    """The simulated path before issue 16 (same numbers, more work)."""
    sk.ops._dense_weight = lambda packed, route: packed.weight(sk.ops.WEIGHT_FORMAT[route]).dequantize(torch.float32)
    fmt.fake_quantize_nvfp4 = lambda x, ts=None, *, check_finite=True: fmt.quantize_nvfp4(
        x, ts, check_finite=check_finite).dequantize(torch.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--legacy", action="store_true", help="the simulated path as it was before issue 16")
    ap.add_argument("--out", default="benchmarks/results/app_cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.legacy:
        legacy_path()
    store = app.store()
    pipe = store.pipeline(store.default_id)
    gen = store.generation_defaults(store.default_id)
    params = dict(prompt=PROMPT, negative_prompt="", seed=0, steps=gen["num_inference_steps"],
                  frames=gen["num_frames"], height=gen["height"], width=gen["width"], guidance=gen["guidance_scale"])
    stop = threading.Event()

    def run(phase, profile=None):
        handle = sixbit.apply(pipe, sixbit.SixBitConfig.preset("balanced")) if phase == "sixbit" else None
        try:
            c0 = _cpu_s()
            if profile is not None:
                profile.enable()
            res = app._run_pipeline(pipe, gen, params, phase, handle, lambda ev: None, stop)
            if profile is not None:
                profile.disable()
            return {"wall_s": res["time_s"], "cpu_s": _cpu_s() - c0,
                    "summary": None if handle is None else res["trace"]["summary"]}
        finally:
            if handle is not None:
                handle.remove()

    run("baseline"), run("sixbit")  # warm-up
    rows = []
    for i in range(args.reps):
        b, s = run("baseline"), run("sixbit")
        rows.append({"baseline": b, "sixbit": s})
        print(f"rep {i}: baseline {b['wall_s']:.2f} s wall / {b['cpu_s']:.2f} s CPU · 6Bit {s['wall_s']:.2f} s wall"
              f" / {s['cpu_s']:.2f} s CPU", flush=True)
    med = {ph: {k: statistics.median(r[ph][k] for r in rows) for k in ("wall_s", "cpu_s")}
           for ph in ("baseline", "sixbit")}
    summary = rows[-1]["sixbit"]["summary"]
    prof = {}
    for phase in ("baseline", "sixbit"):
        pr = cProfile.Profile(time.process_time)
        run(phase, pr)
        st = pstats.Stats(pr).stats
        total = sum(v[2] for v in st.values())  # tottime over every function = the profiled CPU time
        # cumulative time of each part (the transformer's forward: its outermost call, not the blocks')
        cum = {label: max([v[3] for (f, _, name), v in st.items() if f.endswith(fname) and name == func]
                          if func == "forward" else
                          [sum(v[3] for (f, _, name), v in st.items() if f.endswith(fname) and name == func)])
               for label, fname, func in PARTS}
        prof[phase] = {"total_cpu_s": total, **cum}
    cmd = "python -m benchmarks app_cpu " + " ".join(sys.argv[1:])
    env = {**environment(torch.device("cpu"), cmd), "command": cmd, "cpu_count": os.cpu_count(),
           "load_avg_1min": os.getloadavg()[0]}
    res = {"environment": env, "params": params, "preset": "balanced", "legacy": args.legacy, "reps": rows,
           "median": med, "profile": prof, "sixbit_summary": summary}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    ratio = {k: med["sixbit"][k] / med["baseline"][k] for k in ("wall_s", "cpu_s")}
    counts = summary["route_counts"]
    L = [f"# The demo's runs on a CPU: baseline vs 6Bit{' (legacy simulated path)' if args.legacy else ''}", "",
         f"`{cmd}` — sixbit-mini, {params['frames']} frames {params['width']}×{params['height']}, {params['steps']} "
         f"steps, guidance {params['guidance']}, preset balanced; median of {args.reps} alternating pairs after a "
         "warm-up pair.", "",
         "| run | wall s | CPU s |", "|---|---|---|",
         f"| baseline | {med['baseline']['wall_s']:.2f} | {med['baseline']['cpu_s']:.2f} |",
         f"| 6Bit | {med['sixbit']['wall_s']:.2f} | {med['sixbit']['cpu_s']:.2f} |",
         f"| 6Bit / baseline | {ratio['wall_s']:.2f}× | {ratio['cpu_s']:.2f}× |", "",
         f"6Bit run: {100 * summary['skip_fraction']:.0f}% of block evaluations skipped (TDC); linear calls "
         f"NVFP4 / INT8 / FP16 / skipped {counts['nvfp4']} / {counts['int8']} / {counts['fp16']} / "
         f"{counts['skipped']}.", "",
         "Where the CPU time goes (one cProfile run each, process time, s; nested rows are part of the row above):",
         "", "| part | baseline | 6Bit |", "|---|---|---|",
         f"| whole pipeline call | {prof['baseline']['total_cpu_s']:.2f} | {prof['sixbit']['total_cpu_s']:.2f} |",
         *[f"| {label} | {prof['baseline'][label]:.2f} | {prof['sixbit'][label]:.2f} |" for label, _, _ in PARTS], "",
         "- " + ", ".join(f"{k}: `{v}`" for k, v in env.items())]
    out.with_suffix(".md").write_text("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
