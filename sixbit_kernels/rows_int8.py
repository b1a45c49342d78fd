"""Per-token INT8 of token tiles a producer kernel holds in registers (shared by the fused producers).

``norm_quant.py`` (LayerNorm + modulate) and ``gelu_quant.py`` (tanh-GELU) compute their output tile in
registers and hand it here instead of writing it to memory for ``hadamard_quant``'s INT8 pass to read
back: block-Hadamard rotation (the same tensor-core dot, ``_common.rotate``), per-token amax, the spec's
scale arithmetic and RNE codes — the body of ``hadamard_quant._rows_kernel``'s INT8 mode, so given the
same 16-bit tile the codes and scales are the ones that kernel writes for that tensor, bit for bit.

Layout (one register step per token; no split tiles): a program step owns ``TOK`` tokens of ``G`` chunks
of ``BK`` columns as one ``[TOK * G, BK]`` tile (row ``i`` is chunk ``i % G`` of token ``i // G``),
``G = next_pow2(K / BK)``. Output rows can be remapped (``orow``), which is how the norm kernel writes the
text and video streams straight into the concatenated ``[text; video]`` operand of to_q/to_k/to_v.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import absbits, cdiv, chunk_width, int8_row_scale, next_pow2, rne_int, rotate
from .hadamard_quant import _tok_expand, _tok_reduce

#: rows of the register tile on CUDA for rows of ≤ ``ROWS_SHORT_MAX`` chunks (e.g. 1920: two tokens, the tile
#: of ``hadamard_quant.CUDA_ROWS_CONFIG``); longer rows (3072, 7680) take one token per step — a 256-row tile
#: (``CUDA_ROWS_CONFIG_LONG``) needed 360 KB of shared memory in the norm kernel at 3072 (sm_90 compile)
CUDA_ROWS, ROWS_SHORT_MAX = 64, 32
#: programs per SM (persistent grid) for the short / long tiles, warps per program
CUDA_WAVES, CUDA_WAVES_LONG, NUM_WARPS = 8, 4, 4
INTERP_ROWS = 128
#: the fused producers keep a whole token in one register step: K ≤ 128 chunks of BK
MAX_CHUNKS = 128


def geometry(k: int, hadamard_block: int | None, interp: bool) -> tuple[int, int, int, int, int]:
    """(BK, TOK, G, programs per SM, warps) for rows of ``k`` (raises when ``k`` does not fit one step)."""
    bk = chunk_width(k, hadamard_block or 0)
    if bk < 16:
        raise ValueError(f"K={k} must be a multiple of 16")
    nchr = k // bk
    if nchr > MAX_CHUNKS:
        raise ValueError(f"K={k}: the fused producers hold a token in one step of at most {MAX_CHUNKS} chunks of {bk}")
    g = next_pow2(nchr)
    rows = INTERP_ROWS if interp else (CUDA_ROWS if nchr <= ROWS_SHORT_MAX else g)
    waves = 1 if interp else (CUDA_WAVES if nchr <= ROWS_SHORT_MAX else CUDA_WAVES_LONG)
    return bk, max(1, rows // g), g, waves, NUM_WARPS


def grid_size(m: int, tok: int, sms: int, waves: int) -> int:
    return max(1, min(cdiv(m, tok), sms * waves))


@triton.jit
def tile_index(blk, M, K, TOK: tl.constexpr, G: tl.constexpr, BK: tl.constexpr):
    """(token index [TOK*G] int64, column offsets [TOK*G, BK], mask) of token block ``blk``."""
    i = tl.arange(0, TOK * G)
    tok = (blk * TOK + i // G).to(tl.int64)
    kk = (i % G)[:, None] * BK + tl.arange(0, BK)[None, :]
    valid = (tok[:, None] < M) & (kk < K)
    return tok, kk, valid


@triton.jit
def store_int8_rows(y, h, kk, valid, orow, orow_tok, tok_ok, q_ptr, scale_ptr, stride_qm,
                    HB: tl.constexpr, INV_SQRT: tl.constexpr, TOK: tl.constexpr, G: tl.constexpr,
                    DENSE: tl.constexpr, INTERP: tl.constexpr):
    """Rotate the 16-bit tile ``y`` (masked entries 0), per-token INT8 codes at rows ``orow`` of ``q``
    (fp16 codes with ``DENSE``) and scales at ``scale_ptr[orow_tok]`` — ``hadamard_quant``'s INT8 mode."""
    r = rotate(y, h, HB, INV_SQRT, INTERP)
    amax_tok = _tok_reduce(tl.max(absbits(r), axis=1), TOK, G, True)
    inv, scale = int8_row_scale(amax_tok)
    tl.store(scale_ptr + orow_tok, scale, mask=tok_ok)
    q = rne_int(r * _tok_expand(inv, TOK, G)[:, None])
    q = tl.minimum(tl.maximum(q, -127.0), 127.0)
    q = tl.where(q == q, q, 0.0)  # as hadamard_quant; a non-finite row's codes are meaningless (NaN scale)
    if DENSE:
        tl.store(q_ptr + orow[:, None] * stride_qm + kk, q.to(tl.float16), mask=valid)
    else:
        tl.store(q_ptr + orow[:, None] * stride_qm + kk, q.to(tl.int8), mask=valid)
