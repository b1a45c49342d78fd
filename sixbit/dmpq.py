"""DMPQ: the Γ predictor, and the whole route decision of a computed block (one pure function).

Γ of block b at step t is the relative size of its residual update on the video-token stream::

    Γ_{b,t} = ‖out_t − in_t‖₁ / ‖in_t‖₁

At step t the router uses Γ_{b,t'} of the block's previous *computed* step t' (= t−1 unless the block
was skipped). For every routed layer ℓ of the block the policy predicts the relative quantization error
of its NVFP4 route, ``E_ℓ = α_ℓ·Γ + β_ℓ``; the layer runs INT8 activations when ``E_ℓ > τ`` and NVFP4
otherwise.

:func:`route` is the whole ladder, first match wins (the trace's ``mode``): quantization off → ``fp``
(full precision); a warm-up step → ``warmup`` (full precision); a static baseline → ``static`` (its one
route, ``sixbit.routes.STATIC``); PDR fired on the block input (``sixbit.pdr``) → ``pdr`` (full
precision); a replayed schedule with recorded routes → ``replay``; the first computed step after a skip
(no fresh Γ) → ``after_skip`` (INT8, the safe choice; ``after_skip="dmpq"`` routes by the stale Γ instead),
or no Γ at all → ``no_gamma`` (INT8); otherwise ``dmpq``, the rule above. Where NVFP4 has nothing to offer
(``SixBitConfig.nvfp4_route``: ``"auto"`` with INT8 weights resident and no FP4 tensor cores), the NVFP4
decisions of ``dmpq`` and ``replay`` run INT8 (``sixbit.routes.nvfp4_as_int8``; counted in ``Routing.nvfp4_as_int8``). It reads host values only — what
the block hook measured and read once (``sixbit.hooks``) — so it is tested without a pipeline.

Why the video stream only: CogVideoX's layers see text and video tokens together, but the video tokens
are ~99 % of the rows (17,550 of 17,776 at 49×480×720) and Wan's blocks do not update the text at all;
the text stream's change is dominated by the same attention output. Including it would make Γ depend
on the prompt length more than on the denoising state.

The block's attention has its own route (:func:`attention_route`, ``SixBitConfig.attention``): with
``"policy"`` the policy predicts the 8-bit attention's relative error ``E_attn = α_attn·Γ + β_attn`` per
block and the attention runs ``"fp8"`` when ``E_attn ≤ τ_attn``, ``"bf16"`` otherwise (the linears' rule
mirrored: at most τ takes the fewer bits); every full-precision step (quantization off, warm-up, PDR), a
block before any Γ and a block without an attention fit run ``"bf16"``; a replayed schedule's recorded
route wins over the prediction. The first computed step after a skip has no fresh Γ; what its attention
runs is ``SixBitConfig.attention_after_skip``: ``"bf16"`` (why ``after_skip``), ``"policy"`` (the rule
above on the stale Γ of the block's last computed step, why ``stale_policy``, as ``after_skip="dmpq"``
does for the linears) or ``"fp8"`` (why ``after_skip_fp8``). ``attention="fp8"`` runs 8-bit attention on
every computed block except warm-up and PDR steps; ``"bf16"`` never.

Statistics are returned as tensors of additive sums (numerator, denominator), so that under context
parallelism they can be all-reduced across ranks before the single host read the decision needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sixbit import pdr
from sixbit.policy import LinearFit
from sixbit.routes import FP16, INT8, NVFP4, STATIC

__all__ = ["l1", "gamma_sums", "ratio", "Routing", "route", "AttentionRouting", "attention_route"]


def l1(x: torch.Tensor) -> torch.Tensor:
    """‖x‖₁ accumulated in fp32, as a 0-d tensor (no host sync)."""
    return torch.linalg.vector_norm(x, ord=1, dtype=torch.float32)


def gamma_sums(delta: torch.Tensor, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖Δ‖₁, ‖in‖₁) of the video stream; Γ = ``ratio`` of the two after any all-reduce."""
    return l1(delta), l1(inp)


def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


@dataclass(frozen=True)
class Routing:
    """A computed block's decision: why (``mode``), each routed layer's route and predicted NVFP4 error
    (None unless DMPQ predicted it), and whether PDR fired."""

    mode: str
    routes: list[str]
    pred_err: list[float | None]
    pdr: bool = False
    #: layers whose NVFP4 decision runs the INT8 route instead (``SixBitConfig.nvfp4_route``)
    nvfp4_as_int8: int = 0


def route(cfg, step: int, n: int, *, gamma: float | None = None, skipped_last: bool = False,
          fits: list[LinearFit] | None = None, tau: float | None = None, outlier_ratio: float | None = None,
          rho: float | None = None, replayed: list[str] | None = None, probe: bool = False,
          nvfp4_as_int8: bool = False) -> Routing:
    """The routes of a computed block's ``n`` routed layers at ``step`` (see the module docstring).

    ``gamma``: Γ at the block's last computed step (None before the first); ``skipped_last``: the previous
    evaluation was a skip; ``fits``/``tau``: the layers' calibrated lines and τ (DMPQ only);
    ``outlier_ratio``: the block input's, when PDR checked it (``pdr.applies``), with ``rho`` its
    threshold; ``replayed``: the routes a replayed schedule recorded for this cell; ``probe``: the cell is
    step-mode TDC's probe, routed ``cfg.tdc_probe_route`` unless that is ``"policy"``; ``nvfp4_as_int8``:
    the NVFP4 decisions of the ``dmpq`` and ``replay`` modes run INT8 (``routes.nvfp4_as_int8``, counted in
    ``Routing.nvfp4_as_int8``; ``pred_err`` keeps the prediction)."""

    def every(r: str, mode: str, fired: bool = False) -> Routing:
        return Routing(mode, [r] * n, [None] * n, fired)

    if not cfg.quantized:
        return every(FP16, "fp")
    if step < cfg.warmup_steps:
        return every(FP16, "warmup")
    if cfg.quant in STATIC:
        return every(STATIC[cfg.quant], "static")
    if probe and cfg.tdc_probe_route != "policy" and replayed is None:
        return every(cfg.tdc_probe_route, "probe")
    if outlier_ratio is not None and pdr.purify(outlier_ratio, rho) and replayed is None:
        return every(FP16, "pdr", fired=True)
    if replayed is not None:  # recorded routes (PDR's check above is still paid, as in a live run)
        return _promoted(Routing("replay", list(replayed), [None] * n), nvfp4_as_int8)
    if gamma is None or (skipped_last and cfg.after_skip == INT8):
        return every(INT8, "after_skip" if skipped_last else "no_gamma")
    preds = [f.predict(gamma) for f in fits]
    return _promoted(Routing("dmpq", [INT8 if e > tau else NVFP4 for e in preds], preds), nvfp4_as_int8)


def _promoted(r: Routing, nvfp4_as_int8: bool) -> Routing:
    k = r.routes.count(NVFP4) if nvfp4_as_int8 else 0
    if not k:
        return r
    return Routing(r.mode, [INT8 if x == NVFP4 else x for x in r.routes], r.pred_err, r.pdr, k)


@dataclass(frozen=True)
class AttentionRouting:
    """A computed block's attention decision: the route (``"fp8"``/``"bf16"``), the predicted 8-bit error
    (None unless the policy predicted it) and why (``off``, ``full_precision``, ``replay``, ``fp8``,
    ``no_gamma``, ``after_skip``, ``after_skip_fp8``, ``no_fit``, ``policy``, ``stale_policy``)."""

    route: str
    pred_err: float | None
    why: str


def attention_route(cfg, routing: Routing, *, gamma: float | None = None, skipped_last: bool = False,
                    fit: LinearFit | None = None, tau_attn: float | None = None,
                    replayed: str | None = None) -> AttentionRouting:
    """The attention route of a computed block whose linears were routed as ``routing`` (see the module
    docstring). ``gamma``/``skipped_last``: as for :func:`route`; ``fit``: the block's attention line (None
    when the policy has none); ``tau_attn``: the threshold; ``replayed``: a replayed schedule's route."""
    if cfg.attention == "bf16":
        return AttentionRouting("bf16", None, "off")
    if routing.mode in ("fp", "warmup", "pdr"):
        return AttentionRouting("bf16", None, "full_precision")
    if routing.mode == "probe":  # the probe decides from its delta: no 8-bit noise in it either
        return AttentionRouting("bf16", None, "probe")
    if replayed is not None:
        return AttentionRouting(replayed, None, "replay")
    if cfg.attention == "fp8":
        return AttentionRouting("fp8", None, "fp8")
    if gamma is None:
        return AttentionRouting("bf16", None, "no_gamma")
    stale = skipped_last and cfg.attention_after_skip == "policy"
    if skipped_last and not stale:
        fp8 = cfg.attention_after_skip == "fp8"
        return AttentionRouting("fp8" if fp8 else "bf16", None, "after_skip_fp8" if fp8 else "after_skip")
    if fit is None or tau_attn is None:
        return AttentionRouting("bf16", None, "no_fit")
    e = fit.predict(gamma)
    return AttentionRouting("fp8" if e <= tau_attn else "bf16", e, "stale_policy" if stale else "policy")
