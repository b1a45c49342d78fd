"""CogVideoX's norm + modulate emitting the INT8 operand of the linears it feeds (fused producer).

``CogVideoXLayerNormZero`` computes ``LayerNorm(x) · (1 + scale) + shift`` (per-batch ``scale`` / ``shift``
from the time embedding) for the video and the text stream; the attention concatenates ``[text; video]``
and feeds to_q/to_k/to_v, the feed-forward the same concatenation to ff.net.0.proj. diffusers runs that as
LayerNorm, a multiply, an add (each a read and a write of the activation), the concatenation (another),
then sixbit's Hadamard + INT8 pass reads it once more. Here one kernel reads each stream once and writes
the per-token INT8 codes (+ scales) of the block-Hadamard-rotated result straight into its rows of the
concatenated operand: ``formats.norm_modulate_int8`` is the reference.

Arithmetic (fp contraction off): fp32 mean and variance over the token (two passes over the registers),
``y = w · (rstd · (x − mean)) + b`` rounded to the model dtype (PyTorch's LayerNorm formula), then
``(y · (1 + scale))`` and ``+ shift`` each rounded to the model dtype like PyTorch's two element-wise ops;
that 16-bit tile goes through ``rows_int8.store_int8_rows`` — the INT8 pass's rotation and rounding. The
only difference from "the quantize kernel run on diffusers' bf16 output" is the LayerNorm statistics'
summation order (and ``1/sqrt`` vs PyTorch's ``rsqrt``): a normalized value can differ by one ulp of the
model dtype, and then a code by one step (tests bound the rate). ``norm=True`` also (or only, with
``codes=False``) writes the 16-bit modulated output — one pass instead of three where a consumer needs it.

Launch: a persistent grid of (programs, batch) per stream; each program walks token tiles of one batch
entry, so the LayerNorm weight / bias and that entry's ``1 + scale`` / ``shift`` rows are loaded into
registers once, before the loop, and only ``x`` is loaded (software-pipelined) per step. sm_90 compile
(triton 3.9): 32 KB of shared memory per program instead of 96 KB when all five were loaded per step, and
1,065 instead of 1,385 SASS instructions per step in the loop at K = 1920 (941 vs 1,205 at 3072). Any K
that ``rows_int8.geometry`` holds in one step (≤ 128 chunks) runs; the 16-bit row is one tile, padded to
a power of two of chunks (3072 = 48 chunks of 64 → a 64-chunk tile, one token per step, 25 % idle lanes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sixbit.formats import Int8Tensor

from ._common import cast_out, cdiv, check_launchable, make_h, num_sms
from .hadamard_quant import _inv_sqrt, _tok_expand, _tok_reduce
from .rows_int8 import geometry, grid_size, store_int8_rows, tile_index

#: programs per SM of the persistent grid (every tile width): a multiple of 2, 3 and 4 — how many programs
#: fit per SM depends on the compiler's register count (2 or 3 in a triton 3.9 sm_90 compile; 3.6 may differ).
#: The programs' tile counts are equal up to one, so a grid that is not a whole number of resident rounds
#: leaves SMs idle at the end: greedy-scheduling model, 2 × 17,550 video tokens on 132 SMs, makespan over
#: the ideal at 2 / 3 / 4 resident programs per SM — 8 per SM: 1.01 / 1.13 / 1.02 (K = 1920);
#: 4 per SM: 1.00 / 1.49 / 1.01 (K = 3072); 12 per SM: ≤ 1.02 in all six cases
GRID_PROGRAMS_PER_SM = 12
#: the 16-bit output alone (``codes=False``: no rotation, no codes) — one token per step and twice the programs
#: per SM at every width. H200, Triton 3.6, 2B's ``[text; video]`` at 1920 (``probe_sweep_h200_s31.json``):
#: 0.104 ms against 0.148 with the codes forms' geometry (two tokens per step, 12 per SM)
NORM_ONLY_PROGRAMS_PER_SM = 24
#: tokens per step of the 16-bit output alone (None: the codes forms' ``rows_int8.geometry``)
NORM_ONLY_TOKENS: int | None = 1


# token counts and offsets vary with the video size: not specialised (a multiple of 16 or not), so the
# warm-up's small problem compiles the kernel a real video runs
@triton.jit(do_not_specialize=["S", "S_OUT", "OFF"])
def _norm_mod_kernel(
    x_ptr, w_ptr, b_ptr, op_ptr, sh_ptr, q_ptr, s_ptr, y_ptr,
    S, S_OUT, OFF, K, stride_op, stride_sh, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, CODES: tl.constexpr, NORM: tl.constexpr, DENSE: tl.constexpr,
    HB: tl.constexpr, INV_SQRT: tl.constexpr, TOK: tl.constexpr, G: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    bidx = tl.program_id(1)  # one batch entry per grid column: its scale / shift rows are loaded once
    dt = x_ptr.dtype.element_ty
    h = make_h(dt, BK, HB)
    kf = K.to(tl.float32)
    _, kk, col_ok = tile_index(0, TOK, K, TOK, G, BK)  # columns of the tile (the same for every step)
    w = tl.load(w_ptr + kk, mask=col_ok, other=0.0) if HAS_W else 0.0
    b = tl.load(b_ptr + kk, mask=col_ok, other=0.0) if HAS_B else 0.0
    op = tl.load(op_ptr + bidx * stride_op + kk, mask=col_ok, other=0.0)
    sh = tl.load(sh_ptr + bidx * stride_sh + kk, mask=col_ok, other=0.0)
    x_b = x_ptr + bidx.to(tl.int64) * S * K
    row_b = bidx.to(tl.int64) * S_OUT + OFF
    for blk in range(pid, tl.cdiv(S, TOK), nprog):
        tok, kk, valid = tile_index(blk, S, K, TOK, G, BK)
        x = tl.load(x_b + tok[:, None] * K + kk, mask=valid, other=0.0).to(tl.float32)
        mean = tl.math.div_rn(_tok_reduce(tl.sum(x, axis=1), TOK, G, False), kf)
        d = tl.where(valid, x - _tok_expand(mean, TOK, G)[:, None], 0.0)
        var = tl.math.div_rn(_tok_reduce(tl.sum(d * d, axis=1), TOK, G, False), kf)
        rstd = tl.math.div_rn(tl.full(var.shape, 1.0, tl.float32), tl.sqrt_rn(var + eps))
        y = _tok_expand(rstd, TOK, G)[:, None] * d
        if HAS_W:
            y = w.to(tl.float32) * y
        if HAS_B:
            y = y + b.to(tl.float32)
        y = cast_out(y, dt, INTERP).to(tl.float32)
        # padding columns stay 0 (w, b, op, sh load as 0 there); padding tokens are never stored
        y = cast_out(cast_out(y * op.to(tl.float32), dt, INTERP).to(tl.float32) + sh.to(tl.float32), dt, INTERP)
        orow = row_b + tok
        if NORM:
            tl.store(y_ptr + orow[:, None] * K + kk, y, mask=valid)
        if CODES:
            t1 = blk * TOK + tl.arange(0, TOK)
            store_int8_rows(y, h, kk, valid, orow, row_b + t1, t1 < S, q_ptr, s_ptr, K,
                            HB, INV_SQRT, TOK, G, DENSE, INTERP)


def default_warps(k: int, hadamard_block: int | None, interp: bool = False) -> int:
    """Warps of the launch for rows of ``k`` (``rows_int8.geometry``'s: 4 on CUDA at every width). One-token
    tiles (rows of 33-64 chunks: 5B's 3072) ran on 8 warps until session 31; on the H200 (Triton 3.6, 5B's
    ``[text; video]``, ``probe_sweep_h200_s31.json``) 4 warps took 0.302 / 0.289 / 0.178 ms against 0.339 /
    0.335 / 0.229 for the INT8, fp16-code and 16-bit forms."""
    return geometry(k, int(hadamard_block or 0), interp)[4]


def _check_part(x, one_plus, shift, k, b):
    if x.dim() != 3 or x.shape[-1] != k or x.shape[0] != b:
        raise ValueError(f"norm_modulate: stream of shape {tuple(x.shape)}, expected [{b}, S, {k}]")
    for name, t in (("one_plus", one_plus), ("shift", shift)):
        if t.shape != (b, k) or t.stride(-1) != 1:
            raise ValueError(f"norm_modulate: {name} must be [{b}, {k}] with unit column stride, got "
                             f"{tuple(t.shape)} strides {t.stride()}")


def norm_modulate(parts, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                  hadamard_block: int | None, *, codes: bool = True, dense: bool = False, norm: bool = False,
                  num_warps: int | None = None):
    """``LayerNorm(x) · one_plus + shift`` of each part ``(x [B, S_i, K], one_plus [B, K], shift [B, K])``,
    concatenated along the sequence in the order given (``[text; video]``), as

    * ``codes``: per-token INT8 of its block-Hadamard rotation — ``Int8Tensor(codes [B·ΣS_i, K], scale
      [B·ΣS_i, 1])``, the codes as fp16 with ``dense`` (the W4A8 GEMM's operand), else ``None``;
    * ``norm``: the modulated output itself ``[B, ΣS_i, K]`` in the model dtype, else ``None``.

    ``one_plus`` is ``1 + scale`` as diffusers computes it (in the model dtype). ``formats.norm_modulate_int8``
    is the reference. ``num_warps`` overrides the launch's warps (benchmarks; same results)."""
    if not (codes or norm):
        raise ValueError("norm_modulate: nothing to emit (codes=False, norm=False)")
    x0 = parts[0][0]
    b, k = x0.shape[0], x0.shape[-1]
    for x, op, sh in parts:
        _check_part(x, op, sh, k, b)
    interp = check_launchable(*(t for p in parts for t in p))
    if x0.dtype == torch.float32 and not interp:
        raise TypeError("norm_modulate: fp32 activations run only in the interpreter (on the H200 the fp32 "
                        "rotation at K=384, block 128 needed 288 KB of shared memory); the GPU path is bf16/fp16")
    hb = int(hadamard_block or 0)
    bk, tok, g, waves, nw = geometry(k, hb, interp)
    nw = num_warps or nw
    if not codes:  # the 16-bit output alone: its own geometry (NORM_ONLY_TOKENS, NORM_ONLY_PROGRAMS_PER_SM)
        tok = NORM_ONLY_TOKENS or tok
    if not interp:
        waves = GRID_PROGRAMS_PER_SM if codes else NORM_ONLY_PROGRAMS_PER_SM
    s_out = sum(p[0].shape[1] for p in parts)
    dev, dt = x0.device, x0.dtype
    q = torch.empty((b * s_out, k), dtype=torch.float16 if dense else torch.int8, device=dev) if codes else None
    scale = torch.empty((b * s_out, 1), dtype=torch.float32, device=dev) if codes else None
    y = torch.empty((b, s_out, k), dtype=dt, device=dev) if norm else None
    dummy = x0
    off = 0
    for x, op, sh in parts:
        x = x.contiguous()
        m = x.shape[0] * x.shape[1]
        if m:
            _norm_mod_kernel[(cdiv(grid_size(m, tok, num_sms(dev), waves), b), b)](
                x, weight if weight is not None else dummy, bias if bias is not None else dummy, op, sh,
                q if codes else dummy, scale if codes else dummy, y if norm else dummy,
                x.shape[1], s_out, off, k, op.stride(0), sh.stride(0), float(eps),
                HAS_W=weight is not None, HAS_B=bias is not None, CODES=codes, NORM=norm, DENSE=dense,
                HB=hb, INV_SQRT=_inv_sqrt(hb), TOK=tok, G=g, BK=bk, INTERP=interp, num_warps=nw,
                enable_fp_fusion=False,
            )
        off += x.shape[1]
    return (Int8Tensor(q, scale, dt) if codes else None), y


__all__ = ["default_warps", "norm_modulate"]
