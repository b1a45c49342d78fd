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
or no Γ at all → ``no_gamma`` (INT8); otherwise ``dmpq``, the rule above. It reads host values only — what
the block hook measured and read once (``sixbit.hooks``) — so it is tested without a pipeline.

Why the video stream only: CogVideoX's layers see text and video tokens together, but the video tokens
are ~99 % of the rows (17,550 of 17,776 at 49×480×720) and Wan's blocks do not update the text at all;
the text stream's change is dominated by the same attention output. Including it would make Γ depend
on the prompt length more than on the denoising state.

Statistics are returned as tensors of additive sums (numerator, denominator), so that under context
parallelism they can be all-reduced across ranks before the single host read the decision needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sixbit import pdr
from sixbit.policy import LinearFit
from sixbit.routes import FP16, INT8, NVFP4, STATIC

__all__ = ["l1", "gamma_sums", "ratio", "Routing", "route"]


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


def route(cfg, step: int, n: int, *, gamma: float | None = None, skipped_last: bool = False,
          fits: list[LinearFit] | None = None, tau: float | None = None, outlier_ratio: float | None = None,
          rho: float | None = None, replayed: list[str] | None = None) -> Routing:
    """The routes of a computed block's ``n`` routed layers at ``step`` (see the module docstring).

    ``gamma``: Γ at the block's last computed step (None before the first); ``skipped_last``: the previous
    evaluation was a skip; ``fits``/``tau``: the layers' calibrated lines and τ (DMPQ only);
    ``outlier_ratio``: the block input's, when PDR checked it (``pdr.applies``), with ``rho`` its
    threshold; ``replayed``: the routes a replayed schedule recorded for this cell."""

    def every(r: str, mode: str, fired: bool = False) -> Routing:
        return Routing(mode, [r] * n, [None] * n, fired)

    if not cfg.quantized:
        return every(FP16, "fp")
    if step < cfg.warmup_steps:
        return every(FP16, "warmup")
    if cfg.quant in STATIC:
        return every(STATIC[cfg.quant], "static")
    if outlier_ratio is not None and pdr.purify(outlier_ratio, rho) and replayed is None:
        return every(FP16, "pdr", fired=True)
    if replayed is not None:  # recorded routes (PDR's check above is still paid, as in a live run)
        return Routing("replay", list(replayed), [None] * n)
    if gamma is None or (skipped_last and cfg.after_skip == INT8):
        return every(INT8, "after_skip" if skipped_last else "no_gamma")
    preds = [f.predict(gamma) for f in fits]
    return Routing("dmpq", [INT8 if e > tau else NVFP4 for e in preds], preds)
