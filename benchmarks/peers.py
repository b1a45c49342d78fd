"""The peer arena: sixbit against the tools a user would pick instead, on the same model, counted the same way.

    python -m benchmarks.peers quality --steps 20          # CPU: sixbit-mini, every row (resumable)
    python -m benchmarks.peers quality --steps 20 --rows sixbit --fresh   # re-run sixbit's rows only
    python -m benchmarks.peers speed --sizes 2b            # GPU: unit costs at CogVideoX sizes (benchmarks/peers_speed.py)
    python -m benchmarks.peers weights --sizes 2b          # CPU: torchao int8 weight bytes at real sizes
    python -m benchmarks.peers report                      # tables + Pareto chart from the result files

Rows (``benchmarks/peers_rows.py``): the diffusers baseline; diffusers' FirstBlockCache, TaylorSeerCache,
MagCache (calibrated), FasterCache and PyramidAttentionBroadcast through ``transformer.enable_cache``;
cache-dit's DBCache (F1B0) with and without its TaylorSeer calibrator; torchao int8 / fp8 dynamic
quantization; SageAttention; user-assembled stacks; sixbit's presets. Each peer at its documented setting
plus a small sweep of its main knob.

quality
    On sixbit-mini with the prompts, seeds and generation arguments of ``python -m benchmarks quality``
    (``benchmarks.common.mini_setup``: the first ``--prompts`` of its 12; seeds 0..s-1), FP32 on the CPU: PSNR / SSIM / flow error against the FP32 video of the same prompt and
    seed (``sixbit.metrics``), adherence (sixbit-mini's judge), the fraction of block evaluations computed —
    counted for every row by the same :class:`~benchmarks.peers_rows.WorkCounter` (the attention's output
    projection really running) — with its per-step pattern, and the transformer's weight bytes. One JSON per
    row × prompt × seed under ``--run-dir``, reused on a re-run: stop and restart freely. The result files
    list every row the run dir holds; ``--fresh`` deletes the cached videos of ``--rows`` first (after a
    change of sixbit's defaults: ``--rows sixbit --fresh``).

Results: ``benchmarks/results/peers_mini_<steps>.{json,md}`` (device, versions, command, settings).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import common
from benchmarks.peers_report import with_gpu_only_rows
from benchmarks.peers_rows import ROWS, Ctx, WorkCounter, calibrate_magcache, weight_bytes

RESULTS = Path(__file__).resolve().parent / "results"
METRICS = ("psnr", "ssim", "flow_error", "adherence", "computed_fraction", "time_s")


def environment(device="cpu") -> dict[str, Any]:
    """``benchmarks.common.environment`` plus the peer libraries' versions."""
    env = common.environment(device, "python -m benchmarks.peers " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    env["threads"] = torch.get_num_threads()
    for mod in ("cache_dit", "torchao", "sageattention"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # not installed, or no version attribute
            env[mod] = None
    return env


def _uint8(video: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.asarray(video, np.float64) * 255.0), 0, 255).astype(np.uint8)


#: ``--rows sixbit``: every sixbit row (what the lead re-runs after a change of sixbit's defaults)
GROUPS = {"sixbit": [n for n in ROWS if n.startswith("sixbit_")]}


def row_names(requested: list[str] | None) -> list[str]:
    """The rows to run, in order: the baseline (the reference videos) first, groups expanded, GPU-only rows
    left out (their reason is in the tables)."""
    names = [m for n in (requested or ROWS) for m in GROUPS.get(n, [n])]
    return [n for n in dict.fromkeys(["baseline", *names]) if not ROWS[n].gpu_only]


def forget(run: Path, names: list[str]) -> int:
    """Delete the cached videos, metadata and recorded schedules of ``names`` under ``run`` (``--fresh``),
    except the baseline's: they are every row's reference."""
    paths = [p for n in names if n != "baseline"
             for pat in (f"{n}__*_*.json", f"row__{n}.json", f"schedule__{n}.json") for p in run.glob(pat)]
    for p in paths:
        p.unlink()
    return len(paths)


def quality(args) -> dict:
    from sixbit.metrics import compare
    from sixbit.mini.data import prompt_set
    from sixbit.mini.judge import judge

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    # the first --prompts of the 12 prompts of `python -m benchmarks quality` (its default set; the cache
    # under --run-dir is keyed by their index)
    first, gen, drawn = common.mini_setup(None, device, args.steps, max(12, args.prompts))
    prompts = drawn[:args.prompts]
    seeds = list(range(args.seeds))
    run = Path(args.run_dir or Path(tempfile.gettempdir()) / "sixbit-peers" / f"mini_{args.steps}")
    run.mkdir(parents=True, exist_ok=True)
    names = row_names(args.rows)
    if args.fresh and not args.summarize_only:
        print(f"[peers] --fresh: {forget(run, names)} cached files deleted", flush=True)
    spare = [first]

    def fresh():
        return spare.pop() if spare else common.mini_setup(None, device, args.steps, 1)[0]

    def cached(name, pi, seed) -> bool:  # a video of this row, prompt and seed (the prompt text checked)
        p = run / f"{name}__{pi}_{seed}.json"
        return p.exists() and json.loads(p.read_text())["prompt"] == prompts[pi]

    def generate(pipe, prompt, seed):
        t0 = time.perf_counter()
        with WorkCounter(pipe.transformer) as wc:
            out = pipe(prompt=prompt, generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                       **gen).frames[0]
        return _uint8(out), wc, time.perf_counter() - t0

    ratios_path = run / "magcache_ratios.json"
    if not args.summarize_only and not ratios_path.exists() and any(ROWS[n].family == "magcache" for n in names):
        calib_prompt = next(p for p in prompt_set(99, 16) if p not in prompts)
        ratios = calibrate_magcache(fresh(), {**gen, "prompt": calib_prompt, "output_type": "latent",
                                              "generator": torch.Generator("cpu").manual_seed(0)})
        ratios_path.write_text(json.dumps({"prompt": calib_prompt, "seed": 0, "ratios": ratios}))
    mag = json.loads(ratios_path.read_text()) if ratios_path.exists() else None

    total, done = len(names) * len(prompts) * len(seeds), 0
    for name in [] if args.summarize_only else names:
        row = ROWS[name]
        todo = [(pi, s) for pi in range(len(prompts)) for s in seeds if not cached(name, pi, s)]
        done += len(prompts) * len(seeds) - len(todo)
        if not todo and (run / f"row__{name}.json").exists():
            continue
        pipe = fresh()
        ctx = Ctx(args.steps, device, mag_ratios=mag and mag["ratios"], num_blocks=len(pipe.transformer.transformer_blocks))
        meta: dict[str, Any] = {"name": name, "label": row.label, "family": row.family, "settings": row.settings,
                                "note": row.note, "command": environment("cpu")["command"]}
        undo = None
        try:
            undo = row.apply(pipe, ctx)
            handle = getattr(pipe, "_peers_sixbit", None)
            meta["weight_bytes"] = weight_bytes(pipe)
            for pi, seed in todo:
                video, wc, wall = generate(pipe, prompts[pi], seed)
                rec: dict[str, Any] = {"row": name, "prompt": prompts[pi], "seed": seed, "time_s": wall,
                                       "adherence": judge(video, prompts[pi]).adherence * 100.0,
                                       "computed_fraction": wc.fraction(), "per_step": wc.per_step_fraction()}
                ref_path = run / f"ref__{pi}_{seed}.npy"
                if name == "baseline":
                    np.save(ref_path, video)
                    rec.update(psnr=math.inf, ssim=1.0, flow_error=0.0)
                else:
                    m = compare(video, np.load(ref_path))
                    rec.update(psnr=m["psnr_db"], ssim=m["ssim"], flow_error=m["flow_error"])
                if handle is not None:
                    summ = handle.trace.summary()
                    rec.update(sixbit_skip_fraction=summ["skip_fraction"], avg_act_bits=summ["avg_act_bits"])
                    if not (run / f"schedule__{name}.json").exists():
                        (run / f"schedule__{name}.json").write_text(json.dumps(handle.trace.skip_schedule().to_dict()))
                (run / f"{name}__{pi}_{seed}.json").write_text(json.dumps(rec))
                done += 1
                print(f"[peers {done}/{total}] {name:20s} p{pi} s{seed} psnr={rec['psnr']:.2f} "
                      f"computed={rec['computed_fraction']:.2f} adh={rec['adherence']:.0f} t={wall:.1f}s", flush=True)
        except Exception as e:  # one failing row must not lose the others: record why
            import traceback

            meta["error"] = f"{type(e).__name__}: {e}"
            print(traceback.format_exc(), flush=True)
        finally:
            if undo is not None:
                undo()
        (run / f"row__{name}.json").write_text(json.dumps(meta))
        del pipe
    return summarize(run, args, prompts, seeds, gen, mag)


def _stats(values) -> dict[str, float]:
    """Mean, spread and count of the finite values; ``n_inf`` counts the infinite ones (PSNR of a video
    identical to its reference), which the mean leaves out."""
    n_inf = sum(1 for x in values if x is not None and math.isinf(x))
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0, "n_inf": n_inf}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size),
            "n_inf": n_inf}


def _keep_rows(path: Path, payload: dict, run: Path, drop: bool) -> None:
    """Refuse to overwrite a result file with one that lost rows (a run dir without them: another machine, a
    cleaned /tmp) unless ``--drop-missing``."""
    if drop or not path.exists():
        return
    lost = [n for n, r in json.loads(path.read_text())["rows"].items() if r.get("n") and n in payload["not_run"]]
    if lost:
        raise SystemExit(f"{path} has rows that {run} has no videos of: {' '.join(lost)} — point --run-dir at the "
                         "run that made them, re-run them, or pass --drop-missing")


def _carry_rows(path: Path, payload: dict) -> None:
    """``--carry-missing``: the rows of the existing result file that this run dir has no videos of (a cleaned
    /tmp, another machine) are kept as they are — same prompts and seeds required — each with its own command,
    and marked ``carried`` with the date of the file they come from."""
    if not path.exists():
        return
    old = json.loads(path.read_text())
    if old.get("prompts") != payload["prompts"] or old.get("seeds") != payload["seeds"]:
        raise SystemExit(f"--carry-missing: {path} has other prompts or seeds than this run "
                         f"({len(old.get('prompts', []))} prompts, seeds {old.get('seeds')})")
    when = old.get("environment", {}).get("date")
    for n in list(payload["not_run"]):
        row = old["rows"].get(n)
        if row and row.get("n"):
            payload["rows"][n] = {**row, "carried": row.get("carried") or when}
            payload["not_run"].remove(n)


def summarize(run: Path, args, prompts, seeds, gen, mag) -> dict:
    """The result files from what ``run`` holds: every row with videos of these prompts and seeds (whichever
    invocation made them), the rows it has none of listed as not run, the GPU-only rows with their reason."""
    rows: dict[str, Any] = {}
    missing = []
    for name, row in ROWS.items():
        if row.gpu_only:  # added below, in the arena's order, with a borrowed quality where they have one
            continue
        meta_p = run / f"row__{name}.json"
        meta = json.loads(meta_p.read_text()) if meta_p.exists() else {"name": name, "label": row.label}
        paths = [(pi, run / f"{name}__{pi}_{s}.json") for pi in range(len(prompts)) for s in seeds]
        recs = [r for pi, p in paths if p.exists() for r in [json.loads(p.read_text())] if r["prompt"] == prompts[pi]]
        if not recs and "error" not in meta:
            missing.append(name)
            continue
        entry = {**meta, "n": len(recs), "summary": {m: _stats([r.get(m) for r in recs]) for m in METRICS}}
        if recs:
            entry["per_step_computed"] = [float(x) for x in np.mean([r["per_step"] for r in recs], axis=0)]
            if "avg_act_bits" in recs[0]:
                entry["summary"]["avg_act_bits"] = _stats([r["avg_act_bits"] for r in recs])
                entry["summary"]["sixbit_skip_fraction"] = _stats([r["sixbit_skip_fraction"] for r in recs])
        sched = run / f"schedule__{name}.json"
        if sched.exists():
            entry["schedule"] = json.loads(sched.read_text())
        rows[name] = entry
    env = environment("cpu")
    payload = {"benchmark": "peers_quality", "model": "sixbit-mini", "generation": gen, "prompts": prompts,
               "seeds": seeds, "magcache_calibration": mag, "environment": env, "rows": rows, "not_run": missing,
               "counting": "computed fraction = attention output-projection rows actually run / (2 CFG rows × "
                           "blocks × steps), the same forward hook for every row (benchmarks/peers_rows.py)"}
    from benchmarks.peers_report import quality_markdown

    name = args.name or f"peers_mini_{args.steps}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if getattr(args, "carry_missing", False):
        _carry_rows(out / f"{name}.json", payload)
    payload["rows"] = with_gpu_only_rows(payload["rows"])  # after carrying: a borrowed quality may be a carried row's
    payload["commands"] = list(dict.fromkeys(r["command"] for r in payload["rows"].values() if r.get("command")))
    _keep_rows(out / f"{name}.json", payload, run, args.drop_missing)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    md = quality_markdown(payload)
    (out / f"{name}.md").write_text(md)
    print(md)
    return payload


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality", help="every row on sixbit-mini (CPU, resumable)")
    q.add_argument("--steps", type=int, default=20)
    q.add_argument("--prompts", type=int, default=12)
    q.add_argument("--seeds", type=int, default=2)
    q.add_argument("--rows", nargs="*", choices=[*ROWS, *GROUPS],
                   help="rows to run (default: all; 'sixbit' = every sixbit row); the result files list every "
                        "row the run dir holds")
    q.add_argument("--fresh", action="store_true",
                   help="delete the cached videos of --rows first (never the baseline's): after sixbit's "
                        "defaults change, `--rows sixbit --fresh` re-runs sixbit's rows alone")
    q.add_argument("--threads", type=int, default=1)
    q.add_argument("--run-dir", default=None, help="per-video JSON cache (default: $TMPDIR/sixbit-peers/mini_<steps>)")
    q.add_argument("--out", default=str(RESULTS))
    q.add_argument("--name", default=None)
    q.add_argument("--summarize-only", action="store_true", help="write the result files from what --run-dir holds")
    q.add_argument("--carry-missing", action="store_true",
                   help="keep the rows of the existing result file that --run-dir has no videos of (marked carried)")
    q.add_argument("--drop-missing", action="store_true",
                   help="let the result files lose rows the run dir has no videos of (refused otherwise)")
    s = sub.add_parser("speed", help="unit costs at CogVideoX sizes (GPU; see benchmarks/peers_speed.py)")
    from benchmarks.peers_speed import add_arguments

    add_arguments(s)
    w = sub.add_parser("weights", help="torchao int8 weight bytes at real sizes (CPU, random weights)")
    w.add_argument("--sizes", nargs="+", default=["2b"], choices=["2b", "5b"])
    w.add_argument("--out", default=str(RESULTS))
    r = sub.add_parser("report", help="tables and the Pareto chart from the result files")
    r.add_argument("--quality", nargs="*", default=None, help="peers_mini_*.json (default: all in results)")
    r.add_argument("--speed", nargs="*", default=None,
                   help="peers_speed_*.json (default: every one in results, merged: the newest entry per size × family)")
    r.add_argument("--size", default="2b", help="which size of the speed file the chart uses")
    r.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    if args.cmd == "quality":
        quality(args)
    elif args.cmd == "weights":
        from benchmarks.peers_speed import weights

        weights(args)
    elif args.cmd == "speed":
        from benchmarks.peers_speed import speed

        speed(args)
    else:
        from benchmarks.peers_report import report

        report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
