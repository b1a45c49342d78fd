"""LayerNorm over short rows read through strides: the attention's per-head q/k norm.

CogVideoX normalizes ``query``/``key`` per head (``nn.LayerNorm(head_dim)``, 64 wide) on the transposed
view ``[B, heads, S, head_dim]`` of the projection output. PyTorch makes that view contiguous and runs its
row-per-block LayerNorm on 64-element rows: on the H200 that is ~13 % of a CogVideoX-2B denoising step in
the bf16 baseline (``benchmarks/results/step_profile_h200_2b.md``). ``layer_norm_rows`` instead reads the
strided view directly, ``BLOCK_R`` rows × ``D`` columns per program, and writes the contiguous result that
``nn.LayerNorm`` returns.

Numerics: fp32 mean, then the biased variance of the centred values (two passes over the register tile),
``rstd = 1 / sqrt(var + eps)``, affine in fp32, one rounding to the output dtype — PyTorch computes the same
quantities with Welford's update, so results agree to fp32 rounding before the final cast (tests: equal
to ``F.layer_norm`` of the fp32 input within one output ulp).

Rotary embedding (``rope=(cos, sin, start)``): CogVideoX's attention applies diffusers' ``apply_rotary_emb``
(interleaved pairs, ``use_real_unbind_dim=-1``) to the normalized q/k of the video tokens — sequence
positions ``start ..`` — right after this norm; PyTorch spends ~8 element-wise passes on it, several in fp32.
With ``rope`` the kernel does it before its one store, in the reference's arithmetic: the normalized row
rounded to the output dtype, then ``x·cos + rot(x)·sin`` in fp32 with separately rounded products (no FMA:
``enable_fp_fusion=False``), rounded once — so given the same normalized values the result is bit-exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cast_out, cdiv, check_launchable


@triton.jit
def _ln_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, cos_ptr, sin_ptr, R, d1, d2, s0, s1, s2, eps, rope_start,
                    D: tl.constexpr, BLOCK_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                    ROPE: tl.constexpr, INTERP: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < R
    r64 = r.to(tl.int64)
    i0 = r64 // (d1 * d2)
    i1 = (r64 // d2) % d1
    i2 = r64 % d2
    base = i0 * s0 + i1 * s1 + i2 * s2
    col = tl.arange(0, D)
    x = tl.load(x_ptr + base[:, None] + col[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / D
    xc = x - mean[:, None]
    var = tl.sum(xc * xc, axis=1) / D
    rstd = 1.0 / tl.sqrt_rn(var + eps)
    y = xc * rstd[:, None]
    if HAS_W:
        y = y * tl.load(w_ptr + col).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + col).to(tl.float32)[None, :]
    out = cast_out(y, y_ptr.dtype.element_ty, INTERP)
    if ROPE:
        out = _rope(out, i2 - rope_start, rmask, cos_ptr, sin_ptr, D, BLOCK_R, y_ptr.dtype.element_ty, INTERP)
    tl.store(y_ptr + r64[:, None] * D + col[None, :], out, mask=rmask[:, None])


@triton.jit
def _rope(v, pos, rmask, cos_ptr, sin_ptr, D: tl.constexpr, BLOCK_R: tl.constexpr, OUT: tl.constexpr,
          INTERP: tl.constexpr):
    """Rows with ``pos >= 0`` get diffusers' interleaved rotary embedding from row ``pos`` of the ``[*, D]``
    fp32 ``cos``/``sin`` tables: ``out[2i] = x[2i]·c[2i] − x[2i+1]·s[2i]``, ``out[2i+1] = x[2i+1]·c[2i+1] +
    x[2i]·s[2i+1]`` on the rounded ``v``; other rows pass through."""
    on = rmask & (pos >= 0)
    off = tl.where(on, pos, 0)[:, None] * D + tl.arange(0, D)[None, :]
    c = tl.load(cos_ptr + off, mask=on[:, None], other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + off, mask=on[:, None], other=0.0).to(tl.float32)
    xf = v.to(tl.float32)
    ev, od = tl.split(tl.reshape(xf, (BLOCK_R, D // 2, 2)))
    ce, co = tl.split(tl.reshape(c, (BLOCK_R, D // 2, 2)))
    se, so = tl.split(tl.reshape(s, (BLOCK_R, D // 2, 2)))
    rot = tl.reshape(tl.join(ev * ce + (-od) * se, od * co + ev * so), (BLOCK_R, D))
    return tl.where(on[:, None], cast_out(rot, OUT, INTERP), v)


def supported(x: torch.Tensor, normalized_shape) -> bool:
    """Whether :func:`layer_norm_rows` takes this input: one normalized dim, a power of two in [16, 256],
    contiguous along it, at most 4 dims, a float dtype."""
    if len(tuple(normalized_shape)) != 1 or x.dim() < 1 or x.dim() > 4:
        return False
    d = x.shape[-1]
    return (d == normalized_shape[0] and 16 <= d <= 256 and d & (d - 1) == 0 and x.stride(-1) == 1
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16))


def layer_norm_rows(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                    *, rope: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                    block_rows: int = 32, num_warps: int = 4) -> torch.Tensor:
    """``F.layer_norm(x, (D,), weight, bias, eps)`` for any strided ``x`` with a contiguous last dim
    (see :func:`supported`); returns a contiguous tensor of ``x``'s shape and dtype.

    ``rope=(cos, sin, start)``: then apply diffusers' ``apply_rotary_emb`` (``use_real=True``,
    ``use_real_unbind_dim=-1``) along the second-to-last dim of ``x`` from position ``start`` on, with
    ``cos``/``sin`` of shape ``[x.shape[-2] - start, D]`` — CogVideoX's
    ``y[..., start:, :] = apply_rotary_emb(y[..., start:, :], (cos, sin))`` fused into the norm's store.
    ``block_rows`` / ``num_warps``: the CUDA launch (benchmarks; same results). H200, 2B's q with the rotary
    (``[2, 30, 17776, 64]`` strided, ``probe_sweep_h200_s31.json``): 32 rows on 4 warps 0.121 ms, 64 rows (the
    default until session 31) 0.168."""
    if not supported(x, (x.shape[-1],)):
        raise ValueError(f"layer_norm_rows: unsupported input shape {tuple(x.shape)} / strides {x.stride()} / "
                         f"dtype {x.dtype}")
    D = x.shape[-1]
    if rope is not None:
        cos, sin, start = rope
        n = x.shape[-2] - int(start) if x.dim() >= 2 else -1
        if (x.dim() < 2 or not 0 <= int(start) <= x.shape[-2] or tuple(cos.shape) != (n, D)
                or tuple(sin.shape) != (n, D) or D % 2):
            raise ValueError(f"layer_norm_rows: rotary tables {tuple(cos.shape)} / {tuple(sin.shape)} from "
                             f"position {start} do not fit x of shape {tuple(x.shape)}")
        cos, sin = cos.float().contiguous(), sin.float().contiguous()
        interp = check_launchable(x, cos, sin)
    else:
        interp = check_launchable(x)
    lead = list(x.shape[:-1])
    strides = list(x.stride()[:-1])
    while len(lead) < 3:
        lead.insert(0, 1)
        strides.insert(0, 0)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    R = lead[0] * lead[1] * lead[2]
    if R == 0:
        return y
    br = 16 if interp else block_rows
    w = weight if weight is not None else y
    b = bias if bias is not None else y
    c, s = (cos, sin) if rope is not None else (y, y)
    _ln_rows_kernel[(cdiv(R, br),)](
        x, w, b, y, c, s, R, lead[1], lead[2], strides[0], strides[1], strides[2], float(eps),
        int(rope[2]) if rope is not None else 0,
        D=D, BLOCK_R=br, HAS_W=weight is not None, HAS_B=bias is not None, ROPE=rope is not None,
        INTERP=interp, num_warps=num_warps, enable_fp_fusion=False,
    )
    return y


__all__ = ["layer_norm_rows", "supported"]
