"""CogVideoX's gated residual ``x + gate · y`` in one pass.

Each CogVideoX block ends its attention and its feed-forward with ``hidden + gate · out`` per token stream
(``gate`` one row per batch, ``[B, 1, C]``). PyTorch runs it as two element-wise kernels — the broadcasting
multiply takes the non-vectorized path — and writes the product in between: five passes over a
``[2, 17550, 1920]`` tensor at CogVideoX-2B size where three suffice (read ``x`` and ``y``, write the sum).
On the H200 the two ops took 26 ms of a full-method computed 2B step (15.6 multiply + 10.4 add,
``step_profile_h200_2b_s21.md``).

:func:`gated_residual` reads ``x``, ``y`` (any strides with a unit last one, e.g. the video part of the
feed-forward's ``[text; video]`` output) and the gate once and writes a new tensor. Element values are the
reference's (``formats.gated_residual``, i.e. diffusers' line) bit for bit: the product is rounded to the
dtype before the add, as PyTorch's two ops do; no FMA (``enable_fp_fusion=False``). Non-finite values
propagate as there. H200 (``benchmarks/results/probe_resid_h200_s28.json``): ``[2, 17550, 1920]`` bf16 0.104 ms
against PyTorch's 0.279 (3.9 TB/s), ``[2, 17550, 3072]`` 0.163 against 0.439, outputs bit-equal.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cast_out, cdiv, check_launchable

#: (rows, columns) of one program's tile and its warps on CUDA; the interpreter's smaller tile
CUDA_TILE = (16, 256, 8)
INTERP_TILE = (4, 64, 4)


@triton.jit(do_not_specialize=["S"])  # a real video's token count compiles nothing new
def _gated_residual_kernel(x_ptr, y_ptr, g_ptr, o_ptr, S, C, sxb, sxs, syb, sys, sgb, sob, sos,
                           BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, INTERP: tl.constexpr):
    pid_s = tl.program_id(0)
    pid_c = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = (pid_s * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cols < C
    m = (rows < S)[:, None] & cm[None, :]
    dt = o_ptr.dtype.element_ty
    g = tl.load(g_ptr + b * sgb + cols, mask=cm, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + b * sxb + rows[:, None] * sxs + cols[None, :], mask=m, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + b * syb + rows[:, None] * sys + cols[None, :], mask=m, other=0.0).to(tl.float32)
    gy = cast_out(g[None, :] * y, dt, INTERP).to(tl.float32)
    tl.store(o_ptr + b * sob + rows[:, None] * sos + cols[None, :], cast_out(x + gy, dt, INTERP), mask=m)


def supported(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether :func:`gated_residual` takes these: ``x`` and ``y`` ``[B, S, C]`` of one float dtype with unit
    last strides, ``gate`` ``[B, 1, C]`` or ``[B, C]`` of that dtype with a unit last stride, one device."""
    if x.dim() != 3 or y.shape != x.shape or x.dtype != y.dtype or gate.dtype != x.dtype:
        return False
    B, _, C = x.shape
    if gate.shape not in ((B, 1, C), (B, C)) or C == 0:
        return False
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return all(t.stride(-1) == 1 for t in (x, y, gate)) and len({x.device, y.device, gate.device}) == 1


def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, *, tile: tuple | None = None) -> torch.Tensor:
    """``x + gate * y`` as a new contiguous tensor, bit for bit PyTorch's (see the module docstring);
    check :func:`supported` first. ``tile``: (rows, columns, warps) of a program (default :data:`CUDA_TILE`)."""
    if not supported(x, gate, y):
        raise ValueError(f"gated_residual: x and y must be [B, S, C] of one float dtype with gate [B, 1, C] or "
                         f"[B, C], unit last strides, one device; got x {tuple(x.shape)} {x.dtype}, gate "
                         f"{tuple(gate.shape)} {gate.dtype}, y {tuple(y.shape)} {y.dtype}")
    interp = check_launchable(x, y, gate)
    B, S, C = x.shape
    out = torch.empty((B, S, C), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    bs, bc, warps = tile or (INTERP_TILE if interp else CUDA_TILE)
    g2 = gate.reshape(B, C) if gate.dim() == 3 else gate
    _gated_residual_kernel[(cdiv(S, bs), cdiv(C, bc), B)](
        x, y, g2, out, S, C, x.stride(0), x.stride(1), y.stride(0), y.stride(1), g2.stride(0),
        out.stride(0), out.stride(1),
        BLOCK_S=bs, BLOCK_C=bc, INTERP=interp, num_warps=warps, enable_fp_fusion=False,
    )
    return out


__all__ = ["CUDA_TILE", "INTERP_TILE", "gated_residual", "supported"]
