"""The step-mode probe's drift by its route: ``python -m benchmarks tdc_probe``.

Step-mode TDC skips the blocks after the probe (block 0) when the probe's delta moved less than the probe
threshold since the last computed step (or since its forecast, with ``tdc_reuse="linear"``/``"auto"`` at
many steps). With DMPQ the probe's delta carries quantization noise — NVFP4 activation rounding and the
route changing between NVFP4 and INT8 from step to step — so its measured drift has a floor that a tight
threshold (0.02 for the forecast at 50 steps) never gets under. This records, on sixbit-mini (FP32, CPU,
one prompt and seed), each step's probe drift, threshold and decision for each ``--rows`` entry (a
benchmark config name, optionally ``name:field=value,...`` overrides, values as JSON), and the skipped
fraction. The reading is in docs/TDC.md §9.

    python -m benchmarks tdc_probe --steps 50 --rows tdc_only full:tdc_probe_route="policy" \\
        full:tdc_probe_route="int8" full full:tdc_probe_route="policy",tdc_reuse="last"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, env_md, environment, make_config, mini_setup, parse, write_results


def parse_row(spec: str) -> tuple[str, dict]:
    """``name`` or ``name:field=json,field=json`` → (config name, overrides)."""
    name, _, rest = spec.partition(":")
    over = {}
    for item in filter(None, rest.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise SystemExit(f"--rows {spec!r}: expected field=value after ':'")
        try:
            over[key] = json.loads(val)
        except json.JSONDecodeError:
            over[key] = val
    return name, over


def probe_rows(trace: dict) -> list[dict]:
    """Per step (first branch): the probe's decision, drift and threshold from the trace."""
    rows = []
    for t, st in enumerate(trace["steps"]):
        b0 = st["blocks"][0]
        rows.append({"step": t, "tdc": b0.get("tdc"), "drift": b0.get("delta_sim"), "threshold": b0.get("threshold"),
                     "mode": b0.get("mode"), "skipped_rest": not all(b["computed"] for b in st["blocks"][1:])})
    return rows


def floor(rows: list[dict], start: int) -> float | None:
    """Median probe drift over the steps from ``start`` on that compared with the step just before (distance 1:
    the previous step computed) — the drift's floor late in the trajectory."""
    vals = [r["drift"] for i, r in enumerate(rows) if i >= start and r["drift"] is not None
            and i > 0 and not rows[i - 1]["skipped_rest"]]
    return float(np.median(vals)) if vals else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks tdc_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--prompt", type=int, default=0, help="index into the quality benchmark's prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", nargs="+", default=["tdc_only", "full:tdc_probe_route=policy",
                                                  "full:tdc_probe_route=int8", "full"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default=None)
    args = parse(p, argv)
    import sixbit

    torch.set_num_threads(args.threads)
    rows = [parse_row(r) for r in args.rows]
    for name, over in rows:
        make_config(name, **over)  # refuse a bad row before any run
    pipe, gen, prompts = mini_setup(None, "cpu", args.steps, args.prompt + 1)
    prompt = prompts[args.prompt]
    results = []
    for spec, (name, over) in zip(args.rows, rows):
        handle = sixbit.apply(pipe, make_config(name, **over))
        try:
            pipe(prompt=prompt, generator=torch.Generator("cpu").manual_seed(args.seed), output_type="latent", **gen)
            trace = handle.trace.to_dict()
        finally:
            handle.remove()
        per_step = probe_rows(trace)
        late = floor(per_step, args.steps // 2)
        results.append({"row": spec, "config": name, "overrides": over,
                        "skip_fraction": trace["summary"]["skip_fraction"], "late_drift_median": late,
                        "threshold_late": per_step[-2]["threshold"], "steps": per_step})
        print(f"[tdc_probe] {spec}: skipped {trace['summary']['skip_fraction']:.1%}, late drift {late}", flush=True)
    payload = {"benchmark": "tdc_probe", "generation": gen, "prompt": prompt, "seed": args.seed,
               "environment": environment("cpu", args.command), "rows": results}
    md = [f"# Step-mode probe drift by route — sixbit-mini, {args.steps} steps, prompt {args.prompt}, seed {args.seed}",
          "", "Probe = block 0. *late drift* = median drift at distance 1 (previous step computed) over the second "
          "half of the steps: the floor a threshold must clear to skip. Docs: docs/TDC.md §9.", "",
          "| row | skipped | late drift (distance 1) | threshold late |", "|---|---|---|---|"]
    for r in results:
        late = "—" if r["late_drift_median"] is None else f"{r['late_drift_median']:.4f}"
        md.append(f"| `{r['row']}` | {r['skip_fraction']:.1%} | {late} | {r['threshold_late']:.4f} |")
    md += ["", "Per step (drift / decision):", "", "| step | " + " | ".join(f"`{r['row']}`" for r in results) + " |",
           "|---|" + "---|" * len(results)]
    for t in range(args.steps):
        cells = []
        for r in results:
            s = r["steps"][t]
            d = "—" if s["drift"] is None else f"{s['drift']:.3f}"
            cells.append(f"{d} {'skip' if s['skipped_rest'] else ''}".strip())
        md.append(f"| {t} | " + " | ".join(cells) + " |")
    md += ["", env_md(payload["environment"]), ""]
    write_results(args.name or f"tdc_probe_mini_{args.steps}", payload, "\n".join(md), Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
