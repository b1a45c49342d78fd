"""Rank-consistent decisions under an existing distributed engine (diffusers context parallelism).

sixbit brings no parallel engine of its own. Under context parallelism (diffusers'
``transformer.enable_parallelism(config=ContextParallelConfig(...))``, launched with ``torchrun``) every
rank's block hooks see a slice of the tokens; under CFG parallelism, a slice of the batch. Every
decision statistic is an additive sum over tokens and batch rows — Γ's ‖Δ‖₁ and ‖in‖₁ (video stream),
the delta-change sums Σ‖Δₜ − Δₜ'‖₁ and Σ‖Δₜ'‖₁, PDR's outlier count and element count (the outlier test
is per token: ``|x| > k_σ · rms(token)``) — and ``sixbit.hooks.Run.read`` is the one place where they are
read to the host. :func:`enable` sets ``handle.reduce_stats`` to an all-reduce (SUM) over the process
group, so every rank decides — skip/compute (TDC), routes (DMPQ), PDR — from the global sums. The
accumulated skip error is built from the reduced change rates, so it agrees too, and every rank's trace
records the same reduced values (save rank 0's).

Equal on every rank: an all-reduce leaves the same bits on every rank (gloo and NCCL reduce each chunk
once and broadcast it), and the host state the rules read besides the sums (step, step count, cache
context, whether a Δ is cached) is the same on every rank by construction. ``check=True`` verifies that
on every read: it all-gathers the reduced vector and raises :class:`DivergenceError` if any rank holds
other bits (one extra collective per read: a debug switch).

Equal to the 1-process run, up to summation order: each rank sums its slice in fp32 (``dmpq.l1`` or the block-stats kernel) and the
slices are summed in fp64 (``Run.read`` casts before the reduce), so the global sums differ from one
fp32 sum over the whole tensor by fp32 rounding (relative ~1e-7·log n), and the model's own outputs
under CP differ by float noise too. The rules compare ratios of these sums with thresholds (τ, the TDC
threshold and budget, ρ); a decision can differ from the 1-process run only when a ratio lies within
that relative noise of its threshold. Outlier counts are integers, exact in fp64 (< 2⁵³). Exception:
NVFP4 activations carry a per-tensor scale from the amax of the tensor, which under CP is each rank's
local amax, so after an NVFP4 route the outputs and sums move by more than float noise and a decision
may differ from the 1-process run (the ranks still agree); ``docs/PARALLEL.md`` has the measurement.

Order: call ``sixbit.apply`` *before* ``enable_parallelism``. diffusers' hooks wrap outside the ones
already registered, so the CP split hook on ``blocks.0`` then runs first and sixbit's block hook sees
(and, when it skips, returns) the local slice; :func:`enable` refuses the other order. See
``docs/PARALLEL.md`` for which engine fits which model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sixbit.hooks import BLOCK_HOOK

__all__ = ["enable", "disable", "DivergenceError", "all_reduce_stats"]

_CP_HOOK_PREFIXES = ("cp_input---", "cp_output---")


class DivergenceError(RuntimeError):
    """Ranks hold different reduced statistics, so they would take different decisions."""


def all_reduce_stats(stats: torch.Tensor, group=None, *, check: bool = False) -> torch.Tensor:
    """SUM all-reduce of a statistics tensor over ``group`` (a copy: the input is left as it is);
    with ``check``, raise :class:`DivergenceError` unless every rank holds the same bits afterwards."""
    out = stats.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    if check:
        parts = [torch.empty_like(out) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, out, group=group)
        bad = [r for r, p in enumerate(parts) if not torch.equal(p, parts[0])]
        if bad:
            raise DivergenceError(f"reduced statistics differ on ranks {bad} of the group: "
                                  f"{[p.tolist() for p in parts]}")
    return out


def _check_order(handle) -> None:
    for name, block in handle.adapter.blocks(handle.transformer):
        order = getattr(getattr(block, "_diffusers_hook", None), "_hook_order", [])
        if BLOCK_HOOK not in order:
            continue
        inner = order[:order.index(BLOCK_HOOK)]
        if any(h.startswith(_CP_HOOK_PREFIXES) for h in inner):
            raise ValueError(f"{name}: context parallelism was enabled before sixbit.apply, so sixbit's block "
                             "hook would see the whole sequence but a local slice of the output; call "
                             "sixbit.apply(pipe, cfg) first, then transformer.enable_parallelism(...)")


def enable(handle, group=None, *, check: bool = False):
    """Make ``handle``'s decisions rank-consistent: every statistic is SUM-all-reduced over ``group``
    (default: the world) before it is read. ``group`` must hold exactly the ranks that share the
    decisions: those that split one sequence (context parallel) or one CFG batch (CFG parallel).
    ``check``: verify on every read that all ranks hold the same reduced bits. Returns the handle."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("sixbit.parallel.enable: torch.distributed is not initialized "
                           "(launch with torchrun and call torch.distributed.init_process_group first)")
    if handle.removed:
        raise ValueError("sixbit.parallel.enable: the handle was removed")
    _check_order(handle)
    handle.reduce_stats = lambda t: all_reduce_stats(t, group, check=check)
    return handle


def disable(handle) -> None:
    """Back to local statistics (the single-process path)."""
    handle.reduce_stats = None
