"""Quality vs skips of every TDC variant on sixbit-mini, ``python -m benchmarks tdc_curves``.

Each *variant* is a preset plus TDC fields (``tdc_mode``, ``tdc_reuse``, ``tdc_scope``); each is run at a sweep of its
knob — block mode: the per-step change threshold and the budget scaled together from the defaults
(0.165, 0.4); step mode: ``tdc_probe_threshold``. Per point, over prompts × seeds: PSNR and SSIM against
the FP32 video of the same prompt and seed, adherence (sixbit-mini's judge), the fraction of block
evaluations skipped (the trace's, = attention calls not run), and how the skips fall on the steps. The
quantized variants (``full_*``) also report DMPQ alone, the bar of the full method's target. Written as
``results/<name>.json`` + ``.md`` (+ ``.png`` when matplotlib is installed); docs/TDC.md reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    RESULTS,
    env_md,
    environment,
    fmt_stats,
    make_config,
    mini_setup,
    parse,
    stats,
    write_results,
)

#: variant -> (preset, TDC fields, knob, knob values)
BLOCK_SCALES = (0.5, 1.0, 1.5, 2.5)
PROBE_THRESHOLDS = (0.1, 0.2, 0.3, 0.4)
#: the step variants measured before the step-count rules pin tdc_threshold_rule="fixed": their knob is the
#: threshold at every step count (docs/TDC.md §3-§5); §8's rules follow the step count (S = 20 steps)
FIXED = dict(tdc_threshold_rule="fixed")
#: the 20-step default cache (session 16): the last delta with its size extrapolated, the probe against its last delta
MAGNITUDE = dict(tdc_mode="step", tdc_reuse="magnitude", tdc_probe_reference="last")
VARIANTS = {
    "block": ("tdc_only", dict(tdc_mode="block", tdc_reuse="last"), "scale", BLOCK_SCALES),
    "block_linear": ("tdc_only", dict(tdc_mode="block", tdc_reuse="linear"), "scale", BLOCK_SCALES),
    "step": ("tdc_only", dict(tdc_mode="step", tdc_reuse="last", **FIXED), "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_linear": ("tdc_only", dict(tdc_mode="step", tdc_reuse="linear", **FIXED), "tdc_probe_threshold",
                    PROBE_THRESHOLDS),
    "step_tail1": ("tdc_only", dict(tdc_mode="step", tdc_tail=1, **FIXED), "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_tail2": ("tdc_only", dict(tdc_mode="step", tdc_tail=2, **FIXED), "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_scaled": ("tdc_only", dict(tdc_mode="step", tdc_reuse="scaled", **FIXED), "tdc_probe_threshold",
                    PROBE_THRESHOLDS),
    "step_cap1": ("tdc_only", dict(tdc_mode="step", tdc_max_skips=1, **FIXED), "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_steps": ("tdc_only", dict(tdc_mode="step", tdc_reuse="last", tdc_threshold_rule="steps"),
                   "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_profile": ("tdc_only", dict(tdc_mode="step", tdc_reuse="last", tdc_threshold_rule="profile"),
                     "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_linear_steps": ("tdc_only", dict(tdc_mode="step", tdc_reuse="linear", tdc_threshold_rule="steps"),
                          "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_auto": ("tdc_only", dict(tdc_mode="step", tdc_reuse="auto", tdc_threshold_rule="steps"),
                  "tdc_forecast_threshold", (0.05, 0.075)),
    "step_auto_profile": ("tdc_only", dict(tdc_mode="step", tdc_reuse="auto", tdc_threshold_rule="profile"),
                          "tdc_forecast_threshold", (0.05, 0.075)),
    "step_attn": ("tdc_only", dict(tdc_mode="step", tdc_scope="attention", **FIXED), "tdc_probe_threshold",
                  PROBE_THRESHOLDS),
    "step_attn_linear": ("tdc_only", dict(tdc_mode="step", tdc_scope="attention", tdc_reuse="linear", **FIXED),
                         "tdc_probe_threshold", PROBE_THRESHOLDS),
    # session 16: the size of the last delta extrapolated (docs/TDC.md §12-§13), the probe against its last delta
    "step_magnitude": ("tdc_only", MAGNITUDE, "tdc_probe_threshold", PROBE_THRESHOLDS),
    # session 22: the 20-step default with one more rule each (docs/TDC.md §16)
    "step_magnitude_cap1": ("tdc_only", {**MAGNITUDE, "tdc_max_skips": 1}, "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_magnitude_first4": ("tdc_only", {**MAGNITUDE, "tdc_first": 4}, "tdc_probe_threshold", PROBE_THRESHOLDS),
    "step_magnitude_tail1": ("tdc_only", {**MAGNITUDE, "tdc_tail": 1}, "tdc_probe_threshold", PROBE_THRESHOLDS),
    # session 23: the 20-step default on the combined residual of the span (tdc_store="span"; docs/TDC.md §17)
    "step_magnitude_span": ("tdc_only", {**MAGNITUDE, "tdc_store": "span"}, "tdc_probe_threshold", PROBE_THRESHOLDS),
    # session 24: the 20-step default recomposing each skipped block from its gated pieces (tdc_regate; docs/TDC.md §18)
    "step_magnitude_regate": ("tdc_only", {**MAGNITUDE, "tdc_regate": "on"}, "tdc_probe_threshold", PROBE_THRESHOLDS),
    "full_step_magnitude_regate": ("full", {**MAGNITUDE, "tdc_regate": "on"}, "tdc_probe_threshold",
                                   PROBE_THRESHOLDS),
    # the attention scope (§7's step_attn) with the default's probe reference (§16 adds θ 0.12 with --knobs)
    "step_attn_last": ("tdc_only", dict(tdc_mode="step", tdc_scope="attention", tdc_probe_reference="last"),
                       "tdc_probe_threshold", PROBE_THRESHOLDS),
    "full_block": ("full", dict(tdc_mode="block", tdc_reuse="last"), "scale", BLOCK_SCALES),
    "full_step": ("full", dict(tdc_mode="step", tdc_reuse="last", **FIXED), "tdc_probe_threshold", PROBE_THRESHOLDS),
    "full_step_attn": ("full", dict(tdc_mode="step", tdc_scope="attention", **FIXED), "tdc_probe_threshold",
                       PROBE_THRESHOLDS),
    "full_step_linear": ("full", dict(tdc_mode="step", tdc_reuse="linear", **FIXED), "tdc_probe_threshold",
                         PROBE_THRESHOLDS),
    "full_step_magnitude": ("full", MAGNITUDE, "tdc_probe_threshold", PROBE_THRESHOLDS),
}
BLOCK_DEFAULTS = (0.165, 0.4)


#: every variant above was measured (sessions 8–13) with the probe compared with the forecast it returns; the
#: default became the last-delta probe in session 14 (docs/TDC.md §11), so the variants keep what they measured —
#: and with each block's own delta (``tdc_regate`` came in session 24; the ``*_regate`` variants turn it on)
MEASURED_WITH = dict(tdc_probe_reference="forecast", tdc_regate="off")


def variant_config(variant: str, knob: float):
    preset, fields, name, _ = VARIANTS[variant]
    fields = {**MEASURED_WITH, **fields}
    if name == "scale":
        fields = {**fields, "tdc_threshold": BLOCK_DEFAULTS[0] * knob, "tdc_budget": BLOCK_DEFAULTS[1] * knob}
    else:
        fields = {**fields, name: knob}
    return make_config(preset, **fields)


def skipped_per_step(trace: dict) -> list[float]:
    """Fraction of the blocks skipped at each step (first branch)."""
    return [float(np.mean([b["skipped"] for b in s["blocks"]])) for s in trace["steps"]]


def curves(args) -> None:
    import sixbit
    from sixbit.metrics import compare
    from sixbit.mini.judge import judge
    from sixbit.video import to_uint8

    torch.set_num_threads(args.threads)
    pipe, gen, prompts = mini_setup(args.model, "cpu", args.steps, args.prompts)
    cells = [(p, s) for p in prompts for s in range(args.seeds)]

    def generate(prompt, seed):
        g = torch.Generator("cpu").manual_seed(seed)
        return to_uint8(pipe(prompt=prompt, generator=g, output_type="np", **gen).frames[0])

    # the FP32 references, kept in --refs (when given) so that later sweeps of the same cells reuse them
    store = Path(args.refs) if args.refs else None
    saved = torch.load(store, weights_only=False) if store is not None and store.exists() else {}  # our own file
    if saved and saved.get("generation") != gen:
        raise ValueError(f"--refs {store}: recorded with other generation settings {saved.get('generation')}")
    refs, ref_adh = {}, []
    for p, s in cells:
        if (p, s) not in saved.get("videos", {}):
            saved.setdefault("videos", {})[(p, s)] = generate(p, s)
        refs[(p, s)] = saved["videos"][(p, s)]
        ref_adh.append(judge(refs[(p, s)], p).adherence * 100.0)
    if store is not None:
        torch.save({"generation": gen, "videos": saved["videos"]}, store)

    def point(cfg) -> dict:
        rows = []
        handle = sixbit.apply(pipe, cfg)
        try:
            for p, s in cells:
                t0 = time.perf_counter()
                video = generate(p, s)
                wall = time.perf_counter() - t0
                tr = handle.trace.to_dict()
                rows.append({"prompt": p, "seed": s, "psnr": compare(video, refs[(p, s)])["psnr_db"], "ssim": compare(video, refs[(p, s)])["ssim"],
                             "adherence": judge(video, p).adherence * 100.0, "time_s": wall,
                             "skip_fraction": tr["summary"]["skip_fraction"],
                             "avg_act_bits": tr["summary"]["avg_act_bits"], "per_step": skipped_per_step(tr)})
        finally:
            handle.remove()
        out = {m: stats([r[m] for r in rows]) for m in ("psnr", "ssim", "adherence", "skip_fraction",
                                                        "avg_act_bits", "time_s")}
        out["per_step"] = np.mean([r["per_step"] for r in rows], axis=0).round(3).tolist()
        out["runs"] = rows
        return out

    out = Path(args.out)
    # finished points: a sweep that is interrupted, or re-run with more variants or knobs, measures only the
    # missing points (delete the file to re-measure)
    partial = out / f"{args.name}.points.json"
    results: dict = json.loads(partial.read_text()) if partial.exists() else {}

    def write() -> str:
        """Publish every finished point (after each one: an interrupted sweep leaves a complete file)."""
        payload = {"benchmark": "tdc_curves", "generation": gen, "prompts": prompts, "seeds": args.seeds,
                   # the variants with a finished point (published after each point, before the later variants)
                   "variants": {v: {"preset": VARIANTS[v][0], "fields": VARIANTS[v][1], "knob": VARIANTS[v][2]}
                                for v in args.variants if results.get(v)},
                   "default": args.default if args.default in args.variants else None,
                   "fp32_adherence": stats(ref_adh), "environment": environment("cpu", args.command),
                   "results": {k: sorted(results[k], key=lambda r: r["knob"]) if k != "dmpq_only" else results[k]
                               for k in ["dmpq_only", *args.variants] if k in results}}
        return publish(payload, out / args.name, args.peers)

    def done(key: str) -> None:
        partial.write_text(json.dumps(results, default=str) + "\n")
        write()
        r = results[key][-1] if isinstance(results[key], list) else results[key]
        print(f"[tdc_curves] {key} {r.get('knob', '')} psnr={r['psnr']['mean']:.2f} skip={r['skip_fraction']['mean']:.3f} "
              f"adh={r['adherence']['mean']:.1f}", flush=True)

    out.mkdir(parents=True, exist_ok=True)
    if any(v.startswith("full") for v in args.variants) and "dmpq_only" not in results:
        results["dmpq_only"] = point(make_config("dmpq_only"))
        done("dmpq_only")
    for v in args.variants:
        results.setdefault(v, [])
        for k in args.knobs or VARIANTS[v][3]:
            if any(r["knob"] == k for r in results[v]):
                continue
            r = point(variant_config(v, k))
            r["knob"] = k
            results[v].append(r)
            done(v)
    print(write())


def publish(payload: dict, stem: Path, peers: str | None) -> str:
    """Interpolate, compare with the peer arena's file of the same step count, write .json/.md/.png."""
    payload["interpolated"] = {v: {f"{int(x * 100)}%": at_skip(payload["results"][v], x) for x in SKIPS}
                               for v in payload["variants"]}
    steps = payload["generation"]["num_inference_steps"]
    path = Path(peers) if peers else stem.parent / f"peers_mini_{steps}.json"
    payload["peers"] = peer_points(path, steps) if path.exists() else None
    md = markdown(payload)
    write_results(stem.name, payload, md, stem.parent)
    plot(payload, stem.with_suffix(".png"))
    return md


#: the skipped fractions the tables read the curves at, and the range the issue's target covers
SKIPS = (0.3, 0.4, 0.5, 0.6)
#: peer-arena row families that are caches (drawn as curves); quantization rows and sixbit's are left out
PEER_CACHES = ("fbc", "magcache", "taylorseer", "fastercache", "pab", "dbcache", "dbcache_ts")


def peer_points(path: Path, steps: int) -> dict:
    """The peer arena's cache rows at ``steps`` steps: per family, (skipped fraction, PSNR) points, with the
    file, its prompts × seeds and its date (rows identical to FP32 — PSNR ∞ — have no finite point)."""
    d = json.loads(path.read_text())
    if d["generation"]["num_inference_steps"] != steps:
        raise ValueError(f"{path}: {d['generation']['num_inference_steps']} steps, the curves have {steps}")
    fams: dict[str, list] = {}
    for name, r in d["rows"].items():
        if r.get("family") not in PEER_CACHES or "psnr" not in r.get("summary", {}):
            continue  # not a cache row, or a row with no mini quality (GPU-only: its reason is in the file)
        psnr, comp = r["summary"]["psnr"], r["summary"]["computed_fraction"]
        if psnr["n"] and math.isfinite(psnr["mean"]):
            fams.setdefault(r["family"], []).append({"row": name, "label": r["label"], "skip": 1 - comp["mean"],
                                                     "psnr": psnr["mean"]})
    for pts in fams.values():
        pts.sort(key=lambda p: p["skip"])
    return {"file": str(path.name), "prompts": len(d["prompts"]), "seeds": len(d["seeds"]),
            "cells": [[p, s] for p in d["prompts"] for s in d["seeds"]],
            "date": d["environment"].get("date"), "families": fams}


def at_skip(points: list[dict], x: float) -> float | None:
    """PSNR at skip fraction ``x``, linearly interpolated between the measured points (None outside)."""
    pts = sorted((p["skip_fraction"]["mean"], p["psnr"]["mean"]) for p in points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1 and x1 > x0 and math.isfinite(y0) and math.isfinite(y1):
            return round(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 2)
    return None


def markdown(payload: dict) -> str:
    res, gen = payload["results"], payload["generation"]
    md = [f"# TDC variants on sixbit-mini — quality vs skips, {len(payload['prompts'])} prompts × "
          f"{payload['seeds']} seeds, {gen['num_inference_steps']} steps", "",
          "PSNR/SSIM against the FP32 video of the same prompt and seed; adherence = sixbit-mini's judge (%), FP32: "
          f"{fmt_stats(payload['fp32_adherence'], 1)}; skipped = fraction of block evaluations not computed (the "
          "trace's). Mean ± standard deviation over prompts × seeds. Variants: docs/TDC.md.", ""]
    if "dmpq_only" in res:
        d = res["dmpq_only"]
        md += [f"DMPQ alone (every block computed): PSNR {fmt_stats(d['psnr'])} dB, adherence "
               f"{fmt_stats(d['adherence'], 1)} %, {fmt_stats(d['avg_act_bits'])} bits.", ""]
    md += ["| variant | knob | skipped | PSNR dB ↑ | SSIM ↑ | adherence % | act bits |", "|---|---|---|---|---|---|---|"]
    for v, meta in payload["variants"].items():
        for p in res[v]:
            md.append(f"| {v} | {meta['knob']}={p['knob']:g} | {fmt_stats(p['skip_fraction'], 3)} | "
                      f"{fmt_stats(p['psnr'])} | {fmt_stats(p['ssim'], 3)} | {fmt_stats(p['adherence'], 1)} | "
                      f"{fmt_stats(p['avg_act_bits'])} |")
    md += ["", "PSNR dB at a skipped fraction (linear interpolation between measured points; — = outside the sweep):",
           "", "| variant | 30% | 40% | 50% | 60% |", "|---|---|---|---|---|"]
    for v, row in payload["interpolated"].items():
        md.append(f"| {v} | " + " | ".join("—" if row[k] is None else f"{row[k]:.2f}" for k in row) + " |")
    md += peer_markdown(payload)
    md += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in gen.items()), "", env_md(payload["environment"]), ""]
    return "\n".join(md)


def peer_markdown(payload: dict) -> list[str]:
    """Every peer cache point from 30 to 60 % skipped against the default variant's curve there."""
    peers, default = payload.get("peers"), payload.get("default")
    if not peers:
        return []
    md = ["", f"Peers ({peers['file']}: {peers['prompts']} prompts × {peers['seeds']} seeds, {peers['date']}; "
          "skipped = 1 − the arena's computed fraction, the same count):", ""]
    if default is None:
        return md + ["(no default variant in this sweep)"]
    if default not in payload["results"]:  # published after each finished variant: the default may come later
        return md + [f"(the default variant {default!r} has not finished yet)"]
    curves = {"all": payload["results"][default]}
    matched = on_cells(payload, default, peers.get("cells"))
    if matched is not None:  # the peers ran fewer cells: the same curve on exactly their prompts and seeds too
        curves[f"on the peers' {len(peers['cells'])} cells"] = matched
    cols = [f"{default} at that skip" + ("" if k == "all" else f" ({k})") for k in curves]
    md += ["| peer row | skipped | peer PSNR dB | " + " | ".join(f"{c} | margin dB" for c in cols) + " |",
           "|---|---|---|" + "---|---|" * len(cols)]
    for pts in peers["families"].values():
        for p in pts:
            if SKIPS[0] <= p["skip"] <= SKIPS[-1]:
                cells = []
                for curve in curves.values():
                    ours = at_skip(curve, p["skip"])
                    cells += ["—", "—"] if ours is None else [f"{ours:.2f}", f"{ours - p['psnr']:+.2f}"]
                md.append(f"| {p['label']} | {p['skip']:.3f} | {p['psnr']:.2f} | " + " | ".join(cells) + " |")
    return md


def on_cells(payload: dict, variant: str, cells: list | None) -> list[dict] | None:
    """The variant's points averaged over only ``cells`` ([prompt, seed] pairs), when those are a strict subset
    of the sweep's (None otherwise). Runs without a recorded prompt/seed are in the sweep's order."""
    order = [(p, s) for p in payload["prompts"] for s in range(payload["seeds"])]
    want = {tuple(c) for c in cells or []}
    if not want or not want < set(order):
        return None
    out = []
    for pt in payload["results"][variant]:
        runs = [r for i, r in enumerate(pt.get("runs", [])) if (r.get("prompt", order[i][0]), r.get("seed", order[i][1]))
                in want]
        out.append({**pt, "skip_fraction": stats([r["skip_fraction"] for r in runs]),
                    "psnr": stats([r["psnr"] for r in runs])})
    return out


def plot(payload: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    for v in payload["variants"]:
        pts = sorted((p["skip_fraction"]["mean"], p["psnr"]["mean"]) for p in payload["results"][v])
        bold = v == payload.get("default")
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", lw=2.5 if bold else 1.2,
                label=f"sixbit {v}" + (" (default)" if bold else ""))
    for fam, pts in ((payload.get("peers") or {}).get("families") or {}).items():
        ax.plot([p["skip"] for p in pts], [p["psnr"] for p in pts], ls="--", marker="x", label=f"peer {fam}")
    ax.axvspan(SKIPS[0], SKIPS[-1], color="0.9", zorder=0)
    gen = payload["generation"]
    ax.set_title(f"sixbit-mini, {gen['num_inference_steps']} steps, {len(payload['prompts'])} prompts × "
                 f"{payload['seeds']} seeds")
    ax.set_xlabel("block evaluations skipped (peers: attention rows not run)")
    ax.set_ylabel("PSNR vs FP32 (dB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks tdc_curves", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variants", nargs="*", choices=list(VARIANTS), default=["block", "block_linear", "step",
                                                                            "step_linear"])
    p.add_argument("--knobs", nargs="*", type=float, default=None, help="override every variant's knob values")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="tdc_curves_mini_20")
    p.add_argument("--refs", default=None, help="file keeping the FP32 reference videos between sweeps (.pt)")
    p.add_argument("--default", default="step", help="the variant the peer table compares (the config default)")
    p.add_argument("--peers", default=None, help="peer arena result file (default: <out>/peers_mini_<steps>.json)")
    p.add_argument("--redraw", default=None, metavar="JSON",
                   help="only re-read a curves file and the peers file, and rewrite its .md/.png (no generation)")
    args = parse(p, argv)
    if args.redraw:
        stem = Path(args.redraw).with_suffix("")
        payload = json.loads(Path(args.redraw).read_text())
        payload.setdefault("default", args.default if args.default in payload["variants"] else None)
        print(publish(payload, stem, args.peers))
    else:
        curves(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
