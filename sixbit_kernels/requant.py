"""NVFP4 weights re-quantized to per-output-channel INT8: the weight operand of the ``w4a8_requant`` route.

Hopper (and Ada, Ampere) have int8 tensor cores but no FP4 ones, and W4A8's exact product — INT8 codes ×
``E2M1 · bs`` with a new e4m3 scale every 16 elements of K — has no tensor-core form there: the ``int8``
route decodes the weight to 16-bit and multiplies at 16-bit rate (``gemm_w4``). ``w4a8_requant`` keeps the
same 4.5-bit weight resident and, for each call, writes it once as INT8 per output channel
(``formats.requantize_int8``: one more rounding of the weight, at most ``amax_row / 254``) into a transient
``[N, K]`` int8 buffer, then runs the W8A8 GEMM (``gemm_w8a8``: int8 tensor cores) on the same per-token
INT8 activations the other INT8 routes read. The buffer (N·K bytes, half the decode-once GEMM's 16-bit one)
is freed when the call returns.

``_requant_kernel``: a program owns ``BLOCK_N`` whole rows and walks K twice in ``BLOCK_K`` tiles — the row
amax (int32 bit patterns of |u|, NaN-propagating), then the codes (the second walk re-reads the program's
packed rows, ``BLOCK_N · K / 2`` bytes, from L2). The tile decode is ``_common.decode_nvfp4`` (exact
``E2M1 · bs · 2**-7`` in fp16, times 128 exact in fp32); codes ``rne(u · (1/amax · 127))`` with IEEE
divisions, the spec's order of operations — bit for bit :func:`sixbit.formats.requantize_int8`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sixbit.formats import FP4_BLOCK, Int8Tensor, NVFP4Tensor

from ._common import absbits, cdiv, check_launchable, decode_nvfp4, int8_row_scale, next_pow2, rne_int
from .gemm_w4 import _weight_parts
from .targets import Target, resolve

#: (rows per program, K tile, warps): the fastest or within 8 % of it at the six CogVideoX-2B/5B block shapes among
#: seven geometries (H100, ``python benchmarks/hopper_probe.py requant``, ``probe_requant_h100_s33.json``: 12–58 µs a
#: weight, 1–2.5 % of the GEMM after it; every geometry gave the same bits)
CONFIG = (8, 512, 4)
INTERP_CONFIG = (4, 32, 1)


@triton.jit
def _requant_tile(w_ptr, ws_ptr, r64, nmask, k0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  PTX: tl.constexpr):
    """``u = E2M1 · bs`` of rows ``r64`` at K columns ``k0 .. k0 + BLOCK_K`` as fp32 (0 past K or N)."""
    kh = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ks = k0 // 16 + tl.arange(0, BLOCK_K // 16)
    wp = tl.load(w_ptr + r64 * (K // 2) + kh[None, :], mask=nmask & (kh[None, :] < K // 2), other=0)
    wsc = tl.load(ws_ptr + r64 * (K // 16) + ks[None, :], mask=nmask & (ks[None, :] < K // 16), other=0)
    return decode_nvfp4(wp, wsc, BLOCK_N, BLOCK_K, tl.float16, PTX).to(tl.float32) * 128.0


@triton.jit
def _requant_kernel(w_ptr, ws_ptr, ts_ptr, q_ptr, scale_ptr, N, K,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PTX: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn[:, None] < N
    r64 = rn.to(tl.int64)[:, None]
    amax_bits = tl.zeros((BLOCK_N,), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        u = _requant_tile(w_ptr, ws_ptr, r64, nmask, k0, K, BLOCK_N, BLOCK_K, PTX)
        amax_bits = tl.maximum(amax_bits, tl.max(absbits(u), axis=1))
    inv, scale = int8_row_scale(amax_bits)
    tl.store(scale_ptr + rn, scale * tl.load(ts_ptr), mask=rn < N)  # NaN stays NaN
    inv = inv[:, None]
    keep = (amax_bits < 0x7F800000)[:, None]  # a row with a NaN block scale: zero codes (the spec's nan_to_num)
    for k0 in range(0, K, BLOCK_K):
        u = _requant_tile(w_ptr, ws_ptr, r64, nmask, k0, K, BLOCK_N, BLOCK_K, PTX)
        q = tl.where(keep, tl.minimum(tl.maximum(rne_int(u * inv), -127.0), 127.0), 0.0)
        kk = k0 + tl.arange(0, BLOCK_K)
        tl.store(q_ptr + r64 * K + kk[None, :], q.to(tl.int8), mask=nmask & (kk[None, :] < K))


def requantize_int8(w: NVFP4Tensor, *, target: Target | None = None,
                    config: tuple[int, int, int] | None = None) -> Int8Tensor:
    """``formats.requantize_int8(w)`` on the GPU (or in the interpreter): the packed NVFP4 weight ``[N, K]`` as
    int8 codes ``[N, K]`` + fp32 scales ``[N, 1]``, new tensors. ``config``: (rows per program, K tile, warps)."""
    wd, ws, ts = _weight_parts(w)
    if wd.dim() != 2 or ws.shape != (wd.shape[0], wd.shape[1] * 2 // FP4_BLOCK):
        raise ValueError(f"requantize_int8: expected a packed [N, K] NVFP4 weight (data [N, K/2], scales [N, K/16]), "
                         f"got data {tuple(wd.shape)} and scales {tuple(ws.shape)}")
    N, K = wd.shape[0], wd.shape[1] * 2
    interp = check_launchable(wd)
    q = torch.empty((N, K), dtype=torch.int8, device=wd.device)
    scale = torch.empty((N, 1), dtype=torch.float32, device=wd.device)
    if N:
        tgt = resolve(target, wd.device, interp)
        bn, bk, nw = config or (INTERP_CONFIG if interp else CONFIG)
        bk = min(bk, max(FP4_BLOCK, next_pow2(K)))
        _requant_kernel[(cdiv(N, bn),)](wd, ws, ts, q, scale, N, K, BLOCK_N=bn, BLOCK_K=bk, PTX=tgt.ptx_decode,
                                        num_warps=nw, enable_fp_fusion=False)
    return Int8Tensor(q, scale, w.orig_dtype)
