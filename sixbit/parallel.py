"""Rank-consistent decisions under an existing distributed engine (diffusers' context-parallel machinery).

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

Equal to the 1-process run, up to summation order: each rank sums its slice in fp32 (``dmpq.l1`` or the
block-stats kernel) and the slices are summed in fp64 (``Run.read`` casts before the reduce), so the global sums differ from one
fp32 sum over the whole tensor by fp32 rounding (relative ~1e-7·log n), and the model's own outputs
under CP differ by float noise too. The rules compare ratios of these sums with thresholds (τ, the TDC
threshold and budget, ρ); a decision can differ from the 1-process run only when a ratio lies within
that relative noise of its threshold. Outlier counts are integers, exact in fp64 (< 2⁵³).

NVFP4 activations carry one per-tensor scale from the amax of the whole tensor; on a rank that is the
amax of its slice. :func:`enable` therefore also sets every routed layer's ``reduce_amax`` to a MAX
all-reduce over ``group`` of that amax (its int32 bit pattern: for non-negative floats the integer order
is the float order, NaN above inf, so the result is exact and propagates NaN like ``torch.amax``), on the
torch reference path (``formats.nvfp4_tensor_scale``) and the Triton path (the pre-pass result, before
the quantize pass forms the scale). The block scales are per 16 elements of a token, so with the global
amax every rank's codes equal the 1-process codes of its tokens, bit for bit. MAX is idempotent, so a
tensor that every rank holds whole (a replicated input) is unchanged by it. Cost: one 4-byte collective
per NVFP4 activation quantization (Q, K and V share one through the activation cache); none without
:func:`enable`.

CFG parallel (CogVideoX): :func:`cogvideox_cfg_plan` is a diffusers context-parallel plan that splits
the batched ``[uncond; cond]`` call on the batch dimension after the embeddings and gathers it after
``proj_out``; :func:`enable_cogvideox_cfg_parallel` applies it through
``transformer.enable_parallelism(config=ContextParallelConfig(...), cp_plan=...)``. Attention stays each
rank's own (a batch row attends only to itself), so no attention processor may carry diffusers'
``_parallel_config``. ``docs/PARALLEL.md`` says why CFG parallel and not a token-split plan.

Order: call ``sixbit.apply`` *before* ``enable_parallelism``. diffusers' hooks wrap outside the ones
already registered, so the CP split hook on ``blocks.0`` then runs first and sixbit's block hook sees
(and, when it skips, returns) the local slice; :func:`enable` refuses the other order. (The CFG plan's
hooks sit outside the blocks; there the reason is that ``sixbit.apply`` may swap ``proj_out``.) See
``docs/PARALLEL.md`` for which engine fits which model.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from sixbit.hooks import BLOCK_HOOK

__all__ = ["enable", "disable", "DivergenceError", "all_reduce_stats", "all_reduce_amax", "cogvideox_cfg_plan",
           "enable_cogvideox_cfg_parallel"]

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


def all_reduce_amax(bits: torch.Tensor, group=None) -> torch.Tensor:
    """MAX all-reduce, in place, of an NVFP4 amax held as its int32 bit pattern (``SixBitLinear.reduce_amax``)."""
    dist.all_reduce(bits, op=dist.ReduceOp.MAX, group=group)
    return bits


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
    for m in handle.modules:
        m.reduce_amax = partial(all_reduce_amax, group=group)
    return handle


def disable(handle) -> None:
    """Back to local statistics and local NVFP4 amaxes (the single-process path)."""
    handle.reduce_stats = None
    for m in handle.modules:
        m.reduce_amax = None


def cogvideox_cfg_plan() -> dict:
    """The CFG-parallel plan of a ``CogVideoXTransformer3DModel`` in diffusers' plan format: split the
    outputs of ``time_embedding`` (``emb [B, D]``) and ``patch_embed`` (``[B, text + video, D]``) on the
    batch dimension, gather the output of ``proj_out`` on it. The blocks, ``norm_final`` and ``norm_out``
    run on the rank's rows; the unpatchify after ``proj_out`` reads the batch size from the transformer's
    input, i.e. the whole batch. (CogVideoX 1.5's ``ofs`` embedding is one row for any batch: left whole.)"""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    rows = partial(ContextParallelInput, split_dim=0, split_output=True)
    return {"time_embedding": {0: rows(expected_dims=2)}, "patch_embed": {0: rows(expected_dims=3)},
            "proj_out": ContextParallelOutput(gather_dim=0, expected_dims=3)}


def enable_cogvideox_cfg_parallel(transformer, world_size: int | None = None):
    """Split CogVideoX's batched CFG call over ``world_size`` ranks (default: the world) with diffusers'
    own machinery: ``enable_parallelism(config=ContextParallelConfig(ulysses_degree=world_size),
    cp_plan=cogvideox_cfg_plan())``. The batch (2 × videos per prompt) must divide by it.
    Call after ``sixbit.apply``, which may swap ``proj_out`` (a hook on the module it replaces would be lost);
    returns the transformer."""
    from diffusers import ContextParallelConfig

    if type(transformer).__name__ != "CogVideoXTransformer3DModel":
        raise TypeError(f"enable_cogvideox_cfg_parallel: expected a CogVideoXTransformer3DModel, "
                        f"got {type(transformer).__name__}")
    world_size = world_size or dist.get_world_size()
    transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world_size),
                                   cp_plan=cogvideox_cfg_plan())
    aware = [n for n, m in transformer.named_modules()
             if getattr(getattr(m, "processor", None), "_parallel_config", None) is not None]
    if aware:
        raise ValueError(f"{aware[0]}: its attention processor takes diffusers' _parallel_config (context-parallel "
                         "attention), which would exchange tokens between the ranks' different batch rows; CFG parallel "
                         "needs each rank's own attention (CogVideoX's stock or sixbit's processor)")
    return transformer
