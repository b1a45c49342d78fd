"""The peer arena's tables and Pareto chart, rendered from the result files alone.

``python -m benchmarks.peers report`` reads ``benchmarks/results/peers_mini_<steps>.json`` (quality, CPU) and,
when it exists, ``peers_speed_*.json`` (unit costs at CogVideoX sizes, GPU), and writes
``peers_arena.md`` and ``peers_pareto.png``. Without GPU numbers the chart's x-axis is the fraction of block
evaluations skipped on sixbit-mini (what the mini run measures), labelled as such; with them it is the
estimated end-to-end (denoising loop) speed-up at 2B under the transfer protocol of ``peers_speed``, and a
second panel shows the transformer's weight memory at 2B.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _f(s: dict | None, digits: int = 2) -> str:
    if s and not s.get("n") and s.get("n_inf"):
        return "∞ (identical)"
    if not s or not s.get("n"):
        return "—"
    text = f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"
    return text + (f" (+{s['n_inf']} identical)" if s.get("n_inf") else "")


def _mb(b) -> str:
    return "—" if b is None else f"{b / 2**20:.1f}"


def _cannot(r: dict) -> str | None:
    """The one-line reason a row has no quality here (a GPU-only row, or an error), else None."""
    if r.get("quality_of"):  # a GPU speed row with a CPU row's numbers
        return None
    if r.get("gpu_only"):
        return "GPU only: " + r.get("reason", "")
    if r.get("error") and not r.get("n"):
        return "cannot run: " + r["error"][:160]
    return None


def _not_run(payload: dict) -> list[str]:
    names = payload.get("not_run")
    return ["", "Not run at this step count (CPU time): " + ", ".join(f"`{n}`" for n in names) + "."] if names else []


def quality_markdown(payload: dict) -> str:
    g = payload["generation"]
    env = payload["environment"]
    md = [f"# Peer arena on sixbit-mini — {len(payload['prompts'])} prompts × {len(payload['seeds'])} seeds, "
          f"{g['num_inference_steps']} steps", "",
          "Mean ± standard deviation over the row's videos (*n* = prompts × seeds it ran). PSNR / SSIM / flow "
          "error against the FP32 video of the same prompt and seed; adherence = sixbit-mini's judge (%). "
          "*computed* = " + payload["counting"] + ". *weights MB* = the transformer's parameter + buffer bytes as "
          "the row leaves it (torchao's packed tensors counted by their inner storage; sixbit's from "
          "`handle.memory()`).", "",
          "| row | n | PSNR dB ↑ | SSIM ↑ | flow err ↓ | adherence % | computed | weights MB | s / video |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in payload["rows"].values():
        s = r["summary"]
        why = _cannot(r)
        if why:
            md.append(f"| {r['label']} | 0 | {why} | | | | | | |")
            continue
        md.append(f"| {r['label']} | {r['n']} | {_f(s['psnr'])} | {_f(s['ssim'], 3)} | {_f(s['flow_error'], 3)} | "
                  f"{_f(s['adherence'], 1)} | {_f(s['computed_fraction'])} | {_mb(r.get('weight_bytes'))} | "
                  f"{_f(s['time_s'], 1)} |")
    md += _not_run(payload)
    mag = payload.get("magcache_calibration")
    md += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in g.items()) + ".",
           "MagCache ratios: " + (f"calibrated by its `calibrate=True` run on “{mag['prompt']}” (seed {mag['seed']}), "
                                  "a prompt outside the evaluation set." if mag else "not calibrated (no MagCache row)."),
           "", "- " + "\n- ".join(f"{k}: `{v}`" for k, v in env.items() if v is not None and k != "command"),
           f"- command (this summary): `{env['command']}`"]
    md += [f"- rows run by: `{c}`" for c in payload.get("commands", [])]
    carried = {}
    for r in payload["rows"].values():
        if r.get("carried"):
            carried.setdefault(r["carried"], []).append(r["name"])
    md += [f"- carried unchanged from the result file of {when} (`--carry-missing`): {', '.join(names)}"
           for when, names in carried.items()]
    return "\n".join(md + [""])


# ------------------------------------------------------------------------------------------ speed + chart


def warmup_steps(row: dict) -> int:
    """A sixbit row's full-precision warm-up steps, as its sixbit-mini run was configured (0 for peers and for runs
    before the field was recorded)."""
    cfg = ((row.get("schedule") or {}).get("source") or {}).get("config") or {}
    return int(cfg.get("warmup_steps") or 0)


def estimate(row: dict, fam: dict, steps: int, t_warm: float | None = None) -> dict[str, Any]:
    """The transfer protocol (see benchmarks/peers_speed.py): a step costs the family's all-computed step time
    minus, per unit the row did not compute on sixbit-mini (at the same relative step), the family's measured
    saving per skipped unit. A sixbit row's warm-up steps (16-bit activations, bf16 attention; its family is
    timed without them) cost ``t_warm``, the baseline's step, where given."""
    from benchmarks.peers_speed import resample

    pattern = resample(row.get("per_step_computed") or [1.0] * steps, steps)
    units = fam["units_full"]
    t = [fam["t_full_s"] - fam["saving_per_unit_s"] * units * (1.0 - c) for c in pattern]
    if t_warm is not None:
        warm = warmup_steps(row)
        t = [t_warm if i < warm else x for i, x in enumerate(t)]
    return {"denoise_s": sum(t), "step_s": t}


#: GPU-only caching rows without a CPU twin of the same numbers (SageAttention's attention cannot run on the
#: CPU) borrow the work pattern of the CPU row with the same cache on the same quantized model; the rows with
#: a ``Row.quality_from`` carry that row's quality and pattern (:func:`with_gpu_only_rows`)
PATTERN_FROM = {"stack_fbc_fp8_sage": "stack_fbc_fp8"}


def speed_rows(quality: dict, speed: dict, size: str = "2b") -> dict[str, dict]:
    """Estimated denoising time, speed-up and memory at ``size`` of every quality row and of every GPU-only
    row the speed run measured (those carry ``"gpu_only": True`` and no quality)."""
    from benchmarks.peers_rows import ROWS

    model = speed["models"].get(size)
    if not model:
        return {}
    fams, steps = model["families"], speed["steps"]
    # what a family resolves from the step count (tdc_reuse="auto", ...) is taken from a run at the quality
    # run's step count when one was merged in (the estimate still runs at the speed run's steps)
    fams = {**fams, **model.get("by_steps", {}).get(str(quality.get("generation", {}).get("num_inference_steps")), {})}
    base = fams.get("baseline")
    if not base or "error" in base:
        return {}
    rows = dict(quality["rows"])
    for name, row in ROWS.items():
        if row.gpu_only and not rows.get(name, {}).get("quality_of"):
            src = rows.get(PATTERN_FROM.get(name, ""), {})
            rows[name] = {**rows.get(name, {}), "family": row.family, "label": row.label, "gpu_only": True,
                          "per_step_computed": src.get("per_step_computed") if row.caching else None}
    out = {}
    for name, r in rows.items():
        fam = fams.get(r.get("family"))
        if not fam or "error" in fam or (r.get("gpu_only") and ROWS[name].caching and not r["per_step_computed"]):
            continue
        t_base = model.get("baselines", {}).get(fam.get("source"), base)["t_full_s"]
        est = estimate(r, fam, steps, t_warm=t_base)
        out[name] = {**est, "speedup": t_base * steps / est["denoise_s"], "label": r.get("label", name),
                     "gpu_only": bool(r.get("gpu_only")), "peak_mem_bytes": fam.get("peak_mem_bytes"),
                     "weight_bytes": fam.get("weight_bytes")}
    return out


def merge_speed(runs: list[dict]) -> dict:
    """One speed result from several runs (the GPU half split over calls of at most 10 minutes): per size ×
    family the newest run's entry, tagged with its source, and each run's own baseline (a row's speed-up is
    against the baseline of the run that timed it, when that run timed one). The runs at the most ``--steps``
    are the primary ones; a run at another step count (whose sixbit families resolve for that count) goes to
    ``models[size]["by_steps"][str(steps)]``, which :func:`speed_rows` lays over the families of a quality run
    at that count."""
    runs = sorted(runs, key=lambda r: r["environment"]["date"])
    steps = max(r["steps"] for r in runs)
    primary = [r for r in runs if r["steps"] == steps]
    merged = {**primary[-1], "models": {}, "sources": [{k: r.get(k) or r["environment"].get(k)
                                                        for k in ("file", "date", "command", "gpu")}
                                                       | {"steps": r["steps"]} for r in runs]}
    for r in runs:
        for size, m in r["models"].items():
            model = merged["models"].setdefault(size, {"families": {}, "baselines": {}})
            fams = model["families"] if r["steps"] == steps else \
                model.setdefault("by_steps", {}).setdefault(str(r["steps"]), {})
            for fam, e in m["families"].items():
                if "error" not in e or fam not in fams:
                    fams[fam] = {**e, "source": r.get("file")}
            if "error" not in m["families"].get("baseline", {"error": "none"}):
                model["baselines"][r.get("file")] = m["families"]["baseline"]
    return merged


def with_gpu_only_rows(rows: dict) -> dict:
    """A quality table's rows plus every GPU-only row (they have no videos on the CPU, only a reason), in the
    arena's row order. A GPU speed row whose numbers are a CPU row's (``Row.quality_from``: compilation fuses
    kernels, not the quantization) carries that row's quality and work pattern, marked ``quality_of``, when the
    table has that row."""
    from benchmarks.peers_rows import ROWS, gpu_only_entry

    order = [n for n in ROWS if n in rows or ROWS[n].gpu_only] + [n for n in rows if n not in ROWS]
    out = {}
    for n in order:
        out[n] = rows.get(n) if n not in ROWS or not ROWS[n].gpu_only else gpu_only_entry(n)
        src = rows.get(ROWS[n].quality_from) if n in ROWS and ROWS[n].quality_from else None
        if src and src.get("n"):
            out[n] = {**src, **out[n], "n": src["n"], "summary": src["summary"], "quality_of": ROWS[n].quality_from,
                      "label": f"{ROWS[n].label} (quality: {ROWS[n].quality_from}'s)",
                      "per_step_computed": src.get("per_step_computed")}
    return out


def report(args) -> None:
    from benchmarks.peers_goal import goal_markdown

    out = Path(args.out)
    qpaths = [Path(p) for p in args.quality] if args.quality else sorted(out.glob("peers_mini_*.json"))
    qualities = {json.loads(p.read_text())["generation"]["num_inference_steps"]: json.loads(p.read_text())
                 for p in qpaths}
    for q in qualities.values():
        q["rows"] = with_gpu_only_rows(q["rows"])
    spaths = [Path(p) for p in args.speed] if args.speed else sorted(out.glob("peers_speed_*.json"))
    speed = merge_speed([json.loads(p.read_text()) | {"file": p.name} for p in spaths]) if spaths else None
    if not qualities:
        raise SystemExit(f"no peers_mini_*.json under {out}: run `python -m benchmarks.peers quality` first")
    # the chart: the run with the most videos (20 steps: every row, 12 prompts × 2 seeds); its per-step
    # patterns are resampled to the speed run's 50 steps
    q = max(qualities.values(), key=lambda d: (sum(r.get("n", 0) for r in d["rows"].values()),
                                               -d["generation"]["num_inference_steps"]))
    md = arena_markdown(qualities, speed)
    sizes = sorted(speed["models"], key=lambda z: (z != args.size, z)) if speed else [args.size]
    for size in sizes if speed else []:
        md += goal_markdown(qualities, speed, size)
    (out / "peers_arena.md").write_text(md)
    pareto_png(q, speed, out / "peers_pareto.png", sizes)
    print(md)


def _gib(b) -> str:
    return f"{b / 2**30:.2f}" if b else "—"


def arena_markdown(qualities: dict[int, dict], speed: dict | None) -> str:
    """One table per quality run: sixbit-mini quality beside every size's estimated speed and memory."""
    from benchmarks.peers_rows import ROWS

    sizes = list(speed["models"]) if speed else []
    md = ["# sixbit vs peers", ""]
    for steps, q in sorted(qualities.items()):
        est = {size: speed_rows(q, speed, size) for size in sizes}
        head = "".join(f" {z} speed-up (est.) | {z} peak GiB | {z} weights GiB |" for z in sizes)
        md += [f"## sixbit-mini quality at {steps} steps ({len(q['prompts'])} prompts × {len(q['seeds'])} seeds)"
               + (" and estimated speed at " + ", ".join(f"CogVideoX-{z.upper()}" for z in sizes) if sizes else ""),
               "", "| row | n | PSNR dB | SSIM | adherence % | computed |" + head,
               "|---|---|---|---|---|---|" + "---|" * 3 * len(sizes)]
        for name, r in q["rows"].items():
            s, why = r["summary"], _cannot(r)
            cells = []
            for z in sizes:
                e = est[z].get(name, {})
                cells += [f"{e['speedup']:.2f}×" if e else "—", _gib(e.get("peak_mem_bytes")), _gib(e.get("weight_bytes"))]
            tail = "".join(f" {c} |" for c in cells)
            if why:
                md.append(f"| {r['label']} | 0 | {why} | | | |" + tail)
            else:
                md.append(f"| {r['label']} | {r['n']} | {_f(s['psnr'])} | {_f(s['ssim'], 3)} | {_f(s['adherence'], 1)} | "
                          f"{_f(s['computed_fraction'])} |" + tail)
        md += _not_run(q)
        md.append("")
    if speed:
        others = [o for o in speed["sources"] if o["steps"] != speed["steps"]]  # merged into models' by_steps
        md += ["Speed-ups are estimates under one transfer protocol for every row: " + speed["protocol"],
               *([f"Families timed at {', '.join(str(n) for n in sorted({o['steps'] for o in others}))} steps "
                  "(their sixbit options resolved for that count) replace the primary run's in the quality table "
                  "of the same step count: " + ", ".join(f"`{o['file']}` ({o['steps']} steps)" for o in others)
                  + "."] if others else []),
               "GPU speed rows with a CPU row's numbers carry that row's mini quality and work pattern: "
               + ", ".join(f"`{n}` ← `{r.quality_from}`" for n, r in ROWS.items() if r.quality_from)
               + "; GPU-only caching rows borrow only the work pattern of the CPU row with the same cache: "
               + ", ".join(f"`{a}` ← `{b}`" for a, b in PATTERN_FROM.items()) + ".", ""]
    else:
        md += ["No GPU result yet: run `python -m benchmarks.peers speed` on the H200, then `report`.", ""]
    return "\n".join(md)


#: marker per kind of row: sixbit; caches that skip whole blocks; caches that skip attention only (their MLPs
#: still run, so a skipped unit saves less); quantization without a cache
_ATTENTION_ONLY = ("pab", "fastercache")


def _style(name: str) -> dict:
    from benchmarks.peers_rows import ROWS

    row = ROWS[name]
    if name.startswith("sixbit"):
        return dict(s=110, marker="*", c="crimson", zorder=4)
    if row.family in _ATTENTION_ONLY:
        return dict(s=45, marker="^", c="tab:green", zorder=3)
    if not row.caching:
        return dict(s=45, marker="s", c="tab:purple", zorder=3)
    return dict(s=45, marker="o", c="tab:blue", zorder=3)


def pareto_png(q: dict, speed: dict | None, path: Path, sizes: list[str] = ("2b",)) -> Path:
    """Quality (PSNR on sixbit-mini) against the estimated speed-up, one panel per size of the speed data
    (the first: ``--size``), and a memory panel (weights at the first size); without GPU numbers, against the
    fraction of block evaluations skipped on sixbit-mini, with the mini's weights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [z for z in sizes if speed and speed_rows(q, speed, z)] or [None]
    steps = q["generation"]["num_inference_steps"]
    fig, axes = plt.subplots(1, len(sizes) + 1, figsize=(7 * (len(sizes) + 1), 6))
    for i, size in enumerate(sizes):
        est = speed_rows(q, speed, size) if size else {}
        ax = axes[i]
        for name, r in q["rows"].items():
            psnr = r["summary"]["psnr"]["mean"] if r.get("n") else float("nan")
            if name == "baseline" or not math.isfinite(psnr) or (est and name not in est):
                continue
            x = est[name]["speedup"] if est else 1.0 - r["summary"]["computed_fraction"]["mean"]
            wb = est[name].get("weight_bytes") if est else r.get("weight_bytes")
            for a, y in ((ax, psnr), (axes[-1], wb / 2**20 if wb else None)) if i == 0 else ((ax, psnr),):
                if y is not None:
                    a.scatter(x, y, **_style(name))
                    a.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        xlabel = (f"estimated end-to-end (denoising loop) speed-up at CogVideoX-{size.upper()}, H200, "
                  f"{speed['steps']} steps" if est else
                  "fraction of block evaluations skipped on sixbit-mini (attention rows not run) — NOT a speed-up")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"PSNR vs the FP32 video on sixbit-mini, dB ({steps} steps, mean of "
                      f"{q['rows']['baseline']['n']} videos)")
        ax.set_title("sixbit (red ★) vs peers — ● block caches, ▲ attention-only caches, ■ quantization\n"
                     "quality vs " + (f"estimated {size.upper()} speed-up" if est else "skipped work"), fontsize=10)
        if i == 0:
            axes[-1].set_xlabel(xlabel.split(" — ")[0])
            axes[-1].set_ylabel(f"transformer weights at CogVideoX-{size.upper()}, MiB" if est else
                                "transformer weights of sixbit-mini (an FP32 model), MiB")
            axes[-1].set_title("memory (weights the transformer keeps resident)")
    for a in axes:
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
