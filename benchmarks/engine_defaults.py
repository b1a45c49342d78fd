"""How the engine's presets behave on sixbit-mini: the numbers behind SixBitConfig's default thresholds.

    python -m benchmarks engine_defaults [--prompts 4] [--out benchmarks/results]

For each preset (and a few variants) it generates the sixbit-mini default video's latents for the first
N example prompts (seed 0) and reports the relative L2 error of the final latents against the plain
full-precision pipeline, the fraction of block evaluations skipped, the average activation bits and the
PDR count from the trace. Latent error is a quick proxy used to set thresholds; the quality tables with
PSNR/SSIM/flow/adherence are ``python -m benchmarks quality``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, parse, write_results

ROWS = [
    ("off", {}),
    ("w4a4", {}),
    ("w4a8", {}),
    ("w8a8", {}),
    ("dmpq_only", {}),
    ("tdc_only", {}),
    ("dmpq_tdc", {}),
    ("balanced", {}),
    ("balanced", {"fp_weights": "device"}),
    ("balanced", {"after_skip": "dmpq"}),
    ("aggressive", {}),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks engine_defaults", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--out", default=str(RESULTS))
    args = parse(ap, argv)

    import sixbit
    from sixbit import SixBitConfig
    from sixbit.mini import DEFAULT_GENERATION, EXAMPLE_PROMPTS, MINI_PATH

    pipe = sixbit.load_pipeline(MINI_PATH, device="cpu")
    prompts = EXAMPLE_PROMPTS[: args.prompts]

    def gen(p):
        return pipe(p, negative_prompt="", generator=torch.Generator().manual_seed(0), output_type="latent",
                    **DEFAULT_GENERATION).frames

    refs = [gen(p) for p in prompts]
    rows = []
    for preset, over in ROWS:
        handle = sixbit.apply(pipe, SixBitConfig.preset(preset, **over))
        errs, skip, bits, pdr = [], [], [], []
        t0 = time.perf_counter()
        for p, ref in zip(prompts, refs):
            out = gen(p)
            s = handle.trace.to_dict()["summary"]
            errs.append(float((out - ref).norm() / ref.norm()))
            skip.append(s["skip_fraction"])
            bits.append(s["avg_act_bits"])
            pdr.append(s["pdr_count"])
        handle.remove()
        label = preset + "".join(f" {k}={v}" for k, v in over.items())
        rows.append({"config": label, "latent_rel_err": float(np.mean(errs)), "latent_rel_err_std": float(np.std(errs)),
                     "skip_fraction": float(np.mean(skip)), "avg_act_bits": float(np.mean(bits)),
                     "pdr_count": float(np.mean(pdr)), "seconds": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)

    # statistics the thresholds are read against: every block computed, TDC and PDR only measuring
    handle = sixbit.apply(pipe, SixBitConfig.preset("balanced", tdc_threshold=0.0, pdr_rho=1.0))
    sims, outl = [], []
    for p in prompts:
        gen(p)
        d = handle.trace.to_dict()
        sims.append([[b["delta_sim"] for b in s["blocks"]] for s in d["steps"]])
        outl += [b["outlier_ratio"] for s in d["steps"] for b in s["blocks"] if b["outlier_ratio"] is not None]
    handle.remove()
    steps = len(sims[0])
    sim_by_step = [float(np.median([v for run in sims for v in run[t] if v is not None])) if t else None
                   for t in range(steps)]
    stats = {"delta_sim_median_by_step": sim_by_step,
             "outlier_ratio_quantiles": {q: float(np.quantile(outl, q)) for q in (0.05, 0.5, 0.95)}}
    print(json.dumps(stats), flush=True)

    meta = {"command": args.command, "model": "sixbit-mini",
            "generation": DEFAULT_GENERATION, "prompts": prompts, "seed": 0, "device": "cpu",
            "torch": torch.__version__, "python": platform.python_version()}
    md = ["# Engine presets on sixbit-mini (latent error proxy)", "",
          f"`{meta['command']}` — {len(prompts)} prompts, seed 0, {DEFAULT_GENERATION['num_inference_steps']} "
          "steps, CPU reference path. Relative L2 error of the final latents vs the plain FP32 pipeline "
          "(mean ± std over prompts); skip fraction, average activation bits and PDR firings per run from "
          "the trace.", "",
          "| config | latent rel. error | skipped | act bits | PDR / run |", "|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['config']} | {r['latent_rel_err']:.4f} ± {r['latent_rel_err_std']:.4f} | "
                  f"{r['skip_fraction']:.1%} | {r['avg_act_bits']:.2f} | {r['pdr_count']:.1f} |")
    md += ["", "Median delta change rate (`delta_sim`) over blocks and prompts, by step (every block computed):", "",
           " ".join("—" if v is None else f"{v:.2f}" for v in sim_by_step), "",
           "Block-input outlier ratio (k_σ = 8) where PDR measures it: 5 % / 50 % / 95 % quantiles "
           + " / ".join(f"{v:.2e}" for v in stats["outlier_ratio_quantiles"].values()) + "."]
    write_results("engine_defaults", {"meta": meta, "rows": rows, "stats": stats}, "\n".join(md) + "\n", Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
