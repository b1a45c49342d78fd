"""Plotly figures of a sixbit trace (``Trace.to_dict()``, schema version 1). Pure functions, no model.

Three live views, redrawn after every denoising step while the video is generated:

- `precision_figure` — every quantized linear layer (rows, in model order, grouped and labelled by block;
  the layer's name is in the hover) × denoising step (columns), coloured by the activation route the DMPQ
  policy picked: NVFP4 / INT8 / FP16 / skipped (the block was served from the Temporal Delta Cache, so
  its linears did not run). When the trace records attention routes, each block's linears are followed
  by one attention row: 8-bit (FP8) or bf16 attention, with the predicted 8-bit error in the hover.
- `skip_figure` — every transformer block × step: computed, skipped (cached delta reused) or
  PDR-refreshed (computed in full precision so the cached delta is clean).
- `curves_figure` — Γ = ‖out−in‖₁/‖in‖₁ per block, and each block's accumulated skip error, per step;
  the thick line is the mean over blocks, thin lines are the individual blocks.

The x axis always spans the whole run (``total_steps``) so the heatmaps fill from left to right as
the steps arrive instead of being rescaled at every update.
"""

from __future__ import annotations

import re
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

ROUTES = ("nvfp4", "int8", "fp16", "skipped")
ROUTE_LABELS = {"nvfp4": "NVFP4 (4-bit)", "int8": "INT8", "fp16": "full precision (FP16/BF16)", "skipped": "skipped (cached)"}
ROUTE_COLORS = {"nvfp4": "#2a9d8f", "int8": "#e9c46a", "fp16": "#e76f51", "skipped": "#d5d8dc",
                "attn_fp8": "#264653", "attn_bf16": "#f4a261"}
#: a block's attention row (trace ``attention``): 8-bit or bf16 (skipped with its block shows as skipped)
ATTENTION_ROUTES = ("attn_fp8", "attn_bf16")
ROUTE_LABELS.update({"attn_fp8": "attention 8-bit (FP8)", "attn_bf16": "attention bf16"})

BLOCK_STATES = ("computed", "skipped", "pdr")
BLOCK_LABELS = {"computed": "computed", "skipped": "skipped (TDC)", "pdr": "PDR refresh (FP16)"}
BLOCK_COLORS = {"computed": "#457b9d", "skipped": "#d5d8dc", "pdr": "#e63946"}

_FONT = dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12)
_TOP_LEGEND = dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom")


def _dtick(n: int) -> int:
    """Integer step ticks, at most ~12 labels."""
    return max(1, -(-n // 12))


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, font=dict(size=14)) if title else None,
        height=height,
        margin=dict(l=10, r=10, t=40 if title else 36, b=40),
        font=_FONT,
        plot_bgcolor="white",
        paper_bgcolor="white",
    )
    return fig


def placeholder(title: str, message: str = "waiting for the first denoising step", height: int = 260) -> go.Figure:
    """An empty figure with a centred note (shown before a run, and for a cached baseline)."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=13, color="#6c757d"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height)


def block_groups(linears: list[str]) -> list[tuple[str, int, int]]:
    """Consecutive rows of one block: ``(label, first row, last row)``; ``transformer_blocks.3.attn1.to_q``
    belongs to "block 3", a name without a block index to a group of its own name."""
    groups: list[tuple[str, int, int]] = []
    for i, name in enumerate(linears):
        m = re.search(r"(?:^|\.)(\d+)\.", name)
        label = f"block {m.group(1)}" if m else name
        if groups and groups[-1][0] == label:
            groups[-1] = (label, groups[-1][1], i)
        else:
            groups.append((label, i, i))
    return groups


def _discrete_colorscale(colors: list[str]) -> list[list]:
    """A step colorscale mapping integer codes 0..n-1 (z range [-0.5, n-0.5]) to flat colours."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale


def _steps_axis(trace: dict, total_steps: int | None) -> list[int]:
    n = len(trace.get("steps", []))
    return list(range(max(n, int(total_steps or 0))))


def _legend_entries(fig: go.Figure, labels: dict[str, str], colors: dict[str, str], keys, counts=None):
    """Square markers as a categorical legend (a colorbar reads badly for 3–4 discrete states)."""
    for k in keys:
        label = labels[k] + (f" · {counts.get(k, 0)}" if counts is not None else "")
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label, showlegend=True,
                                 marker=dict(symbol="square", size=12, color=colors[k]), hoverinfo="skip"))


def _precision_rows(trace: dict, linears: list[str]) -> list[tuple[str, int]]:
    """Heatmap rows in order: each block's linears (``("lin", i)``), then — when the trace records attention
    routes — that block's attention (``("attn", block)``)."""
    attention = any("attention" in st for st in trace.get("steps", []))
    rows: list[tuple[str, int]] = []
    for label, a, b in block_groups(linears):
        rows += [("lin", i) for i in range(a, b + 1)]
        m = re.fullmatch(r"block (\d+)", label)
        if attention and m:
            rows.append(("attn", int(m.group(1))))
    return rows


def precision_figure(trace: dict, total_steps: int | None = None, height: int | None = None) -> go.Figure:
    """Layers × steps heatmap of the activation route (NVFP4 / INT8 / FP16 / skipped), with one attention
    row per block after its linears (8-bit / bf16 attention) when the trace records attention routes."""
    linears = list(trace.get("linears", []))
    blocks = list(trace.get("blocks", []))
    steps = trace.get("steps", [])
    x = _steps_axis(trace, total_steps)
    if not linears:
        return placeholder("Activation precision per layer × step")
    rows = _precision_rows(trace, linears)
    keys = ROUTES + (ATTENTION_ROUTES if any(k == "attn" for k, _ in rows) else ())
    code = {r: i for i, r in enumerate(ROUTES + ATTENTION_ROUTES)}
    z: list[list[Any]] = [[None] * len(x) for _ in rows]
    err: list[list[Any]] = [[None] * len(x) for _ in rows]
    counts = dict.fromkeys(keys, 0)
    for j, st in enumerate(steps):
        routes = st.get("routes", [])
        preds = st.get("pred_err") or [None] * len(routes)
        att = st.get("attention") or []
        for r_i, (kind, i) in enumerate(rows):
            if kind == "lin":
                r, e = (routes[i], preds[i] if i < len(preds) else None) if i < len(routes) else (None, None)
            else:
                a = att[i] if i < len(att) else None
                r = None if a is None else ("skipped" if a.get("route") == "skipped" else f"attn_{a.get('route')}")
                e = None if a is None else a.get("pred_err")
            if r in code:
                z[r_i][j] = code[r]
                counts[r] += 1
            err[r_i][j] = e
    # hover: the full layer name and its predicted error; rows grouped by block (one label per block)
    names = [linears[i] if kind == "lin" else f"{blocks[i] if i < len(blocks) else f'block {i}'} · attention "
             "(predicted error of 8-bit attention)" for kind, i in rows]
    hover = [[[name, "–" if e is None else f"{e:.4f}"] for e in row] for name, row in zip(names, err)]
    n_codes = len(ROUTES) + len(ATTENTION_ROUTES)
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=list(range(len(rows))), customdata=hover, zmin=-0.5, zmax=n_codes - 0.5,
        colorscale=_discrete_colorscale([ROUTE_COLORS[r] for r in ROUTES + ATTENTION_ROUTES]), showscale=False,
        xgap=1, ygap=0 if len(rows) > 60 else 1,
        hovertemplate="step %{x}<br>%{customdata[0]}<br>predicted error %{customdata[1]}<extra></extra>",
    ))
    _legend_entries(fig, ROUTE_LABELS, ROUTE_COLORS, keys, counts)
    groups = block_groups([linears[i] if kind == "lin" else f"{i}.attention" for kind, i in rows])
    # the block separators in one layout update (plotly's add_hline re-validates every shape per call: 29 of
    # them cost ~1.7 s of Python at 2B depth, in the app's redraw loop)
    fig.update_layout(shapes=[dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=first - 0.5, y1=first - 0.5,
                                   line=dict(color="white", width=2)) for _, first, _ in groups[1:]])
    title = "linear layers (+ attention), by block" if len(keys) > len(ROUTES) else "linear layers, by block"
    fig.update_yaxes(autorange="reversed", title=title, tickmode="array",
                     tickvals=[(a + b) / 2 for _, a, b in groups], ticktext=[g for g, _, _ in groups],
                     showgrid=False, zeroline=False)
    fig.update_xaxes(title="denoising step", range=[-0.5, len(x) - 0.5], dtick=_dtick(len(x)))
    fig.update_layout(legend=_TOP_LEGEND)
    h = height or int(min(900, max(300, 140 + 7 * len(rows))))
    return _layout(fig, "", h)


def skip_figure(trace: dict, total_steps: int | None = None, height: int | None = None) -> go.Figure:
    """Blocks × steps heatmap: computed / skipped (Temporal Delta Cache) / PDR-refreshed."""
    blocks = list(trace.get("blocks", []))
    steps = trace.get("steps", [])
    x = _steps_axis(trace, total_steps)
    if not blocks:
        return placeholder("Block decisions per step")
    z: list[list[Any]] = [[None] * len(x) for _ in blocks]
    hover: list[list[Any]] = [[["", "", "", "", ""]] * len(x) for _ in blocks]
    counts = dict.fromkeys(BLOCK_STATES, 0)

    def fmt(v):
        return "–" if v is None else f"{v:.4g}"

    for j, st in enumerate(steps):
        for i, b in enumerate(st.get("blocks", [])[: len(blocks)]):
            state = "pdr" if b.get("pdr") else ("skipped" if b.get("skipped") else "computed")
            z[i][j] = BLOCK_STATES.index(state)
            counts[state] += 1
            hover[i][j] = [fmt(b.get("gamma")), fmt(b.get("delta_sim")), fmt(b.get("acc_err")),
                           fmt(b.get("outlier_ratio")), str(b.get("mode") or state)]
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=[f"block {i}" for i in range(len(blocks))], customdata=hover,
        zmin=-0.5, zmax=len(BLOCK_STATES) - 0.5,
        colorscale=_discrete_colorscale([BLOCK_COLORS[s] for s in BLOCK_STATES]), showscale=False,
        xgap=1, ygap=1,
        hovertemplate=("step %{x} · %{y} · %{customdata[4]}<br>Γ %{customdata[0]} · Δ change %{customdata[1]}"
                       "<br>accumulated error %{customdata[2]} · outlier ratio %{customdata[3]}<extra></extra>"),
    ))
    _legend_entries(fig, BLOCK_LABELS, BLOCK_COLORS, BLOCK_STATES, counts)
    fig.update_yaxes(autorange="reversed", title="block")
    fig.update_xaxes(title="denoising step", range=[-0.5, len(x) - 0.5], dtick=_dtick(len(x)))
    fig.update_layout(legend=_TOP_LEGEND)
    h = height or int(min(700, max(240, 120 + 14 * len(blocks))))
    return _layout(fig, "", h)


def _series(steps: list[dict], n_blocks: int, key: str) -> list[list[float | None]]:
    out = []
    for i in range(n_blocks):
        col = []
        for st in steps:
            bl = st.get("blocks", [])
            col.append(bl[i].get(key) if i < len(bl) else None)
        out.append(col)
    return out


def _mean(col: list[float | None]) -> float | None:
    vals = [v for v in col if v is not None]
    return sum(vals) / len(vals) if vals else None


def curves_figure(trace: dict, total_steps: int | None = None, height: int = 420) -> go.Figure:
    """Γ per block and accumulated skip error per block, against the denoising step."""
    blocks = list(trace.get("blocks", []))
    steps = trace.get("steps", [])
    if not blocks:
        return placeholder("Γ and accumulated cache error", height=height)
    x = [st.get("step", j) for j, st in enumerate(steps)]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("Γ = ‖out−in‖₁ / ‖in‖₁", "accumulated skip error"))
    for row, key in ((1, "gamma"), (2, "acc_err")):
        series = _series(steps, len(blocks), key)
        for i, col in enumerate(series):
            fig.add_trace(go.Scatter(x=x, y=col, mode="lines", line=dict(width=1, color="rgba(69,123,157,0.35)"),
                                     name=f"block {i}", showlegend=False, connectgaps=False,
                                     hovertemplate=f"block {i} · step %{{x}}: %{{y:.4g}}<extra></extra>"),
                          row=row, col=1)
        mean = [_mean([series[i][j] for i in range(len(blocks))]) for j in range(len(steps))]
        fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", line=dict(width=3, color="#1d3557"),
                                 marker=dict(size=4), name="mean over blocks", showlegend=(row == 1),
                                 hovertemplate="mean · step %{x}: %{y:.4g}<extra></extra>"),
                      row=row, col=1)
    budget = _error_budget(trace.get("config", {}))
    if budget is not None:
        fig.add_hline(y=budget, line=dict(dash="dash", color="#e63946", width=1.5), row=2, col=1,
                      annotation_text="error budget", annotation_position="top left")
    n = max(len(steps), int(total_steps or 0))
    fig.update_xaxes(range=[-0.5, max(n, 1) - 0.5], dtick=_dtick(n))
    fig.update_xaxes(title="denoising step", row=2, col=1)
    fig.update_layout(legend=dict(orientation="h", y=1.08, yanchor="bottom", x=1, xanchor="right"))
    return _layout(fig, "", height)


def _error_budget(config: dict) -> float | None:
    """The TDC error budget from the trace's config, whatever the engine named the field."""
    for k, v in config.items():
        if "budget" in k.lower() and isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None
