"""Purified Delta Refresh: never cache a delta computed from dirty (outlier-heavy) inputs in 4 bits.

A computed block's residual Δ is written to the temporal delta cache and may be reused for several
steps, so any quantization error in it is reused too. PDR checks, *before* the block runs, the outlier
ratio of its input (``sixbit.formats.outlier_ratio``: elements beyond ``k_σ`` times their token's RMS,
counted over all the streams the block updates). If it exceeds ρ, the whole block runs with
full-precision activations for this step — route ``"fp16"`` (the original weights: on the device with
``fp_weights="device"``, copied from pinned host memory for that block with ``"stream"``) or ``"w4a16"``
(16-bit activations × the 4-bit weights; ``"cpu"``, the default, which keeps no 16-bit weights on the GPU
and moves none there) — so the cached Δ is clean of activation quantization error (and, with the original
weights, of the 4-bit weight error too).

When does a delta count as "about to be cached"? Only when a later step could reuse it: TDC on,
DMPQ routing (a static baseline has no route to change), past warm-up, and the next step is one at which the block may skip
(``tdc_first ≤ t+1 < num_steps − tdc_last``). Under a replayed skip schedule the rule is exact: PDR
applies when the schedule skips the block at the next step.

ρ is a property of the model: where the config leaves ``pdr_rho`` empty (the default), ``sixbit.apply`` takes
the calibrated policy's ρ — ``python -m sixbit.calibrate`` measures the block-input outlier ratio at the
steps where PDR would check it and stores its 95th percentile (``POLICY_RHO_QUANTILE``), so PDR fires on
about one check in twenty — and ``FALLBACK_RHO`` when the policy has none (or was measured at another
k_σ). :func:`resolve_rho` is that rule.

The counts are additive tensors (count, total), all-reducible under context parallelism before the one
host read the decision needs (``sixbit.hooks.Run.read``). :func:`applies` says whether the block hook
measures; :func:`purify` is the rule that ``sixbit.dmpq.route`` applies to the measurement, beside the
companion rule there: the first computed step after a skip has no fresh Γ and runs INT8.
"""

from __future__ import annotations

import torch

from sixbit.formats import outlier_count

__all__ = ["applies", "outlier_sums", "outlier_ratio", "purify", "resolve_rho", "reuse_window", "FALLBACK_RHO",
           "POLICY_RHO_QUANTILE"]

#: ρ when neither the config nor the policy gives one (the 95th percentile on an earlier sixbit-mini)
FALLBACK_RHO = 3.6e-3
#: the quantile of calibration outlier ratios that a calibrated policy stores as its ρ
POLICY_RHO_QUANTILE = 0.95


def applies(cfg, step: int, num_steps: int | None, next_skip: bool | None = None) -> bool:
    """Whether the delta computed at ``step`` may be reused by a skip, under DMPQ (so PDR should check it);
    ``next_skip``: a replayed schedule's answer for the next step."""
    if not (cfg.pdr and cfg.tdc and cfg.quant == "dmpq") or step < cfg.warmup_steps:
        return False
    if next_skip is not None:  # replayed schedule: known exactly
        return next_skip
    return reuse_window(step, num_steps, cfg)


def outlier_sums(streams: list[torch.Tensor], k_sigma: float, counter=outlier_count) -> torch.Tensor:
    """``[outlier count, element count]`` over the streams as one fp64 tensor (all-reducible). ``counter``:
    ``formats.outlier_count`` (the reference) or a kernel with its signature (the block hook passes
    ``sixbit_kernels.ops.outlier_count``, one read per stream on the GPU). :func:`outlier_ratio` of the
    two, once read."""
    counts = [counter(s, k_sigma) for s in streams]
    total = sum(n for _, n in counts)
    count = sum(c for c, _ in counts)
    return torch.stack([count.to(torch.float64), torch.tensor(float(total), dtype=torch.float64, device=count.device)])


def outlier_ratio(count: float, total: float) -> float:
    """The outlier ratio from :func:`outlier_sums` read to the host (0 for an empty input)."""
    return count / total if total else 0.0


def reuse_window(step: int, num_steps: int | None, cfg) -> bool:
    """Past warm-up, and the next step is one at which TDC may skip (``tdc_first ≤ t+1 < num_steps −
    tdc_last``; no upper bound when ``num_steps`` is unknown): where a delta computed at ``step`` may be
    reused. :func:`applies` uses it without a replayed schedule; calibration samples ρ there."""
    if step < cfg.warmup_steps or step + 1 < cfg.tdc_first:
        return False
    return num_steps is None or step + 1 < num_steps - cfg.tdc_last


def resolve_rho(cfg, policy) -> tuple[float, str]:
    """(ρ, where it came from): the config's ``pdr_rho`` if set, else the calibrated policy's (when it was
    measured at the config's k_σ), else :data:`FALLBACK_RHO`."""
    if cfg.pdr_rho is not None:
        return float(cfg.pdr_rho), "config"
    rho = getattr(policy, "pdr_rho", None)
    if rho is not None and getattr(policy, "pdr_k_sigma", None) == cfg.pdr_k_sigma:
        return float(rho), "policy"
    return FALLBACK_RHO, "fallback"


def purify(ratio: float, rho: float) -> bool:
    return ratio > rho
