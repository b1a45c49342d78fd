"""One video, followed step by step: why a quantized run can land in another mode, ``python -m benchmarks mode_flip``.

The quality table's means on sixbit-mini are sometimes moved by a single video that collapses (PSNR ~16 dB
against ~36 for its neighbours; docs/TDC.md §13). This benchmark takes one prompt and seed and asks whether
that is an error that grows or a discrete flip of the outcome:

* **FP32 with a nudge**: Gaussian noise of a given size (relative to the latents' std) added to the FP32
  latents at one step — if the trajectory is contractive these videos stay at high PSNR and the gap closes;
* **quantized rows** (presets, with overrides): the per-step latent divergence from FP32,
  ``‖x_t − x_t^FP32‖ / ‖x_t^FP32‖`` after each step, the final PSNR and what sixbit-mini's judge sees
  (colour, shape, motion of each prompted object);
* **attention-route replays** of the first quantized row's recorded schedule (its linear routes replayed
  exactly, the per-block 8-bit attention routes edited): as recorded, with step 0 on 8-bit, with steps 0–1
  on 8-bit, and with step 2's pattern on every step from 1 — a handful of cells changing the outcome means a
  flip, not a drift.

Writes ``<name>.json`` / ``<name>.md`` and a divergence plot ``<name>.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import ast
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS, env_md, environment, make_config, mini_setup, parse, write_results

#: rows as ``label: (preset, overrides)``: the preset's own policy, then its attention pinned each way, then
#: the static 4-bit and INT8 baselines on the same 4-bit weights
DEFAULT_ROWS = {
    "dmpq_only": ("dmpq_only", {}),
    "dmpq_only, attention bf16": ("dmpq_only", {"attention": "bf16"}),
    "dmpq_only, attention 8-bit": ("dmpq_only", {"attention": "fp8"}),
    "w4a4": ("w4a4", {}),
    "w4a8": ("w4a8", {}),
}
#: (step, relative size) of the FP32 nudges
DEFAULT_NUDGES = ((0, 0.01), (0, 0.03), (3, 0.03), (8, 0.03))


def _all8(row: str) -> str:
    return "8" * len(row)


#: attention-route edits of a recorded schedule: ``fn(step, row, rows) -> row`` (one letter per block)
REPLAYS: dict[str, Callable[[int, str, list[str]], str]] = {
    "as recorded": lambda t, r, rows: r,
    "step 0 on 8-bit": lambda t, r, rows: _all8(r) if t == 0 else r,
    "steps 0-1 on 8-bit": lambda t, r, rows: _all8(r) if t <= 1 else r,
    "step 2's pattern from step 1": lambda t, r, rows: r if t == 0 or len(rows) < 3 else rows[2],
}


def _found(verdict) -> str:
    out = []
    for o in verdict.objects:
        f = o["found"]
        out.append("nothing" if f is None else f"{f['colour']} {f['shape']} {f['motion']}")
    return "; ".join(out)


def mode_flip(args) -> dict:
    import sixbit
    from sixbit.metrics import compare
    from sixbit.mini.judge import judge
    from sixbit.video import to_uint8

    device = torch.device("cpu")
    pipe, gen, prompts = mini_setup(args.model, device, args.steps, args.prompts)
    prompt = prompts[args.prompt_index]

    def generate(cfg=None, schedule=None, nudge=None):
        lat: list[torch.Tensor] = []

        def cb(p, i, t, kw):
            x = kw["latents"]
            if nudge is not None and i == nudge[0]:
                g = torch.Generator().manual_seed(123)
                x = x + nudge[1] * x.std() * torch.randn(x.shape, generator=g, dtype=x.dtype)
            lat.append(x.detach().clone())
            return {"latents": x}

        handle = sixbit.apply(pipe, cfg, schedule=schedule) if cfg is not None else None
        try:
            g = torch.Generator("cpu").manual_seed(args.seed)
            frames = pipe(prompt=prompt, generator=g, output_type="np", callback_on_step_end=cb,
                          callback_on_step_end_tensor_inputs=["latents"], **gen).frames[0]
            return to_uint8(frames), lat, (handle.trace if handle is not None else None)
        finally:
            if handle is not None:
                handle.remove()

    ref, ref_lat, _ = generate()
    ref_verdict = judge(ref, prompt)
    rows: list[dict[str, Any]] = []

    def record(kind, label, video, lat, trace=None):
        div = [float((a - b).norm() / b.norm()) for a, b in zip(lat, ref_lat)]
        v = judge(video, prompt)
        rec = {"kind": kind, "row": label, "psnr": compare(video, ref)["psnr_db"], "adherence": v.adherence * 100,
               "found": _found(v), "divergence": div}
        if trace is not None:
            s = trace.summary()
            rec.update(attention_fp8=s["attention_fp8_fraction"], avg_act_bits=s["avg_act_bits"])
        rows.append(rec)
        print(f"[mode_flip] {kind:8s} {label:32s} psnr={rec['psnr']:.2f} found={rec['found']} "
              f"div[-1]={div[-1]:.3f}", flush=True)
        return rec

    for step, size in args.nudges:
        if step < len(ref_lat):
            video, lat, _ = generate(nudge=(step, size))
            record("nudge", f"FP32, {size:g}·std noise at step {step}", video, lat)
    schedule = None
    for label, (preset, over) in args.rows.items():
        video, lat, trace = generate(make_config(preset, **over))
        record("row", label, video, lat, trace)
        recorded = trace.skip_schedule() if schedule is None else None
        if recorded is not None and recorded.attention:
            schedule, replay_preset = recorded, (preset, over)
    if schedule is not None:
        branch = next(iter(schedule.attention))
        preset, over = replay_preset
        # a schedule replays through the delta cache: the same preset with TDC on (every cell is computed)
        cfg = make_config(preset, **{**over, "tdc": True, "pdr": False})
        for label, edit in REPLAYS.items():
            s = copy.deepcopy(schedule)
            rows_ = s.attention[branch]
            s.attention[branch] = [edit(t, r, rows_) for t, r in enumerate(rows_)]
            video, lat, trace = generate(cfg, schedule=s)
            rec = record("replay", label, video, lat, trace)
            rec["attention_routes"] = s.attention[branch]

    env = environment(device, args.command)
    payload = {"benchmark": "mode_flip", "prompt": prompt, "seed": args.seed, "generation": gen,
               "reference": {"adherence": ref_verdict.adherence * 100, "found": _found(ref_verdict)},
               "environment": env, "rows": rows}
    out = Path(args.out)
    name = args.name or "mode_flip_mini"
    marks = sorted({0, len(ref_lat) // 4, len(ref_lat) // 2, 3 * len(ref_lat) // 4, len(ref_lat) - 1})
    md = [f"# One video step by step: \"{prompt}\", seed {args.seed}", "",
          f"FP32 reference: the judge finds *{payload['reference']['found']}* (adherence "
          f"{payload['reference']['adherence']:.0f} %). Divergence = ‖x_t − x_t^FP32‖ / ‖x_t^FP32‖ of the latents "
          "after step t; *replay* rows replay the first quantized row's recorded schedule (linear routes exactly) "
          "with its per-block attention routes edited as named.", "",
          "| kind | row | PSNR dB | adherence % | judge finds | 8-bit attention | "
          + " | ".join(f"div. step {m}" for m in marks) + " |",
          "|---|---|---|---|---|---|" + "---|" * len(marks)]
    for r in rows:
        a8 = r.get("attention_fp8")
        md.append(f"| {r['kind']} | {r['row']} | {r['psnr']:.2f} | {r['adherence']:.0f} | {r['found']} | "
                  f"{'—' if a8 is None else f'{a8:.0%}'} | " + " | ".join(f"{r['divergence'][m]:.3f}" for m in marks)
                  + " |")
    if schedule is not None:
        md += ["", "Attention routes of the recorded schedule (one row per step, one letter per block: `8` 8-bit, "
               "`b` bf16):", "", "```", *schedule.attention[branch], "```"]
    md += ["", f"![divergence per step]({name}.png)", "", env_md(env), ""]
    write_results(name, payload, "\n".join(md), out)
    _plot(rows, out / f"{name}.png", prompt, args.seed)
    print("\n".join(md))
    return payload


def _plot(rows, path: Path, prompt: str, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=110)
    styles = {"nudge": ":", "row": "-", "replay": "--"}
    for r in rows:
        div = np.array(r["divergence"], dtype=float)
        div[div <= 0] = np.nan  # before a nudge: identical (no point on a log axis)
        ax.plot(np.arange(len(div)), div, styles[r["kind"]],
                label=f"{r['kind']}: {r['row']} ({r['psnr']:.1f} dB)")
    ax.set_xlabel("denoising step")
    ax.set_ylabel("latent divergence from FP32")
    ax.set_yscale("log")
    ax.set_title(f'"{prompt}", seed {seed}', fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks mode_flip", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="pipeline (default: the embedded sixbit-mini)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=12, help="size of `bench quality`'s prompt set to draw from")
    p.add_argument("--prompt-index", type=int, default=2,
                   help="which prompt of that set (default 2: the yellow circle of docs/TDC.md §13)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=ast.literal_eval, default=DEFAULT_ROWS,
                   help="{label: (preset, {overrides})} as a Python literal")
    p.add_argument("--nudges", type=ast.literal_eval, default=DEFAULT_NUDGES,
                   help="((step, relative size), ...) of the FP32 nudges")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default=None)
    mode_flip(parse(p, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
