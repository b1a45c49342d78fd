"""8-bit attention forward for Hopper: QKᵀ and PV on the 8-bit tensor cores, online softmax in fp32.

The numerics are ``sixbit.formats``' "8-bit attention" section (``attention_fp8_reference``); this module
is its fast form. Two launches per call:

1. ``quantize_kv`` — the K/V pass. The per-(batch, head) statistics come first (``kv_stats``: the K mean
   over tokens and the per-channel V amax of ``formats.attention_kv_stats``, V's scales too, in two launches —
   per 1,024 rows partial sums and maxima, then a fixed-order finish per head — that read K and V once;
   until session 23 two torch reductions and ~8 small torch ops); then one Triton kernel reads the strided
   ``[B, H, S, D]`` K and V views once and
   writes, per ``block_n`` tokens, the smoothed (``k − mean``; softmax is invariant to a vector added to
   every key), optionally Hadamard-rotated K as 8-bit codes with one fp32 scale per block, and V as e4m3
   with one scale per channel, **transposed** (``[BH, D, S_pad]``: an 8-bit wgmma needs both operands
   K-major, and PV reduces over tokens). Both are padded with zeros to a multiple of ``block_n``.
2. ``attention_fp8`` — the attention. Each program takes ``BLOCK_M`` query rows of one head, quantizes
   them in its prologue (per-token scale; Q is read once, so quantizing it inside the kernel costs no
   extra pass), then walks the K/V blocks: ``S = Q8·K8ᵀ`` (fp32 accumulators), row max, ``t = S·c − m +
   8`` with ``c = q_scale·k_scale·sm_scale·log2 e`` (one FMA), ``p = exp2(t)`` — P in [0, 1] times the
   fixed scale 2⁸, put into the exponent for free —, row sum of p, ``O = O·α + e4m3(p)·V8``. The epilogue
   multiplies by the V channel scales, divides by the row sum and stores in the caller's layout (a
   ``[B, S, H, D]`` buffer viewed as ``[B, H, S, D]`` makes the processor's transpose free).

P·V key order (session 37). The P·V MMA takes P from registers, and the layout its A operand needs (per thread
four consecutive keys, 8-bit) is not the one P's fp32 accumulator has (per thread pairs of consecutive keys): Triton
moved P between the threads with 32 ``shfl.sync.idx`` + 32 ``prmt`` + 32 ``selp`` per thread and 256-key block
(~11 % of the loop's instructions, counted in the sm_90 PTX). A sum over keys does not care about their order, so
``KV8.v`` stores V's keys permuted within each group of :data:`PV_GROUP` = 32 — position k holds key c(k), c's bits
(k0, k2, k3, k1, k4) — and the kernel reorders P's columns the same way (``_pv_order``: a reshape and permute of bit
axes, which on sm_89, sm_90 and sm_120 land on the registers each thread already holds: the shuffles are gone
from the PTX). The result is the same sum in another order. Key blocks smaller than 32 (the interpreter tests' 16-key
tiles) keep the natural order; :func:`pv_key_order` says which key each position of ``KV8.v`` holds.

Formats. ``qk="fp8"`` puts Q and K in e4m3 (scale amax/448), ``qk="int8"`` in int8 (scale amax/127,
int32 accumulators). ``rotate=True`` multiplies Q and K by the same ±1 Sylvester-Hadamard matrix (QKᵀ is
unchanged up to the factor D, folded into ``c``): it spreads outlier channels over all channels, which
INT8's uniform grid needs and e4m3's relative grid does not. PV is always e4m3 × e4m3.

Speed option (not the spec): ``tma`` reads the K/V tiles through TMA tensor descriptors instead of
pointer loads. Tried and dropped (slower on the H200, ``benchmarks/results/attention_h200_first.md``):
``exp2`` as ``ex2.approx.f16x2`` (two results per MUFU op, but the fp32 → f16 conversions cost more:
434 vs 477 TFLOP/s at the 2B shape) and the row sum from a ``P8 · ones`` MMA (344). The row sum is taken
over the fp32 ``p`` before rounding (one add per element instead of two conversions and an add).

Speed option under test (``exp2_poly``, default 0 = off; not the spec): at head dim 64 the kernel is bound by
the softmax's ``exp2``, which runs on the MUFU unit (16 per clock per SM on Hopper). ``exp2_poly`` = 1 / 2 / 4
computes every / every second / every fourth ``exp2`` of a score tile on the FMA units instead (FlashAttention-4's
idea): Cody–Waite range reduction ``2^x = 2^j · 2^f`` with ``j = round(x)`` and ``f = x − j ∈ [−½, ½]`` — both
from one add of 1.5·2²³ (no float→int conversion) —, ``2^f`` by a degree-3 minimax polynomial (relative error
≤ 7.5·10⁻⁵ in fp32, :data:`EXP2_POLY_MAX_REL_ERR`; computed for this module by the Remez algorithm), and ``j``
added to the exponent bits with an integer shift and add; arguments are clamped at −125 (``p`` below 2⁻¹²⁵
counts as ≈ 2⁻¹²⁵ in the row sum, an e4m3 zero in PV). Every score of a tile stays in one MMA: the tile is split
into interleaved column pairs (``tl.split``) and joined back. The error is ~800× below the e4m3 rounding of P
that follows (half an ulp: 6.25 %), so at most one P code in ~800 moves to its neighbour, and the row sum moves
by ≤ 7.5·10⁻⁵ relative. A NaN score of a non-finite Q row is not carried by the polynomial; the epilogue writes
NaN where the row's Q scale is not finite (K/V: the NaN V scales already do). Measured slower on the H200 (session
21, ``attention_variants_h200_s21.md``: 1/4 and 1/2 of the exp2 by the polynomial 1.06× / 1.12× cuDNN against 1.37×
without), so :data:`POLY` keeps it off. Cross-compiled for sm_90 on the CPU (Triton 3.9; D = 64, tile
(128, 128, 4, 3), pointer loads): ``exp2_poly=2`` halves the PTX's ``ex2.approx`` (264 → 136) for 384 more FMAs
with the same 16 KB of shared memory (the pair split stays in registers); ``exp2_poly=4``'s second split goes
through shared memory (40 KB, 4× the ``ld.shared``); ``exp2_poly=1`` leaves 8 (the rescale's).

Accuracy option (not the default; docs/ATTENTION.md "Outlier channels in 16 bits"): ``hi_channels=16`` keeps K's 16
largest channels per head (and Q's same channels, times the logit scale) in a bf16 MMA beside the fp8 one —
``formats.attention_fp8_reference(..., hi_channels=16)``. On the H200 it took the relative L2 with K outlier channels
from 16.3 % to 3.3 % and ran 2.3× slower (``benchmarks/results/attention_h200_hi_s19.md``); ``k_hi`` now loads through
TMA under ``tma`` (not yet timed).

Residual terms (an accuracy option, off by default; ``residual_channels`` = n in :data:`RESIDUAL_CHANNELS`,
``v_residual``; session 39, docs/ATTENTION.md "Session 39"; ``formats.attention_fp8_reference``'s same options). An
e4m3 operand x can carry a second e4m3 term, its rounding residual on the same scale — ``x ≈ h + l`` with ``h =
e4m3(x)``, ``l = e4m3(x − h)`` — which another fp8 MMA adds into the *same* fp32 accumulator. With K outlier channels
the logit error comes from K's largest channels, so only they get second terms: the statistics also return the
smoothed K's channel amax (``kv_stats(k_amax=True)``: per-tile max and min, exact), the n largest per head are
``KV8.res_idx``, and the K/V pass writes ``KV8.k_res`` ``[BH, S_pad, 2n]`` — per channel the pair ``(kl, kh)`` of K's
scaled value on its block scale; the attention's prologue gathers Q's same channels (``tl.gather``) into pairs
``(qh, ql)``, and each key block's scores are ``dot(q_res, k_resᵀ, dot(q8, k8ᵀ))`` = ``Q8·K8ᵀ + Qh·Klᵀ + Ql·Khᵀ``
(a reduction of D + 2n). ``v_residual``: the K/V pass writes V's residual ``KV8.v_lo`` (laid out as ``v``) and P·V
becomes ``dot(p8, v_lo, dot(p8, v8, acc))``. The softmax is untouched; the extra cost is MMA work and shared memory
(each stage holds the two extra tiles). Relative L2 vs fp32 with 5 K channels ×20 (CPU, the spec at the kernel's
256-key blocks): 18.2 % → 1.7 % with n = 32 and ``v_residual``. ``residual_ratio`` = r > 0 (session 40) gives the
terms only to the heads whose K has outlier channels — its smoothed channel amax (the statistics' fourth output) has a
maximum ≥ r × its median (``formats.attention_residual_heads``; ``KV8.res_heads``) — and the attention runs as two
launches over every head, constexpr ``SEL`` = −1 then +1, each program returning at once where its head is of the
other kind: the one-term kernel for the rest, the residual one for the picked heads. No host sync; a head's cost is
its own loop's.

Q/K norm on load (``q_norm`` / ``k_norm``, ``layernorm.RowNorm``; session 32). CogVideoX normalizes q and k per head
(LayerNorm over the 64-wide rows, then the rotary embedding on the video tokens) before the attention; run first,
that is one more read and write of Q and of K (``layer_norm_rows``). Given the norm, the kernels read the raw
projections instead and apply it as they load rows — the attention in its prologue (Q is read once per program),
the K statistics and the K/V pass each on their own tiles (K is normalized twice, in registers; nothing is
written) — with ``layernorm.norm_rows_tile``, the arithmetic ``layer_norm_rows`` stores. Bit for bit the
normalized-first call in the interpreter; on a GPU a row's fp32 sums follow the tile's layout, so an odd value
may differ by one bf16 ulp from ``layer_norm_rows``' (and the statistics' copy from the K/V pass's: the K mean
then smooths with a mean of values one ulp apart — softmax is invariant to it either way). Not with the hi
channels (their selection reads the normalized K).

Lengths. Query rows past ``S_q`` are masked on load/store. Keys: ``kv_len`` (int32 per batch, ≤ S_kv;
default S_kv) ends each batch's keys; full key blocks run unmasked, the one partial block runs masked
(keys ≥ kv_len get −inf). A key-padding mask is exactly this. ``kv_len`` = 0 gives NaN (0/0).

Non-finite input (tested): a NaN/Inf in a Q row makes that output row NaN; a NaN/Inf anywhere in K or V
of a (batch, head) makes that head's whole output NaN (the statistics flag the head and its V scales
become NaN). Never finite garbage.

Measured on H100s in session 37 (docs/ATTENTION.md "Session 37"): the P·V key order made the kernel ≈ 2 % faster
(``probe_pvorder_h100_s37.json``: against session 36's module in 15 shuffled rounds, outputs identical); the kernel
alone 1.41× / 1.41× cuDNN SDPA at 2B / 5B and the whole call 1.36× / 1.35× (``attention_h100_s37.md``, medians of 5
paired rounds; 1.39× / 1.37× in ``attention_h100_s37b.md``); on the H200 the kernel alone 1.39× / 1.38× and the
whole call 1.36× / 1.36× (``attention_h200_s37.md``).

Measured on H100s in session 36 (docs/ATTENTION.md "Session 36"): at 2B the whole call as the processor runs it
1.33–1.35× cuDNN after the same norms (three probes), the kernel alone 1.32× cuDNN SDPA in ``attention_h100_s36.md``
(whose cuDNN ran at 11.19 ms, against 11.5–12.0 in the probes) — these H100s' do_bench medians move ±3 % between
rounds, the size of the gap to 1.35×. Tried there and dropped (``probe_overlap_h100_s36.json``,
``probe_tail*_h100_s36*.json``): the K/V pass of later heads on a second stream while the first heads' attention runs
(slower in every form), and splitting the tiles of the last partial wave over their key blocks (a partial last wave
costs nothing measurable: 0.528–0.533 µs a tile at whole and partial last waves alike).

Measured on the H200 (``benchmarks/results/attention_h200_s21.md``, docs/ATTENTION.md "Session 21"): at the
CogVideoX 2B / 5B shapes, with 256-key tiles of 64 query rows, the kernel is 1.38× / 1.36× cuDNN bf16 SDPA
(571–572 TFLOP/s) and the whole call with the K/V pass 1.33× / 1.32×; session 23's statistics kernels took the
pass from 0.29 / 0.42 to 0.21 / 0.30 ms (``attention_h200_s23.md``); at Wan's head dim 128 1.05×. In the sm_90
SASS the 128 × 128 tile of before ran at 255 registers with every wgmma waited for right after it; the 256-key
tiles keep each key block's wgmma group in flight. ``pipelined`` (the next block's QKᵀ issued before this block's
softmax) computes the same in another order; Triton still waits for that MMA at once (measured slower, off).
Relative L2 vs fp32 on random inputs: e4m3 QKᵀ 5.3 %, 16–17 % with 5 K channels ×20; int8 + rotation 3.8 % /
4.0 % (but 1.04× cuDNN: Triton 3.6 issues int8 wgmma synchronously); cuDNN 0.2 %. The floor is the e4m3 PV:
an e4m3 element carries up to ±6 % relative rounding error, which a weighted mean of zero-mean random V does not
average away (2.7 % from V alone, CPU emulation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sixbit import formats as spec

from ._common import absbits, cast_out, cdiv, check_launchable, hadamard_blockdiag, rne_int
from .layernorm import RowNorm, no_norm, norm_rows_tile
from .targets import device_target

LOG2E = 1.4426950408889634
assert spec.ATTN_P_LOG2 == 8  # P is stored as e4m3(p · 2**8): the literal 8.0 in _softmax_pv

#: tile configuration per head dim: (BLOCK_M, BLOCK_N, num_warps, num_stages), the fastest measured on the H200
#: (``benchmarks/attention.py --sweep`` / ``--variants tiles``, benchmarks/results/attention_*h200*.md); 32 is
#: untuned. D = 64: 256-key tiles of 64 query rows (session 21: the kernel 1.38× / 1.36× cuDNN at 2B / 5B, the whole
#: call 1.33× / 1.32×; the (128, 128, 4, 3) tile before it 1.27× / 1.22× at 2B in the same variants run) — K scales
#: per 256 keys, ``quantize_kv``'s default
CONFIGS = {32: (64, 64, 4, 2), 64: (64, 256, 4, 3), 128: (128, 128, 8, 2)}
#: the same key block on devices whose opt-in shared memory per block is below :data:`SMEM_NEEDED` (sm_80/86/89/120:
#: 99–163 KB; the 3-stage 256-key tile needs ~100 KB): 2 stages (~70 KB); not measured there
SMALL_SMEM_CONFIGS = {64: (64, 256, 4, 2)}
SMEM_NEEDED = 110 * 1024
#: ``qk="int8", rotate=True`` keeps the 128-key tile of sessions 9–20: with 256-key tiles that kernel (int8 QKᵀ
#: after the in-kernel rotation of Q) hits an illegal memory access under Triton 3.6 on the H200 (session 21; every
#: 256-key config, TMA or pointer loads, 300 keys already; the same tiles run int8 without rotation and fp8 with it)
INT8_ROTATE_CONFIGS = {64: (128, 128, 4, 3)}
#: largest key block the int8 + rotation kernel is launched with on a GPU (:data:`INT8_ROTATE_CONFIGS`)
INT8_ROTATE_MAX_BLOCK_N = 128
#: TMA descriptor loads for K/V per head dim (module docstring), from the same sweep: at D = 64 TMA and
#: pointer loads are within 3 % of each other (533 vs 520 TFLOP/s), at D = 128 pointer loads win (616 vs 530)
TMA = {32: False, 64: True, 128: False}
#: ``exp2_poly`` choices (module docstring): 0 = every exp2 on MUFU, 1 = all, 2 = every second, 4 = every fourth
#: exp2 of a tile by the FMA-unit polynomial; the default per head dim (off until measured on a GPU)
EXP2_POLY = (0, 1, 2, 4)
POLY = {32: 0, 64: 0, 128: 0}
#: max relative error of the polynomial 2**x in fp32 (measured on a dense grid: tests/test_kernels_attention.py)
EXP2_POLY_MAX_REL_ERR = 7.5e-5
#: software-pipelined key loop per head dim (module docstring, "pipelined"): measured slower on the H200, off
PIPELINED = {32: False, 64: False, 128: False}
#: Triton's automatic warp specialization of the key loop (not the pipelined one): on the H200 under Triton 3.6 the
#: same speed and output as without (8.561 vs 8.563 ms at 2B; probe_ws_attn_h200_s28.json), so off
WARP_SPECIALIZE = False
#: the compiled attention kernel of the last launch (registers, spills, shared memory for the benchmark)
LAST_LAUNCH: dict = {}
#: keys per group of ``KV8.v``'s P·V key order (module docstring; ``_pv_order`` in the kernels, :func:`pv_key_order`);
#: key blocks that are not a multiple of it keep the natural order
PV_GROUP = tl.constexpr(32)
#: ``hi_channels`` the kernel takes besides 0 (one bf16 MMA of reduction 16; docs/ATTENTION.md; H200: 2.3× slower)
HI_CHANNELS = 16
#: ``residual_channels`` the kernel takes besides 0 (module docstring, "Residual terms"; capped at the head dim)
RESIDUAL_CHANNELS = (16, 32, 64)


@dataclass
class KV8:
    """Quantized K/V of one attention call (``quantize_kv``'s output, ``attention_fp8``'s input).

    ``k`` ``[BH, S_pad, D]`` e4m3 or int8 codes of the smoothed (rotated) K; ``k_scale`` ``[BH, S_pad /
    block_n]`` fp32; ``v`` ``[BH, D, S_pad]`` e4m3 (transposed, its keys in the P·V key order of
    :func:`pv_key_order`); ``v_scale`` ``[BH, D]`` fp32 (NaN for a head with non-finite K or V); ``hi_idx`` /
    ``k_hi``: the channels kept in bf16 (``hi_channels``)."""

    k: torch.Tensor
    k_scale: torch.Tensor
    v: torch.Tensor
    v_scale: torch.Tensor
    batch: int
    heads: int
    seq_len: int
    block_n: int
    qk: str
    rotate: bool
    #: ``hi_channels`` (docs/ATTENTION.md "Outlier channels in 16 bits"): ``hi_idx`` ``[BH, n]`` int32, the K
    #: channels kept apart per head (ascending), ``k_hi`` ``[BH, S_pad, n]`` bf16 their smoothed values; None at n = 0
    hi_idx: torch.Tensor | None = None
    k_hi: torch.Tensor | None = None
    #: ``residual_channels`` (module docstring, "Residual terms"): ``res_idx`` ``[BH, n]`` int32, K's n largest
    #: smoothed channels per head (ascending); ``k_res`` ``[BH, S_pad, 2n]`` e4m3, per channel j the pair
    #: ``(kl_j, kh_j)`` — the rounding residual and the code of K's scaled value —; None at n = 0
    res_idx: torch.Tensor | None = None
    k_res: torch.Tensor | None = None
    #: ``v_residual``: ``[BH, D, S_pad]`` e4m3, V's rounding residual on its channel scale, laid out as ``v``
    v_lo: torch.Tensor | None = None
    #: ``residual_ratio`` > 0: ``[BH]`` int32, 1 where the head takes the residual terms
    #: (``formats.attention_residual_heads``); the others' ``k_res``/``v_lo`` rows are written but not read
    res_heads: torch.Tensor | None = None


# ------------------------------------------------------------------------------------ jit helpers


@triton.jit
def _e4m3(v, INTERP: tl.constexpr):
    """fp32 → float8e4nv, round to nearest even, saturating at ±448. The interpreter's own conversion is
    not RNE, so there the value is first rounded onto the e4m3 grid by bit arithmetic (then exact)."""
    if INTERP:
        a = tl.abs(v)
        bits = a.to(tl.int32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)
        sub = (a + 24576.0) - 24576.0  # subnormals: steps of 2**-9 (ulp of 24576 = 1.5 * 2**14)
        r = tl.minimum(tl.where(a < 0.015625, sub, normal), 448.0)
        r = tl.where(v < 0, -r, r)
        return tl.where(v != v, v, r).to(tl.float8e4nv)
    else:
        return v.to(tl.float8e4nv)


@triton.jit
def _bf16(v, INTERP: tl.constexpr):
    """fp32 → bf16, round to nearest even (the interpreter's conversion truncates: there the value is rounded
    by bit arithmetic first, then converted exactly; NaN stays NaN, ±inf stays ±inf)."""
    if INTERP:
        bits = v.to(tl.int32, bitcast=True)
        r = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        return tl.where(v != v, v, r).to(tl.bfloat16)
    else:
        return v.to(tl.bfloat16)


@triton.jit
def _codes(v, QK_INT8: tl.constexpr, INTERP: tl.constexpr):
    """fp32 values already scaled into [-QMAX, QMAX] → 8-bit codes (int8 RNE, or e4m3)."""
    if QK_INT8:
        r = rne_int(v)
        return tl.where(r == r, r, 0.0).to(tl.int8)
    else:
        return _e4m3(v, INTERP)


@triton.jit
def _amax_to_scale(amax, QMAX: tl.constexpr):
    """(inverse scale, scale) of an amax: QMAX/amax and amax/QMAX (IEEE), 1 for amax 0, NaN scale for a
    non-finite amax."""
    safe = tl.where(amax == 0, QMAX, amax)
    qmax = tl.full(safe.shape, QMAX, tl.float32)
    inv = tl.math.div_rn(qmax, safe)
    scale = tl.math.div_rn(safe, qmax)
    finite = amax < float("inf")  # False for NaN and +inf
    return tl.where(finite, inv, 0.0), tl.where(finite, scale, float("nan"))


@triton.jit
def _rotate(x, D: tl.constexpr, INTERP: tl.constexpr):
    """fp32 ``x [R, D]`` times the ±1 Sylvester-Hadamard matrix with exact products and fp32 sums. On
    CUDA ``x`` is split into three bf16 parts that add up to it exactly (8 + 8 + 8 significant bits) and
    each goes through a bf16 MMA with the (exact) ±1 matrix: an fp32 FMA loop took 12.8 ms for the Wan
    K/V pass, ``tf32x3`` needed 256 KB of shared memory at D = 128."""
    if INTERP:
        return tl.dot(x, hadamard_blockdiag(D, D, tl.float32), input_precision="ieee")
    else:
        h = hadamard_blockdiag(D, D, tl.bfloat16)
        hi = x.to(tl.bfloat16)
        r = x - hi.to(tl.float32)
        mid = r.to(tl.bfloat16)
        lo = (r - mid.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(lo, h, tl.dot(mid, h, tl.dot(hi, h)))


@triton.jit
def _dot8(a, b, acc, INTERP: tl.constexpr):
    """8-bit MMA with fp32 accumulation (int8: int32 on the tensor cores, exact, then fp32)."""
    if INTERP:  # the interpreter multiplies 8-bit float operands as raw bytes
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif a.dtype == tl.int8:
        return acc + tl.dot(a, b, out_dtype=tl.int32).to(tl.float32)
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _dot16(a, b, INTERP: tl.constexpr):
    """bf16 × bf16 MMA with fp32 accumulation (products exact in fp32), the ``hi_channels`` logit part."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _pv_order(x, R: tl.constexpr, C: tl.constexpr, KEYS_AXIS: tl.constexpr):
    """``x`` ``[R, C]`` with its keys (columns if ``KEYS_AXIS`` = 1, rows if 0) in the P·V key order: within
    each group of :data:`PV_GROUP` = 32, position k takes key c(k), c's bits (k0, k2, k3, k1, k4) (module
    docstring); ``x`` as it is where its keys are not a multiple of the group (the natural order)."""
    if KEYS_AXIS == 1 and C % PV_GROUP.value == 0:
        x = tl.reshape(tl.permute(tl.reshape(x, (R, C // 32, 2, 2, 2, 2, 2)), (0, 1, 2, 4, 5, 3, 6)), (R, C))
    elif KEYS_AXIS == 0 and R % PV_GROUP.value == 0:
        x = tl.reshape(tl.permute(tl.reshape(x, (R // 32, 2, 2, 2, 2, 2, C)), (0, 1, 3, 4, 2, 5, 6)), (R, C))
    return x


@triton.jit
def _is_hi(d, hidx):
    """[D] mask of the channels listed in ``hidx`` [NH]."""
    return tl.sum((d[:, None] == hidx[None, :]).to(tl.int32), axis=1) > 0


@triton.jit
def _exp2_poly(x):
    """2**x without MUFU (module docstring): j = round(x) from the bits of x + 1.5·2²³, 2**(x − j) by a degree-3
    minimax polynomial on [−½, ½], j added to the exponent field. x is clamped at −125; NaN is not carried."""
    x = tl.maximum(x, -125.0)  # keeps the result normal: p(f) ≥ 2**-0.5 at j ≥ -125
    y = x + 12582912.0  # 1.5 * 2**23: the low mantissa bits of y hold round(x), ties to even
    f = x - (y - 12582912.0)
    p = tl.fma(tl.fma(tl.fma(0.0551716685295105, f, 0.2426111251115799), f, 0.6932609677314758), f,
               0.9999280571937561)
    j = y.to(tl.int32, bitcast=True) << 23  # the exponent bits of y shift out: round(x) · 2**23
    return (p.to(tl.int32, bitcast=True) + j).to(tl.float32, bitcast=True)


@triton.jit
def _exp2_mix(t, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POLY: tl.constexpr):
    """exp2 of a [BLOCK_M, BLOCK_N] tile, 1 in ``POLY`` of its elements (interleaved columns) by
    :func:`_exp2_poly`, the rest on MUFU (``POLY`` = 0: none)."""
    if POLY == 0:
        return tl.exp2(t)
    elif POLY == 1:
        return _exp2_poly(t)
    else:
        a, b = tl.split(tl.reshape(t, (BLOCK_M, BLOCK_N // 2, 2)))
        if POLY == 2:
            pb = _exp2_poly(b)
        else:
            b0, b1 = tl.split(tl.reshape(b, (BLOCK_M, BLOCK_N // 4, 2)))
            pb = tl.reshape(tl.join(tl.exp2(b0), _exp2_poly(b1)), (BLOCK_M, BLOCK_N // 2))
        return tl.reshape(tl.join(tl.exp2(a), pb), (BLOCK_M, BLOCK_N))


@triton.jit
def _exp2_test_kernel(x_ptr, y_ptr, n, POLY: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * 64 * BLOCK + tl.arange(0, 64 * BLOCK)
    t = tl.load(x_ptr + i, mask=i < n, other=0.0)
    y = _exp2_mix(tl.reshape(t, (64, BLOCK)), 64, BLOCK, POLY)
    tl.store(y_ptr + i, tl.reshape(y, (64 * BLOCK,)), mask=i < n)


def exp2_tile(x: torch.Tensor, poly: int = 1) -> torch.Tensor:
    """The kernel's exp2 of a 1-d fp32 tensor (``_exp2_mix`` on [64, 16] tiles) — for its tests."""
    x = x.contiguous()
    y = torch.empty_like(x)
    check_launchable(x)
    _exp2_test_kernel[(cdiv(x.numel(), 64 * 16),)](x, y, x.numel(), POLY=poly, BLOCK=16, enable_fp_fusion=False)
    return y


# ---------------------------------------------------------------------------------------- K/V pass

#: rows of K and V each program of the statistics kernel reads (``STATS_TILE``-row tiles in a loop); the partial
#: sums of a head (``cdiv(S, STATS_ROWS)`` of them) are added in a fixed order by the finishing kernel
STATS_ROWS = 1024
STATS_TILE = 128


@triton.jit
def _kv_stats_kernel(k_ptr, v_ptr, ksum_ptr, vbits_ptr, kmax_ptr, kmin_ptr, S, H, NS, skb, skh, sks, skd, svb, svh,
                     svs, svd, nw_ptr, nb_ptr, ncos_ptr, nsin_ptr, n_eps, n_start,
                     D: tl.constexpr, TILE: tl.constexpr, TILES: tl.constexpr, SMOOTH: tl.constexpr,
                     NORM: tl.constexpr, NORM_W: tl.constexpr, NORM_B: tl.constexpr, NORM_ROPE: tl.constexpr,
                     EXTREMA: tl.constexpr, INTERP: tl.constexpr):
    """Per (``TILES·TILE`` rows, head): K's fp32 column sums and V's column max of |v| as int32 bit patterns
    (NaN > inf > finite: an exact amax that carries NaN), one partial each into ``[BH, NS, D]``; ``EXTREMA``: K's
    column max and min too (the residual channels' selection). ``NORM``: K's rows are the raw projection, normalized
    (and rotated) on load (``layernorm.norm_rows_tile``)."""
    j = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    d = tl.arange(0, D)
    ksum = tl.zeros((D,), tl.float32)
    vmax = tl.zeros((D,), tl.int32)
    kmax = tl.full((D,), float("-inf"), tl.float32)
    kmin = tl.full((D,), float("inf"), tl.float32)
    for t in range(TILES):
        r = (j * TILES + t) * TILE + tl.arange(0, TILE)
        valid = (r < S)[:, None]
        r64 = r.to(tl.int64)
        if SMOOTH:
            k = tl.load(k_ptr + b * skb + h * skh + r64[:, None] * sks + d[None, :] * skd, mask=valid, other=0.0)
            if NORM:
                k = norm_rows_tile(k, r - n_start, r < S, nw_ptr, nb_ptr, ncos_ptr, nsin_ptr, n_eps, D, TILE, NORM_W,
                                   NORM_B, NORM_ROPE, k_ptr.dtype.element_ty, INTERP)
            ksum += tl.sum(k.to(tl.float32), axis=0)
            if EXTREMA:
                kmax = tl.maximum(kmax, tl.max(tl.where(valid, k.to(tl.float32), float("-inf")), axis=0))
                kmin = tl.minimum(kmin, tl.min(tl.where(valid, k.to(tl.float32), float("inf")), axis=0))
        v = tl.load(v_ptr + b * svb + h * svh + r64[:, None] * svs + d[None, :] * svd, mask=valid, other=0.0)
        vmax = tl.maximum(vmax, tl.max(absbits(v.to(tl.float32)), axis=0))
    out = (bh * NS + j) * D + d
    tl.store(ksum_ptr + out, ksum)
    tl.store(vbits_ptr + out, vmax)
    if EXTREMA:
        tl.store(kmax_ptr + out, kmax)
        tl.store(kmin_ptr + out, kmin)


@triton.jit
def _kv_stats_finish_kernel(ksum_ptr, vbits_ptr, kmax_ptr, kmin_ptr, mean_ptr, vamax_ptr, vscale_ptr, kamax_ptr, S,
                            NS, D: tl.constexpr, CHUNK: tl.constexpr, SMOOTH: tl.constexpr, EXTREMA: tl.constexpr):
    """Per head: the partials added in a fixed order → K mean (``sum / S``, IEEE), V amax (NaN on every
    channel of a head whose mean or amax is not finite) and V's dequantization scales (``_amax_to_scale``);
    ``EXTREMA``: the smoothed K's channel amax ``max(kmax − mean, mean − kmin)`` (= max |k − mean| exactly: fp32
    subtraction is monotone)."""
    bh = tl.program_id(0)
    d = tl.arange(0, D)
    ksum = tl.zeros((D,), tl.float32)
    vmax = tl.zeros((D,), tl.int32)
    kmax = tl.full((D,), float("-inf"), tl.float32)
    kmin = tl.full((D,), float("inf"), tl.float32)
    for i in range(0, NS, CHUNK):
        idx = i + tl.arange(0, CHUNK)
        m = (idx < NS)[:, None]
        off = (bh * NS + idx)[:, None] * D + d[None, :]
        ksum += tl.sum(tl.load(ksum_ptr + off, mask=m, other=0.0), axis=0)
        vmax = tl.maximum(vmax, tl.max(tl.load(vbits_ptr + off, mask=m, other=0), axis=0))
        if EXTREMA:
            kmax = tl.maximum(kmax, tl.max(tl.load(kmax_ptr + off, mask=m, other=float("-inf")), axis=0))
            kmin = tl.minimum(kmin, tl.min(tl.load(kmin_ptr + off, mask=m, other=float("inf")), axis=0))
    amax = vmax.to(tl.float32, bitcast=True)
    finite = amax < float("inf")
    if SMOOTH:
        mean = tl.math.div_rn(ksum, tl.full((D,), S, tl.float32))
        finite = finite & (tl.abs(mean) < float("inf"))
    else:
        mean = tl.zeros((D,), tl.float32)
    bad = tl.min(finite.to(tl.int32), axis=0) == 0
    amax = tl.where(bad, float("nan"), amax)
    _, scale = _amax_to_scale(amax, 448.0)
    tl.store(mean_ptr + bh * D + d, mean)
    tl.store(vamax_ptr + bh * D + d, amax)
    tl.store(vscale_ptr + bh * D + d, scale)
    if EXTREMA:
        tl.store(kamax_ptr + bh * D + d, tl.maximum(kmax - mean, mean - kmin))


def kv_stats(k: torch.Tensor, v: torch.Tensor, *, smooth: bool = True, k_norm: RowNorm | None = None,
             k_amax: bool = False) -> tuple[torch.Tensor, ...]:
    """``formats.attention_kv_stats`` in two launches that read K and V once: (K mean ``[B, H, D]`` fp32 — zeros
    without ``smooth`` —, V amax ``[B, H, D]`` — NaN for every channel of a head with a non-finite value in K's
    mean or V —, V dequantization scales ``[BH, D]``). The V amax is bit-exact; the mean is the spec's to fp32
    rounding (its sum runs in another order: per 1,024-row partial sums, then those in a fixed order — the same
    result every run). ``k_norm``: ``k`` is the raw projection and K is its :class:`~.layernorm.RowNorm` (the
    same statistics as of ``layer_norm_rows``' output, read without it). ``k_amax`` (``smooth`` only): a fourth
    output, the smoothed K's channel amax ``[BH, D]`` (max |k − mean| over tokens, bit-exact given the mean; the
    ``residual_channels`` selection)."""
    B, H, S, D = k.shape
    interp = check_launchable(k, v)
    norm_args, norm_flags = _norm_launch(k_norm, k, "k")
    tile = 16 if interp else STATS_TILE
    tiles = 4 if interp else STATS_ROWS // STATS_TILE
    ns = max(cdiv(S, tile * tiles), 1)
    if k_amax and not smooth:
        raise ValueError("kv_stats: k_amax is the smoothed K's (smooth=True)")
    ksum = torch.empty(B * H, ns, D, dtype=torch.float32, device=k.device)
    vbits = torch.empty(B * H, ns, D, dtype=torch.int32, device=k.device)
    kext = [torch.empty(B * H, ns, D, dtype=torch.float32, device=k.device) for _ in range(2)] if k_amax else [ksum] * 2
    _kv_stats_kernel[(ns, B * H)](k, v, ksum, vbits, *kext, S, H, ns, *k.stride(), *v.stride(), *norm_args,
                                  D=D, TILE=tile, TILES=tiles, SMOOTH=smooth, **norm_flags, EXTREMA=k_amax,
                                  INTERP=interp,
                                  num_warps=KV_NORM_WARPS if k_norm is not None else 4,
                                  enable_fp_fusion=False)
    mean = torch.empty(B, H, D, dtype=torch.float32, device=k.device)
    vamax = torch.empty(B, H, D, dtype=torch.float32, device=k.device)
    vscale = torch.empty(B * H, D, dtype=torch.float32, device=k.device)
    kamax = torch.empty(B * H, D, dtype=torch.float32, device=k.device) if k_amax else vscale
    _kv_stats_finish_kernel[(B * H,)](ksum, vbits, *kext, mean, vamax, vscale, kamax, S, ns, D=D, CHUNK=16,
                                      SMOOTH=smooth, EXTREMA=k_amax, num_warps=1)
    return (mean, vamax, vscale, kamax) if k_amax else (mean, vamax, vscale)


@triton.jit
def _kv_quant_kernel(k_ptr, v_ptr, mean_ptr, vamax_ptr, k8_ptr, ks_ptr, v8_ptr, hidx_ptr, khi_ptr, vlo_ptr, S, S_pad,
                     H, skb, skh, sks, skd, svb, svh, svs, svd, nw_ptr, nb_ptr, ncos_ptr, nsin_ptr, n_eps, n_start,
                     D: tl.constexpr, BLOCK_N: tl.constexpr, QK_INT8: tl.constexpr, ROT: tl.constexpr,
                     NH: tl.constexpr, NR: tl.constexpr, VRES: tl.constexpr, NORM: tl.constexpr,
                     NORM_W: tl.constexpr, NORM_B: tl.constexpr, NORM_ROPE: tl.constexpr, INTERP: tl.constexpr):
    """One ``BLOCK_N``-key block of one head: K's codes and block scale, V's codes in the P·V key order; ``NH``:
    the hi channels apart in bf16 (``hidx_ptr``/``khi_ptr``); ``NR``: the residual channels' ``[kl, kh]`` pairs
    (``hidx_ptr``/``khi_ptr``, module docstring); ``VRES``: V's residual codes (``vlo_ptr``)."""
    j = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    r = j * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    valid = (r < S)[:, None]
    r64 = r.to(tl.int64)
    k = tl.load(k_ptr + b * skb + h * skh + r64[:, None] * sks + d[None, :] * skd, mask=valid, other=0.0)
    if NORM:
        k = norm_rows_tile(k, r - n_start, r < S, nw_ptr, nb_ptr, ncos_ptr, nsin_ptr, n_eps, D, BLOCK_N, NORM_W,
                           NORM_B, NORM_ROPE, k_ptr.dtype.element_ty, INTERP)
    mean = tl.load(mean_ptr + bh * D + d)
    kc = tl.where(valid, k.to(tl.float32) - mean[None, :], 0.0)
    if ROT:
        kc = _rotate(kc, D, INTERP)
    if NH > 0:  # the hi channels: stored apart in bf16, zero in the 8-bit codes
        j16 = tl.arange(0, NH)
        hidx = tl.load(hidx_ptr + bh * NH + j16)
        khi = tl.load(k_ptr + b * skb + h * skh + r64[:, None] * sks + hidx[None, :] * skd, mask=valid, other=0.0)
        khi = tl.where(valid, khi.to(tl.float32) - tl.load(mean_ptr + bh * D + hidx)[None, :], 0.0)
        tl.store(khi_ptr + bh.to(tl.int64) * S_pad * NH + r64[:, None] * NH + j16[None, :], _bf16(khi, INTERP))
        kc = tl.where(_is_hi(d, hidx)[None, :], 0.0, kc)
    QMAX: tl.constexpr = 127.0 if QK_INT8 else 448.0
    amax = tl.max(tl.max(absbits(kc), axis=1), axis=0).to(tl.float32, bitcast=True)
    inv, scale = _amax_to_scale(amax, QMAX)
    out = bh.to(tl.int64) * S_pad * D + r64[:, None] * D + d[None, :]
    kx = kc * inv
    tl.store(k8_ptr + out, _codes(kx, QK_INT8, INTERP))
    tl.store(ks_ptr + bh * (S_pad // BLOCK_N) + j, scale)
    if NR > 0:  # the residual channels as [kl, kh] pairs (kl pairs with Q's qh, kh with ql)
        jr = tl.arange(0, 2 * NR)
        sel = tl.gather(kx, tl.broadcast_to(tl.load(hidx_ptr + bh * NR + tl.arange(0, NR))[None, :], (BLOCK_N, NR)), 1)
        khf = _e4m3(sel, INTERP).to(tl.float32)
        kres = _e4m3(tl.reshape(tl.join(sel - khf, khf), (BLOCK_N, 2 * NR)), INTERP)
        tl.store(khi_ptr + bh.to(tl.int64) * S_pad * 2 * NR + r64[:, None] * 2 * NR + jr[None, :], kres)
    v = tl.load(v_ptr + b * svb + h * svh + r64[:, None] * svs + d[None, :] * svd, mask=valid, other=0.0)
    vinv, _ = _amax_to_scale(tl.load(vamax_ptr + bh * D + d), 448.0)
    vx = v.to(tl.float32) * vinv[None, :]
    v8 = _e4m3(vx, INTERP)
    vout = bh.to(tl.int64) * D * S_pad + d[None, :] * S_pad + r64[:, None]
    tl.store(v8_ptr + vout, _pv_order(v8, BLOCK_N, D, 0))  # the P·V key order
    if VRES:
        tl.store(vlo_ptr + vout, _pv_order(_e4m3(vx - v8.to(tl.float32), INTERP), BLOCK_N, D, 0))


def quantize_kv(k: torch.Tensor, v: torch.Tensor, *, block_n: int | None = None, qk: str = "fp8",
                rotate: bool = False, smooth: bool = True, hi_channels: int = 0, residual_channels: int = 0,
                v_residual: bool = False, residual_ratio: float = 0.0, stats: tuple[torch.Tensor, ...] | None = None,
                k_norm: RowNorm | None = None) -> KV8:
    """The K/V pass (module docstring, step 1) for ``[B, H, S, D]`` views (any strides). ``hi_channels``: 0 or
    :data:`HI_CHANNELS` K channels per head kept in bf16 (``formats.attention_quantize_kv``; module docstring).
    ``stats``: :func:`kv_stats`' output for these K and V if already computed (then ``smooth`` is theirs).
    ``k_norm``: ``k`` is the raw projection; K is its row norm (and rotary), applied on load by both launches
    (module docstring, "Q/K norm on load"); not with ``hi_channels``. ``residual_channels`` (0 or one of
    :data:`RESIDUAL_CHANNELS`) / ``v_residual``: second e4m3 terms (``formats.attention_quantize_kv``; module
    docstring, "Residual terms"); their selection comes from the statistics (``kv_stats(k_amax=True)``: ``stats``
    then has its fourth entry), so it combines with ``k_norm``. ``residual_ratio`` > 0: only the heads whose K has
    outlier channels take them (``formats.attention_residual_heads`` on the same statistics; ``KV8.res_heads``)."""
    _check_qkv(k, k, v, qk)
    B, H, S, D = k.shape
    _check_hi(hi_channels, D, rotate, residual_channels, qk, residual_ratio, v_residual)
    if hi_channels and k_norm is not None:
        raise ValueError("quantize_kv: k_norm (the norm on load) does not combine with hi_channels; normalize K "
                         "first (layernorm.layer_norm_rows)")
    block_n = block_n or default_config(D, int8_rotate=qk == "int8" and rotate)[1]
    interp = check_launchable(k, v)
    norm_args, norm_flags = _norm_launch(k_norm, k, "k")
    amax = bool(residual_channels or residual_ratio)  # the selections read the smoothed K's channel amax
    if amax and not smooth:
        raise ValueError("quantize_kv: residual_channels / residual_ratio select channels / heads of the smoothed K "
                         "(smooth=True)")
    if stats is None:
        stats = kv_stats(k, v, smooth=smooth, k_norm=k_norm, k_amax=amax)
    elif amax and len(stats) != 4:
        raise ValueError("quantize_kv: residual_channels / residual_ratio need the K channel amax in stats "
                         "(kv_stats(k_amax=True))")
    mean, vamax, vscale = stats[:3]
    hidx = khi = vlo = None
    if residual_channels:  # K's n largest smoothed channels per head, ascending (the spec's selection)
        hidx = stats[3].topk(residual_channels, dim=-1).indices.sort(dim=-1).values.to(torch.int32).contiguous()
    elif hi_channels:  # max |k - mean| per channel from K's max and min (rounding is monotone: the spec's values)
        amax = torch.maximum(k.amax(dim=2).float() - mean, mean - k.amin(dim=2).float())
        hidx = amax.topk(hi_channels, dim=-1).indices.sort(dim=-1).values.to(torch.int32).reshape(B * H, -1)
        hidx = hidx.contiguous()
    S_pad = cdiv(max(S, 1), block_n) * block_n
    dt8 = torch.int8 if qk == "int8" else torch.float8_e4m3fn
    k8 = torch.empty(B * H, S_pad, D, dtype=dt8, device=k.device)
    ks = torch.empty(B * H, S_pad // block_n, dtype=torch.float32, device=k.device)
    v8 = torch.empty(B * H, D, S_pad, dtype=torch.float8_e4m3fn, device=k.device)
    if hi_channels:
        khi = torch.empty(B * H, S_pad, hi_channels, dtype=torch.bfloat16, device=k.device)
    if residual_channels:
        khi = torch.empty(B * H, S_pad, 2 * residual_channels, dtype=torch.float8_e4m3fn, device=k.device)
    if v_residual:
        vlo = torch.empty_like(v8)
    _kv_quant_kernel[(S_pad // block_n, B * H)](
        k, v, mean, vamax, k8, ks, v8, ks if hidx is None else hidx, ks if khi is None else khi,
        ks if vlo is None else vlo, S, S_pad, H, *k.stride(), *v.stride(), *norm_args,
        D=D, BLOCK_N=block_n, QK_INT8=qk == "int8", ROT=rotate, NH=hi_channels, NR=residual_channels,
        VRES=v_residual, **norm_flags, INTERP=interp,
        num_warps=KV_NORM_WARPS if k_norm is not None else 4, enable_fp_fusion=False,
    )
    side = dict(res_idx=hidx, k_res=khi) if residual_channels else dict(hi_idx=hidx, k_hi=khi)  # exclusive options
    heads = spec.attention_residual_heads(stats[3], residual_ratio).to(torch.int32) if residual_ratio else None
    return KV8(k8, ks, v8, vscale, B, H, S, block_n, qk, rotate, **side, v_lo=vlo, res_heads=heads)


#: warps of the K statistics and the K/V pass when they normalize K on load: on 4 warps the norm and rotary's
#: temporaries take the K/V pass's 256-key tile of 64 channels to 255 registers and a spill (ptxas for sm_90a; the
#: statistics' 128-row tile to 210); on 8, 174 and 159, no spill
KV_NORM_WARPS = 8


def _norm_launch(norm: RowNorm | None, x: torch.Tensor, name: str) -> tuple[tuple, dict]:
    """The norm-on-load arguments of a launch reading ``x`` (``layernorm.RowNorm.launch``), checked."""
    if norm is None:
        return no_norm(x)
    norm.check(x, name)
    return norm.launch(x)


def _check_hi(hi_channels: int, D: int, rotate: bool, residual_channels: int = 0, qk: str = "fp8",
              residual_ratio: float = 0.0, v_residual: bool = False) -> None:
    spec._check_hi_channels(hi_channels, D, rotate, residual_channels, qk, residual_ratio, v_residual)
    if hi_channels not in (0, HI_CHANNELS) or (hi_channels and HI_CHANNELS >= D):
        raise ValueError(f"8-bit attention: the kernel keeps 0 or {HI_CHANNELS} K channels in bf16 (a bf16 MMA "
                         f"reduces over 16) below head dim {D}, got hi_channels={hi_channels}")
    if residual_channels and residual_channels not in RESIDUAL_CHANNELS:
        raise ValueError(f"8-bit attention: the kernel takes residual_channels in {RESIDUAL_CHANNELS} (the [qh, ql] · "
                         f"[kl, kh] MMA reduces over 2n ≥ 32, a power of two), got {residual_channels}")


# ------------------------------------------------------------------------------------- attention


@triton.jit
def _qk(q8, k8_base, k_desc, bh, start, S_pad, q_res, kres_base, kres_desc, D: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, NR: tl.constexpr, TMA: tl.constexpr, INTERP: tl.constexpr):
    """The 8-bit scores ``Q8·K8ᵀ`` of the key block at ``start`` (fp32, unscaled); ``NR``: plus the residual
    channels' ``[qh, ql]·[kl, kh]ᵀ`` into the same accumulator (module docstring, "Residual terms")."""
    start = tl.multiple_of(start, BLOCK_N)
    n = start + tl.arange(0, BLOCK_N)
    if TMA:
        kt = k_desc.load([bh * S_pad + start, 0]).T
    else:
        d = tl.arange(0, D)
        kt = tl.trans(tl.load(k8_base + n[:, None] * D + d[None, :]))  # [D, BLOCK_N], read as [BLOCK_N, D] rows
    s = _dot8(q8, kt, tl.zeros((BLOCK_M, BLOCK_N), tl.float32), INTERP)
    if NR > 0:
        if TMA:
            krt = kres_desc.load([bh * S_pad + start, 0]).T
        else:
            krt = tl.trans(tl.load(kres_base + n[:, None] * (2 * NR) + tl.arange(0, 2 * NR)[None, :]))
        s = _dot8(q_res, krt, s, INTERP)
    return s


@triton.jit
def _softmax_pv(acc, l_i, m_i, s, c, v8_base, ks_base, v_desc, bh, start, n_kv, S_pad, q_hi, khi_base, khi_desc,
                vlo_base, vlo_desc, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
                TMA: tl.constexpr, POLY: tl.constexpr, NH: tl.constexpr, VRES: tl.constexpr, INTERP: tl.constexpr):
    """One key block's online-softmax update from its scores ``s``: row max, ``p = exp2(t)``, row sum, PV
    (``VRES``: plus ``P8·Vl`` into the same accumulator)."""
    start = tl.multiple_of(start, BLOCK_N)
    n = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    if MASK:  # −inf stays −inf through the hi channels' FMA below
        s = tl.where((n < n_kv)[None, :], s, float("-inf"))
    cks = c * tl.load(ks_base + start // BLOCK_N)
    if NH > 0:  # the logit itself (× log2 e): the 8-bit part scaled, plus the bf16 part of the hi channels
        j16 = tl.arange(0, NH)
        if TMA:
            khi_t = khi_desc.load([bh * S_pad + start, 0]).T  # [NH, BLOCK_N], pipelined like K
        else:
            khi_t = tl.trans(tl.load(khi_base + n[:, None] * NH + j16[None, :]))
        s = tl.fma(s, cks[:, None], _dot16(q_hi, khi_t, INTERP))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = _exp2_mix(s + (8.0 - m_new)[:, None], BLOCK_M, BLOCK_N, POLY)
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * cks)
        alpha = tl.exp2(m_i - m_new)
        p = _exp2_mix(tl.fma(s, cks[:, None], (8.0 - m_new)[:, None]), BLOCK_M, BLOCK_N, POLY)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if TMA:
        vt = v_desc.load([bh * D, start]).T
    else:
        vt = tl.trans(tl.load(v8_base + d[:, None] * S_pad + n[None, :]))  # [BLOCK_N, D], read as [D, BLOCK_N] rows
    p8 = _pv_order(_e4m3(p, INTERP), BLOCK_M, BLOCK_N, 1)  # the order V8's keys are stored in (module docstring)
    acc = _dot8(p8, vt, acc * alpha[:, None], INTERP)
    if VRES:
        if TMA:
            vlt = vlo_desc.load([bh * D, start]).T
        else:
            vlt = tl.trans(tl.load(vlo_base + d[:, None] * S_pad + n[None, :]))
        acc = _dot8(p8, vlt, acc, INTERP)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_kernel(q_ptr, k8_ptr, ks_ptr, v8_ptr, vs_ptr, o_ptr, kvlen_ptr, k_desc, v_desc, hidx_ptr, khi_ptr, khi_desc,
                     vlo_ptr, vlo_desc, sel_ptr, S_q, S_kv, S_pad, H, qk_const, hi_const,
                     sqb, sqh, sqs, sqd, sob, soh, sos, sod, nw_ptr, nb_ptr, ncos_ptr, nsin_ptr, n_eps, n_start,
                     D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, QK_INT8: tl.constexpr,
                     ROT: tl.constexpr, HAS_KVLEN: tl.constexpr, TMA: tl.constexpr, POLY: tl.constexpr,
                     NH: tl.constexpr, NR: tl.constexpr, VRES: tl.constexpr, PIPE: tl.constexpr,
                     NORM: tl.constexpr, NORM_W: tl.constexpr, NORM_B: tl.constexpr, NORM_ROPE: tl.constexpr,
                     INTERP: tl.constexpr, SEL: tl.constexpr = 0, WS: tl.constexpr = False):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    if SEL > 0:  # residual_ratio: the launch of the picked heads (module docstring, "Residual terms") ...
        if tl.load(sel_ptr + bh) == 0:
            return
    if SEL < 0:  # ... and the launch of the others
        if tl.load(sel_ptr + bh) != 0:
            return
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    rmask = (rows < S_q)[:, None]
    rows64 = rows.to(tl.int64)
    q = tl.load(q_ptr + b * sqb + h * sqh + rows64[:, None] * sqs + d[None, :] * sqd, mask=rmask, other=0.0)
    if NORM:  # the raw projection: its row norm (and rotary) here, once per program
        q = norm_rows_tile(q, rows - n_start, rows < S_q, nw_ptr, nb_ptr, ncos_ptr, nsin_ptr, n_eps, D, BLOCK_M,
                           NORM_W, NORM_B, NORM_ROPE, q_ptr.dtype.element_ty, INTERP)
    if ROT:
        qf = _rotate(q.to(tl.float32), D, INTERP)
    else:
        qf = q.to(tl.float32)
    q_hi = qf  # unused unless NH > 0
    khi_base = khi_ptr
    if NH > 0:
        hidx = tl.load(hidx_ptr + bh * NH + tl.arange(0, NH))
        q_hi = tl.load(q_ptr + b * sqb + h * sqh + rows64[:, None] * sqs + hidx[None, :] * sqd, mask=rmask,
                       other=0.0).to(tl.float32)
        q_hi = _bf16(q_hi * hi_const, INTERP)  # the logit scale rides on Q's hi channels (the spec's rounding)
        qf = tl.where(_is_hi(d, hidx)[None, :], 0.0, qf)
        khi_base = khi_ptr + bh.to(tl.int64) * S_pad * NH
    QMAX: tl.constexpr = 127.0 if QK_INT8 else 448.0
    amax = tl.max(absbits(qf), axis=1).to(tl.float32, bitcast=True)
    inv, qscale = _amax_to_scale(amax, QMAX)
    qx = qf * inv[:, None]
    q8 = _codes(qx, QK_INT8, INTERP)
    q_res = q8  # unused unless NR > 0
    if NR > 0:  # Q's two terms on the residual channels as [qh, ql] pairs (module docstring, "Residual terms")
        sel = tl.gather(qx, tl.broadcast_to(tl.load(hidx_ptr + bh * NR + tl.arange(0, NR))[None, :], (BLOCK_M, NR)), 1)
        qhf = _e4m3(sel, INTERP).to(tl.float32)
        q_res = _e4m3(tl.reshape(tl.join(qhf, sel - qhf), (BLOCK_M, 2 * NR)), INTERP)
        khi_base = khi_ptr + bh.to(tl.int64) * S_pad * 2 * NR
    c = qscale * qk_const
    n_kv = S_kv
    if HAS_KVLEN:
        n_kv = tl.minimum(tl.load(kvlen_ptr + b), S_kv)
    k8_base = k8_ptr + bh.to(tl.int64) * S_pad * D
    v8_base = v8_ptr + bh.to(tl.int64) * D * S_pad
    vlo_base = vlo_ptr + bh.to(tl.int64) * D * S_pad
    ks_base = ks_ptr + bh * (S_pad // BLOCK_N)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    full = (n_kv // BLOCK_N) * BLOCK_N
    if PIPE:  # the next block's QKᵀ is issued before this block's softmax (module docstring, "pipelined")
        last = tl.cdiv(n_kv, BLOCK_N) * BLOCK_N - BLOCK_N  # every block before it is full
        s = _qk(q8, k8_base, k_desc, bh, pid_m * 0, S_pad, q_res, khi_base, khi_desc, D, BLOCK_M, BLOCK_N, NR, TMA,
                INTERP)
        for start in range(0, last, BLOCK_N):
            s_next = _qk(q8, k8_base, k_desc, bh, start + BLOCK_N, S_pad, q_res, khi_base, khi_desc, D, BLOCK_M,
                         BLOCK_N, NR, TMA, INTERP)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, c, v8_base, ks_base, v_desc, bh, start, n_kv, S_pad, q_hi,
                                        khi_base, khi_desc, vlo_base, vlo_desc, D, BLOCK_M, BLOCK_N, False, TMA, POLY,
                                        NH, VRES, INTERP)
            s = s_next
        if full < n_kv:
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, c, v8_base, ks_base, v_desc, bh, last, n_kv, S_pad, q_hi,
                                        khi_base, khi_desc, vlo_base, vlo_desc, D, BLOCK_M, BLOCK_N, True, TMA, POLY,
                                        NH, VRES, INTERP)
        else:
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, c, v8_base, ks_base, v_desc, bh, last, n_kv, S_pad, q_hi,
                                        khi_base, khi_desc, vlo_base, vlo_desc, D, BLOCK_M, BLOCK_N, False, TMA, POLY,
                                        NH, VRES, INTERP)
    else:
        for start in tl.range(0, full, BLOCK_N, warp_specialize=WS):
            s = _qk(q8, k8_base, k_desc, bh, start, S_pad, q_res, khi_base, khi_desc, D, BLOCK_M, BLOCK_N, NR,
                    TMA, INTERP)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, c, v8_base, ks_base, v_desc, bh, start, n_kv, S_pad, q_hi,
                                        khi_base, khi_desc, vlo_base, vlo_desc, D, BLOCK_M, BLOCK_N, False, TMA, POLY,
                                        NH, VRES, INTERP)
        if full < n_kv:
            s = _qk(q8, k8_base, k_desc, bh, full, S_pad, q_res, khi_base, khi_desc, D, BLOCK_M, BLOCK_N, NR,
                    TMA, INTERP)
            acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, s, c, v8_base, ks_base, v_desc, bh, full, n_kv, S_pad, q_hi,
                                        khi_base, khi_desc, vlo_base, vlo_desc, D, BLOCK_M, BLOCK_N, True, TMA, POLY,
                                        NH, VRES, INTERP)
    vs = tl.load(vs_ptr + bh * D + d)
    out = acc / l_i[:, None] * vs[None, :]
    if POLY != 0:  # the polynomial does not carry a non-finite Q row's NaN
        out = tl.where((c == c)[:, None], out, float("nan"))
    o = cast_out(out, o_ptr.dtype.element_ty, INTERP)
    tl.store(o_ptr + b * sob + h * soh + rows64[:, None] * sos + d[None, :] * sod, o, mask=rmask)


def default_config(D: int, smem: int | None = None, *, int8_rotate: bool = False) -> tuple[int, int, int, int]:
    """The tile config for head dim ``D`` on a device with ``smem`` bytes of opt-in shared memory per block (None:
    the H200's, :data:`CONFIGS`): the :data:`SMALL_SMEM_CONFIGS` one below :data:`SMEM_NEEDED` (the same key block,
    so K/V quantized with the default block suit either); ``int8_rotate`` (``qk="int8", rotate=True``): the
    :data:`INT8_ROTATE_CONFIGS` one."""
    if int8_rotate and D in INT8_ROTATE_CONFIGS:
        return INT8_ROTATE_CONFIGS[D]
    if smem is not None and smem < SMEM_NEEDED and D in SMALL_SMEM_CONFIGS:
        return SMALL_SMEM_CONFIGS[D]
    return CONFIGS[D]


def attention_fp8(q: torch.Tensor, kv: KV8, *, sm_scale: float | None = None, kv_len: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, config: tuple[int, int, int, int] | None = None,
                  tma: bool | None = None, exp2_poly: int | None = None, pipelined: bool | None = None,
                  q_norm: RowNorm | None = None) -> torch.Tensor:
    """Attention of ``q`` ``[B, H, S_q, D]`` (any strides, bf16/fp16/fp32) over the quantized ``kv``.

    Returns ``out`` (default a new ``[B, H, S_q, D]`` tensor of q's dtype; any strided view is written in
    place). ``kv_len``: int32/int64 ``[B]`` keys per batch (key padding). ``config`` = (BLOCK_M, BLOCK_N,
    num_warps, num_stages) with BLOCK_N equal to ``kv.block_n``; ``tma``: read K/V tiles through TMA
    tensor descriptors instead of pointer loads (default :data:`TMA`); ``exp2_poly``: 1 in this many exp2 by
    the FMA-unit polynomial (:data:`EXP2_POLY`, module docstring; 0 = off; default :data:`POLY`); ``pipelined``:
    the software-pipelined key loop (default :data:`PIPELINED`); ``q_norm``: ``q`` is the raw projection and Q its
    row norm (and rotary), applied as each program loads its rows (not with ``kv``'s hi channels)."""
    B, H, S_q, D = q.shape
    if (B, H, D) != (kv.batch, kv.heads, kv.k.shape[-1]):
        raise ValueError(f"attention_fp8: q of shape {tuple(q.shape)} does not match the quantized K/V "
                         f"(batch {kv.batch}, heads {kv.heads}, head dim {kv.k.shape[-1]})")
    interp = check_launchable(q, kv.k)
    if config is None:
        smem = None if interp else device_target(q.device).smem  # cached per device
        config = default_config(D, smem, int8_rotate=kv.qk == "int8" and kv.rotate)
    bm, bn, warps, stages = config
    if kv.qk == "int8" and kv.rotate and bn > INT8_ROTATE_MAX_BLOCK_N and not interp:
        raise ValueError(f"attention_fp8: qk='int8' with rotate=True runs key blocks of at most "
                         f"{INT8_ROTATE_MAX_BLOCK_N} on a GPU (BLOCK_N {bn} hits an illegal memory access under "
                         f"Triton 3.6 on the H200); quantize K/V with block_n={INT8_ROTATE_MAX_BLOCK_N}")
    if bn != kv.block_n:
        raise ValueError(f"attention_fp8: config BLOCK_N {bn} != the K/V block {kv.block_n}")
    exp2_poly = POLY.get(D, 0) if exp2_poly is None else exp2_poly
    pipelined = PIPELINED.get(D, False) if pipelined is None else bool(pipelined)
    if exp2_poly not in EXP2_POLY:
        raise ValueError(f"attention_fp8: exp2_poly must be one of {EXP2_POLY}, got {exp2_poly!r}")
    if tma is None:  # TMA descriptors need sm_90+ (the kernel itself runs from sm_89)
        tma = TMA.get(D, False) and (interp or torch.cuda.get_device_capability(q.device) >= (9, 0))
    if interp:
        bm = min(bm, 32)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if kv_len is not None:
        kv_len = kv_len.to(device=q.device, dtype=torch.int32).contiguous()
        if kv_len.shape != (B,):
            raise ValueError(f"attention_fp8: kv_len must have shape ({B},), got {tuple(kv_len.shape)}")
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    qk_const = sm_scale * LOG2E / (D if kv.rotate else 1)
    hi_const = float(torch.tensor(sm_scale * LOG2E, dtype=torch.float32))  # the logit scale on Q's hi channels
    nh = 0 if kv.hi_idx is None else kv.hi_idx.shape[-1]
    nr = 0 if kv.res_idx is None else kv.res_idx.shape[-1]
    if nh and q_norm is not None:
        raise ValueError("attention_fp8: q_norm (the norm on load) does not combine with K/V hi channels; "
                         "normalize Q first (layernorm.layer_norm_rows)")
    norm_args, norm_flags = _norm_launch(q_norm, q, "q")
    S_pad = kv.k.shape[1]
    k_desc = v_desc = khi_desc = vlo_desc = kv.k
    k_side = kv.k_hi if nh else kv.k_res  # the hi channels' bf16 K or the residual channels' pairs (exclusive)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        k_desc = TensorDescriptor.from_tensor(kv.k.view(-1, D), [bn, D])
        if nh or nr:
            khi_desc = TensorDescriptor.from_tensor(k_side.view(-1, k_side.shape[-1]), [bn, k_side.shape[-1]])
        v_desc = TensorDescriptor.from_tensor(kv.v.view(-1, S_pad), [D, bn])
        if kv.v_lo is not None:
            vlo_desc = TensorDescriptor.from_tensor(kv.v_lo.view(-1, S_pad), [D, bn])
    vres = kv.v_lo is not None
    # residual_ratio (module docstring, "Residual terms"): two launches over every head, each running the heads of
    # its kind — the one-term kernel those without outlier channels, the residual one the picked heads
    launches = [(0, False, -1), (nr, vres, 1)] if kv.res_heads is not None else [(nr, vres, 0)]
    for n_res, v_res, sel in launches:
        LAST_LAUNCH["kernel"] = _attn_fwd_kernel[(cdiv(S_q, bm), B * H)](
            q, kv.k, kv.k_scale, kv.v, kv.v_scale, out, kv_len if kv_len is not None else kv.k_scale, k_desc, v_desc,
            kv.hi_idx if nh else kv.res_idx if nr else kv.k_scale, k_side if nh or nr else kv.k_scale, khi_desc,
            kv.v_lo if vres else kv.k_scale, vlo_desc, kv.res_heads if sel else kv.k_scale,
            S_q, kv.seq_len, S_pad, H, qk_const, hi_const, *q.stride(), *out.stride(), *norm_args,
            D=D, BLOCK_M=bm, BLOCK_N=bn, QK_INT8=kv.qk == "int8", ROT=kv.rotate, HAS_KVLEN=kv_len is not None,
            TMA=tma, POLY=exp2_poly, NH=nh, NR=n_res, VRES=v_res, PIPE=pipelined, **norm_flags, INTERP=interp,
            SEL=sel, WS=WARP_SPECIALIZE and not pipelined,
            num_warps=warps, num_stages=stages, enable_fp_fusion=False,
        )
    return out


def pv_key_order(n: int, block_n: int) -> torch.Tensor:
    """``[n]`` int64: the key each position of a ``KV8.v`` row of ``n`` (= S_pad) keys holds, for K/V quantized in
    blocks of ``block_n`` — ``kv.v[..., j]`` is key ``pv_key_order(n, block_n)[j]``'s (module docstring, "P·V key
    order"); the identity where ``block_n`` is not a multiple of :data:`PV_GROUP`."""
    idx = torch.arange(n)
    if block_n % PV_GROUP.value or n % PV_GROUP.value:
        return idx
    return idx.reshape(-1, 2, 2, 2, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(n)


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, qk: str = "fp8", rotate: bool = False,
                  smooth: bool = True, sm_scale: float | None = None, kv_len: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, config: tuple[int, int, int, int] | None = None,
                  tma: bool | None = None, exp2_poly: int | None = None, hi_channels: int = 0,
                  pipelined: bool | None = None, q_norm: RowNorm | None = None,
                  k_norm: RowNorm | None = None, residual_channels: int = 0, v_residual: bool = False,
                  residual_ratio: float = 0.0) -> torch.Tensor:
    """``softmax(q kᵀ · sm_scale) v`` in 8 bits: :func:`quantize_kv` then :func:`attention_fp8`.
    Numerics: ``formats.attention_fp8_reference`` with the same arguments — of ``q_norm``/``k_norm`` applied
    to the raw ``q``/``k`` where given (``layernorm.layer_norm_rows``' output, which is never written)."""
    _check_qkv(q, k, v, qk)
    block_n = config[1] if config else None
    kv = quantize_kv(k, v, block_n=block_n, qk=qk, rotate=rotate, smooth=smooth, hi_channels=hi_channels,
                     residual_channels=residual_channels, v_residual=v_residual, residual_ratio=residual_ratio,
                     k_norm=k_norm)
    return attention_fp8(q, kv, sm_scale=sm_scale, kv_len=kv_len, out=out, config=config, tma=tma,
                         exp2_poly=exp2_poly, pipelined=pipelined, q_norm=q_norm)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`fp8_attention` takes these tensors: 4-d ``[B, H, S, D]`` with D in 32, 64, 128 (an
    8-bit wgmma reduces over at least 32), matching batch/heads/head dim, K and V of one length, float dtypes."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    D = q.shape[-1]
    return (D in CONFIGS and k.shape == v.shape and q.shape[:2] == k.shape[:2] and k.shape[-1] == D
            and all(t.dtype in (torch.bfloat16, torch.float16, torch.float32) for t in (q, k, v)))


def _check_qkv(q, k, v, qk):
    if qk not in spec.ATTN_QK_FORMATS:
        raise ValueError(f"qk must be one of {spec.ATTN_QK_FORMATS}, got {qk!r}")
    if not supported(q, k, v):
        raise ValueError(f"8-bit attention: unsupported q/k/v shapes {tuple(q.shape)} / {tuple(k.shape)} / "
                         f"{tuple(v.shape)} or dtypes {q.dtype}/{k.dtype}/{v.dtype} (need [B, H, S, D], D in "
                         f"{sorted(CONFIGS)})")


__all__ = ["KV8", "CONFIGS", "TMA", "POLY", "EXP2_POLY", "EXP2_POLY_MAX_REL_ERR", "HI_CHANNELS", "RESIDUAL_CHANNELS",
           "quantize_kv", "attention_fp8",
           "fp8_attention", "supported", "exp2_tile", "pv_key_order", "PV_GROUP"]
