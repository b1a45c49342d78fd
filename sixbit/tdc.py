"""Temporal Delta Cache: skip a block whose residual update is temporally stable.

Per block and per cache context (CFG branch) the cache holds the block's last computed residual
``Δ = out − in`` for *every* token stream the block updates (CogVideoX: video and text; Wan: video).
A skipped block returns ``out = in + Δ_cached`` for each stream — exactly that expression, in the
model's dtype.

Similarity of two computed deltas (relative L1, summed over streams, per step of distance)::

    delta_sim = Σ_s ‖Δ_s,t − Δ_s,t'‖₁ / Σ_s ‖Δ_s,t'‖₁ / (t − t')

where t' is the block's previous computed step. 0 means "identical"; it is a *change rate*, so a delta
recomputed after k skipped steps is judged per step, not penalised for the gap.

Decision at step t (``decide``; the block hook in ``sixbit.hooks`` holds the state): skip iff

* TDC is on, t ≥ ``tdc_first`` and t < num_steps − ``tdc_last`` (the first/last K steps never skip);
* two computed deltas exist (``delta_sim`` is known);
* ``delta_sim ≤ tdc_threshold``; and
* ``acc_err + delta_sim ≤ tdc_budget``.

``acc_err`` estimates how stale the cached delta has become: every skipped step adds ``delta_sim``
(linear drift), so after k consecutive skips it is k·delta_sim. When the next skip would exceed the
budget, the block is computed — a refresh — which stores the new Δ and resets ``acc_err`` to 0.

Variants (options of the config, recorded in the trace's config and per cell; the paper's rule above is
``tdc_mode="block"``, ``tdc_reuse="last"``, preset ``tdc_paper``; why and how much each helps: docs/TDC.md):

* ``tdc_mode="step"`` — one decision per step (FirstBlockCache/TeaCache-style): block 0 is the *probe*,
  computed at every step; its delta is compared with its *reference*, the delta of the last fully
  computed step (or, with ``tdc_reuse="linear"``, the forecast of it), ``probe_change = Σ‖Δ₀ − ref‖₁ /
  Σ‖ref‖₁`` — the drift since the last computed step, measured, not predicted. The step's remaining
  blocks skip jointly iff ``probe_change ≤ tdc_probe_threshold`` inside the window (``step_skips``); the
  reference moves only on a computed step. Each skipped block returns ``in + Δ_b``, so the step returns
  ``in₁ + Σ_b Δ_b`` — the combined residual of the last computed step, a coherent snapshot of the network,
  instead of per-block reuse that mixes stale and fresh deltas.
* ``tdc_reuse="linear"`` — forecasting instead of reuse: a skipped cell returns ``in + Δ̂`` with the first
  order extrapolation ``Δ̂_t = Δ₁ + (t − t₁)/(t₁ − t₀)·(Δ₁ − Δ₀)`` of the block's last two computed deltas
  (``forecast``; one extra delta per block and stream is kept). In block mode the budget is charged with
  the forecast's own error: at a refresh the fresh Δ is compared with the forecast of it, and that error
  per step of distance is the rate ``decide`` reads and ``accumulate`` adds (the zero-order rate until a
  forecast exists).

* ``tdc_reuse="quadratic"`` — the second-order forecast (TaylorSeer's order 2, written for uneven spacing):
  Newton's form through the last three computed deltas at steps s₂ < s₁ < s₀,
  ``Δ̂_t = Δ₀ + (t − s₀)·D₁ + (t − s₀)(t − s₁)·D₂`` with ``D₁ = (Δ₀ − Δ₁)/(s₀ − s₁)`` and
  ``D₂ = (D₁ − (Δ₁ − Δ₂)/(s₁ − s₂))/(s₀ − s₂)``; first order while only two exist. Two extra deltas per block
  and stream are kept (CogVideoX-2B, 49 frames, CFG batched: ~4 GB per extra set of 30 blocks' deltas in bf16).
  Everything said of ``"linear"`` holds for it (the probe is compared with its forecast, block mode charges
  the forecast's error, attention scope forecasts the attention output).

* ``tdc_reuse="magnitude"`` (block scope) — the direction of the last computed delta, its size extrapolated:
  ``Δ̂_t = Δ₀ · r^((t − s₀)/(s₀ − s₁))`` with ``r = ‖Δ₀‖₁ / ‖Δ₁‖₁`` per block and stream, clamped to
  :data:`MAGNITUDE_CLAMP` — the first order of the log-magnitude only. At 20 steps, where the first-order
  forecast of the whole delta loses 4.7 dB (the deltas of computed steps two or three steps apart do not
  extrapolate), the magnitude alone gains +2.1 dB at the same skips on sixbit-mini (docs/TDC.md §12); what
  ``"auto"`` resolves to below ``tdc_forecast_steps`` since session 16 (§13). One extra delta per block and stream
  is kept, as with ``"linear"`` (+3.8 GiB at CogVideoX-2B); its two L1 reductions per stream at each skip do not
  show in a skipped step's time (2B on the H200: 6 ms, plain reuse 7–8).

* ``tdc_reuse="scaled"`` (step mode) — MagCache's observation that the residuals' magnitude changes by about
  the same ratio in every block: a skipped block returns ``in + r·Δ_b`` with ``r = ‖Δ₀,t‖₁ / ‖ref‖₁``, the
  probe's video-stream magnitude now over its reference's (both already in the probe's statistics read).
* ``tdc_tail=K`` — the last K blocks never skip (cache-dit DBCache's "Bn"): they compute every step on the
  input the skipped blocks before them produced (in step mode ``in₁ + Σ_{0<b<n−K} Δ_b``). The last block
  amplifies its own error most and costs the most to skip (docs/TDC.md §1). Their deltas are not cached.
* ``tdc_max_skips=K`` — at most K consecutive skipped steps (0: no cap): per block in block mode, per step
  (counted on the probe) in step mode, where a step the cap forces to compute is traced ``"probe_capped"``.

* ``tdc_store`` (step mode, block scope) — what is kept: ``"blocks"`` = every skippable block's own Δ (and, for a
  forecast, the earlier ones); ``"span"`` = one combined residual per stream for the *span*, the blocks between the
  probe and the tail that skip together (:func:`live_span`; in a replay :meth:`SkipSchedule.span`): ``R = out(last)
  − in(first)`` of the last computed step, the earlier ones for a forecast. A skipped step's first span block returns
  ``in + R`` (or ``R``'s forecast), the others pass their input through. For ``"last"``, ``"linear"``,
  ``"quadratic"`` and ``"scaled"`` that is the per-block sum ``in₁ + Σ_b Δ̂_b`` (the forecasts are linear with
  weights shared by every block), up to rounding; for ``"magnitude"`` it extrapolates R's size instead of each
  block's. Memory: one Δ-sized tensor per stream and kept order instead of one per span block (CogVideoX-2B, 49
  frames, CFG batched: 0.13 GiB instead of 29 × 0.13 GiB per set). ``"auto"`` (the default): :func:`uses_span`.
* ``tdc_regate`` (step mode, block scope, a Δ per block) — a block's update is a sum of gated pieces,
  ``Δ_b(t) = Σ_k g_k(t) ⊙ P_k(t)``, the gates ``g_k(t)`` computed from the timestep embedding alone (CogVideoX:
  ``g_msa ⊙ attn1 + g_ff ⊙ ff`` per stream; Wan: ``g_msa ⊙ attn1 + attn2 + g_ff ⊙ ffn``; ``Adapter.gated_parts``).
  A plain skip reuses ``g(t′) ⊙ P(t′)``; a regated skip keeps the pieces ``P(t′)`` and multiplies them by the
  skipped step's own gates ``g(t)`` — exact where only the gates move (on sixbit-mini a reused delta's error one step
  later falls from 0.116 to 0.090 of its size with ``"magnitude"``, 0.131 plain: tdc_analysis). The forecasts apply to each piece
  (``"magnitude"``: each piece's own size ratio, folded into the piece's small gate). Cost of a skip: the gates' two
  small modulation GEMMs on ``silu(temb)`` and one fused multiply-add per piece (a stream's later pieces in place);
  a held tensor's size is measured once, by the first skip that reads it (``BlockState.sizes``). Memory: the pieces are two Δ-sized sets per block (attention and MLP), so with ``"magnitude"`` (which now
  keeps the earlier set's sizes only, 0-d) a regated block holds what the per-block ``"magnitude"`` held before.
  ``"auto"`` (the default): on wherever a Δ per block is kept (:func:`regates`: the 20-step ``"magnitude"``
  default), off on the span; docs/TDC.md §18 has the measurements.
* ``tdc_scope="attention"`` (step mode) — what a skipped cell reuses: not the block (``in + Δ``) but its
  self-attention's output (PyramidAttentionBroadcast / FasterCache's lever): the block runs on its fresh input,
  its attention call (projections, attention, output projection) returns the output cached at the last computed
  step (``"last"``) or its first-order forecast (``"linear"``, by :func:`forecast`), and the norms, modulation and
  MLP are recomputed. The probe decides as above (it keeps its delta as the reference; the other blocks keep
  their attention output instead of a delta). The trace marks such a cell ``"attn_reuse"``/``"attn_forecast"``
  (computed *and* skipped: its attention call did not run, which is what ``skip_fraction`` counts).

Step mode's threshold and the step count (``probe_threshold``, ``resolve_reuse``; docs/TDC.md §8): the drift
of one step shrinks about as 1/N with N steps, so a fixed threshold skips more the more steps there are.

* ``tdc_threshold_rule="steps"`` — the threshold is given for ``tdc_threshold_steps`` = S steps and applied at
  N steps as ``θ·S/N`` (``"fixed"``: θ at every N, the rule before session 10).
* ``tdc_threshold_rule="profile"`` — per-step thresholds calibrated into the policy (``python -m
  sixbit.calibrate``, :class:`sixbit.policy.ProbeProfile`): ``θ·S/N / w(t)``, ``w`` the calibrated ratio of
  the rest of the network's one-step drift to the probe's at the same normalised time, over its median —
  the probe's drift rescaled to the drift of what a skip reuses (TeaCache/MagCache's idea: the proxy's
  change is not the skipped part's, and the ratio moves along the trajectory). Without a profile in the
  policy: ``"steps"``, stated in the trace's config (``tdc_threshold_resolved``).
* ``tdc_reuse="auto"`` — ``"quadratic"`` (the second-order forecast; the probe compared with its forecast;
  ``"linear"`` in attention scope) at N ≥ ``tdc_forecast_steps``, where neighbouring steps' deltas are close enough to extrapolate, with the
  threshold ``tdc_forecast_threshold`` (a forecast is closer than the last reference, so the same drift
  needs a lower bar); below, ``"magnitude"`` (``"last"`` in attention scope) with ``tdc_probe_threshold``.
  Block mode and an unknown step count resolve it to ``"last"``. (Sessions 10–13: ``"linear"`` with 0.05;
  session 14 measured the second order +3.7 dB at the same skips at 50 steps, docs/TDC.md §11; below 40 steps
  ``"last"`` until session 16, docs/TDC.md §13.)
* ``tdc_probe_reference`` (step mode, with a forecast) — the probe's delta is compared with its forecast
  (``"forecast"``) or, as cache-dit's DBCache does, with its last computed delta (``"last"``: the drift since the
  last computed step, thresholded by ``tdc_probe_threshold`` like plain reuse) while the skipped blocks still
  return the forecast (docs/TDC.md §11).
* ``tdc_probe_route`` (with DMPQ) — the probe's linears run ``"fp16"`` activations (default) or ``"int8"``, not
  DMPQ's routes, and its attention bf16 (:func:`sixbit.dmpq.route` ``probe=True``): a quantized probe's drift
  has a noise floor above the thresholds at many steps (docs/TDC.md §9); its delta only decides.

All statistics are additive sums (``delta_change_sums``), read through ``Run.read``.

A :class:`SkipSchedule` records the computed/skipped pattern (block × step, per branch) of a run and can
replay it (``sixbit.apply(..., schedule=...)``), resampled to another depth or step count: the
benchmarks record it on sixbit-mini and replay it at real CogVideoX sizes, where random weights would
make TDC's own decisions meaningless.

A schedule recorded by :meth:`sixbit.trace.Trace.skip_schedule` (format version 2) also holds the
*routes* of every computed block evaluation — one letter per routed linear (``sixbit.routes.LETTERS``: ``n``
NVFP4, ``i`` INT8, ``f`` 16-bit activations: warm-up, PDR) — because DMPQ's Γ-driven routes, like TDC's decisions, are
meaningless on random weights. With routes, a DMPQ run replays them too (block mode ``replay``); PDR's
outlier count is still computed where the live rule would compute it, so the replay costs what a live
run costs, but the recorded route wins. Format version 3 adds each computed cell's *attention* route (one
letter per block and step: ``8`` 8-bit, ``b`` bf16, ``-`` skipped), replayed the same way
(``sixbit.dmpq.attention_route``). Version-1 (skips only) and version-2 files still load. A schedule recorded
with ``tdc_scope="attention"`` says so (``"scope": "attention"``): its skipped cells are attention reuses, which
also record the routes of the linears that ran (:data:`NO_ROUTE` for the attention's own); it replays only
under the same scope.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sixbit.dmpq import l1, ratio
from sixbit.routes import FROM_LETTER, LETTERS, SKIPPED

__all__ = ["MODES", "REUSE", "SCOPES", "extrapolates", "magnitude_ratios", "STORES", "THRESHOLD_RULES", "span_possible", "uses_span", "regates", "regate_possible", "live_span", "l1_size", "delta_change_sums", "change_rate", "capped", "decide",
           "accumulate", "step_skips", "resolve_reuse", "forecast_order", "probe_threshold", "fixed", "forecast", "SkipSchedule"]

#: decision granularity: one decision per block and step (the paper's), or per step through a probe block
MODES = ("block", "step")
#: what a skipped cell returns: the last computed delta, its first- or second-order forecast, the last delta with
#: its size extrapolated, or it scaled by the probe's ratio
REUSE = ("last", "linear", "quadratic", "magnitude", "scaled", "auto")
#: the forecast order of each reuse (0: no forecast)
ORDER = {"linear": 1, "quadratic": 2, "magnitude": 1}
#: what step mode keeps (``tdc_store``): one residual for the span of blocks that skip together, or a Δ per block
STORES = ("auto", "span", "blocks")
#: reuses whose per-block forecasts sum to the forecast of the summed deltas (weights shared by every block)
SPAN_EXACT = ("last", "linear", "quadratic", "scaled")
#: how step mode's probe threshold follows the step count
THRESHOLD_RULES = ("fixed", "steps", "profile")


def delta_change_sums(new: list[torch.Tensor], old: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ‖new − old‖₁, Σ‖old‖₁) over streams, as fp32 0-d tensors (additive: all-reducible)."""
    num = sum(l1(n - o) for n, o in zip(new, old))
    den = sum(l1(o) for o in old)
    return num, den


def change_rate(num: float, den: float, step: int, last_step: int) -> float:
    """``delta_sim`` from :func:`delta_change_sums` read to the host: the relative change per step of
    distance between the delta computed at ``step`` and the one computed at ``last_step``."""
    return ratio(num, den) / max(1, step - last_step)


def capped(run_skips: int, cfg) -> bool:
    """True when ``run_skips`` consecutive skips already reach ``tdc_max_skips`` (0: no cap)."""
    return 0 < cfg.tdc_max_skips <= run_skips


def decide(delta_sim: float | None, acc_err: float, step: int, num_steps: int | None, cfg,
           run_skips: int = 0) -> bool:
    """True when a block holding a cached delta may be skipped at ``step`` (see the module docstring):
    ``delta_sim`` is its change rate at the last refresh (None before two computed deltas), ``acc_err``
    the skip error accumulated since, ``run_skips`` its consecutive skips before this step."""
    if not cfg.tdc or step < cfg.tdc_first or capped(run_skips, cfg):
        return False
    if num_steps is not None and step >= num_steps - cfg.tdc_last:
        return False
    if delta_sim is None or delta_sim > cfg.tdc_threshold:
        return False
    return acc_err + delta_sim <= cfg.tdc_budget


def accumulate(acc_err: float, delta_sim: float | None) -> float:
    """The skip error after one more skip: linear drift by the last change rate (a replayed schedule may
    skip before a rate exists: nothing is added then). A computed step resets it to 0."""
    return acc_err + (delta_sim or 0.0)


def resolve_reuse(cfg, num_steps: int | None) -> str:
    """``tdc_reuse`` with ``"auto"`` resolved, in step mode: at ``num_steps`` ≥ ``tdc_forecast_steps`` a forecast —
    ``"quadratic"`` of block deltas, ``"linear"`` of attention outputs (``tdc_scope="attention"``: the second order
    lost 3.3 dB there, docs/TDC.md §11); below it ``"magnitude"`` of block deltas (docs/TDC.md §13) and ``"last"``
    of attention outputs. ``"last"`` in block mode and when the step count is unknown."""
    if cfg.tdc_reuse != "auto":
        return cfg.tdc_reuse
    if cfg.tdc_mode != "step" or num_steps is None:
        return "last"
    attention = cfg.tdc_scope == "attention"
    if num_steps >= cfg.tdc_forecast_steps:
        return "linear" if attention else "quadratic"
    return "last" if attention else "magnitude"


def span_possible(cfg) -> bool:
    """Whether a run of ``cfg`` may keep the span's residual at some step count: TDC in step mode with block scope,
    ``tdc_store`` not ``"blocks"`` (:func:`uses_span` decides per step count)."""
    return cfg.tdc and cfg.tdc_mode == "step" and cfg.tdc_scope == "block" and cfg.tdc_store != "blocks"


def uses_span(cfg, num_steps: int | None) -> bool:
    """Whether a run keeps one combined residual for the span instead of a Δ per block (``tdc_store``, module
    docstring): only in step mode with block scope; ``"auto"`` where that computes what per-block deltas would
    (:data:`SPAN_EXACT` reuses)."""
    if not span_possible(cfg) or (cfg.tdc_regate == "on" and cfg.tdc_store == "auto"):
        return False
    return cfg.tdc_store == "span" or resolve_reuse(cfg, num_steps) in SPAN_EXACT


def regate_possible(cfg) -> bool:
    """Whether a run of ``cfg`` may recompose skipped blocks from gated pieces at some step count (:func:`regates`)."""
    return cfg.tdc and cfg.tdc_mode == "step" and cfg.tdc_scope == "block" and cfg.tdc_regate != "off"


def regates(cfg, num_steps: int | None) -> bool:
    """Whether a run keeps each skippable block's gated pieces and recomposes its skips with the skipped step's gates
    (``tdc_regate``, module docstring): ``"on"``, or ``"auto"`` wherever step mode with block scope keeps a delta per
    block (not the span). The model family must have gated pieces (``Adapter.gated_parts``; checked by ``apply``)."""
    if not regate_possible(cfg):
        return False
    return cfg.tdc_regate == "on" or not uses_span(cfg, num_steps)


def live_span(cfg, num_blocks: int) -> tuple[int, int] | None:
    """Step mode's span in a live run: the blocks after the probe and before the ``tdc_tail`` tail (first, last)."""
    first, last = 1, num_blocks - 1 - cfg.tdc_tail
    return (first, last) if cfg.tdc_mode == "step" and first <= last else None


def forecast_order(cfg, num_steps: int | None) -> int:
    """The order of the forecast a skipped cell returns (0: the last delta itself; ``"scaled"`` is 0 too)."""
    return ORDER.get(resolve_reuse(cfg, num_steps), 0)


def probe_threshold(step: int, num_steps: int | None, cfg, profile=None) -> float:
    """Step mode's threshold on the probe's drift at ``step`` of ``num_steps`` (module docstring): the base —
    ``tdc_forecast_threshold`` where ``tdc_reuse="auto"`` forecasts the whole delta (``"linear"``/``"quadratic"``,
    at ``tdc_forecast_steps`` or more; not ``"magnitude"`` below) and the probe is compared with the forecast,
    else ``tdc_probe_threshold`` (also with ``tdc_probe_reference="last"``: the drift since the last computed
    step, as without a forecast) — × S/N
    (rules ``"steps"``, ``"profile"``; not when the step count is unknown), ÷ the calibrated weight of
    ``profile`` (a :class:`sixbit.policy.ProbeProfile`, rule ``"profile"``; None: no weight)."""
    auto_forecast = (cfg.tdc_reuse == "auto" and resolve_reuse(cfg, num_steps) in ("linear", "quadratic")
                     and cfg.tdc_probe_reference == "forecast")
    theta = cfg.tdc_forecast_threshold if auto_forecast else cfg.tdc_probe_threshold
    if cfg.tdc_threshold_rule == "fixed" or num_steps is None:
        return theta
    theta *= cfg.tdc_threshold_steps / num_steps
    if cfg.tdc_threshold_rule == "profile" and profile is not None:
        theta /= profile.weight(step, num_steps)
    return theta


def step_skips(probe_change: float | None, step: int, num_steps: int | None, cfg,
               threshold: float | None = None) -> bool:
    """Step mode: True when the blocks after the probe skip jointly at ``step`` — inside the window and the
    probe's drift since the last computed step (None without a reference) at most ``threshold`` (default: the
    step's :func:`probe_threshold` without a profile). (The cap on consecutive skipped steps, :func:`capped`,
    is the hook's: it records why.)"""
    if not cfg.tdc or step < cfg.tdc_first or probe_change is None:
        return False
    if num_steps is not None and step >= num_steps - cfg.tdc_last:
        return False
    return probe_change <= (probe_threshold(step, num_steps, cfg) if threshold is None else threshold)


def fixed(index: int, num_blocks: int, cfg) -> bool:
    """True for a block that never skips in a live decision: step mode's probe (block 0) and, in either mode,
    the ``tdc_tail`` last blocks."""
    return (cfg.tdc_mode == "step" and index == 0) or index >= num_blocks - cfg.tdc_tail


#: ``tdc_reuse="magnitude"``: the per-step magnitude ratio is clamped to this range before it is extrapolated
MAGNITUDE_CLAMP = (0.5, 2.0)


def l1_size(t: torch.Tensor) -> torch.Tensor:
    """A tensor's mean |x| (fp32, 0-d) over its finite elements — ``"magnitude"``'s size: a non-finite element stays in
    its place, it does not poison the stream's ratio (the output is not cleaned). Of a 0-d size: the size itself."""
    return t.abs().nan_to_num_(nan=0.0, posinf=0.0).mean(dtype=torch.float32)


def extrapolates(prev, prev_step: int | None, last_step: int | None) -> bool:
    """Whether a forecast has an earlier computed delta (``prev`` at ``prev_step``, before ``last_step``) to extrapolate
    from; without one the held delta is reused as it is."""
    return prev is not None and prev_step is not None and prev_step < last_step


def magnitude_ratios(delta: list[torch.Tensor], prev: list[torch.Tensor], step: int, last_step: int, prev_step: int,
                     sizes: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """``"magnitude"``'s factor per stream at ``step`` (fp32, 0-d): ``r^s`` with ``r = ‖Δ₀‖₁ / ‖Δ₁‖₁`` clamped to
    :data:`MAGNITUDE_CLAMP`, ``s`` the steps since ``last_step`` in units of the last gap. ``prev`` may hold the earlier
    delta's sizes only (0-d: ``BlockState.keep``'s ``sizes_only``; the size of a size is the size itself); ``sizes``:
    ``delta``'s sizes where the caller keeps them (a skip then reads no tensor: ``BlockState.sizes``)."""
    s = (step - last_step) / (last_step - prev_step)
    lo, hi = MAGNITUDE_CLAMP
    sizes = [l1_size(d) for d in delta] if sizes is None else sizes
    # the streams' factors as one stacked chain (a skipped step's host time is launches: ~7 per block, not ~10 per
    # stream); elementwise the same operations, so the same bits as one stream at a time
    if all(p.dim() == 0 for p in prev):  # l1_size of a 0-d size, stacked
        den = torch.stack(prev).abs().nan_to_num_(nan=0.0, posinf=0.0)
    else:
        den = torch.stack([l1_size(p) for p in prev])
    return list((torch.stack(sizes) / den.clamp_min(1e-30)).clamp(lo, hi).pow(s).unbind())


def forecast(delta: list[torch.Tensor], prev: list[torch.Tensor] | None, step: int, last_step: int,
             prev_step: int | None, prev2: list[torch.Tensor] | None = None,
             prev2_step: int | None = None, onto: list[torch.Tensor] | None = None,
             magnitude: bool = False, sizes: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Δ̂ at ``step`` per stream, extrapolated from ``delta`` (computed at ``last_step``), ``prev`` (at
    ``prev_step``) and, for the second order, ``prev2`` (at ``prev2_step``): the module docstring's Newton form,
    evaluated as its Lagrange weights (``w₀Δ₀ + w₁Δ₁ + w₂Δ₂``: three fused multiply-adds per stream, no
    temporaries); first order without ``prev2``, ``delta`` itself while there is no earlier delta. ``onto``: the
    streams the forecast is added to (a skipped block's input) — for the second order within the same passes.
    ``sizes``: ``delta``'s :func:`l1_size` per stream where the caller keeps them (``magnitude``; else measured)."""
    if not extrapolates(prev, prev_step, last_step):
        return delta if onto is None else [x + d for x, d in zip(onto, delta)]
    if magnitude:  # Δ₀ · r^s, r = ‖Δ₀‖₁ / ‖Δ₁‖₁ per stream (clamped): the direction is Δ₀'s, only its size moves
        rs = [r.to(d.dtype) for d, r in zip(delta, magnitude_ratios(delta, prev, step, last_step, prev_step, sizes))]
        return [d * r for d, r in zip(delta, rs)] if onto is None else [x.addcmul(d, r) for x, d, r in zip(onto, delta, rs)]
    if prev2 is None or prev2_step is None or prev2_step >= prev_step:
        s = (step - last_step) / (last_step - prev_step)
        out = [d + s * (d - p) for d, p in zip(delta, prev)]
        return out if onto is None else [x + f for x, f in zip(onto, out)]
    t, s0, s1, s2 = step, last_step, prev_step, prev2_step
    w0 = (t - s1) * (t - s2) / ((s0 - s1) * (s0 - s2))
    w1 = (t - s0) * (t - s2) / ((s1 - s0) * (s1 - s2))
    w2 = (t - s0) * (t - s1) / ((s2 - s0) * (s2 - s1))
    base = [torch.mul(d, w0) for d in delta] if onto is None else [x.add(d, alpha=w0) for x, d in zip(onto, delta)]
    return [b.add_(p, alpha=w1).add_(q, alpha=w2) for b, p, q in zip(base, prev, prev2)]


SCHEDULE_FORMAT = "sixbit-skip-schedule"


def _dense_attention(attention: dict[str, list[str]], nb: int) -> dict[str, list[str]]:
    """Every cell's attention route: a skipped cell takes the nearest computed step's (earlier on a tie)."""
    out = {}
    for name, rows in attention.items():
        out[name] = ["".join(next((rows[u][b] for d in range(len(rows)) for u in (t - d, t + d)
                                   if 0 <= u < len(rows) and rows[u][b] != NO_ATTENTION), "b") for b in range(nb))
                     for t in range(len(rows))]
    return out
#: attention routes in a schedule (version 3): one letter per block of a step, "-" for a skipped cell
ATTENTION_LETTERS = {"fp8": "8", "bf16": "b"}
NO_ATTENTION = "-"
#: a routed linear that did not run in a recorded cell that ran (the attention's linears of an attention reuse)
NO_ROUTE = "-"
#: what a schedule's skipped cells reused (``SixBitConfig.tdc_scope``)
SCOPES = ("block", "attention")
_FROM_ATTENTION = {v: k for k, v in ATTENTION_LETTERS.items()}


def _near(i: int, n_new: int, n_old: int) -> int:
    """Nearest source index at the same relative position (first ↔ first, last ↔ last)."""
    return 0 if n_new <= 1 or n_old <= 1 else round(i * (n_old - 1) / (n_new - 1))


@dataclass
class SkipSchedule:
    """Which block evaluations were computed (True) or skipped (False): ``branches[name][step][block]``;
    optionally ``routes[name][step][block]``: the route letters of a computed cell's linears ("" when
    skipped or not recorded); optionally ``attention[name][step]``: one letter per block, the attention route
    of each computed cell (:data:`ATTENTION_LETTERS`, ``"-"`` when skipped; format version 3)."""

    num_blocks: int
    num_steps: int
    branches: dict[str, list[list[bool]]]
    source: dict[str, Any] = field(default_factory=dict)
    routes: dict[str, list[list[str]]] | None = None
    attention: dict[str, list[str]] | None = None
    scope: str = "block"

    def computed(self, branch: str, step: int, block: int) -> bool:
        pattern = self.branches.get(branch) or next(iter(self.branches.values()))
        if step >= len(pattern):
            return True
        return bool(pattern[step][block])

    def span(self, branch: str) -> tuple[int, int] | None:
        """The blocks that skip together in ``branch`` as (first, last): contiguous, and every step skips all of them
        or none (a step-mode recording, also resampled). None when the skips are not one such span (block mode). A
        schedule that skips nothing reuses nothing: it gets a live run's span (blocks 1 …), which keeps no per-block
        delta (the benchmarks' forced all-computed mode measures what a live run holds)."""
        pattern = self.branches.get(branch) or next(iter(self.branches.values()))
        rows = [frozenset(b for b, c in enumerate(row) if not c) for row in pattern]
        cols = frozenset().union(*rows)
        if not cols:
            return min(1, self.num_blocks - 1), self.num_blocks - 1
        if cols != frozenset(range(min(cols), max(cols) + 1)) or any(r and r != cols for r in rows):
            return None
        return min(cols), max(cols)

    def block_routes(self, branch: str, step: int, block: int, n_linears: int) -> list[str] | None:
        """The recorded routes of a computed cell for a block of ``n_linears`` routed linears (letters
        resampled by relative position when the recording had another count), or None."""
        if not self.routes:
            return None
        pattern = self.routes.get(branch) or next(iter(self.routes.values()))
        if step >= len(pattern) or not pattern[step][block]:
            return None
        codes = pattern[step][block]
        return [FROM_LETTER.get(codes[_near(k, n_linears, len(codes))], SKIPPED) for k in range(n_linears)]

    def attention_route(self, branch: str, step: int, block: int) -> str | None:
        """The recorded attention route of a computed cell (``"fp8"``/``"bf16"``), or None."""
        if not self.attention:
            return None
        rows = self.attention.get(branch) or next(iter(self.attention.values()))
        return None if step >= len(rows) else _FROM_ATTENTION.get(rows[step][block])

    @property
    def attention_fp8_fraction(self) -> float | None:
        """Share of recorded computed cells whose attention ran 8-bit (None without attention routes)."""
        letters = "".join(r for rows in (self.attention or {}).values() for r in rows).replace(NO_ATTENTION, "")
        return letters.count(ATTENTION_LETTERS["fp8"]) / len(letters) if letters else None

    @property
    def skip_fraction(self) -> float:
        cells = [c for p in self.branches.values() for row in p for c in row]
        return 0.0 if not cells else 1.0 - sum(cells) / len(cells)

    def resample(self, num_blocks: int, num_steps: int | None = None) -> SkipSchedule:
        """The same pattern on another grid: block b and step t read the source cell at the same
        relative depth and time (nearest neighbour). Keeps the skip fraction approximately."""
        num_steps = self.num_steps if num_steps is None else num_steps

        def grid(p, cast):
            return [[cast(p[_near(t, num_steps, len(p))][_near(b, num_blocks, self.num_blocks)])
                     for b in range(num_blocks)] for t in range(num_steps)]

        branches = {name: grid(p, bool) for name, p in self.branches.items()}
        routes = None if self.routes is None else {name: grid(p, str) for name, p in self.routes.items()}
        attention = None if self.attention is None else {name: ["".join(r) for r in grid(p, str)]
                                                         for name, p in self.attention.items()}
        src = {**self.source, "resampled_from": [self.num_blocks, self.num_steps]}
        return SkipSchedule(num_blocks, num_steps, branches, src, routes, attention, self.scope)

    def dense(self) -> SkipSchedule:
        """Every cell computed, each with recorded routes: a skipped cell takes the routes of the nearest
        computed step of the same block and branch (the earlier one on a tie). For profiling the method's
        computed step with realistic routes (``python -m benchmarks step_profile --schedule``)."""
        if not self.routes:
            raise ValueError("dense() needs a schedule with routes (format version 2)")
        routes = {}
        for name, rows in self.routes.items():
            dense_rows = []
            for t in range(len(rows)):
                row = []
                for b in range(self.num_blocks):
                    row.append(next((rows[u][b] for d in range(len(rows)) for u in (t - d, t + d)
                                     if 0 <= u < len(rows) and rows[u][b] and NO_ROUTE not in rows[u][b]), ""))
                dense_rows.append(row)
            routes[name] = dense_rows
        branches = {name: [[True] * self.num_blocks for _ in rows] for name, rows in self.branches.items()}
        return SkipSchedule(self.num_blocks, self.num_steps, branches, {**self.source, "dense": True}, routes,
                            None if self.attention is None else _dense_attention(self.attention, self.num_blocks),
                            self.scope)

    @property
    def route_fractions(self) -> dict[str, float]:
        """Share of recorded linear evaluations per route (empty without routes; linears that did not run, the
        attention's in an attention reuse, are not evaluations)."""
        letters = "".join(c for p in (self.routes or {}).values() for row in p for c in row).replace(NO_ROUTE, "")
        return {r: letters.count(c) / len(letters) for r, c in LETTERS.items()} if letters else {}

    def to_dict(self) -> dict[str, Any]:
        d = {
            "format": SCHEDULE_FORMAT, "version": 3 if self.attention is not None else 1 if self.routes is None else 2,
            "num_blocks": self.num_blocks, "num_steps": self.num_steps,
            "branches": {k: [[int(c) for c in row] for row in v] for k, v in self.branches.items()},
            "skip_fraction": self.skip_fraction, "source": self.source,
        }
        if self.routes is not None:
            d["routes"] = self.routes
            d["route_fractions"] = self.route_fractions
        if self.attention is not None:
            d["attention"] = self.attention
            d["attention_fp8_fraction"] = self.attention_fp8_fraction
        if self.scope != "block":
            d["scope"] = self.scope
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SkipSchedule:
        if not isinstance(d, dict) or d.get("format") != SCHEDULE_FORMAT:
            raise ValueError(f"not a sixbit skip schedule (format != {SCHEDULE_FORMAT!r})")
        nb, ns = d["num_blocks"], d["num_steps"]
        branches = {}
        for k, rows in d["branches"].items():
            if len(rows) != ns or any(len(r) != nb for r in rows):
                raise ValueError(f"skip schedule branch {k!r}: expected {ns} steps × {nb} blocks")
            branches[k] = [[bool(c) for c in r] for r in rows]
        if not branches:
            raise ValueError("skip schedule has no branches")
        scope = d.get("scope", "block")
        if scope not in SCOPES:
            raise ValueError(f"skip schedule scope {scope!r}: expected one of {SCOPES}")
        letters = set(FROM_LETTER) | ({NO_ROUTE} if scope == "attention" else set())
        routes = d.get("routes")
        if routes is not None:
            for k, rows in routes.items():
                if k not in branches or len(rows) != ns or any(len(r) != nb for r in rows):
                    raise ValueError(f"skip schedule routes {k!r}: expected a branch's {ns} steps × {nb} blocks")
                for t, row in enumerate(rows):
                    for b, codes in enumerate(row):
                        if not isinstance(codes, str) or set(codes) - letters:
                            raise ValueError(f"skip schedule routes {k!r} step {t} block {b}: {codes!r} is not "
                                             f"a string of route letters {sorted(letters)}")
                        if codes and not branches[k][t][b] and scope == "block":
                            raise ValueError(f"skip schedule routes {k!r} step {t} block {b}: routes recorded "
                                             "for a skipped cell")
        attention = d.get("attention")
        if attention is not None:
            for k, rows in attention.items():
                if k not in branches or len(rows) != ns or any(
                        not isinstance(r, str) or len(r) != nb or set(r) - {*_FROM_ATTENTION, NO_ATTENTION} for r in rows):
                    raise ValueError(f"skip schedule attention {k!r}: expected a branch's {ns} strings of {nb} letters "
                                     f"{sorted({*_FROM_ATTENTION, NO_ATTENTION})}")
        return cls(nb, ns, branches, d.get("source", {}), routes, attention, scope)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict()) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> SkipSchedule:
        return cls.from_dict(json.loads(Path(path).read_text()))
