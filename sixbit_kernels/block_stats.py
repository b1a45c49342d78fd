"""The engine's per-block bookkeeping in one pass: the residual Δ, Γ's sums and TDC's delta-change sums.

After a computed block the engine needs, per token stream (``sixbit/engine.py``):

* ``Δ = out − in`` in the model's dtype (the cached delta; TDC),
* ``‖Δ‖₁`` and ``‖in‖₁`` (Γ, ``sixbit/dmpq.py``), and, when a previous Δ is cached,
* ``‖Δ − Δ_old‖₁`` and ``‖Δ_old‖₁`` (the change rate, ``sixbit/tdc.py``).

In PyTorch that is a subtraction, a second subtraction into a temporary and four reductions: ten passes
over a ``[2, 17550, 1920]`` tensor at CogVideoX-2B size. ``delta_stats`` reads ``out``, ``in`` and
``Δ_old`` once and writes ``Δ`` once. Element values are the reference's: ``Δ`` is ``out − in`` rounded
once to the model's dtype (what PyTorch's bf16 subtraction does), ``Δ − Δ_old`` is likewise rounded to the
model's dtype before its absolute value, as ``l1(new − old)`` sees it. The sums are fp32 per program (a
persistent grid; each lane accumulates a strided slice), added up in fp64 on the device: deterministic,
but in another order than ``torch.linalg.vector_norm`` — equal to fp32 rounding, not bit for bit.
Non-finite values propagate as in the reference (a NaN anywhere makes the sums NaN).

``finite_l1_mean`` is TDC's ``"magnitude"`` size of a held tensor (``sixbit.tdc.l1_size``: the mean |x| over its
finite elements, a non-finite element counted as 0) in one read — the reference takes an ``abs`` into a temporary,
a ``nan_to_num_`` and a mean, and on the regated pieces (strided views into the feed-forward's ``[text; video]``
output) PyTorch's ``abs`` runs its non-vectorized kernel: 10 ms of a 2B computed step on the H200
(``step_profile_h200_2b_s28``). Any ``[B, S, C]`` view with a unit last stride (or a contiguous tensor);
fp32 partial sums in a fixed order, added in fp64: equal to the reference to fp32 rounding, deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cast_out, cdiv, check_launchable, num_sms
from .targets import RowsConfig


@triton.jit
def _delta_stats_kernel(out_ptr, in_ptr, old_ptr, delta_ptr, part_ptr, N,
                        BLOCK: tl.constexpr, HAS_OLD: tl.constexpr, WRITE: tl.constexpr, INTERP: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    dt = out_ptr.dtype.element_ty
    a_d = tl.zeros((BLOCK,), dtype=tl.float32)
    a_in = tl.zeros((BLOCK,), dtype=tl.float32)
    a_ch = tl.zeros((BLOCK,), dtype=tl.float32)
    a_old = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(pid * BLOCK, N, nprog * BLOCK):
        offs = tl.arange(0, BLOCK).to(tl.int64) + start
        m = offs < N
        o = tl.load(out_ptr + offs, mask=m, other=0.0).to(tl.float32)
        x = tl.load(in_ptr + offs, mask=m, other=0.0).to(tl.float32)
        d = cast_out(o - x, dt, INTERP)
        if WRITE:
            tl.store(delta_ptr + offs, d, mask=m)
        df = d.to(tl.float32)
        a_d += tl.abs(df)
        a_in += tl.abs(x)
        if HAS_OLD:
            old = tl.load(old_ptr + offs, mask=m, other=0.0).to(tl.float32)
            a_ch += tl.abs(cast_out(df - old, dt, INTERP).to(tl.float32))
            a_old += tl.abs(old)
    base = part_ptr + pid * 4
    tl.store(base, tl.sum(a_d, axis=0))
    tl.store(base + 1, tl.sum(a_in, axis=0))
    tl.store(base + 2, tl.sum(a_ch, axis=0))
    tl.store(base + 3, tl.sum(a_old, axis=0))


#: (elements per program step, num_warps, programs per SM) on CUDA
CUDA_CONFIG = RowsConfig(2048, 8, 4)
INTERP_CONFIG = RowsConfig(256, 4, 1)


def supported(out: torch.Tensor, inp: torch.Tensor, old: torch.Tensor | None = None) -> bool:
    """Whether :func:`delta_stats` takes these tensors: same shape and float dtype, contiguous, one device."""
    ts = [out, inp] + ([old] if old is not None else [])
    return (all(t.shape == out.shape and t.dtype == out.dtype and t.is_contiguous() for t in ts)
            and out.dtype in (torch.bfloat16, torch.float16, torch.float32)
            and len({t.device for t in ts}) == 1)


def delta_stats(out: torch.Tensor, inp: torch.Tensor, old: torch.Tensor | None = None, *, write: bool = True,
                config: tuple | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(Δ = out − in or None, sums)`` with ``sums`` an fp64 tensor ``[‖Δ‖₁, ‖in‖₁, ‖Δ − old‖₁, ‖old‖₁]``
    (the last two 0 without ``old``); one read of each input, one write of ``Δ`` (``write=False``: none)."""
    if not supported(out, inp, old):
        raise ValueError(f"delta_stats: tensors must be contiguous, of one shape, float dtype and device; got "
                         f"{[(tuple(t.shape), t.dtype, t.device) for t in (out, inp, old) if t is not None]}")
    interp = check_launchable(out, inp, *([old] if old is not None else []))
    block, nw, waves = config or (INTERP_CONFIG if interp else CUDA_CONFIG)
    n = out.numel()
    delta = torch.empty_like(out) if write else None
    grid = (max(1, min(cdiv(n, block), num_sms(out.device) * waves)),)
    part = torch.empty((grid[0], 4), dtype=torch.float32, device=out.device)
    _delta_stats_kernel[grid](
        out, inp, old if old is not None else out, delta if write else out, part, n,
        BLOCK=block, HAS_OLD=old is not None, WRITE=write, INTERP=interp, num_warps=nw, enable_fp_fusion=False,
    )
    return delta, part.to(torch.float64).sum(0)


@triton.jit(do_not_specialize=["R", "S"])
def _finite_l1_kernel(x_ptr, part_ptr, R, S, C, sb, ss, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for r0 in range(pid * BLOCK_R, R, nprog * BLOCK_R):
        rows = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        base = (rows // S) * sb + (rows % S) * ss
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + tl.arange(0, BLOCK_C)
            m = (rows < R)[:, None] & (cols < C)[None, :]
            a = tl.abs(tl.load(x_ptr + base[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32))
            acc += tl.where(a < float("inf"), a, 0.0)  # NaN and ±inf count as 0
    tl.store(part_ptr + pid, tl.sum(tl.sum(acc, axis=1), axis=0))


#: (rows, columns, num_warps, programs per SM) of the size kernel on CUDA; the interpreter's. H200, a regated
#: 2B piece ``[2, 17550, 1920]`` (``probe_sweep_h200_s31.json``): 0.069 ms strided / 0.088 contiguous, against
#: 0.092 / 0.103 for session 28's (4, 512, 4, 4)
L1_CUDA_CONFIG = (8, 512, 8, 4)
L1_INTERP_CONFIG = (2, 32, 4, 1)


def _rows3(t: torch.Tensor) -> tuple[int, int, int, int, int] | None:
    """``(R, S, C, stride_b, stride_s)`` of ``t`` as rows of ``C`` contiguous elements, or None where
    :func:`finite_l1_mean` does not take ``t``."""
    if t.numel() == 0 or t.dim() == 0 or t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    if t.is_contiguous():
        c = t.shape[-1]
        return t.numel() // c, t.numel() // c, c, 0, c
    if t.dim() == 3 and t.stride(-1) == 1:
        B, S, C = t.shape
        return B * S, S, C, t.stride(0), t.stride(1)
    return None


def finite_l1_supported(t: torch.Tensor) -> bool:
    """Whether :func:`finite_l1_mean` takes ``t``: a non-empty float tensor, contiguous or a ``[B, S, C]`` view with a
    unit last stride."""
    return _rows3(t) is not None


def finite_l1_mean(t: torch.Tensor, *, config: tuple | None = None) -> torch.Tensor:
    """The mean |x| over ``t``'s finite elements, non-finite ones counted as 0 (fp32, 0-d; ``sixbit.tdc.l1_size``)."""
    rows = _rows3(t)
    if rows is None:
        raise ValueError(f"finite_l1_mean: a non-empty bf16/fp16/fp32 tensor, contiguous or [B, S, C] with a unit last "
                         f"stride; got {tuple(t.shape)} {t.dtype} strides {t.stride()}")
    interp = check_launchable(t)
    br, bc, nw, waves = config or (L1_INTERP_CONFIG if interp else L1_CUDA_CONFIG)
    R, S, C, sb, ss = rows
    grid = (max(1, min(cdiv(R, br), num_sms(t.device) * waves)),)
    part = torch.empty(grid[0], dtype=torch.float32, device=t.device)
    _finite_l1_kernel[grid](t, part, R, S, C, sb, ss, BLOCK_R=br, BLOCK_C=bc, num_warps=nw)
    return part.sum(dtype=torch.float64).div_(t.numel()).float()


__all__ = ["delta_stats", "supported", "finite_l1_mean", "finite_l1_supported"]
