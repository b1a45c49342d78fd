"""Paired comparison of quality rows that separates judged flips from the rest:
``python -m benchmarks paired RESULT.json [MORE.json ...] --base full [--rows full_requant ...]``.

On sixbit-mini one video whose judged outcome flips (the judge reads another colour, shape, motion or
background than in the FP32 video of the same prompt and seed) costs ~20 dB of PSNR and, in a 12 × 2 table,
~2 points of adherence and ~0.8 dB of the mean (docs/TDC.md §13). Two rows whose means differ by a few tenths
of a dB can therefore be the same numerics plus one chaotic flip — or a real loss. This report takes the runs of
``benchmarks quality`` (one or more result files with the same settings; a video is keyed by prompt and seed,
later files add videos, never replace them) and, per row against ``--base``:

- **flips**: videos judged ≠ FP32 in the base only, in the row only, in both, and the exact two-sided McNemar
  p-value of the discordant counts (the probability of a split at least this uneven if either row were as
  likely to flip a given video);
- **PSNR on the videos flipped in neither**: the mean paired difference row − base with its standard error
  (and the number of such videos) — the numerics' effect with the outcome held fixed;
- the rows' mean PSNR and adherence over all their common videos, as the quality table reports them.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .common import LABELS, RESULTS, parse, write_results

__all__ = ["load_runs", "compare", "mcnemar_p", "main"]


def load_runs(paths: list[Path]) -> tuple[dict[str, dict[tuple[str, int], dict]], list[dict]]:
    """``{row: {(prompt, seed): record}}`` over the files, and their environments; the generation settings
    (steps, frames, size …) must agree."""
    runs: dict[str, dict[tuple[str, int], dict]] = {}
    envs, settings = [], None
    for p in paths:
        d = json.loads(Path(p).read_text())
        if settings is None:
            settings = d.get("generation")
        elif d.get("generation") != settings:
            raise SystemExit(f"paired: {p} was generated with other settings ({d.get('generation')}) than "
                             f"{paths[0]} ({settings})")
        envs.append(d.get("environment", {}))
        for row, recs in d["runs"].items():
            into = runs.setdefault(row, {})
            for r in recs:
                into.setdefault((r["prompt"], int(r["seed"])), r)
    return runs, envs


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value of ``b`` vs ``c`` discordant pairs (binomial, p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def _mean_se(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, math.sqrt(var / len(xs))


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def compare(base: dict[tuple[str, int], dict], row: dict[tuple[str, int], dict]) -> dict:
    """The paired figures of ``row`` against ``base`` over the videos both have."""
    keys = sorted(set(base) & set(row))
    fb = {k for k in keys if base[k].get("judge_changed")}
    fr = {k for k in keys if row[k].get("judge_changed")}
    neither = [k for k in keys if k not in fb and k not in fr]
    diffs = [row[k]["psnr"] - base[k]["psnr"] for k in neither
             if math.isfinite(row[k]["psnr"]) and math.isfinite(base[k]["psnr"])]
    d_mean, d_se = _mean_se(diffs)
    return {
        "videos": len(keys),
        "flips_base": len(fb), "flips_row": len(fr),
        "flips_base_only": sorted(fb - fr), "flips_row_only": sorted(fr - fb), "flips_both": sorted(fb & fr),
        "mcnemar_p": mcnemar_p(len(fb - fr), len(fr - fb)),
        "unflipped": len(diffs), "psnr_diff_unflipped": d_mean, "psnr_diff_unflipped_se": d_se,
        "psnr_base": _mean([base[k]["psnr"] for k in keys]), "psnr_row": _mean([row[k]["psnr"] for k in keys]),
        "adherence_base": _mean([base[k]["adherence"] for k in keys]),
        "adherence_row": _mean([row[k]["adherence"] for k in keys]),
    }


def _video(k: tuple[str, int]) -> str:
    return f"{k[0]} (seed {k[1]})"


def markdown(base: str, results: dict[str, dict], ref_adherence: float, envs: list[dict], command: str) -> str:
    lines = [f"# Paired comparison against `{base}` — flips apart from the numerics", "",
             __doc__.split("\n\n", 1)[1].split("\n\n")[0].replace("\n", " "), "",
             "| row | videos | judged flips: base only / row only / both | McNemar p | PSNR row − base, videos "
             "flipped in neither (n) | PSNR base → row (all) | adherence base → row (FP32 "
             f"{ref_adherence:.1f}) |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(
            f"| {LABELS.get(name, name)} | {r['videos']} | {len(r['flips_base_only'])} / {len(r['flips_row_only'])}"
            f" / {len(r['flips_both'])} | {r['mcnemar_p']:.2f} | {r['psnr_diff_unflipped']:+.3f} ± "
            f"{r['psnr_diff_unflipped_se']:.3f} dB ({r['unflipped']}) | {r['psnr_base']:.2f} → {r['psnr_row']:.2f}"
            f" | {r['adherence_base']:.1f} → {r['adherence_row']:.1f} |")
    for name, r in results.items():
        lines += ["", f"**{name}** — flipped only in the base: "
                  + (", ".join(map(_video, r["flips_base_only"])) or "none")
                  + "; only in the row: " + (", ".join(map(_video, r["flips_row_only"])) or "none")
                  + "; in both: " + (", ".join(map(_video, r["flips_both"])) or "none") + "."]
    lines += ["", "Source runs:"]
    lines += [f"- `{e.get('command', '?')}` ({e.get('cpu') or e.get('gpu') or '?'}, torch {e.get('torch')}, "
              f"{e.get('date')})" for e in envs]
    lines += [f"- this report: `{command}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks paired", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="result files of `python -m benchmarks quality`")
    ap.add_argument("--base", default="full", help="the row the others are compared with")
    ap.add_argument("--rows", nargs="*", default=None, help="rows to compare (default: every other DMPQ/TDC row)")
    ap.add_argument("--reference", default="fp16", help="the FP32 row (its adherence is printed)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--name", default=None, help="result file name (default: none written, markdown printed)")
    args = parse(ap, argv)
    runs, envs = load_runs(args.results)
    for name in [args.base, *(args.rows or [])]:
        if name not in runs:
            raise SystemExit(f"paired: no row {name!r} in the results (rows: {', '.join(sorted(runs))})")
    rows = args.rows or [r for r in runs if r not in (args.base, args.reference)]
    results = {r: compare(runs[args.base], runs[r]) for r in rows}
    ref = runs.get(args.reference, {})
    ref_adh = _mean([v["adherence"] for v in ref.values()])
    md = markdown(args.base, results, ref_adh, envs, args.command)
    print(md)
    if args.name:
        payload = {"benchmark": "paired", "base": args.base, "reference_adherence": ref_adh, "command": args.command,
                   "sources": [str(p) for p in args.results], "environments": envs,
                   "rows": {r: {**v, **{k: [list(x) for x in v[k]] for k in v if k.startswith("flips_") and
                                        isinstance(v[k], list)}} for r, v in results.items()}}
        write_results(args.name, payload, md, Path(args.out))
    return 0
