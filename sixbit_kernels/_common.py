"""Small pieces shared by the kernels: device checks, launch helpers and ``@triton.jit`` building blocks.

Numerics notes that every kernel relies on (see ``sixbit/formats.py`` for the spec):

* An E2M1 code ``c`` (sign bit 3, magnitude bits 0..2) placed as ``(c & 7) << 9 | (c & 8) << 12`` into the
  bits of an IEEE half is exactly ``E2M1[c] * 2**-14`` (magnitude 1 lands in the half's subnormal range,
  which mirrors E2M1's own subnormal). Multiplying that half by ``bs * 2**7`` (``bs`` an e4m3 block scale
  in ``[2**-6, 448]``, so ``bs * 2**7`` in ``[2, 57344]`` is an exact half) gives ``E2M1[c] * bs * 2**-7``
  exactly: at most 6 significant bits, smallest non-zero magnitude ``0.5 * 2**-6 * 2**-7 = 2**-14`` (the
  smallest normal half), largest ``6 * 448 / 128 = 21``. The GEMMs multiply these exact halves on the
  tensor cores (products exact in fp32) and put the missing ``2**7`` and the per-tensor scale into the
  epilogue. (Block scales below ``2**-6`` — e4m3 subnormals — never come out of ``sixbit.formats``,
  which clamps at ``E4M3_TINY``; they would lose bits here.)
* The triton interpreter (``TRITON_INTERPRET=1``, CPU tensors) multiplies bf16 ``tl.dot`` operands as raw
  uint16 bit patterns; :func:`dot` therefore upcasts to fp32 there (bf16/fp16 products are exact in fp32,
  so this is the same function up to the order of the fp32 sums).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True when triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # older triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_launchable(*tensors: torch.Tensor) -> bool:
    """Raise unless the tensors can be handed to a triton kernel; returns whether the interpreter runs it."""
    devs = {t.device.type for t in tensors if t is not None}
    if len(devs) != 1:
        raise ValueError(f"tensors on several device types: {sorted(devs)}")
    dev = devs.pop()
    if dev == "cuda":
        if interpreting():
            return True  # the interpreter also runs on CUDA tensors (copies through the host)
        return False
    if dev == "cpu":
        if not interpreting():
            raise RuntimeError(
                "a triton kernel was asked to run on CPU tensors, which only works in triton's interpreter: "
                "set TRITON_INTERPRET=1 before sixbit_kernels is first imported (or use backend='torch')"
            )
        return True
    raise ValueError(f"triton kernels run on CUDA tensors (or CPU under TRITON_INTERPRET=1), got {dev}")


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host-side grid math (``triton.cdiv`` is a wrapped function, ~6 µs a call in
    triton 3.9; launch wrappers call this several times per linear)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (0 for 0), like ``triton.next_power_of_2``, in plain Python."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def lowbit(n: int) -> int:
    """Largest power of two dividing ``n`` (n > 0)."""
    return n & -n


def chunk_width(k: int, hadamard_block: int = 0) -> int:
    """The K-chunk the activation kernels rotate at once: a power of two dividing K, at most 128, and — with a
    rotation — ``max(64, block)`` when K allows (a 64-wide block-diagonal ±1 matrix keeps the tensor-core
    work per element small; wider chunks only add zero blocks)."""
    bk = min(128, lowbit(k))
    if hadamard_block:
        bk = min(bk, max(64, hadamard_block))
    return bk


_SM_COUNT: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (4 for the interpreter: enough programs to exercise loops)."""
    if device.type != "cuda" or interpreting():
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


# ------------------------------------------------------------------------------------ jit helpers


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of this program in the grouped order of a 1-d GEMM grid: ``GROUP_M`` row tiles walk
    the N tiles together, so the weight tiles they share stay in L2."""
    return tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)


@triton.jit
def tile_coords(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of output tile number ``tile`` in :func:`grouped_tile`'s order (persistent loops)."""
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + ((tile % group) % gsize), (tile % group) // gsize


@triton.jit
def dot(a, b, INTERP: tl.constexpr):
    """fp32-accumulating dot; exact fp32 products for fp32 operands; interpreter-safe for bf16."""
    if INTERP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def hadamard_blockdiag(BK: tl.constexpr, HB: tl.constexpr, dtype: tl.constexpr):
    """``[BK, BK]`` block-diagonal matrix of ``BK // HB`` unnormalised Sylvester-Hadamard blocks (±1, 0).

    Entry ``(i, j)`` of ``H_HB`` is ``(-1) ** popcount(i & j)``: the recursive ``[[H, H], [H, -H]]``.
    """
    i = tl.arange(0, BK)[:, None]
    j = tl.arange(0, BK)[None, :]
    v = i & j & (HB - 1)
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    sign = 1 - 2 * (v & 1)
    same = (i // HB) == (j // HB)
    return tl.where(same, sign, 0).to(tl.float32).to(dtype)  # via fp32: the interpreter mis-converts int→bf16


@triton.jit
def make_h(xdtype: tl.constexpr, BK: tl.constexpr, HB: tl.constexpr):
    """The ±1 block-diagonal rotation matrix for activations of dtype ``xdtype`` (a dummy when HB == 0)."""
    if HB == 0:
        return 0
    elif xdtype == tl.float32:
        return hadamard_blockdiag(BK, HB, tl.float32)
    else:
        return hadamard_blockdiag(BK, HB, xdtype)


@triton.jit
def rotate(x, h, HB: tl.constexpr, INV_SQRT: tl.constexpr, INTERP: tl.constexpr):
    """Block-Hadamard rotation of a ``[R, BK]`` tile along its last dim (fp32 result); ``h`` from make_h.

    ``x @ blockdiag(±1)`` on the tensor cores (exact ±1 operands, fp32 accumulation), then one multiply by
    ``fp32(1/sqrt(HB))``. The reference computes ``x @ (H / sqrt(HB))``; for HB = 16, 64 the factor is a
    power of two and both are the same exact sum when no partial sum rounds; otherwise they can differ in
    the last bit of fp32 (documented: rare ±1 code steps at rounding ties).
    """
    if HB == 0:
        return x.to(tl.float32)
    else:
        return dot(x, h, INTERP) * INV_SQRT


@triton.jit
def absbits(v):
    """|v| as int32 bit patterns: a max over them is an exact amax that propagates NaN (> inf)."""
    return v.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def int8_row_scale(amax_bits):
    """Per-row symmetric INT8 from a row amax given as :func:`absbits` patterns: ``(inv, scale)`` with codes
    ``rne(x · inv)`` and ``scale = amax / 127`` (``formats.quantize_int8``: amax 0 → scale 1; a non-finite
    amax → NaN scale). The spec's ``127 / amax`` is torch's ``amax.reciprocal() * 127`` (Tensor.__rtruediv__)."""
    amax = amax_bits.to(tl.float32, bitcast=True)
    amax_safe = tl.where(amax == 0.0, 127.0, amax)
    inv = tl.math.div_rn(tl.full(amax_safe.shape, 1.0, tl.float32), amax_safe) * 127.0
    scale = tl.where(amax_bits < 0x7F800000, tl.math.div_rn(amax_safe, 127.0), float("nan"))
    return inv, scale


@triton.jit
def e4m3_round(v):
    """fp32 ``v`` in [2**-6, 448] (or NaN) → (e4m3 byte as int32, the e4m3 value as fp32); RNE.

    The clamp in the NVFP4 spec keeps ``v`` in e4m3's normal range, so rounding the fp32 mantissa to 3
    bits (round to nearest, ties to even) is the conversion.
    """
    bits = v.to(tl.int32, bitcast=True)
    r = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # & ~0xFFFFF
    byte = (((r >> 23) & 0xFF) - 120) << 3 | ((r >> 20) & 7)
    isnan = v != v
    byte = tl.where(isnan, 0x7F, byte)
    val = tl.where(isnan, v, r.to(tl.float32, bitcast=True))
    return byte, val


@triton.jit
def e4m3_to_f32(u):
    """e4m3 bytes (uint8/int tensor) → fp32 values (normals, subnormals, NaN)."""
    b = u.to(tl.int32) & 0xFF
    e = (b >> 3) & 0xF
    m = b & 7
    normal = (((b & 0x80) << 24) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125  # 2**-9
    sub = tl.where((b & 0x80) != 0, -sub, sub)
    val = tl.where(e == 0, sub, normal)
    return tl.where((b & 0x7F) == 0x7F, float("nan"), val)


@triton.jit
def e2m1_encode(v):
    """fp32 values (already divided by the block scale) → E2M1 codes 0..15, round to nearest, ties to the
    even code, saturating at ±6 — ``formats.e2m1_encode`` without its seven threshold compares.

    |v| < 1 is E2M1's subnormal range with step 0.5: ``rne(2|v|)`` is the code (0, 1 or 2 = 1.0). |v| ≥ 1
    rounds the fp32 mantissa to one bit (ties to even, i.e. to the even code) and reads exponent and that
    bit as the code, ``((bits >> 22) & 0x1FF) - 252``, saturated at 7. The sign comes from the sign bit,
    so -0.0 and tiny negatives give code 8 like the reference. Codes of NaN inputs are unspecified (their
    block scale is NaN)."""
    bits = v.to(tl.int32, bitcast=True)
    a = tl.abs(v)
    ab = bits & 0x7FFFFFFF
    rb = ab + 0x1FFFFF + ((ab >> 22) & 1)
    normal = tl.minimum((rb >> 22) - 252, 7)
    sub = rne_int(a * 2.0).to(tl.int32)
    mag = tl.where(a < 1.0, sub, normal)
    return mag | ((bits >> 28) & 8)


@triton.jit
def e2m1_half(c):
    """int16/int32 E2M1 codes → halves equal to ``E2M1[c] * 2**-14`` (exact; see module docstring)."""
    bits = ((c & 7) << 9) | ((c & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


# Four packed bytes (8 codes) → four half2 registers with 5 integer ops per register: bytes 0,1 (2,3) are
# spread to byte positions 0 and 2 with one prmt; ``(t << 9) & 0x0E000E00 | (t << 12) & 0x80008000`` then
# places the low nibbles' magnitude and sign bits of both bytes into two halves at once (high nibbles:
# shifts 5 and 8). Outputs: the low-nibble codes of the 4 bytes, then the high-nibble codes.
_DECODE_ASM = tl.constexpr("""
{
.reg .b32 t0, t1, a, b;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
shl.b32 a, t0, 9;
shl.b32 b, t0, 12;
and.b32 a, a, 0x0E000E00;
and.b32 b, b, 0x80008000;
or.b32 $0, a, b;
shl.b32 a, t1, 9;
shl.b32 b, t1, 12;
and.b32 a, a, 0x0E000E00;
and.b32 b, b, 0x80008000;
or.b32 $1, a, b;
shl.b32 a, t0, 5;
shl.b32 b, t0, 8;
and.b32 a, a, 0x0E000E00;
and.b32 b, b, 0x80008000;
or.b32 $2, a, b;
shl.b32 a, t1, 5;
shl.b32 b, t1, 8;
and.b32 a, a, 0x0E000E00;
and.b32 b, b, 0x80008000;
or.b32 $3, a, b;
}
""")


@triton.jit
def decode_nvfp4(packed, scales, R: tl.constexpr, BK: tl.constexpr, OUT: tl.constexpr, PTX: tl.constexpr):
    """Decode an NVFP4 tile: ``packed`` uint8 ``[R, BK//2]``, ``scales`` uint8 (e4m3 bits) ``[R, BK//16]``
    → ``[R, BK]`` of dtype OUT (fp16 or bf16) holding ``E2M1 * bs * 2**-7`` exactly.

    With ``PTX`` (CUDA, capability >= 8.9: ``targets.Target.ptx_decode``) the bit placement runs as inline
    PTX on whole 32-bit registers (8 codes at a time; plain integer PTX, any sm) and the scales use the
    native e4m3x2 → f16x2 conversion (sm_89+); otherwise (sm_80/86, and always in the interpreter, which
    cannot run PTX) the same placement is done element by element — same bits."""
    if not PTX:
        p = packed.to(tl.int16)
        lo = e2m1_half(p & 0xF)
        hi = e2m1_half((p >> 4) & 0xF)
    else:
        lo, hi = tl.inline_asm_elementwise(
            _DECODE_ASM, "=r,=r,=r,=r,r", [packed], dtype=(tl.float16, tl.float16), is_pure=True, pack=4
        )
    v = tl.reshape(tl.join(lo, hi), (R, BK))
    if not PTX:
        s = (e4m3_to_f32(scales) * 128.0).to(tl.float16)
    else:  # native e4m3x2 → f16x2 conversion (sm_89+); * 128 is exact in fp16 (448 * 128 < 65504)
        s = scales.to(tl.float8e4nv, bitcast=True).to(tl.float16) * 128.0
    v = tl.reshape(tl.reshape(v, (R, BK // 16, 16)) * s[:, :, None], (R, BK))
    return v.to(OUT)


@triton.jit
def rne_int(v):
    """Round-half-to-even of fp32 ``|v| < 2**22`` (NaN stays NaN). Kernels using it are launched with
    ``enable_fp_fusion=False`` so that no multiply feeding ``v`` is contracted into the add."""
    return (v + 12582912.0) - 12582912.0


@triton.jit
def cast_out(v, dtype: tl.constexpr, INTERP: tl.constexpr):
    """fp32 → output dtype, round to nearest even. The interpreter truncates fp32 → bf16, so there the
    rounding is done on the bit pattern (the GPU's ``cvt.rn`` gives the same result)."""
    if INTERP and dtype == tl.bfloat16:
        bits = v.to(tl.int32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        return v.to(dtype)


#: √(2/π) and the cubic coefficient of PyTorch's tanh-GELU (``kBeta = M_SQRT2 * M_2_SQRTPI * 0.5``)
GELU_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
GELU_KAPPA = 0.044715
_BETA = tl.constexpr(GELU_BETA)  # what a jit function may read of a module global
_KAPPA = tl.constexpr(GELU_KAPPA)


@triton.jit
def gelu_tanh(x, BETA: tl.constexpr, KAPPA: tl.constexpr):
    """fp32 tanh-GELU ``0.5·x·(1 + tanh(u))``, ``u = β·(x + κ·x³)``, as ``x / (1 + e^{−2u})`` (the same function:
    ``(1 + tanh u)/2 = σ(2u)``): one exp (MUFU) and one fast division (``div.full.f32``, ~2 ulp) per element,
    so it costs little in a GEMM's epilogue. Tails: ``x → −∞`` gives −0 (``x / inf``; ``−inf`` itself gives
    NaN, as PyTorch's), ``+∞`` gives ``+∞``, NaN stays NaN. Against PyTorch's ``tanhf`` form, values agree to a
    few fp32 ulps (an ulp of a 16-bit dtype only where a value lies at a rounding boundary); in the negative
    tail PyTorch's ``1 + tanh u`` keeps only fp32's absolute precision, and this form is the more accurate."""
    inner = BETA * (x + KAPPA * (x * x * x))
    return tl.fdiv(x, 1.0 + tl.exp(-2.0 * inner), ieee_rounding=False)


@triton.jit
def store_value(y, dtype: tl.constexpr, ACT: tl.constexpr, INTERP: tl.constexpr):
    """An epilogue's fp32 ``y`` as stored: rounded to ``dtype``, and with ``ACT`` = 1 the tanh-GELU of that
    rounded value, rounded again — what ``F.gelu(linear(x), approximate="tanh")`` computes, the linear's
    output being a ``dtype`` tensor (PyTorch's GELU of a 16-bit tensor runs in fp32)."""
    r = cast_out(y, dtype, INTERP)
    if ACT == 1:
        r = cast_out(gelu_tanh(r.to(tl.float32), _BETA, _KAPPA), dtype, INTERP)
    return r
