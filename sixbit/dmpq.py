"""DMPQ: the Γ predictor and the per-layer NVFP4/INT8 routing rule.

Γ of block b at step t is the relative size of its residual update on the video-token stream::

    Γ_{b,t} = ‖out_t − in_t‖₁ / ‖in_t‖₁

At step t the router uses Γ_{b,t'} of the block's previous *computed* step t' (= t−1 unless the block
was skipped). For every routed layer ℓ of the block the policy predicts the relative quantization error
of its NVFP4 route, ``E_ℓ = α_ℓ·Γ + β_ℓ``; the layer runs INT8 activations when ``E_ℓ > τ`` and NVFP4
otherwise. Without a fresh Γ (the first computed step after a skip) every layer runs INT8 — the safe
choice — and during warm-up every layer runs with full-precision activations (``sixbit.engine``).

Why the video stream only: CogVideoX's layers see text and video tokens together, but the video tokens
are ~99 % of the rows (17,550 of 17,776 at 49×480×720) and Wan's blocks do not update the text at all;
the text stream's change is dominated by the same attention output. Including it would make Γ depend
on the prompt length more than on the denoising state.

Statistics are returned as tensors of additive sums (numerator, denominator), so that under context
parallelism they can be all-reduced across ranks before the single host read the decision needs.
"""

from __future__ import annotations

import torch

from sixbit.policy import LinearFit, Policy

__all__ = ["l1", "gamma_sums", "ratio", "Router"]


def l1(x: torch.Tensor) -> torch.Tensor:
    """‖x‖₁ accumulated in fp32, as a 0-d tensor (no host sync)."""
    return torch.linalg.vector_norm(x, ord=1, dtype=torch.float32)


def gamma_sums(delta: torch.Tensor, inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖Δ‖₁, ‖in‖₁) of the video stream; Γ = first / second after any all-reduce."""
    return l1(delta), l1(inp)


def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


class Router:
    """Routes the layers of one block from Γ, given their fits and τ."""

    def __init__(self, fits: list[LinearFit], tau: float):
        self.fits = fits
        self.tau = tau

    @classmethod
    def for_block(cls, policy: Policy, names: list[str], tau: float) -> Router:
        return cls([policy.fit(n) for n in names], tau)

    def route(self, gamma: float) -> tuple[list[str], list[float]]:
        """(routes, predicted errors) for a host-side Γ."""
        preds = [f.predict(gamma) for f in self.fits]
        return ["int8" if e > self.tau else "nvfp4" for e in preds], preds
