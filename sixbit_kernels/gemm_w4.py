"""GEMMs with NVFP4 weights, decoded in-kernel: W4A4, W4A8 and W4A16 (Hopper and the CPU interpreter).

``y[M, N] = A[M, K] @ W[N, K]^T (+ bias)``. The weight operand is the packed NVFP4 tensor as
``sixbit.formats`` lays it out (``data [N, K/2]`` uint8, two codes per byte; ``scales [N, K/16]`` e4m3;
an fp32 tensor scale). Each K-step decodes a ``[BLOCK_N, BLOCK_K]`` weight tile to exact halves
``E2M1 * bs * 2**-7`` (see ``_common``; no LUT: bit placement + one multiply per element) and runs a
16-bit ``tl.dot`` with fp32 accumulation. The activation operand, by ``A_MODE``:

* ``A_DENSE`` (0): a 16-bit tensor used as is — unrotated bf16/fp16 activations (W4A16), INT8 codes
  carried as exact fp16 integers (W4A8), or NVFP4 values carried as exact fp16 ``E2M1 * bs * 2**-7``
  (W4A4; what ``quantize_nvfp4_act(..., dense=True)`` writes). Hopper has no FP4 tensor cores, so carrying
  the already-quantized activations in 16 bits costs bandwidth but no accuracy and saves the per-tile
  decode of A (measured in ``benchmarks/kernels.py``).
* ``A_SPLIT`` (1): a bf16 ``[M, 2K]`` tensor ``[hi | lo]`` with ``hi + lo`` the fp32 rotated activations of
  W4A16 with a Hadamard (or fp32 inputs): the K loop runs over 2K and reads the weight tile at ``k mod K``,
  so ``hi @ W^T + lo @ W^T`` is one pipelined dot chain; the pair keeps ~16 significant bits, so the
  product stays within fp32-accumulation tolerance of the reference.
* ``A_NVFP4`` (2): packed NVFP4 activations, decoded in-kernel like the weights (true 4-bit operand).
* ``A_INT8`` (3): INT8 codes, converted in-kernel to fp16 (exact).

Epilogue (``_w4_epilogue``, shared with the decode-once kernel): ``acc * 2**7 * s_w`` (weight tensor
scale), times ``2**7 * s_a`` (NVFP4 activations) or the per-token scale (INT8 activations), plus bias, cast
to the output dtype — then, with ``activation="gelu_tanh"``, the tanh-GELU of that rounded value, rounded again
(``_common.store_value``: ``F.gelu(y, approximate="tanh")`` without writing ``y``). Never ``tl.dot_scaled``: on
sm_90 it is emulated (0.33x of a bf16 dot, FACTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sixbit.formats import FP4_BLOCK, Int8Tensor, NVFP4Tensor, act_code

from ._common import (
    cdiv,
    check_launchable,
    decode_nvfp4,
    dot,
    grouped_tile,
    next_pow2,
    num_sms,
    store_value,
    tile_coords,
)
from .targets import HOPPER, KB, PORTABLE, DecodeConfig, GemmConfig, Target, W4Config, pick, resolve

A_DENSE, A_SPLIT, A_NVFP4, A_INT8 = 0, 1, 2, 3


@dataclass
class DenseAct:
    """Quantized activations carried as exact 16-bit values (the Hopper GEMM operand format).

    ``fmt == "nvfp4"``: ``values`` = ``E2M1 * block_scale * 2**-7`` (fp16), real value = ``values * 2**7 *
    tensor_scale``. ``fmt == "int8"``: ``values`` = the INT8 codes as fp16, real value = ``values *
    row_scale``. Bit-for-bit the same numbers as the packed :class:`NVFP4Tensor` / :class:`Int8Tensor`.
    ``fmt == "fp16"``: unquantized (W4A16) activations scaled per token, real value = ``values * row_scale``.
    """

    values: torch.Tensor
    fmt: str
    tensor_scale: torch.Tensor | None = None
    row_scale: torch.Tensor | None = None
    block_scales: torch.Tensor | None = None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.fmt == "nvfp4":
            return (self.values.float() * (128.0 * self.tensor_scale.float())).to(dtype)
        return (self.values.float() * self.row_scale.float()).to(dtype)


@dataclass
class SplitAct:
    """fp32-precision activations as one bf16 tensor ``hilo [M, 2K] = [hi | lo]``, ``hi + lo ≈ x`` to ~2**-17."""

    hilo: torch.Tensor

    def value(self) -> torch.Tensor:
        k = self.hilo.shape[1] // 2
        return self.hilo[:, :k].float() + self.hilo[:, k:].float()


@triton.jit
def _w4_scale(acc, offs_m, offs_n, M, N, wts_ptr, ats_ptr, rs_ptr, bias_ptr,
              A_TS: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """``acc * 2**7 * s_w`` (× ``2**7 * s_a`` for NVFP4 activations, × the per-row scale for INT8 / scaled
    fp16 ones) ``+ bias`` in fp32 (rows/columns past the edge read clamped scales: masked or clipped at the store)."""
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    alpha = tl.load(wts_ptr) * 128.0
    if A_TS:
        alpha = alpha * (tl.load(ats_ptr) * 128.0)
    acc = acc * alpha
    if ROW_SCALE:
        acc = acc * tl.load(rs_ptr + rm)[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    return acc


@triton.jit
def _w4_epilogue(acc, offs_m, offs_n, M, N, stride_om, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
                 A_TS: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                 INTERP: tl.constexpr):
    """:func:`_w4_scale`, cast (then ``ACT``'s activation) and stored with the M/N edges masked."""
    y = _w4_scale(acc, offs_m, offs_n, M, N, wts_ptr, ats_ptr, rs_ptr, bias_ptr, A_TS, ROW_SCALE, HAS_BIAS)
    o_off = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    omask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + o_off, store_value(y, out_ptr.dtype.element_ty, ACT, INTERP), mask=omask)


@triton.jit
def _gemm_w4_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
    M, N, K, stride_am, stride_om,
    A_MODE: tl.constexpr, A_TS: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    OP: tl.constexpr, SWAP: tl.constexpr, EVEN_K: tl.constexpr, SVEC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERP: tl.constexpr, PTX: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (offs_m % M).to(tl.int64)  # clamped rows: loads stay in bounds, the store is masked
    rn = (offs_n % N).to(tl.int64)
    KH = K // 2
    # K / 16 scale bytes per row; written as a multiple of SVEC (a power of two dividing it) so that the
    # compiler can vectorize the scale loads (≥ 4 bytes per thread is what cp.async pipelining needs)
    KS = (K // (16 * SVEC)) * SVEC
    kb = tl.arange(0, BLOCK_K)
    kh = tl.arange(0, BLOCK_K // 2)
    ks = tl.arange(0, BLOCK_K // 16)

    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    if A_MODE == 1:
        KA = 2 * K  # [hi | lo]: the weight tile index wraps at K (K % BLOCK_K == 0 here)
    else:
        KA = K
    for ka in range(0, KA, BLOCK_K):
        if A_MODE == 1:
            k0 = ka % K
        else:
            k0 = ka
        # ---- weight tile, decoded
        w_off = rn[:, None] * KH + (k0 // 2 + kh)[None, :]
        s_off = rn[:, None] * KS + tl.max_contiguous(tl.multiple_of(k0 // 16 + ks, SVEC), SVEC)[None, :]
        if EVEN_K:
            wp = tl.load(w_ptr + w_off)
            wsc = tl.load(ws_ptr + s_off)
        else:
            wp = tl.load(w_ptr + w_off, mask=(k0 // 2 + kh)[None, :] < KH, other=0)
            wsc = tl.load(ws_ptr + s_off, mask=(k0 // 16 + ks)[None, :] < KS, other=0)
        w = decode_nvfp4(wp, wsc, BLOCK_N, BLOCK_K, OP, PTX)  # [BN, BK]

        # ---- activation tile
        a_off = rm[:, None] * stride_am + (ka + kb)[None, :]
        kmask = (k0 + kb)[None, :] < K
        if A_MODE == 2:
            ap_off = rm[:, None] * KH + (k0 // 2 + kh)[None, :]
            as_off = rm[:, None] * KS + tl.max_contiguous(tl.multiple_of(k0 // 16 + ks, SVEC), SVEC)[None, :]
            if EVEN_K:
                ap = tl.load(a_ptr + ap_off)
                asc = tl.load(as_ptr + as_off)
            else:
                ap = tl.load(a_ptr + ap_off, mask=(k0 // 2 + kh)[None, :] < KH, other=0)
                asc = tl.load(as_ptr + as_off, mask=(k0 // 16 + ks)[None, :] < KS, other=0)
            a = decode_nvfp4(ap, asc, BLOCK_M, BLOCK_K, OP, PTX)
        else:
            if EVEN_K:
                a = tl.load(a_ptr + a_off)
            else:
                a = tl.load(a_ptr + a_off, mask=kmask, other=0)
            a = a.to(OP)

        if SWAP:
            acc += dot(w, tl.trans(a), INTERP)
        else:
            acc += dot(a, tl.trans(w), INTERP)

    if SWAP:
        acc = tl.trans(acc)
    _w4_epilogue(acc, offs_m, offs_n, M, N, stride_om, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
                 A_TS, ROW_SCALE, HAS_BIAS, ACT, INTERP)


@triton.jit
def _decode_w_kernel(w_ptr, ws_ptr, out_ptr, N, K, SVEC: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, OP: tl.constexpr, PTX: tl.constexpr):
    """Packed NVFP4 weight ``[N, K]`` → 16-bit ``E2M1 * bs * 2**-7`` (exact), one tile per program."""
    pid_n = tl.program_id(0)
    k0 = tl.program_id(1) * BLOCK_K
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    kh = tl.arange(0, BLOCK_K // 2)
    ks = tl.arange(0, BLOCK_K // 16)
    kb = tl.arange(0, BLOCK_K)
    KH = K // 2
    KS = (K // (16 * SVEC)) * SVEC
    nmask = rn[:, None] < N
    r64 = rn.to(tl.int64)[:, None]
    wp = tl.load(w_ptr + r64 * KH + (k0 // 2 + kh)[None, :], mask=nmask & ((k0 // 2 + kh)[None, :] < KH), other=0)
    wsc = tl.load(ws_ptr + r64 * KS + (k0 // 16 + ks)[None, :], mask=nmask & ((k0 // 16 + ks)[None, :] < KS),
                  other=0)
    w = decode_nvfp4(wp, wsc, BLOCK_N, BLOCK_K, OP, PTX)
    tl.store(out_ptr + r64 * K + (k0 + kb)[None, :], w, mask=nmask & ((k0 + kb)[None, :] < K))


@triton.jit
def _gemm_dense_w_kernel(
    a_src, w_src, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
    M, N, K, KA, stride_om,
    SPLIT: tl.constexpr, A_TS: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERP: tl.constexpr,
):
    """The decode-once GEMM, portable variant: 16-bit activations × the weight already decoded to 16-bit
    halves; same epilogue as :func:`_gemm_w4_kernel`. ``KA`` is the activation's width: ``K``, or ``2K`` for
    the ``[hi | lo]`` split form (``SPLIT``), whose second half re-reads the weight from column 0. Contiguous
    ``[M, KA]`` / ``[N, K]`` pointers, rows clamped, K tail masked; one program per output tile."""
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    kb = tl.arange(0, BLOCK_K)
    for ka in range(0, KA, BLOCK_K):
        if SPLIT:
            k0 = ka % K
        else:
            k0 = ka
        a_off = rm[:, None] * KA + (ka + kb)[None, :]
        w_off = rn[:, None] * K + (k0 + kb)[None, :]
        if EVEN_K:
            a = tl.load(a_src + a_off)
            w = tl.load(w_src + w_off)
        else:
            a = tl.load(a_src + a_off, mask=(k0 + kb)[None, :] < K, other=0.0)
            w = tl.load(w_src + w_off, mask=(k0 + kb)[None, :] < K, other=0.0)
        acc += dot(a, tl.trans(w), INTERP)

    _w4_epilogue(acc, offs_m, offs_n, M, N, stride_om, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
                 A_TS, ROW_SCALE, HAS_BIAS, ACT, INTERP)


@triton.jit
def _gemm_dense_w_persistent_kernel(
    a_desc, w_desc, o_desc, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
    M, N, K, KA, stride_om,
    SPLIT: tl.constexpr, A_TS: tl.constexpr, ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
    TMA_STORE: tl.constexpr, NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERP: tl.constexpr,
):
    """The decode-once GEMM, Hopper variant: persistent — program ``p`` computes output tiles ``p, p + NUM_SMS,
    …`` in :func:`grouped_tile`'s order, one flattened loop over (tile, K step), so the next tile's TMA loads
    are in flight while this tile's epilogue runs — with TMA descriptor loads (zero-filled out of bounds) and,
    with ``TMA_STORE``, the output tile stored through a descriptor (rows/columns past the edge clipped by
    the copy engine). Same operands, ``SPLIT`` and epilogue as :func:`_gemm_dense_w_kernel`."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(KA, BLOCK_K)
    done = tl.program_id(0) - NUM_SMS  # the tile whose epilogue runs next (recomputed: no index lives across)
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=True):
        pm, pn = tile_coords(tile, num_m, num_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            ka = kt * BLOCK_K
            a = a_desc.load([pm * BLOCK_M, ka])
            if SPLIT:
                w = w_desc.load([pn * BLOCK_N, ka % K])
            else:
                w = w_desc.load([pn * BLOCK_N, ka])
            acc += dot(a, tl.trans(w), INTERP)
        done += NUM_SMS
        pm, pn = tile_coords(done, num_m, num_n, GROUP_M)
        offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pn * BLOCK_N + tl.arange(0, BLOCK_N)
        if TMA_STORE:
            y = _w4_scale(acc, offs_m, offs_n, M, N, wts_ptr, ats_ptr, rs_ptr, bias_ptr, A_TS, ROW_SCALE, HAS_BIAS)
            o_desc.store([pm * BLOCK_M, pn * BLOCK_N], store_value(y, o_desc.dtype, ACT, INTERP))
        else:
            _w4_epilogue(acc, offs_m, offs_n, M, N, stride_om, wts_ptr, ats_ptr, rs_ptr, bias_ptr, out_ptr,
                         A_TS, ROW_SCALE, HAS_BIAS, ACT, INTERP)


#: per-tile-decode GEMM configs per A mode, ``[(min opt-in shared memory, config), ...]`` (``targets.pick``;
#: no TMA in this kernel, so both variants use them). The 200 KB tier is Hopper's: A_DENSE picked by
#: ``benchmarks/kernels.py --tune`` on the H200 (benchmarks/results/kernels_h200.md), the others not
#: re-tuned after the first run. The smaller tiers keep every config inside the 99 KB (sm_86/89/120) and
#: 163 KB (sm_80) budgets (checked by tests/test_kernels_compile.py). SWAP computes the transposed product
#: so the decoded weight is the MMA's register operand (async wgmma on Hopper).
TILE_CONFIGS = {
    A_DENSE: [(200 * KB, W4Config(256, 128, 128, 8, 8, 2, True)), (0, W4Config(128, 128, 64, 8, 4, 3, True))],
    A_SPLIT: [(200 * KB, W4Config(256, 128, 64, 8, 8, 3, True)), (0, W4Config(128, 128, 64, 8, 4, 3, True))],
    A_NVFP4: [(0, W4Config(128, 128, 64, 8, 8, 3, True))],
    A_INT8: [(0, W4Config(128, 256, 64, 8, 8, 3, True))],
}
INTERP_CONFIG = W4Config(32, 32, 32, 4, 4, 1, False)
#: decode-once GEMM configs per variant (Hopper: the persistent TMA kernel, tile picked on an H100 by the
#: session-29 sweep at the 2B/5B shapes, benchmarks/results/probe_pgemm_h100_s29.json: 1.01–1.17x the
#: one-tile-per-program kernel of sessions 8–28; portable: pointer loads)
DENSE_W_CONFIGS = {
    HOPPER: [(0, GemmConfig(128, 256, 64, 8, 8, 3))],
    PORTABLE: [(200 * KB, GemmConfig(256, 128, 64, 8, 8, 3)), (0, GemmConfig(128, 128, 64, 8, 4, 3))],
}
INTERP_DENSE_W_CONFIG = GemmConfig(32, 32, 32, 4, 4, 1)
#: ``decode="auto"`` decodes the weight once per call (into a transient 16-bit ``[N, K]`` buffer) when the
#: activation has at least this many rows and is 16-bit (not packed 4-bit / int8 codes): the decode then
#: costs < 1 % of the GEMM, and the main loop is a plain 16-bit GEMM. Fewer rows: decode per tile.
DECODE_ONCE_MIN_M = 1024
DECODE_CONFIG = DecodeConfig(64, 128, 4)
INTERP_DECODE_CONFIG = DecodeConfig(32, 32, 4)


def tile_config(target: Target, mode: int) -> W4Config:
    return target.config(f"w4_tile/{mode}", pick(TILE_CONFIGS[mode], target.smem))


def dense_w_config(target: Target) -> GemmConfig:
    return target.config("w4_once", pick(DENSE_W_CONFIGS[target.variant], target.smem))


def _lowbit(n: int) -> int:
    return n & -n


def _weight_parts(w: NVFP4Tensor):
    if w.data.dtype != torch.uint8 or w.scales.dtype != torch.float8_e4m3fn:
        raise TypeError("weights must be a packed NVFP4Tensor (uint8 codes, float8_e4m3fn scales)")
    return w.data.contiguous(), w.scales.contiguous().view(torch.uint8), w.tensor_scale.float().reshape(1)


def gemm_w4(
    a,
    w: NVFP4Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: tuple | None = None,
    decode: str = "auto",
    target: Target | None = None,
    decode_once_min_m: int = DECODE_ONCE_MIN_M,
    activation: str | None = None,
) -> torch.Tensor:
    """``A @ dequant(W)^T + bias`` with W packed NVFP4 ``[N, K]``.

    ``a`` is one of: :class:`NVFP4Tensor` (W4A4, decoded in-kernel), :class:`Int8Tensor` (W4A8),
    :class:`DenseAct` (W4A4/W4A8 with the activations carried as exact halves), a bf16/fp16 tensor
    (W4A16, unrotated), or a :class:`SplitAct` (W4A16 on fp32-precision activations, e.g. rotated).

    ``decode``: ``"tile"`` decodes each weight tile inside the GEMM's K loop (nothing but the packed weight
    is ever read); ``"once"`` (16-bit activations only) first decodes the whole weight to a transient
    16-bit ``[N, K]`` buffer (:func:`decode_weight`, freed when the call returns; only the packed weight
    stays resident) and runs :func:`_gemm_dense_w_kernel` on it; ``"auto"`` picks ``"once"`` for 16-bit
    activations with at least ``decode_once_min_m`` rows. Same numbers either way (the decoded halves
    are exact). ``config`` is the tile config of whichever kernel runs; ``target`` (default: the device's,
    ``targets.device_target``) picks the variant (decode-once through TMA descriptors on ``hopper``,
    pointer loads on ``portable``), the configs and the decoder. ``activation`` (``"gelu_tanh"``): the
    activation of the rounded output, in the epilogue.
    """
    act = act_code(activation)
    if decode not in ("auto", "tile", "once"):
        raise ValueError(f"decode must be 'auto', 'tile' or 'once', got {decode!r}")
    wd, ws, wts = _weight_parts(w)
    N, K = wd.shape[0], wd.shape[1] * 2
    a_ts = row_scale = a_sc = None
    op = tl.float16
    if isinstance(a, NVFP4Tensor):
        mode, a1 = A_NVFP4, a.data.contiguous()
        a_sc = a.scales.contiguous().view(torch.uint8)
        a_ts = a.tensor_scale.float().reshape(1)
        M = a1.shape[0]
    elif isinstance(a, Int8Tensor):
        mode, a1 = A_INT8, a.data.contiguous()
        row_scale = a.scale.float().reshape(-1).contiguous()
        M = a1.shape[0]
    elif isinstance(a, DenseAct):
        mode, a1 = A_DENSE, a.values.contiguous()
        if a.fmt == "nvfp4":
            a_ts = a.tensor_scale.float().reshape(1)
        else:
            row_scale = a.row_scale.float().reshape(-1).contiguous()
        M = a1.shape[0]
    elif isinstance(a, SplitAct):
        mode, a1 = A_SPLIT, a.hilo.contiguous()
        if a1.dtype != torch.bfloat16:
            raise TypeError("SplitAct.hilo must be bf16")
        op = tl.bfloat16
        M = a1.shape[0]
    elif isinstance(a, torch.Tensor):
        if a.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError("a plain activation tensor must be bf16/fp16 (pass a SplitAct for fp32)")
        mode, a1 = A_DENSE, a.contiguous()
        op = tl.bfloat16 if a.dtype == torch.bfloat16 else tl.float16
        M = a1.shape[0]
    else:
        raise TypeError(f"unsupported activation operand {type(a).__name__}")
    ka = a1.shape[1] * {A_NVFP4: 2, A_SPLIT: 0.5}.get(mode, 1)
    if ka != K:
        raise ValueError(f"activation K={ka} does not match the weight's K={K}")
    if K % FP4_BLOCK:
        raise ValueError(f"K={K} must be a multiple of {FP4_BLOCK}")
    interp = check_launchable(a1, wd)
    out = torch.empty((M, N), dtype=out_dtype, device=a1.device)
    if M == 0:
        return out
    dense16 = mode in (A_DENSE, A_SPLIT)
    if decode == "once" and not dense16:
        raise ValueError("decode='once' needs 16-bit activations (DenseAct, a bf16/fp16 tensor or a SplitAct)")
    tgt = resolve(target, a1.device, interp)
    if decode == "once" and a1.data_ptr() % 16:
        a1 = a1.clone()  # TMA needs a 16-byte aligned base
    if decode == "once" or (decode == "auto" and dense16 and M >= decode_once_min_m and a1.data_ptr() % 16 == 0):
        return _gemm_decoded_once(a1, w, op, a_ts, row_scale, bias, out, config, interp, tgt, act)
    cfg = config or (INTERP_CONFIG if interp else tile_config(tgt, mode))
    bm, bn, bk, gm, nw, ns, swap = cfg
    bk = min(bk, max(16, next_pow2(K)))
    if mode == A_SPLIT:
        bk = min(bk, _lowbit(K))  # the [hi | lo] halves must not share a K tile
    dummy = wts
    grid = (cdiv(M, bm) * cdiv(N, bn),)
    _gemm_w4_kernel[grid](
        a1, a_sc if a_sc is not None else wd, wd, ws, wts,
        a_ts if a_ts is not None else dummy, row_scale if row_scale is not None else dummy,
        bias if bias is not None else dummy, out,
        M, N, K, a1.stride(0), out.stride(0),
        A_MODE=mode, A_TS=a_ts is not None, ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None, ACT=act,
        OP=op, SWAP=swap, EVEN_K=(K % bk == 0), SVEC=min(bk // 16, _lowbit(K // 16)),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, INTERP=interp, PTX=tgt.ptx_decode,
        num_warps=nw, num_stages=ns,
    )
    return out


def decode_weight(w: NVFP4Tensor, dtype: torch.dtype = torch.float16, *, target: Target | None = None) -> torch.Tensor:
    """The packed NVFP4 weight ``[N, K]`` as exact 16-bit ``E2M1 * bs * 2**-7`` (times ``2**7 * tensor_scale``
    is the weight): the operand of the decode-once GEMM, ``N * K * 2`` bytes, one pass over the packed data."""
    wd, ws, _ = _weight_parts(w)
    N, K = wd.shape[0], wd.shape[1] * 2
    if K % FP4_BLOCK:
        raise ValueError(f"K={K} must be a multiple of {FP4_BLOCK}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise TypeError("decode_weight writes fp16 or bf16")
    interp = check_launchable(wd)
    tgt = resolve(target, wd.device, interp)
    out = torch.empty((N, K), dtype=dtype, device=wd.device)
    bn, bk, nw = INTERP_DECODE_CONFIG if interp else DECODE_CONFIG
    bk = min(bk, max(16, next_pow2(K)))
    grid = (cdiv(N, bn), cdiv(K, bk))
    _decode_w_kernel[grid](
        wd, ws, out, N, K, SVEC=min(bk // 16, _lowbit(K // 16)), BLOCK_N=bn, BLOCK_K=bk,
        OP=tl.float16 if dtype == torch.float16 else tl.bfloat16, PTX=tgt.ptx_decode,
        num_warps=nw,
    )
    return out


def _gemm_decoded_once(a1, w, op, a_ts, row_scale, bias, out, config, interp, tgt: Target, act: int = 0):
    wdec = decode_weight(w, torch.bfloat16 if op == tl.bfloat16 else torch.float16, target=tgt)
    M, N, KA = a1.shape[0], wdec.shape[0], a1.shape[1]
    K = wdec.shape[1]
    bm, bn, bk, gm, nw, ns = config or (INTERP_DENSE_W_CONFIG if interp else dense_w_config(tgt))
    bk = min(bk, max(16, next_pow2(K)))
    if KA != K:
        bk = min(bk, _lowbit(K))  # [hi | lo]: a K tile must not straddle the halves
    wts = w.tensor_scale.float().reshape(1)
    scalars = (wts, a_ts if a_ts is not None else wts, row_scale if row_scale is not None else wts,
               bias if bias is not None else wts, out, M, N, K, KA, out.stride(0))
    flags = dict(SPLIT=KA != K, A_TS=a_ts is not None, ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None,
                 ACT=act, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, INTERP=interp, num_warps=nw, num_stages=ns)
    tiles = cdiv(M, bm) * cdiv(N, bn)
    # the persistent kernel keeps its pipeline buffers live through the epilogue, whose layout change of a
    # 128 x 256 fp32 output tile needs 128 KB more shared memory than Hopper has left at 3 stages (measured on an
    # H100: OutOfResources): fp32 outputs (an fp32 model) run the one-tile-per-program kernel
    if tgt.variant != HOPPER or out.element_size() != 2:
        _gemm_dense_w_kernel[(tiles,)](a1, wdec, *scalars, EVEN_K=K % bk == 0, **flags)
        return out
    from triton.tools.tensor_descriptor import TensorDescriptor

    desc = lambda t, rows: TensorDescriptor.from_tensor(t, [rows, bk])  # noqa: E731
    store = (N * 2) % 16 == 0 and out.data_ptr() % 16 == 0  # a TMA store's 16-byte row pitch
    sms = num_sms(a1.device)
    _gemm_dense_w_persistent_kernel[(min(sms, tiles),)](
        desc(a1, bm), desc(wdec, bn), TensorDescriptor.from_tensor(out, [bm, bn]) if store else out, *scalars,
        TMA_STORE=store, NUM_SMS=sms, **flags)
    return out
