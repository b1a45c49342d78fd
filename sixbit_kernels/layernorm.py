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

from typing import NamedTuple

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
    x = tl.load(x_ptr + base[:, None] + col[None, :], mask=rmask[:, None], other=0.0)
    out = norm_rows_tile(x, i2 - rope_start, rmask, w_ptr, b_ptr, cos_ptr, sin_ptr, eps, D, BLOCK_R, HAS_W, HAS_B,
                         ROPE, y_ptr.dtype.element_ty, INTERP)
    tl.store(y_ptr + r64[:, None] * D + col[None, :], out, mask=rmask[:, None])


@triton.jit
def norm_rows_tile(x, pos, rmask, w_ptr, b_ptr, cos_ptr, sin_ptr, eps, D: tl.constexpr, BLOCK_R: tl.constexpr,
                   HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROPE: tl.constexpr, OUT: tl.constexpr,
                   INTERP: tl.constexpr):
    """The norm (and rotary) of a loaded ``[BLOCK_R, D]`` tile of rows, rounded to ``OUT`` — what
    :func:`layer_norm_rows` stores; rows where ``rmask`` is false give zeros. ``pos``: each row's position
    in the rotary tables (rows with ``pos < 0`` are not rotated). The one definition of the arithmetic: the
    8-bit attention's Q load and K/V pass call it on the projections (:class:`RowNorm`)."""
    x = x.to(tl.float32)
    mean = tl.sum(x, axis=1) / D
    xc = x - mean[:, None]
    var = tl.sum(xc * xc, axis=1) / D
    rstd = 1.0 / tl.sqrt_rn(var + eps)
    y = xc * rstd[:, None]
    col = tl.arange(0, D)
    if HAS_W:
        y = y * tl.load(w_ptr + col).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + col).to(tl.float32)[None, :]
    out = cast_out(y, OUT, INTERP)
    if ROPE:
        out = _rope(out, pos, rmask, cos_ptr, sin_ptr, D, BLOCK_R, OUT, INTERP)
    return tl.where(rmask[:, None], out, 0.0).to(OUT)


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


class RowNorm(NamedTuple):
    """A per-row LayerNorm (and rotary) to apply on load: ``F.layer_norm(x, (D,), weight, bias, eps)``, then
    with ``rope=(cos, sin, start)`` diffusers' ``apply_rotary_emb`` on rows ``start ..`` of the
    second-to-last dim — what :func:`layer_norm_rows` computes, for kernels that read the raw rows instead
    of its output (the 8-bit attention: ``attention_fp8.fp8_attention(..., q_norm=, k_norm=)``)."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    rope: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def check(self, x: torch.Tensor, name: str = "x") -> None:
        """Raise ``ValueError`` (naming ``name`` and the field) where this norm does not fit ``x``."""
        D = x.shape[-1]
        if not supported(x, (D,)):
            raise ValueError(f"{name}: unsupported input for the row norm: shape {tuple(x.shape)} / strides "
                             f"{x.stride()} / dtype {x.dtype} (a power-of-two last dim in [16, 256], contiguous)")
        for field in ("weight", "bias"):
            t = getattr(self, field)
            if t is not None and tuple(t.shape) != (D,):
                raise ValueError(f"{name}: norm {field} of shape {tuple(t.shape)} does not match head dim {D}")
        if self.rope is not None:
            cos, sin, start = self.rope
            n = x.shape[-2] - int(start) if x.dim() >= 2 else -1
            if (x.dim() < 2 or not 0 <= int(start) <= x.shape[-2] or tuple(cos.shape) != (n, D)
                    or tuple(sin.shape) != (n, D) or D % 2):
                raise ValueError(f"{name}: rotary tables {tuple(cos.shape)} / {tuple(sin.shape)} from position "
                                 f"{start} do not fit {name} of shape {tuple(x.shape)}")

    def launch(self, like: torch.Tensor) -> tuple[tuple, dict]:
        """The kernel arguments ``(w, b, cos, sin, eps, start)`` (``like`` where absent) and the constexprs
        ``NORM``, ``NORM_W``, ``NORM_B``, ``NORM_ROPE`` of a kernel that calls :func:`norm_rows_tile`."""
        cos = sin = like
        start = 0
        if self.rope is not None:
            cos, sin, start = self.rope
            cos, sin = cos.float().contiguous(), sin.float().contiguous()
        args = (like if self.weight is None else self.weight, like if self.bias is None else self.bias, cos, sin,
                float(self.eps), int(start))
        return args, dict(NORM=True, NORM_W=self.weight is not None, NORM_B=self.bias is not None,
                          NORM_ROPE=self.rope is not None)


def no_norm(like: torch.Tensor) -> tuple[tuple, dict]:
    """:meth:`RowNorm.launch` of a kernel call without a norm (the pointers are placeholders)."""
    return (like, like, like, like, 0.0, 0), dict(NORM=False, NORM_W=False, NORM_B=False, NORM_ROPE=False)


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
    norm = RowNorm(weight, bias, eps, rope)
    norm.check(x, "layer_norm_rows")
    D = x.shape[-1]
    interp = check_launchable(x, *(rope[:2] if rope is not None else ()))
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
    (w, b, c, s, eps, start), flags = norm.launch(y)
    _ln_rows_kernel[(cdiv(R, br),)](
        x, w, b, y, c, s, R, lead[1], lead[2], strides[0], strides[1], strides[2], eps, start,
        D=D, BLOCK_R=br, HAS_W=flags["NORM_W"], HAS_B=flags["NORM_B"], ROPE=flags["NORM_ROPE"],
        INTERP=interp, num_warps=num_warps, enable_fp_fusion=False,
    )
    return y


__all__ = ["RowNorm", "layer_norm_rows", "norm_rows_tile", "no_norm", "supported"]
