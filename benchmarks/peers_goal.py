"""The arena's goal, computed from the result files: at equal PSNR on sixbit-mini, sixbit's best row ≥ 1.2× the
best peer's estimated 2B speed-up, and sixbit's memory row ≥ 3× smaller weights than any peer row at that speed.

*The best peer at a PSNR* is the peers' quality-vs-speed front (every non-sixbit row with a mini quality and a
speed estimate, the baseline included; a row whose videos are all identical to the reference sits at +∞ dB),
linearly interpolated between its two neighbouring points — a user can set a threshold between two measured
ones; above the front's best finite PSNR, the fastest row at least that good (a step); below its worst, its
fastest row. Only rows run on every prompt take part (with one seed or more: the *n* of the tables). *At
that speed*: the peer rows whose estimated speed-up is at least the sixbit row's (at any
quality); when none is that fast, every peer row.
"""

from __future__ import annotations

import math

SPEED_TARGET, MEMORY_TARGET = 1.2, 3.0


def _points(q: dict, est: dict) -> list[tuple[str, float, float, int | None]]:
    """(row, PSNR, est. speed-up, weight bytes) of every row with both a mini quality and a speed estimate."""
    def videos(r):  # videos with a PSNR (an identical one counts as +inf)
        s = r["summary"].get("psnr") or {}
        return s.get("n", 0) + s.get("n_inf", 0)

    pts = []
    for name, r in q["rows"].items():
        s = r["summary"].get("psnr") or {}
        if name not in est or videos(r) < len(q["prompts"]):  # only rows run on every prompt
            continue
        psnr = s["mean"] if s.get("n") else math.inf
        pts.append((name, psnr, est[name]["speedup"], est[name].get("weight_bytes")))
    return pts


def front(points) -> list[tuple[float, float, str]]:
    """The peers' Pareto front as (PSNR, speed-up, row), PSNR ascending (so speed-up descending)."""
    pts = sorted(((p, s, n) for n, p, s, _ in points), key=lambda t: (-t[0], -t[1]))
    out, best = [], -math.inf
    for p, s, n in pts:  # from the best PSNR down: keep a row only if it is faster than every better one
        if s > best:
            out.append((p, s, n))
            best = s
    return out[::-1]


def front_speedup(fr, psnr: float) -> tuple[float, str]:
    """The best peer speed-up at ``psnr`` on the front ``fr`` (see the module docstring) and which rows give it."""
    if psnr <= fr[0][0]:
        return fr[0][1], fr[0][2]
    for (p0, s0, n0), (p1, s1, n1) in zip(fr, fr[1:]):
        if p0 <= psnr <= p1:
            if math.isinf(p1):
                return s1, n1
            return s0 + (s1 - s0) * (psnr - p0) / (p1 - p0), f"{n0}–{n1}"
    return fr[-1][1], fr[-1][2]  # unreachable: the front's last point is the best PSNR


def goal(q: dict, est: dict) -> dict:
    """Per sixbit row: PSNR, speed-up, the best peer's at that PSNR and the ratio; weights, the smallest peer
    weights at that speed and the ratio. Plus the verdicts."""
    pts = _points(q, est)
    peers = [t for t in pts if not t[0].startswith("sixbit")]
    if not peers:
        return {}
    fr = front(peers)
    rows = {}
    for name, psnr, sp, wb in (t for t in pts if t[0].startswith("sixbit")):
        peer_sp, via = front_speedup(fr, psnr)
        fast = [t for t in peers if t[2] >= sp] or peers
        small = min(fast, key=lambda t: t[3] or math.inf)
        rows[name] = {"psnr": psnr, "speedup": sp, "peer_speedup": peer_sp, "peer_rows": via,
                      "speed_ratio": sp / peer_sp, "weight_bytes": wb, "peer_weight_bytes": small[3],
                      "peer_weight_row": small[0], "peers_this_fast": len([t for t in peers if t[2] >= sp]),
                      "memory_ratio": small[3] / wb if wb and small[3] else math.nan}
    if not rows:
        return {}
    best = max(rows, key=lambda n: rows[n]["speed_ratio"])
    # the memory row: the smallest weights; among rows that small, the one fastest against the peers' weights
    smallest = min(rows[n]["weight_bytes"] or math.inf for n in rows)
    mem = max((n for n in rows if (rows[n]["weight_bytes"] or math.inf) <= smallest * 1.001),
              key=lambda n: (-1.0 if math.isnan(rows[n]["memory_ratio"]) else rows[n]["memory_ratio"],
                             rows[n]["speedup"]))
    return {"front": fr, "rows": rows, "best": best, "memory": mem,
            "speed_met": rows[best]["speed_ratio"] >= SPEED_TARGET,
            "memory_met": rows[mem]["memory_ratio"] >= MEMORY_TARGET}


def verdict(value: float, target: float) -> str:
    """'met (by X)' or 'missed by X' — X the shortfall or margin against the target, as a ratio and in %."""
    gap = value - target
    word = "met" if gap >= 0 else "missed"
    sign = "+" if gap >= 0 else "−"
    return f"**{word}** ({sign}{abs(gap):.2f}× against {target:g}×: {sign}{abs(100 * gap / target):.0f} %)"


def goal_markdown(qualities: dict[int, dict], speed: dict, size: str = "2b") -> str:
    from benchmarks.peers_report import speed_rows

    intro = (__doc__.split("\n\n", 1)[1].replace("\n", " ").strip() if size == "2b" else
             f"The same computation with every row's estimated CogVideoX-{size.upper()} speed-up (the same mini "
             "quality; the unit costs measured at this size) and its weights at this size.")
    md = [f"## The goal at CogVideoX-{size.upper()}", "", intro, ""]
    for steps, q in sorted(qualities.items()):
        g = goal(q, speed_rows(q, speed, size))
        if not g:
            continue
        md += [f"### {steps} steps", "", "Peer front (PSNR dB → est. speed-up): " + ", ".join(
                   f"`{n}` {'∞' if math.isinf(p) else f'{p:.1f}'} → {s:.2f}×" for p, s, n in g["front"]), "",
               "| sixbit row | PSNR dB | est. speed-up | best peer at that PSNR | ratio | weights GiB | "
               "smallest peer weights at ≥ that speed | ratio |", "|---|---|---|---|---|---|---|---|"]
        for n, r in g["rows"].items():
            scope = "" if r["peers_this_fast"] else " (no peer this fast: all peers)"
            md.append(f"| `{n}` | {r['psnr']:.1f} | {r['speedup']:.2f}× | {r['peer_speedup']:.2f}× ({r['peer_rows']}) | "
                      f"**{r['speed_ratio']:.2f}×** | {r['weight_bytes'] / 2**30:.2f} | "
                      f"{r['peer_weight_bytes'] / 2**30:.2f} ({r['peer_weight_row']}{scope}) | **{r['memory_ratio']:.2f}×** |")
        b, m = g["rows"][g["best"]], g["rows"][g["memory"]]
        md += ["", f"- speed: sixbit's best row `{g['best']}` is **{b['speed_ratio']:.2f}×** the best peer at equal "
                   f"PSNR (target ≥ {SPEED_TARGET}×): {verdict(b['speed_ratio'], SPEED_TARGET)}.",
               f"- memory: sixbit's memory row `{g['memory']}` keeps **{m['memory_ratio']:.2f}×** smaller weights than "
               f"the smallest peer row at its speed (target ≥ {MEMORY_TARGET:g}×): "
               f"{verdict(m['memory_ratio'], MEMORY_TARGET)}; at {m['psnr']:.1f} dB it is {m['speed_ratio']:.2f}× the "
               "best peer's speed.",
               f"- both halves in one row: {both(g)}.", ""]
    return "\n".join(md) + "\n"


def both(g: dict) -> str:
    """Which sixbit rows meet the speed and the memory target at once (the goal asks for one row: its best)."""
    rows = [n for n, r in g["rows"].items() if r["speed_ratio"] >= SPEED_TARGET and r["memory_ratio"] >= MEMORY_TARGET]
    return ("`" + "`, `".join(rows) + "`") if rows else "none"
