"""Fused activation quantization: block Hadamard → NVFP4 or INT8, with the PDR outlier count.

Two kernels; neither writes the rotated tensor to memory:

``_rows_kernel`` (token-resident). A program owns ``TOK`` whole tokens (rows of ``x [M, K]``). K is cut
into chunks of ``BK`` (≤ 128) columns; a step loads ``G`` chunks of each of the ``TOK`` tokens as one
``[TOK * G, BK]`` register tile (row ``i`` is chunk ``i % G`` of token ``i // G``; ``G`` a power of two,
padding masked; a one-step row that would leave over 1/8 of the tile as padding — 48 or 192 chunks — is
two tiles of ``G`` and ``G2`` chunks per token instead, 32 + 16 or 128 + 64) and rotates it with one
tensor-core dot against a block-diagonal ±1 matrix. When a token fits in one step (every CogVideoX width on
the CUDA configs) the kernel has whole rows in registers: per-token amax (INT8 scale) and RMS (outlier
threshold) need no second read. Otherwise a second pass re-reads the program's own ``TOK * K`` values, which
are still in L2, so DRAM sees one read.
Modes:

* ``INT8``  → INT8 codes + per-token scale (``formats.quantize_int8`` of the rotated rows); without
  ``ROUND``, the same per-token scaling left unrounded in fp16 (:func:`scale16_act`, the W4A16 operand).
* ``AMAX``  → the NVFP4 pre-pass: global amax of the rotated tensor (``tl.atomic_max`` on the int32 bit
  pattern of |x|, which orders non-negative floats exactly and makes NaN win over inf, as torch's amax).
* ``SPLIT`` → the rotated rows as a bf16 pair ``[hi | lo]`` (≈16 significant bits) for the W4A16 GEMM.
* ``STATS`` → only the outlier count.

Every mode can also count outliers (``|x| > k_sigma * rms(token)`` on the *un-rotated* row, exactly
``formats.outlier_count``) and add the program's count to one int32 counter with ``tl.atomic_add``.

``_nvfp4_kernel`` (tiles). NVFP4's per-tensor scale needs the global amax before any code is written, so
NVFP4 is a pre-pass (``_rows_kernel`` in ``AMAX`` mode, which also counts outliers) followed by this
kernel: tiles of the contiguous view ``x.view(M * K / BK, BK)``, rotate, 16-element block amax, e4m3 block
scale, E2M1 codes, two codes per byte. Its second read of ``x`` is the price of the per-tensor scale.

Bit-exactness. Given the same rotated input (``hadamard_block=None`` on ``block_hadamard(x)``), codes and
scales equal ``sixbit.formats`` bit for bit: the same fp32 operations in the same order (IEEE divisions via
``div_rn``, e4m3 rounding by integer RNE on the fp32 mantissa, ties-to-even thresholds, magic-number RNE
for INT8, fp-contraction off). With the rotation fused, the rotated values can differ from the reference's
``x @ (H / sqrt(b))`` in the last fp32 bit (different summation order; for b = 32, 128 the 1/sqrt(b) factor
is applied after the sum): then a code can flip by one step where a value sits on a rounding tie — rare
(tests bound the rate) and never more than one step. When every partial sum is exact (e.g. bf16 inputs of
moderate dynamic range, b = 16 or 64) the fused result is bit-exact too (tested).

Non-finite input follows the spec's ``check_finite=False`` behaviour: NaN scale for every INT8 row with a
NaN/Inf; for NVFP4 one non-finite value makes the tensor scale non-finite and every block scale NaN.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sixbit.formats import E4M3_MAX, E4M3_TINY, F4_MAX, FP4_BLOCK, Int8Tensor, NVFP4Tensor

from ._common import (
    absbits,
    cdiv,
    check_launchable,
    chunk_width,
    dot,
    e2m1_encode,
    e2m1_half,
    e4m3_round,
    int8_row_scale,
    make_h,
    next_pow2,
    num_sms,
    rne_int,
    rotate,
)
from .gemm_w4 import DenseAct, SplitAct
from .targets import RowsConfig, Target

MODE_INT8, MODE_AMAX, MODE_SPLIT, MODE_STATS = 0, 1, 2, 3
#: rows of the token-resident register tile (TOK * G) used by the interpreter
ROWS_TILE = 128
#: at most this many register-tile steps per token (K ≤ 8 * 128 * 128 = 131072)
MAX_CHUNKS = 8 * 128


def _inv_sqrt(b: int) -> float:
    return float(torch.tensor(1.0 / math.sqrt(b), dtype=torch.float64).float()) if b else 1.0


# ------------------------------------------------------------------------------- token-resident kernel


@triton.jit
def _rows_tail(x, r, kk, valid, tok64, stride_qm, q_ptr, inv_r, thr_r,
               MODE: tl.constexpr, DENSE: tl.constexpr, OUTLIERS: tl.constexpr, ROUND: tl.constexpr):
    """Second half of a step: INT8 codes of the rotated tile ``r`` (or, without ``ROUND``, the scaled
    values ``r * 127 / amax`` as fp16) and the outlier hits of ``x`` (``inv_r``, ``thr_r``: per-row copies
    of the per-token values)."""
    n = 0
    if OUTLIERS:
        hits = tl.abs(x.to(tl.float32)) > thr_r[:, None]
        n = tl.sum(tl.sum(hits.to(tl.int32), axis=1), axis=0)
    if MODE == 0 and not ROUND:
        tl.store(q_ptr + tok64[:, None] * stride_qm + kk, (r * inv_r[:, None]).to(tl.float16), mask=valid)
    elif MODE == 0:
        q = rne_int(r * inv_r[:, None])
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        q = tl.where(q == q, q, 0.0)  # non-finite rows: codes 0 (their scale is NaN)
        if DENSE:
            tl.store(q_ptr + tok64[:, None] * stride_qm + kk, q.to(tl.float16), mask=valid)
        else:
            tl.store(q_ptr + tok64[:, None] * stride_qm + kk, q.to(tl.int8), mask=valid)
    return n


@triton.jit
def _tok_reduce(v, TOK: tl.constexpr, G: tl.constexpr, IS_MAX: tl.constexpr):
    """[TOK * G] per-row values → [TOK] per-token max / sum."""
    v2 = tl.reshape(v, (TOK, G))
    if IS_MAX:
        return tl.max(v2, axis=1)
    else:
        return tl.sum(v2, axis=1)


@triton.jit
def _tok_expand(v, TOK: tl.constexpr, G: tl.constexpr):
    """[TOK] per-token values → [TOK * G] per-row copies."""
    return tl.reshape(tl.broadcast_to(v[:, None], (TOK, G)), (TOK * G,))


@triton.jit
def _rows_load(x_ptr, blk, c0, M, K, stride_xm, h,
               ROTATE: tl.constexpr, HB: tl.constexpr, INV_SQRT: tl.constexpr,
               TOK: tl.constexpr, GG: tl.constexpr, BK: tl.constexpr, INTERP: tl.constexpr):
    """Chunks ``c0 .. c0 + GG - 1`` of the ``TOK`` tokens of block ``blk`` as one ``[TOK * GG, BK]`` tile (row
    ``i`` is chunk ``c0 + i % GG`` of token ``i // GG``), and its rotation (fp32; ``x`` itself without ``ROTATE``)."""
    i = tl.arange(0, TOK * GG)
    tok64 = (blk * TOK + i // GG).to(tl.int64)
    kk = (c0 + i % GG)[:, None] * BK + tl.arange(0, BK)[None, :]
    valid = (tok64[:, None] < M) & (kk < K)
    x = tl.load(x_ptr + tok64[:, None] * stride_xm + kk, mask=valid, other=0.0)
    if ROTATE:
        r = rotate(x, h, HB, INV_SQRT, INTERP)
    else:
        r = x
    return x, r, kk, valid, tok64


@triton.jit
def _rows_stats(x, r, kk, valid, tok64, q_ptr, stride_qm, K, amax_tok, sumsq,
                MODE: tl.constexpr, OUTLIERS: tl.constexpr, TOK: tl.constexpr, GG: tl.constexpr):
    """Pass 1 on one tile: per-token amax bits (INT8) and sum of squares (outliers) folded into the running
    ``[TOK]`` vectors — reductions go row → token on small per-row vectors, so the tile is never re-laid
    out — and ``SPLIT``'s stores, which need no statistics."""
    if OUTLIERS:
        xf = x.to(tl.float32)
        sumsq += _tok_reduce(tl.sum(xf * xf, axis=1), TOK, GG, False)
    if MODE == 0:
        amax_tok = tl.maximum(amax_tok, _tok_reduce(tl.max(absbits(r), axis=1), TOK, GG, True))
    elif MODE == 2:  # rotated rows as a bf16 pair, stored [hi | lo] along the row
        hi = r.to(tl.bfloat16)
        lo = (r - hi.to(tl.float32)).to(tl.bfloat16)
        tl.store(q_ptr + tok64[:, None] * stride_qm + kk, hi, mask=valid)
        tl.store(q_ptr + tok64[:, None] * stride_qm + K + kk, lo, mask=valid)
    return amax_tok, sumsq


# the row count is not specialised: PDR's outlier count runs per stream (CogVideoX-2B: 2 × 226 text and
# 2 × 17,550 video rows, not multiples of 16) and the warm-up's 1024 rows would otherwise compile another
# variant than the run meets (session 12: a 0.5 s compile inside step 8 of a timed 2B run)
@triton.jit(do_not_specialize=["M"])
def _rows_kernel(
    x_ptr, q_ptr, scale_ptr, amax_ptr, count_ptr,
    M, K, stride_xm, stride_qm, k_sigma,
    MODE: tl.constexpr, DENSE: tl.constexpr, OUTLIERS: tl.constexpr, ROUND: tl.constexpr,
    HB: tl.constexpr, INV_SQRT: tl.constexpr,
    TOK: tl.constexpr, G: tl.constexpr, G2: tl.constexpr, NSTEP: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr,
):
    # persistent: a program walks token blocks pid, pid + nprog, ...; the Hadamard matrix is built once.
    # G2 > 0 (one step only): a token's chunks are two tiles of G and G2 rows per token (e.g. 48 = 32 + 16),
    # so a row length that is not a power-of-two number of chunks wastes no lanes on padding
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblk = tl.cdiv(M, TOK)
    h = make_h(x_ptr.dtype.element_ty, BK, HB)
    ROT: tl.constexpr = MODE != 3
    n = 0
    gmax = 0
    for blk in range(pid, nblk, nprog):
        # ---- pass 1: statistics (and the outputs that need none)
        amax_tok = tl.zeros((TOK,), dtype=tl.int32)
        sumsq = tl.zeros((TOK,), dtype=tl.float32)
        for s in tl.static_range(NSTEP):
            x, r, kk, valid, tok64 = _rows_load(x_ptr, blk, s * G, M, K, stride_xm, h, ROT, HB, INV_SQRT,
                                                TOK, G, BK, INTERP)
            amax_tok, sumsq = _rows_stats(x, r, kk, valid, tok64, q_ptr, stride_qm, K, amax_tok, sumsq,
                                          MODE, OUTLIERS, TOK, G)
            if MODE == 1:
                gmax = tl.maximum(gmax, tl.max(tl.max(absbits(r), axis=1), axis=0))
        if G2 > 0:
            x2, r2, kk2, valid2, tok2 = _rows_load(x_ptr, blk, G, M, K, stride_xm, h, ROT, HB, INV_SQRT,
                                                   TOK, G2, BK, INTERP)
            amax_tok, sumsq = _rows_stats(x2, r2, kk2, valid2, tok2, q_ptr, stride_qm, K, amax_tok, sumsq,
                                          MODE, OUTLIERS, TOK, G2)
            if MODE == 1:
                gmax = tl.maximum(gmax, tl.max(tl.max(absbits(r2), axis=1), axis=0))

        # ---- per-token results
        inv = tl.zeros((TOK,), dtype=tl.float32)
        if MODE == 0:
            inv, scale = int8_row_scale(amax_tok)
            t1 = blk * TOK + tl.arange(0, TOK)
            tl.store(scale_ptr + t1, scale, mask=t1 < M)
        thr = tl.zeros((TOK,), dtype=tl.float32)
        if OUTLIERS:
            thr = k_sigma * tl.sqrt_rn(tl.math.div_rn(sumsq, K.to(tl.float32)))

        # ---- pass 2: codes and outlier hits (a single step reuses the tiles in registers; more steps
        #      re-read this block's rows, TOK * K values, which are still in L2)
        if MODE == 0 or OUTLIERS:
            inv_r = _tok_expand(inv, TOK, G)
            thr_r = _tok_expand(thr, TOK, G)
            if NSTEP == 1:
                n += _rows_tail(x, r, kk, valid, tok64, stride_qm, q_ptr, inv_r, thr_r, MODE, DENSE, OUTLIERS, ROUND)
                if G2 > 0:
                    n += _rows_tail(x2, r2, kk2, valid2, tok2, stride_qm, q_ptr, _tok_expand(inv, TOK, G2),
                                    _tok_expand(thr, TOK, G2), MODE, DENSE, OUTLIERS, ROUND)
            else:
                for s in tl.static_range(NSTEP):
                    x, r, kk, valid, tok64 = _rows_load(x_ptr, blk, s * G, M, K, stride_xm, h, MODE == 0, HB,
                                                        INV_SQRT, TOK, G, BK, INTERP)
                    n += _rows_tail(x, r, kk, valid, tok64, stride_qm, q_ptr, inv_r, thr_r, MODE, DENSE, OUTLIERS, ROUND)
    if MODE == 1:
        tl.atomic_max(amax_ptr, gmax)
    if OUTLIERS:
        tl.atomic_add(count_ptr, n)


# ---------------------------------------------------------------------------------------- NVFP4 tiles


@triton.jit
def _nvfp4_kernel(
    x_ptr, data_ptr, scales_ptr, ts_ptr, amax_ptr, dense_ptr,
    MR, BLOCK_R: tl.constexpr, BK: tl.constexpr,
    HB: tl.constexpr, INV_SQRT: tl.constexpr, DENSE: tl.constexpr, INTERP: tl.constexpr,
):
    """Rows of the view ``x.view(MR, BK)`` → NVFP4 codes ``[MR, BK/2]`` and e4m3 scales ``[MR, BK/16]``.
    Persistent: a program walks row blocks pid, pid + nprog, ... with the Hadamard matrix built once."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    h = make_h(x_ptr.dtype.element_ty, BK, HB)
    col = tl.arange(0, BK)
    # per-tensor decode scale s = amax / (6 * 448); an all-zero tensor keeps s = 1
    amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
    s = tl.math.div_rn(amax, 2688.0)
    s = tl.where(s == 0.0, 1.0, s)
    if pid == 0:
        tl.store(ts_ptr, s)
    for blk in range(pid, tl.cdiv(MR, BLOCK_R), nprog):
        _nvfp4_block(x_ptr, data_ptr, scales_ptr, dense_ptr, blk, MR, s, h, col,
                     BLOCK_R, BK, HB, INV_SQRT, DENSE, INTERP)


@triton.jit
def _nvfp4_block(x_ptr, data_ptr, scales_ptr, dense_ptr, blk, MR, s, h, col,
                 BLOCK_R: tl.constexpr, BK: tl.constexpr, HB: tl.constexpr, INV_SQRT: tl.constexpr,
                 DENSE: tl.constexpr, INTERP: tl.constexpr):
    rows = blk * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < MR
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * BK + col[None, :], mask=rmask[:, None], other=0.0)
    r = rotate(x, h, HB, INV_SQRT, INTERP)

    NB: tl.constexpr = BK // 16
    r3 = tl.reshape(r, (BLOCK_R, NB, 16))
    blk_bits = tl.max(absbits(r3), axis=2)
    amax_blk = blk_bits.to(tl.float32, bitcast=True)
    bsc = tl.math.div_rn(tl.math.div_rn(amax_blk, 6.0), s)
    bsc = tl.where(bsc < 0.015625, 0.015625, bsc)  # clamp(min=E4M3_TINY): NaN stays NaN
    bsc = tl.where(bsc > 448.0, 448.0, bsc)
    byte, bs32 = e4m3_round(bsc)
    bad = blk_bits >= 0x7F800000  # block holds NaN/Inf → NaN scale (check_finite=False behaviour)
    byte = tl.where(bad, 0x7F, byte)
    bs32 = tl.where(bad, float("nan"), bs32)
    recip = tl.math.div_rn(tl.math.div_rn(tl.full(bs32.shape, 1.0, tl.float32), s), bs32)
    v = r3 * recip[:, :, None]
    code = e2m1_encode(v)
    code = tl.reshape(code, (BLOCK_R, BK))

    if DENSE:
        # E2M1 * bs * 2**-7 as exact halves (the GEMM's operand format); s and 2**7 go to the epilogue
        half = e2m1_half(code)
        val = tl.reshape(half.to(tl.float32), (BLOCK_R, NB, 16)) * (bs32 * 128.0)[:, :, None]
        tl.store(dense_ptr + rows64[:, None] * BK + col[None, :], tl.reshape(val, (BLOCK_R, BK)).to(tl.float16),
                 mask=rmask[:, None])
    else:
        lo, hi = tl.split(tl.reshape(code, (BLOCK_R, BK // 2, 2)))
        packed = (lo | (hi << 4)).to(tl.uint8)
        ch = tl.arange(0, BK // 2)
        tl.store(data_ptr + rows64[:, None] * (BK // 2) + ch[None, :], packed, mask=rmask[:, None])
    sb = tl.arange(0, NB)
    tl.store(scales_ptr + rows64[:, None] * NB + sb[None, :], byte.to(tl.uint8), mask=rmask[:, None])


# ------------------------------------------------------------------------------------------- wrappers


def _prep(x2d: torch.Tensor, hadamard_block: int | None):
    if x2d.dim() != 2:
        raise ValueError(f"expected a 2-d activation [M, K], got shape {tuple(x2d.shape)}")
    if x2d.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"activations must be bf16, fp16 or fp32, got {x2d.dtype}")
    M, K = x2d.shape
    hb = int(hadamard_block or 0)
    if hb:
        if hb < 2 or hb & (hb - 1) or K % hb:
            raise ValueError(f"Hadamard block {hb} must be a power of two >= 2 dividing K={K}")
        if hb > 128:
            raise ValueError(f"the Triton kernels rotate blocks of at most 128, got {hb}")
    bk = chunk_width(K, hb)
    if bk < 16:
        raise ValueError(f"K={K} must be a multiple of 16")
    nchr = K // bk
    if nchr > MAX_CHUNKS:
        raise ValueError(f"K={K}: the token-resident kernels hold at most {MAX_CHUNKS} chunks of {bk} columns")
    interp = check_launchable(x2d)
    return x2d.contiguous(), M, K, hb, bk, nchr, interp


#: the second tile of a split must have at least this many rows: on the H200 (INT8, K = 3072) split tiles
#: of 32 + 16 and 64 + 32 rows were slower than one padded tile (57 % / 60 % vs 67 % / 63 % of copy), 128 + 64
#: faster (75 % vs 58 %); K = 12288 as 128 + 64 rows 83 % vs 67 % (benchmarks/results/kernels_h200*.md and a
#: one-off sweep)
SPLIT_MIN_ROWS = 64


def rows_geometry(nchr: int, rows_tile: int = ROWS_TILE, split: bool = True, min_rows: int | None = None):
    """(TOK tokens per program, G and G2 chunks per step, NSTEP steps) for a row of ``nchr`` chunks.

    ``TOK * next_pow2(nchr)`` rows fill the register tile. A row that takes one step but would leave more
    than 1/8 of the padded tile idle (CogVideoX-5B's 48 chunks of 64 → 64, 12288's 192 → 256) is cut into
    two power-of-two tiles instead, ``G = next_pow2(nchr) / 2`` and ``G2`` for the rest (48 = 32 + 16), when
    the second tile keeps ``min_rows`` rows (default :data:`SPLIT_MIN_ROWS`; at least the 16 rows a
    tensor-core dot needs); otherwise ``G2 = 0``."""
    min_rows = max(16, SPLIT_MIN_ROWS if min_rows is None else min_rows)
    gp = next_pow2(nchr)
    g = min(gp, rows_tile)
    tok = max(1, rows_tile // g)
    nstep = cdiv(nchr, g)
    if split and nstep == 1 and g > 1 and 8 * nchr < 7 * g:
        g2 = next_pow2(nchr - g // 2)
        if tok * g2 >= min_rows:
            return tok, g // 2, g2, 1
    return tok, g, 0, nstep


#: (rows per register tile, num_warps, programs per SM) of the token-resident kernel on CUDA (persistent
#: grid of SMs × programs) for rows of at most :data:`ROWS_SHORT_MAX` chunks (CogVideoX-2B's 1920);
#: picked by benchmarks/kernels.py --tune on the H200
CUDA_ROWS_CONFIG = RowsConfig(64, 4, 8)
#: the same for longer rows (3072, 7680, 12288): a bigger tile keeps a whole token in registers (one step,
#: no re-read) and leaves the two-tile split (:func:`rows_geometry`) tiles of 64+ rows — smaller split tiles
#: measured slower than padding. H200, INT8: K = 12288 0.46 ms (one padded 256-row tile) → 0.37 (128 + 64);
#: K = 12288 with the short-row config 0.78 ms
CUDA_ROWS_CONFIG_LONG = RowsConfig(256, 4, 2)
#: rows of up to this many chunks take :data:`CUDA_ROWS_CONFIG`
ROWS_SHORT_MAX = 32
#: the outlier count alone (``STATS``, PDR's block-input check): a pure read; H200 at K = 1920: 0.055 ms
#: with this config, 0.079 with the INT8 one above
CUDA_STATS_CONFIG = RowsConfig(64, 4, 4)
#: (rows per block, num_warps, programs per SM) of the NVFP4 tile kernel on CUDA
CUDA_NVFP4_CONFIG = RowsConfig(64, 4, 8)
INTERP_ROWS_CONFIG = RowsConfig(ROWS_TILE, 4, 1)
INTERP_NVFP4_CONFIG = RowsConfig(64, 4, 1)


def rows_config(mode: int, nchr: int, target: Target | None = None) -> RowsConfig:
    """The token-resident kernel's CUDA config for a mode and a row of ``nchr`` chunks (every target: no
    Hopper-only feature, small shared-memory footprint — checked by tests/test_kernels_compile.py), or the
    ``target``'s override (``"stats"``, ``"rows"``, ``"rows_long"``)."""
    if mode == MODE_STATS:
        key, cfg = "stats", CUDA_STATS_CONFIG
    elif nchr <= ROWS_SHORT_MAX:
        key, cfg = "rows", CUDA_ROWS_CONFIG
    else:
        key, cfg = "rows_long", CUDA_ROWS_CONFIG_LONG
    return target.config(key, cfg) if target is not None else cfg


def _rows_launch(x, M, K, hb, bk, nchr, interp, mode, *, q=None, scale=None, amax=None,
                 k_sigma=None, dense=False, config=None, round_codes=True, split=True, target=None):
    rows_tile, nw, waves = config or (INTERP_ROWS_CONFIG if interp else rows_config(mode, nchr, target))
    tok, g, g2, nstep = rows_geometry(nchr, rows_tile, split)
    if nstep > 8:
        raise ValueError(f"K={K}: more than 8 register-tile steps per token ({nchr} chunks of {bk}, tile {rows_tile})")
    count = torch.zeros((), dtype=torch.int32, device=x.device) if k_sigma is not None else None
    dummy = x
    grid = (min(cdiv(M, tok), num_sms(x.device) * waves),)
    stride_q = q.stride(0) if q is not None else 0
    _rows_kernel[grid](
        x, q if q is not None else dummy,
        scale if scale is not None else dummy, amax if amax is not None else dummy,
        count if count is not None else dummy,
        M, K, x.stride(0), stride_q, float(k_sigma) if k_sigma is not None else 0.0,
        MODE=mode, DENSE=dense, OUTLIERS=k_sigma is not None, ROUND=round_codes, HB=hb, INV_SQRT=_inv_sqrt(hb),
        TOK=tok, G=g, G2=g2, NSTEP=nstep, BK=bk, INTERP=interp, num_warps=nw, enable_fp_fusion=False,
    )
    return count


def quantize_int8_act(
    x2d: torch.Tensor, hadamard_block: int | None = None, k_sigma: float | None = None, *, dense: bool = False,
    config: tuple | None = None, split: bool = True, target: Target | None = None,
):
    """Fused ``block_hadamard`` + per-token INT8 (+ outlier count) in one read of ``x2d [M, K]``.

    Returns ``(Int8Tensor(codes [M, K] int8, scale [M, 1] fp32), count or None)``. With ``dense=True``
    the codes come back as fp16 (exact integers), the operand format of the W4A8 GEMM. ``split=False``:
    pad one-step rows instead of the two-tile split (:func:`rows_geometry`; same bits, for comparisons).
    """
    x, M, K, hb, bk, nchr, interp = _prep(x2d, hadamard_block)
    q = torch.empty((M, K), dtype=torch.float16 if dense else torch.int8, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    count = _rows_launch(x, M, K, hb, bk, nchr, interp, MODE_INT8, q=q, scale=scale, k_sigma=k_sigma, dense=dense,
                         config=config, split=split, target=target)
    return Int8Tensor(q, scale, x2d.dtype), count


def scale16_act(x2d: torch.Tensor, hadamard_block: int | None = None, k_sigma: float | None = None, *,
                config: tuple | None = None, target: Target | None = None):
    """``block_hadamard(x)`` as fp16 values scaled per token into ``[-127, 127]`` (the INT8 pass without the
    rounding): a :class:`DenseAct` ``"fp16"`` with ``values * row_scale ≈ block_hadamard(x)`` to fp16
    precision (relative ~2**-12; the per-token scale keeps any magnitude in fp16's range), plus the count.
    The W4A16 operand for rotated or fp32 activations: one 16-bit GEMM pass instead of the ``[hi | lo]``
    split's two (see :func:`rotate_split`, kept for fp32-exact work)."""
    x, M, K, hb, bk, nchr, interp = _prep(x2d, hadamard_block)
    q = torch.empty((M, K), dtype=torch.float16, device=x.device)
    scale = torch.empty((M, 1), dtype=torch.float32, device=x.device)
    count = _rows_launch(x, M, K, hb, bk, nchr, interp, MODE_INT8, q=q, scale=scale, k_sigma=k_sigma, dense=True,
                         config=config, round_codes=False, target=target)
    return DenseAct(q, "fp16", row_scale=scale), count


def nvfp4_amax(x2d: torch.Tensor, hadamard_block: int | None = None, k_sigma: float | None = None, *,
               config: tuple | None = None, target: Target | None = None):
    """The NVFP4 pre-pass: (int32 bit pattern of amax(|block_hadamard(x)|) as a 1-element tensor, count)."""
    x, M, K, hb, bk, nchr, interp = _prep(x2d, hadamard_block)
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    count = _rows_launch(x, M, K, hb, bk, nchr, interp, MODE_AMAX, amax=amax, k_sigma=k_sigma, config=config,
                         target=target)
    return amax, count


def quantize_nvfp4_act(
    x2d: torch.Tensor, hadamard_block: int | None = None, k_sigma: float | None = None, *,
    dense: bool = False, config: tuple | None = None, rows_config: tuple | None = None, target: Target | None = None,
    reduce_amax=None,
):
    """Fused ``block_hadamard`` + NVFP4 with the per-tensor scale of the rotated tensor (+ outlier count).

    Two launches: the amax pre-pass (which also counts outliers), then the quantize pass. Returns
    ``(NVFP4Tensor, count or None)``. With ``dense=True`` the first element is instead
    ``(values fp16 [M, K] = E2M1 * bs * 2**-7 exactly, block scales, tensor scale)`` — the operand format
    of the Hopper GEMM, see ``gemm_w4``. ``reduce_amax``: ``fn(bits)`` applied, in place, to the pre-pass's
    amax bit pattern before the quantize pass reads it (``sixbit.parallel``: a MAX all-reduce over the ranks
    that share the tensor; int32 order is float order for non-negative floats, NaN above inf).
    """
    x, M, K, hb, bk, nchr, interp = _prep(x2d, hadamard_block)
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    count = _rows_launch(x, M, K, hb, bk, nchr, interp, MODE_AMAX, amax=amax, k_sigma=k_sigma, config=rows_config,
                         target=target)
    if reduce_amax is not None:
        reduce_amax(amax)
    mr = M * nchr
    tiles = CUDA_NVFP4_CONFIG if target is None else target.config("nvfp4_tiles", CUDA_NVFP4_CONFIG)
    block_rows, nw, waves = config or (INTERP_NVFP4_CONFIG if interp else tiles)
    ts = torch.empty((), dtype=torch.float32, device=x.device)
    scales = torch.empty((M, K // FP4_BLOCK), dtype=torch.uint8, device=x.device)
    if dense:
        vals = torch.empty((M, K), dtype=torch.float16, device=x.device)
        data = scales  # unused
    else:
        data = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
        vals = scales  # unused
    grid = (min(cdiv(mr, block_rows), num_sms(x.device) * waves),)
    _nvfp4_kernel[grid](
        x, data, scales, ts, amax, vals, mr, BLOCK_R=block_rows, BK=bk, HB=hb, INV_SQRT=_inv_sqrt(hb),
        DENSE=dense, INTERP=interp, num_warps=nw, enable_fp_fusion=False,
    )
    if dense:
        return (vals, scales.view(torch.float8_e4m3fn), ts), count
    return NVFP4Tensor(data, scales.view(torch.float8_e4m3fn), ts, x2d.dtype), count


def rotate_split(x2d: torch.Tensor, hadamard_block: int | None = None, k_sigma: float | None = None, *,
                 config: tuple | None = None, target: Target | None = None):
    """``block_hadamard(x)`` (fp32 math) as a :class:`SplitAct`: one bf16 ``[M, 2K]`` tensor ``[hi | lo]``
    with ``hi + lo`` within ~2**-17 relative of the fp32 rotation (the W4A16 GEMM operand), plus the count."""
    x, M, K, hb, bk, nchr, interp = _prep(x2d, hadamard_block)
    hilo = torch.empty((M, 2 * K), dtype=torch.bfloat16, device=x.device)
    count = _rows_launch(x, M, K, hb, bk, nchr, interp, MODE_SPLIT, q=hilo, k_sigma=k_sigma, config=config,
                         target=target)
    return SplitAct(hilo), count


def outlier_count(x2d: torch.Tensor, k_sigma: float, *, config: tuple | None = None, target: Target | None = None):
    """``formats.outlier_count(x2d, k_sigma)[0]`` in one read of ``x2d`` (int32 0-d tensor)."""
    x, M, K, hb, bk, nchr, interp = _prep(x2d, None)
    return _rows_launch(x, M, K, 0, bk, nchr, interp, MODE_STATS, k_sigma=k_sigma, config=config, target=target)


__all__ = [
    "quantize_int8_act",
    "quantize_nvfp4_act",
    "scale16_act",
    "nvfp4_amax",
    "rotate_split",
    "outlier_count",
    "E4M3_MAX",
    "E4M3_TINY",
    "F4_MAX",
]

_ = dot  # re-exported helper (kept importable for tests)
