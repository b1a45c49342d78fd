"""The numerics spec of sixbit, in plain torch: the single source of truth for every kernel.

Everything here runs on CPU and GPU tensors alike and favours clarity over speed. The Triton kernels in
``sixbit_kernels/`` are tested against these functions (bit-exact for quantization, fp32-accumulation tolerance
for GEMMs); the CPU path of the engine calls them directly.

NVFP4 (as NVIDIA ModelOpt and torchao define it)
------------------------------------------------
* Element format E2M1: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}; code = sign bit (bit 3) | magnitude index.
* Blocks of 16 consecutive elements along the last (reduction, K) dimension.
* One per-tensor fp32 scale in *decode* form: ``s = amax / (6 * 448)`` (``nvfp4_tensor_scale``).
* One float8_e4m3fn scale per block: ``bs = e4m3(clamp(amax_blk / 6 / s, tiny_e4m3, 448))``.
* Codes: ``x * ((1 / s) / float(bs))``, clamped to ±6, rounded to nearest E2M1 value, ties to the even
  code (the one whose mantissa bit is 0). Dequantized value = ``E2M1[code] * float(bs) * s``.
* Packing: two codes per byte, element ``2i`` in the low nibble, ``2i+1`` in the high nibble.
* Size: K/2 bytes of codes + K/16 bytes of block scales per row + 4 bytes = 4.5 bits/element + 4 B.

These operations reproduce torchao's ``nvfp4_quantize`` bit for bit (tests/test_formats.py checks it),
including the order of floating-point operations in the code scaling, with one deliberate exception: an
all-zero tensor (tensor scale 0) gets tensor scale 1 and all-zero codes, where torchao divides by zero.

INT8
----
Symmetric, round-half-to-even, saturating at ±127 (-128 is never produced):
* activations per token (row):          ``scale = amax_row / 127``
* weights per output channel (row of W): ``scale = amax_row / 127``
Codes are ``round_half_even(x * (127 / amax))`` clamped to [-127, 127]; an all-zero row has amax 0 and is
given scale 1.0 (codes 0), so dequantization is exact there.

Block Hadamard
--------------
``H_b`` is the orthonormal Sylvester-Hadamard matrix of size b (b a power of two, 16 … 128 in practice),
symmetric, so ``H_b @ H_b = I``. ``block_hadamard(x, b)`` rotates every consecutive group of b elements
along the last dimension: ``x.view(..., K/b, b) @ H_b``. ``fold_hadamard(w, b)`` applies the same rotation
to the rows of a weight ``W [N, K]``; then ``block_hadamard(x) @ fold_hadamard(W).T == x @ W.T`` up to
rounding (exactly in exact arithmetic). The activation rotation runs online; the weight rotation once,
offline, before the weight is quantized.

Outlier ratio (the statistic of the Purified Delta Refresh)
-----------------------------------------------------------
For an activation tensor viewed as tokens × channels ``[M, K]``, element ``x[m, k]`` is an *outlier* if
``|x[m, k]| > k_sigma * rms(x[m, :])`` with ``rms`` the root-mean-square over the token's K channels.
``outlier_ratio = #outliers / (M * K)``. It is measured on the block input before any rotation, and it is
returned as a tensor (count and total are additive, so it can be all-reduced across ranks under context
parallelism before a decision is taken). The default ``k_sigma = 8``: a Gaussian token has essentially no
element beyond 8 RMS, while the persistent outlier channels of DiT activations routinely exceed it.

Non-finite values
-----------------
The quantizers raise :class:`NonFiniteError` (a ``ValueError``) on NaN/Inf input when ``check_finite`` is
true (the default here). With ``check_finite=False`` — the behaviour the GPU kernels implement, since a
check would cost a host sync per call — the documented result is: the scale of every block/row that holds
a non-finite value is NaN, so that whole block/row dequantizes to NaN. For NVFP4 with the per-tensor scale
taken from the tensor itself, one non-finite value makes that scale non-finite and the *whole tensor*
dequantizes to NaN. Never a silent finite value.

Routes
------
``route`` names how a linear layer computes: ``"nvfp4"`` (W4A4), ``"int8"`` (W4A8: NVFP4 weights, INT8
activations), ``"w8a8"`` (INT8 weights and activations; the Hopper int8 tensor-core path), ``"w4a8_requant"`` (W4A8 on the
int8 tensor cores: the NVFP4 weight re-quantized to per-channel INT8, :func:`requantize_int8`), ``"w4a16"`` (activations unquantized,
times the dequantized NVFP4 weights: the full-precision-activation route of a layer that no longer holds
its original weights), ``"fp16"`` (the plain layer: activations times the original weights).
``reference_linear`` defines each one's numerics; their names, bits and letters are the table in
``sixbit.routes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sixbit.routes import ROUTES, WEIGHT_FORMAT

__all__ = [
    "E2M1_VALUES",
    "FP4_BLOCK",
    "E4M3_MAX",
    "E4M3_TINY",
    "F4_MAX",
    "INT8_MAX",
    "OUTLIER_K",
    "NonFiniteError",
    "NVFP4Tensor",
    "Int8Tensor",
    "e2m1_encode",
    "e2m1_decode",
    "pack_fp4",
    "unpack_fp4",
    "nvfp4_tensor_scale",
    "quantize_nvfp4",
    "fake_quantize_nvfp4",
    "e2m1_round",
    "dequantize_nvfp4",
    "quantize_int8",
    "dequantize_int8",
    "requantize_int8",
    "hadamard_matrix",
    "block_hadamard",
    "fold_hadamard",
    "check_hadamard_block",
    "outlier_count",
    "outlier_ratio",
    "relative_error",
    "quantize_weight",
    "reference_linear",
]

FP4_BLOCK = 16
F4_MAX = 6.0
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
E4M3_TINY = float(torch.finfo(torch.float8_e4m3fn).tiny)  # 2**-6
INT8_MAX = 127
OUTLIER_K = 8.0

#: E2M1 magnitudes indexed by the 3-bit magnitude code.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# Rounding thresholds between consecutive magnitudes, and whether a tie rounds up: a tie goes to the
# even code, i.e. up exactly when the lower code is odd.
_E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


class NonFiniteError(ValueError):
    """Raised when a tensor to be quantized holds NaN or Inf (and ``check_finite`` is on)."""


def _check_finite(x: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(x).all()):
        n = int((~torch.isfinite(x)).sum())
        raise NonFiniteError(f"{what}: input holds {n} non-finite value(s) (NaN/Inf); refusing to quantize")


# ---------------------------------------------------------------------------------------------- E2M1


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values already scaled into [-6, 6] (larger magnitudes saturate) → uint8 codes 0..15.

    Round to nearest, ties to even; the sign bit is taken from the float's sign (so -0.0 and small
    negatives that round to zero give code 8, "negative zero", as torchao does). NaN encodes as 0x7/0xF
    is *not* promised: callers must not pass NaN (see the module docstring).
    """
    x = x.float()
    a = x.abs()
    mag = torch.zeros_like(a, dtype=torch.uint8)
    for thr, tie_up in _E2M1_THRESHOLDS:
        mag += (a >= thr if tie_up else a > thr).to(torch.uint8)
    sign = torch.signbit(x).to(torch.uint8) << 3
    return mag | sign


def e2m1_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 values → the nearest E2M1 value as fp32: ``e2m1_decode(e2m1_encode(x))`` bit for bit (sign of
    zero included) for every non-NaN input, in a few elementwise passes instead of codes and a table. The
    grid step is 0.5 below 2, 1 below 4, 2 up to 6, so ``round(|x| / step) * step`` with round-half-even
    lands on the even code at every tie."""
    a = x.float().abs().clamp(max=F4_MAX)
    step = (a >= 2).float() * 0.5 + (a >= 4).float() + 0.5
    return torch.copysign(torch.round(a / step) * step, x.float())


def e2m1_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 codes 0..15 → values (exact in any float dtype)."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=codes.device)
    return lut[codes.long()].to(dtype)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (K even) → [..., K/2] bytes; element 2i low nibble, 2i+1 high nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4: last dimension must be even, got {codes.shape[-1]}")
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes → [..., K] uint8 codes (inverse of :func:`pack_fp4`)."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


# --------------------------------------------------------------------------------------------- NVFP4


@dataclass
class NVFP4Tensor:
    """A packed NVFP4 tensor of logical shape ``[..., K]``.

    ``data``: uint8 ``[..., K/2]`` packed codes; ``scales``: float8_e4m3fn ``[..., K/16]`` block scales;
    ``tensor_scale``: fp32 scalar (decode form). ``orig_dtype``: dtype that :meth:`dequantize` returns.
    """

    data: torch.Tensor
    scales: torch.Tensor
    tensor_scale: torch.Tensor
    orig_dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.data.shape[:-1], self.data.shape[-1] * 2))

    @property
    def nbytes(self) -> int:
        """Bytes actually held: packed codes + block scales + the fp32 tensor scale."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales, self.tensor_scale))

    @property
    def bits_per_element(self) -> float:
        return 8.0 * self.nbytes / math.prod(self.shape)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_nvfp4(self, dtype or self.orig_dtype)

    def to(self, device) -> NVFP4Tensor:
        return NVFP4Tensor(self.data.to(device), self.scales.to(device), self.tensor_scale.to(device), self.orig_dtype)


def nvfp4_tensor_scale(x: torch.Tensor, reduce_amax=None) -> torch.Tensor:
    """Per-tensor decode scale ``amax / (448 * 6)`` as a 0-d fp32 tensor (no host sync). ``reduce_amax``:
    ``fn(bits)`` that MAX-reduces, in place, the amax's int32 bit pattern (a 1-element tensor) over the
    ranks that share ``x`` (``sixbit.parallel``: each rank holds a slice of the tokens)."""
    amax = x.detach().abs().amax().float()
    if reduce_amax is not None:
        reduce_amax(amax.reshape(1).view(torch.int32))  # a view: the reduce writes amax
    return amax / (E4M3_MAX * F4_MAX)


def quantize_nvfp4(
    x: torch.Tensor, tensor_scale: torch.Tensor | None = None, *, check_finite: bool = True
) -> NVFP4Tensor:
    """Quantize ``x [..., K]`` (K divisible by 16) to NVFP4. ``tensor_scale`` defaults to
    :func:`nvfp4_tensor_scale` of ``x``. An all-zero tensor gets tensor scale 0 → see below."""
    scaled, bs8, s = _nvfp4_scaled(x, tensor_scale, check_finite, "quantize_nvfp4")
    return NVFP4Tensor(pack_fp4(e2m1_encode(scaled).reshape(x.shape)), bs8, s.clone(), x.dtype)


def fake_quantize_nvfp4(x: torch.Tensor, tensor_scale: torch.Tensor | None = None, *,
                        check_finite: bool = True) -> torch.Tensor:
    """``quantize_nvfp4(x, tensor_scale).dequantize(torch.float32)``, bit for bit, without packing codes:
    what the CPU reference path multiplies (simulated quantization)."""
    scaled, bs8, s = _nvfp4_scaled(x, tensor_scale, check_finite, "fake_quantize_nvfp4")
    return (e2m1_round(scaled) * (bs8.float() * s).unsqueeze(-1)).reshape(x.shape)


def _nvfp4_scaled(x: torch.Tensor, tensor_scale, check_finite: bool, what: str):
    """The steps of :func:`quantize_nvfp4` before rounding: (``x`` scaled into ±6 per block
    ``[..., K/16, 16]``, block scales e4m3 (NaN for non-finite blocks when unchecked), tensor scale)."""
    if x.shape[-1] % FP4_BLOCK:
        raise ValueError(f"{what}: last dimension {x.shape[-1]} is not a multiple of {FP4_BLOCK}")
    if check_finite:
        _check_finite(x, what)
    if tensor_scale is None:
        tensor_scale = nvfp4_tensor_scale(x)
    s = tensor_scale.float().reshape(())
    # An all-zero tensor has s == 0; any positive scale encodes it exactly (all codes 0). Keep s finite.
    s = torch.where(s == 0, torch.ones_like(s), s)
    xb = x.float().reshape(*x.shape[:-1], -1, FP4_BLOCK)
    amax_blk = xb.abs().amax(dim=-1)
    block_scale = (amax_blk / F4_MAX) / s
    bs8 = block_scale.clamp(min=E4M3_TINY, max=E4M3_MAX).to(torch.float8_e4m3fn)
    # non-finite blocks: clamp() maps NaN to NaN (kept), +inf to 448; make inf blocks NaN explicitly
    bs32 = bs8.float()
    recip = (1.0 / s) / bs32
    scaled = (xb * recip.unsqueeze(-1)).clamp(-F4_MAX, F4_MAX)
    if not check_finite:
        bad = ~torch.isfinite(amax_blk)
        if bool(bad.any()):
            bs8 = torch.where(bad, torch.full_like(bs32, float("nan")), bs32).to(torch.float8_e4m3fn)
    return scaled, bs8, s


def dequantize_nvfp4(t: NVFP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    vals = e2m1_decode(unpack_fp4(t.data)).reshape(*t.scales.shape, FP4_BLOCK)
    out = vals * (t.scales.float() * t.tensor_scale.float()).unsqueeze(-1)
    return out.reshape(t.shape).to(dtype)


# ---------------------------------------------------------------------------------------------- INT8


@dataclass
class Int8Tensor:
    """Symmetric INT8 rows: ``data`` int8 ``[..., K]``, ``scale`` fp32 ``[..., 1]`` (one per row)."""

    data: torch.Tensor
    scale: torch.Tensor
    orig_dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_int8(self, dtype or self.orig_dtype)

    def to(self, device) -> Int8Tensor:
        return Int8Tensor(self.data.to(device), self.scale.to(device), self.orig_dtype)


def quantize_int8(x: torch.Tensor, *, check_finite: bool = True) -> Int8Tensor:
    """Per-row (per token for activations, per output channel for weights ``W [N, K]``) symmetric INT8."""
    if check_finite:
        _check_finite(x, "quantize_int8")
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    zero = amax == 0
    amax_safe = torch.where(zero, torch.full_like(amax, float(INT8_MAX)), amax)
    inv = INT8_MAX / amax_safe
    q = torch.round(xf * inv).clamp(-INT8_MAX, INT8_MAX)
    q = torch.nan_to_num(q, nan=0.0).to(torch.int8)  # non-finite rows: codes are meaningless, scale is not
    scale = amax_safe / INT8_MAX
    if not check_finite:
        scale = torch.where(torch.isfinite(amax), scale, torch.full_like(scale, float("nan")))
    return Int8Tensor(q, scale, x.dtype)


def dequantize_int8(t: Int8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (t.data.float() * t.scale.float()).to(dtype)


def requantize_int8(t: NVFP4Tensor) -> Int8Tensor:
    """An NVFP4 weight ``[N, K]`` as per-output-channel INT8: the weight the ``w4a8_requant`` route multiplies.

    ``u = E2M1 · bs`` (exact in fp32: ≤ 6 significant bits; the tensor scale left out), codes =
    :func:`quantize_int8`'s codes of ``u`` per row, scale = ``(amax_row(u) / 127) · s``. A row holding a NaN
    block scale gets a NaN scale and zero codes, as :func:`quantize_int8` unchecked. The extra rounding error is
    at most half an INT8 step of the row's largest magnitude (``6 · bs_max / 254``), below NVFP4's own largest
    rounding error in the finest band (a quarter of the block scale) in every block whose scale is above
    ~1/10 of the row's largest."""
    u = e2m1_decode(unpack_fp4(t.data)).reshape(*t.scales.shape, FP4_BLOCK) * t.scales.float().unsqueeze(-1)
    q = quantize_int8(u.reshape(t.shape), check_finite=False)
    return Int8Tensor(q.data, q.scale * t.tensor_scale.float().reshape(()), t.orig_dtype)


# ------------------------------------------------------------------------------------------ Hadamard


def check_hadamard_block(k: int, block: int) -> None:
    """Raise ``ValueError`` unless ``block`` is a power of two ≥ 2 that divides ``k``."""
    if block < 2 or block & (block - 1):
        raise ValueError(f"Hadamard block size must be a power of two >= 2, got {block}")
    if k % block:
        raise ValueError(f"Hadamard block size {block} does not divide the reduction dimension {k}")


_H_CACHE: dict[tuple[int, torch.dtype, str], torch.Tensor] = {}


def hadamard_matrix(n: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Orthonormal Sylvester-Hadamard matrix of size ``n`` (power of two); symmetric, ``H @ H = I``."""
    check_hadamard_block(n, n)
    key = (n, dtype, str(device))
    if key not in _H_CACHE:
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        _H_CACHE[key] = (h / math.sqrt(n)).to(dtype=dtype, device=device)
    return _H_CACHE[key]


def block_hadamard(x: torch.Tensor, block: int) -> torch.Tensor:
    """Rotate each consecutive group of ``block`` elements of the last dim by ``H_block`` (fp32 math,
    result in fp32)."""
    k = x.shape[-1]
    check_hadamard_block(k, block)
    h = hadamard_matrix(block, torch.float32, x.device)
    return (x.float().reshape(*x.shape[:-1], k // block, block) @ h).reshape(x.shape)


def fold_hadamard(w: torch.Tensor, block: int) -> torch.Tensor:
    """Weight ``W [N, K]`` → ``W·H`` (per K-block), so that ``block_hadamard(x) @ fold_hadamard(W).T = x @ W.T``.
    Returned in fp32 (rotate before quantizing)."""
    return block_hadamard(w, block)


# --------------------------------------------------------------------------------- outlier statistic


#: rows of an activation are counted in chunks of about this many elements: the fp32 temporaries stay
#: ~64 MB instead of several times the activation (CogVideoX-2B's FF input is 0.5 GB in bf16)
OUTLIER_CHUNK_ELEMS = 1 << 24


def outlier_count(x: torch.Tensor, k_sigma: float = OUTLIER_K) -> tuple[torch.Tensor, int]:
    """(number of outliers as an int64 0-d tensor, number of elements). See the module docstring.
    Tokens are independent, so the count runs over chunks of rows (no host sync)."""
    x2 = x.detach().reshape(-1, x.shape[-1])
    rows = max(1, OUTLIER_CHUNK_ELEMS // max(1, x2.shape[1]))
    count = torch.zeros((), dtype=torch.int64, device=x.device)
    for i in range(0, x2.shape[0], rows):
        xf = x2[i:i + rows].float()
        rms = xf.pow(2).mean(dim=-1, keepdim=True).sqrt()
        count += (xf.abs() > k_sigma * rms).sum()
    return count, x2.numel()


def outlier_ratio(x: torch.Tensor, k_sigma: float = OUTLIER_K) -> torch.Tensor:
    """Fraction of elements with ``|x| > k_sigma · rms(token)`` as an fp32 0-d tensor (no host sync)."""
    count, n = outlier_count(x, k_sigma)
    return count.float() / max(n, 1)


def relative_error(y_q: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``‖y_q − y‖_F / ‖y‖_F`` in fp32 (0-d tensor); 0 when both are zero, inf when only ``y`` is."""
    num = (y_q.float() - y.float()).norm()
    den = y.float().norm()
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(torch.float32).tiny), torch.where(num > 0, torch.inf, 0.0))


# ------------------------------------------------------------------------------- reference linear


def quantize_weight(w: torch.Tensor, fmt: str, hadamard_block: int | None = None):
    """Offline weight preparation: fold the Hadamard rotation (if any), then quantize.
    ``fmt``: ``"nvfp4"`` → :class:`NVFP4Tensor`, ``"int8"`` → per-output-channel :class:`Int8Tensor`."""
    wr = fold_hadamard(w, hadamard_block) if hadamard_block else w.float()
    if fmt == "nvfp4":
        return quantize_nvfp4(wr)
    if fmt == "int8":
        return quantize_int8(wr)
    raise ValueError(f"unknown weight format {fmt!r} (expected 'nvfp4' or 'int8')")


def reference_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    route: str,
    hadamard_block: int | None = None,
    *,
    check_finite: bool = False,
) -> torch.Tensor:
    """What a quantized linear computes on ``route`` (fake-quant, fp32 accumulation, output in x.dtype).

    ``weight`` is the original high-precision ``W [N, K]``. ``"fp16"`` is the plain ``F.linear`` in the
    activation dtype. The quantized routes rotate activations and weights by the block Hadamard (when
    ``hadamard_block`` is given), quantize both (weights NVFP4 for ``nvfp4``/``int8``, INT8 per channel
    for ``w8a8``, NVFP4 then :func:`requantize_int8` for ``w4a8_requant``; activations NVFP4 with a per-tensor
    scale for ``nvfp4``, per-token INT8 for ``int8``, ``w8a8`` and ``w4a8_requant``, left unquantized for
    ``w4a16``), and multiply the dequantized values in fp32.
    """
    if route == "fp16":
        return torch.nn.functional.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; expected one of {ROUTES}")
    xr = block_hadamard(x, hadamard_block) if hadamard_block else x.float()
    wq = quantize_weight(weight, WEIGHT_FORMAT[route], hadamard_block)
    if route == "w4a8_requant":
        wq = requantize_int8(wq)
    if route == "w4a16":
        xq = xr
    elif route == "nvfp4":
        xq = quantize_nvfp4(xr, check_finite=check_finite).dequantize(torch.float32)
    else:
        xq = quantize_int8(xr, check_finite=check_finite).dequantize(torch.float32)
    y = xq @ wq.dequantize(torch.float32).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# ================================================================================================
# 8-bit attention (sixbit_kernels/attention_fp8.py): the exact quantized numerics
# ================================================================================================
#
# softmax(Q Kᵀ · sm_scale) V with both products on 8-bit operands, per (batch, head):
#
# * Statistics (attention_kv_stats): μ = mean of K over tokens (fp32; 0 without smoothing) and the
#   per-channel amax of V. A head whose μ or V amax is non-finite gets NaN V amaxes (whole head NaN).
# * K: K − μ (softmax is invariant to a vector added to every key), optionally rotated by the ±1
#   Sylvester-Hadamard matrix R (``rotate``), zero-padded to a multiple of ``block_n`` tokens; one scale
#   per block of ``block_n`` tokens: scale = amax/QMAX, codes = cast(x · (QMAX/amax)) (IEEE division;
#   amax 0 → scale 1; a non-finite amax → NaN scale). QMAX = 448 with cast = e4m3 RNE saturating
#   (``qk="fp8"``) or 127 with cast = round-half-even (``qk="int8"``).
# * Q: the same per token (row), rotated by R when ``rotate``; c = q_scale · (sm_scale·log2 e / (D if
#   rotate else 1)) per row, the constant rounded to fp32 first.
# * V: per channel, scale = amax/448, codes = e4m3(v · (448/amax)).
# * Online softmax over the key blocks j (keys ≥ kv_len masked to −inf), fp32 throughout:
#   S = Q8·K8ⱼᵀ, cks = c·k_scaleⱼ, m' = max(m, rowmax(S)·cks), α = exp2(m − m'),
#   p = exp2(S·cks + (8 − m')) — P·2⁸ —, l = l·α + Σ p (before rounding), O = O·α + e4m3(p)·V8ⱼ.
# * out = O / l · v_scale (per channel).
#
# Kernel vs reference: the statistics' V amax is bit-exact and the K mean equal to fp32 rounding (its sum
# runs in another order); given the kernel's statistics the quantization pass is bit-exact without
# rotation (rotation: sums of D terms in another order, rare one-step code flips); the attention agrees
# to fp32 rounding of its sums (a P8 code can flip where exp2 lands on a rounding tie).

#: P in [0, 1] is stored as e4m3(p · ATTN_P_SCALE) (the kernel adds log2 of it to the exponent)
ATTN_P_LOG2 = 8
ATTN_P_SCALE = 2.0**ATTN_P_LOG2
ATTN_QK_FORMATS = ("fp8", "int8")
_ATTN_QMAX = {"fp8": E4M3_MAX, "int8": float(INT8_MAX)}
_LOG2E = 1.4426950408889634


def attention_rotation(d: int, device=None) -> torch.Tensor:
    """The ±1 Sylvester-Hadamard matrix of size ``d`` (``R Rᵀ = d·I``) that ``rotate`` applies to Q and K."""
    return torch.round(hadamard_matrix(d, torch.float64) * math.sqrt(d)).to(torch.float32).to(device)


def attention_kv_stats(k: torch.Tensor, v: torch.Tensor, *, smooth: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(K mean over tokens ``[B, H, D]`` fp32 — zeros without ``smooth`` —, V channel amax ``[B, H, D]``
    fp32, NaN for every channel of a head with a non-finite value in K's mean or V). No host sync. The amax is
    the ∞-norm reduction — max |v| exactly, NaN carried — which reads V once and writes no |V| copy (``v.abs()``
    materialised one: 5.5 ms of a computed 2B step on the H200, ``step_profile_h200_2b_s21.md``)."""
    vamax = torch.linalg.vector_norm(v, float("inf"), dim=2).float()
    if smooth:
        mean = torch.mean(k, dim=2, dtype=torch.float32)
        bad = ~(torch.isfinite(mean).all(-1, keepdim=True) & torch.isfinite(vamax).all(-1, keepdim=True))
    else:
        mean = torch.zeros(vamax.shape, dtype=torch.float32, device=k.device)
        bad = ~torch.isfinite(vamax).all(-1, keepdim=True)
    return mean.contiguous(), torch.where(bad, torch.full_like(vamax, float("nan")), vamax).contiguous()


def attention_scale(amax: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(QMAX/amax, amax/QMAX) as IEEE fp32 divisions of two tensors (PyTorch computes ``c / x`` as
    ``c · (1/x)`` and, on CUDA, ``x / c`` as ``x · (1/c)``); amax 0 → 1; non-finite → (0, NaN)."""
    qmax = torch.full_like(amax, _ATTN_QMAX[fmt])
    safe = torch.where(amax == 0, qmax, amax)
    finite = torch.isfinite(amax)
    return (torch.where(finite, qmax / safe, torch.zeros_like(safe)),
            torch.where(finite, safe / qmax, torch.full_like(safe, float("nan"))))


def _attn_cast(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Values on the 8-bit grid, as fp32 (NaN stays NaN)."""
    if fmt == "int8":
        return torch.round(x).clamp(-INT8_MAX, INT8_MAX)
    return x.to(torch.float8_e4m3fn).float()


def _check_hi_channels(hi_channels: int, D: int, rotate: bool, residual_channels: int = 0, qk: str = "fp8",
                       residual_ratio: float = 0.0, v_residual: bool = False) -> None:
    for name, n in (("hi_channels", hi_channels), ("residual_channels", residual_channels)):
        if not 0 <= n <= D:
            raise ValueError(f"{name} must be in [0, head dim {D}], got {n}")
        if n and rotate:
            raise ValueError(f"{name} and rotate exclude each other: the rotation spreads the outlier channels "
                             f"that {name} singles out")
    if residual_channels and hi_channels:
        raise ValueError("residual_channels and hi_channels exclude each other: both treat K's largest channels")
    if residual_channels and qk != "fp8":
        raise ValueError(f"residual_channels takes qk='fp8' (a second e4m3 term), got qk={qk!r}")
    _check_residual_ratio(residual_ratio)
    if residual_ratio and not (residual_channels or v_residual):
        raise ValueError("residual_ratio picks the heads that take residual terms: it needs residual_channels or "
                         "v_residual")


#: ``residual_ratio``'s usual value (docs/ATTENTION.md "Session 40"): a head takes the residual terms where its
#: smoothed K's largest channel amax is at least this many times the median channel's. On N(0, 1) inputs with 5 K
#: channels scaled ×f (2 heads × 256 rows × 17,776 keys, 256-key blocks; benchmarks/results/attention_accuracy_cpu.md,
#: third table) the ratio is ≈ 1.05 f and the one-term error 5.2 / 5.7 / 6.9 / 8.9 / 19.0 % at f = 1 / 2 / 3 / 4 / 20
#: against the 16-channel + V form's 4.1 / 4.2 / 4.1 / 3.9 / 1.8 %: from a ratio of about 3 the one-term error grows
#: fast
RESIDUAL_RATIO = 3.0


def _check_residual_ratio(ratio: float) -> None:
    if not (isinstance(ratio, (int, float)) and ratio >= 0 and math.isfinite(ratio)):
        raise ValueError(f"residual_ratio must be a finite number ≥ 0, got {ratio!r}")


def attention_residual_heads(k_amax: torch.Tensor, ratio: float) -> torch.Tensor:
    """Which heads take the residual terms (``residual_ratio``): ``k_amax`` ``[..., D]`` is the smoothed K's channel
    amax per head (max |k − mean| over the tokens); a head's K has outlier channels where its largest channel amax
    is at least ``ratio`` × its median one (``torch.median``: the lower of the two middle values). Bool ``[...]``;
    ``ratio`` 0 selects every head, a head whose amax holds a NaN none (a non-finite K makes the smoothed K's amax
    NaN; that head's output is NaN either way)."""
    _check_residual_ratio(ratio)
    if ratio == 0:
        return torch.ones(k_amax.shape[:-1], dtype=torch.bool, device=k_amax.device)
    return k_amax.amax(-1) >= ratio * k_amax.median(-1).values


def attention_e4m3_terms(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3(x), e4m3(x − e4m3(x))) as fp32 values: an operand on the e4m3 grid and its rounding residual on the
    same scale — the two e4m3 terms whose sum is x to ~2⁻⁸ relative."""
    hi = _attn_cast(x, "fp8")
    return hi, _attn_cast(x - hi, "fp8")


def attention_quantize_kv(k: torch.Tensor, v: torch.Tensor, *, block_n: int = 128, qk: str = "fp8",
                          rotate: bool = False, smooth: bool = True, hi_channels: int = 0,
                          residual_channels: int = 0, v_residual: bool = False, residual_ratio: float = 0.0,
                          stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """The K/V quantization: ``k`` codes ``[B, H, S_pad, D]`` (as fp32 values), ``k_scale`` ``[B, H, S_pad /
    block_n]``, ``v`` codes ``[B, H, S_pad, D]`` (fp32 values of the e4m3 codes), ``v_scale`` ``[B, H, D]``.

    ``hi_channels`` = n > 0 (an accuracy option, off by default; docs/ATTENTION.md "Outlier channels in 16 bits"):
    per (batch, head) the n channels of largest smoothed-K amax are kept apart in bf16 — ``hi_idx`` ``[B, H, n]``
    (ascending), ``k_hi`` ``[B, H, S_pad, n]`` (bf16 values as fp32) — and are zero in the 8-bit codes, whose
    block scales then come from the other channels.

    ``residual_channels`` = n > 0 (an accuracy option, ``qk="fp8"``; docs/ATTENTION.md "Session 39"): K's n largest
    channels per head (the same selection, ``res_idx`` ``[B, H, n]`` ascending) also carry their e4m3 rounding
    residual on the block's scale, ``k_lo`` ``[B, H, S_pad, n]`` = e4m3(x − e4m3(x)) of the scaled values; the codes
    and scales are today's. ``v_residual``: V's rounding residual on its channel scale, ``v_lo`` (as ``v``).
    ``residual_ratio`` > 0 (docs/ATTENTION.md "Session 40"): only the heads :func:`attention_residual_heads` picks
    (``res_heads`` ``[B, H]`` bool) carry the terms — ``k_lo``/``v_lo`` are zero on the others, whose attention is then
    today's (the scores add Q's terms times zero).

    ``stats``: (K mean, V amax) ``[B, H, D]`` to quantize with instead of :func:`attention_kv_stats`'s — the
    kernel's own statistics (``attention_fp8.kv_stats``: the mean to fp32 rounding), so its quantization can be
    checked bit for bit."""
    if qk not in ATTN_QK_FORMATS:
        raise ValueError(f"qk must be one of {ATTN_QK_FORMATS}, got {qk!r}")
    B, H, S, D = k.shape
    _check_hi_channels(hi_channels, D, rotate, residual_channels, qk, residual_ratio, v_residual)
    mean, vamax = attention_kv_stats(k, v, smooth=smooth) if stats is None else \
        (t.to(k.device, torch.float32).reshape(B, H, D) for t in stats)
    kc = k.float() - mean[:, :, None, :]
    if rotate:
        kc = kc @ attention_rotation(D, k.device)
    pad = (-S) % block_n if S else block_n
    hi = {}
    if hi_channels or residual_channels or residual_ratio:
        ch_amax = kc.abs().amax(dim=2)  # the smoothed K's channel amax [B, H, D]
    if hi_channels or residual_channels:  # K's n largest smoothed channels per head, ascending
        idx = ch_amax.topk(hi_channels or residual_channels, dim=-1).indices.sort(dim=-1).values
    if residual_ratio:  # the heads with outlier channels in K
        hi["res_heads"] = attention_residual_heads(ch_amax, residual_ratio)
    if hi_channels:
        gather = idx[:, :, None, :].expand(B, H, S, hi_channels)
        k_hi = kc.gather(-1, gather).to(torch.bfloat16).float()
        hi.update(hi_idx=idx, k_hi=torch.nn.functional.pad(k_hi, (0, 0, 0, pad)))
        kc = kc.scatter(-1, gather, 0.0)
    kc = torch.nn.functional.pad(kc, (0, 0, 0, pad)).view(B, H, -1, block_n, D)
    kinv, kscale = attention_scale(kc.abs().amax(dim=(-1, -2)), qk)
    kx = (kc * kinv[..., None, None]).view(B, H, -1, D)
    k8 = _attn_cast(kx, qk)

    def picked(lo):  # the terms on the heads residual_ratio picks, zero on the others
        return torch.where(hi["res_heads"][:, :, None, None], lo, 0.0) if residual_ratio else lo

    if residual_channels:
        sel = kx.gather(-1, idx[:, :, None, :].expand(B, H, kx.shape[2], residual_channels))
        hi.update(res_idx=idx, k_lo=picked(attention_e4m3_terms(sel)[1]))
    vinv, vscale = attention_scale(vamax, "fp8")
    vx = torch.nn.functional.pad(v.float(), (0, 0, 0, pad)) * vinv[:, :, None, :]
    v8 = _attn_cast(vx, "fp8")
    if v_residual:
        hi["v_lo"] = picked(_attn_cast(vx - v8, "fp8"))
    return {"k": k8, "k_scale": kscale, "v": v8, "v_scale": vscale, **hi}


def attention_fp8_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_n: int = 128,
                            qk: str = "fp8", rotate: bool = False, smooth: bool = True,
                            sm_scale: float | None = None, kv_len: torch.Tensor | None = None,
                            hi_channels: int = 0, pv: str = "fp8", residual_channels: int = 0,
                            v_residual: bool = False, residual_ratio: float = 0.0) -> torch.Tensor:
    """What ``sixbit_kernels/attention_fp8.fp8_attention`` computes (see the section comment), fp32
    ``[B, H, S_q, D]``. ``q``/``k``/``v`` are ``[B, H, S, D]``; ``kv_len`` int ``[B]`` keys per batch.

    ``pv="bf16"`` (an accuracy study, no kernel takes it): ``P`` rounded to bf16 and multiplied by the bf16 ``V``
    itself, as a 16-bit P·V MMA would — what the e4m3 P·V costs in accuracy, apart from QKᵀ.

    ``hi_channels`` = n > 0 (an accuracy option; the kernel takes n = 16): K's n largest channels per head and
    the same channels of Q go through a bf16 product beside the 8-bit one — the logit (× log2 e) is
    ``s8 · q_scale · k_scale · c + bf16(q_hi · c)ᵀ k_hi`` with ``c = sm_scale · log2 e``, the rest as without.

    ``residual_channels`` = n > 0 / ``v_residual`` (an accuracy option, ``qk="fp8"``; docs/ATTENTION.md "Session 39"):
    second e4m3 terms, each a rounding residual on its operand's scale, added into the same fp32 sums — the scores
    ``S = Q8·K8ᵀ + Qh·Klᵀ + Ql·Khᵀ`` with ``h``/``l`` the two terms (:func:`attention_e4m3_terms`) of Q's and K's scaled values on
    K's n largest channels (``res_idx``), and ``O = O·α + P8·V8 + P8·Vl`` with ``v_residual``. ``residual_ratio`` > 0
    (docs/ATTENTION.md "Session 40"): only on the heads :func:`attention_residual_heads` picks; the others compute
    today's attention (Q's terms are zero there)."""
    B, H, S_q, D = q.shape
    if pv not in ("fp8", "bf16"):
        raise ValueError(f"pv must be 'fp8' or 'bf16', got {pv!r}")
    if pv == "bf16" and v_residual:
        raise ValueError("v_residual is a term of the e4m3 P·V; pv='bf16' has none")
    kv = attention_quantize_kv(k, v, block_n=block_n, qk=qk, rotate=rotate, smooth=smooth, hi_channels=hi_channels,
                               residual_channels=residual_channels, v_residual=v_residual,
                               residual_ratio=residual_ratio)
    if pv == "bf16":  # V unquantized (its bf16 values, zero rows as padding), no V scale
        kv["v"] = torch.nn.functional.pad(v.float(), (0, 0, 0, kv["v"].shape[2] - v.shape[2]))
        kv["v_scale"] = torch.ones_like(kv["v_scale"])
    qf = q.float() @ attention_rotation(D, q.device) if rotate else q.float()
    sm_scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
    if hi_channels:  # Q's hi channels carry the logit scale (sm_scale · log2 e), rounded to bf16 with it
        gather = kv["hi_idx"][:, :, None, :].expand(B, H, S_q, hi_channels)
        c_hi = float(torch.tensor(sm_scale * _LOG2E, dtype=torch.float32))
        q_hi = (qf.gather(-1, gather) * c_hi).to(torch.bfloat16).float()
        qf = qf.scatter(-1, gather, 0.0)
    qinv, qscale = attention_scale(qf.abs().amax(dim=-1), qk)
    q8 = _attn_cast(qf * qinv[..., None], qk)
    if residual_channels:  # [Qh, Ql] and [Kl, Kh] on K's n largest channels: Qh·Klᵀ + Ql·Khᵀ in one product
        gather = kv["res_idx"][:, :, None, :]
        q_res = torch.cat(attention_e4m3_terms((qf * qinv[..., None]).gather(-1, gather.expand(B, H, S_q, -1))), -1)
        if residual_ratio:  # one term on the other heads: Q's terms zero there
            q_res = torch.where(kv["res_heads"][:, :, None, None], q_res, 0.0)
        kh = kv["k"].gather(-1, gather.expand(B, H, kv["k"].shape[2], -1))
        k_res = torch.cat([kv["k_lo"], kh], -1)
    c = qscale * float(torch.tensor(sm_scale * _LOG2E / (D if rotate else 1), dtype=torch.float32))
    n_kv = torch.full((B,), k.shape[2]) if kv_len is None else kv_len.cpu().clamp(max=k.shape[2])
    acc = torch.zeros(B, H, S_q, D, device=q.device)
    m = torch.full((B, H, S_q), float("-inf"), device=q.device)
    lsum = torch.zeros(B, H, S_q, device=q.device)
    for j in range(0, int(n_kv.max()), block_n):
        s = q8 @ kv["k"][:, :, j:j + block_n].transpose(-1, -2)
        if residual_channels:
            s = s + q_res @ k_res[:, :, j:j + block_n].transpose(-1, -2)
        valid = (j + torch.arange(block_n)[None, :] < n_kv[:, None]).to(q.device)  # [B, block_n]
        s = torch.where(valid[:, None, None, :], s, float("-inf"))
        cks = c * kv["k_scale"][:, :, j // block_n, None]
        if hi_channels:  # the logit itself (times log2 e), then the same softmax
            s = s * cks[..., None] + q_hi @ kv["k_hi"][:, :, j:j + block_n].transpose(-1, -2)
            cks = torch.ones_like(cks)
        m_new = torch.maximum(m, s.amax(dim=-1) * cks)
        m_new = torch.where(valid.any(-1)[:, None, None], m_new, m)  # batches already past their keys
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s * cks[..., None] + (ATTN_P_LOG2 - m_new)[..., None])
        p = torch.where(valid[:, None, None, :], p, 0.0)
        done = ~valid.any(-1)[:, None, None]
        lsum = torch.where(done, lsum, lsum * alpha + p.sum(-1))
        p8 = _attn_cast(p, "fp8") if pv == "fp8" else p.to(torch.bfloat16).float()
        pv8 = p8 @ kv["v"][:, :, j:j + block_n]
        if v_residual:
            pv8 = pv8 + p8 @ kv["v_lo"][:, :, j:j + block_n]
        acc = torch.where(done[..., None], acc, acc * alpha[..., None] + pv8)
        m = m_new
    return acc / lsum[..., None] * kv["v_scale"][:, :, None, :]


__all__ += [
    "ATTN_P_LOG2",
    "ATTN_P_SCALE",
    "ATTN_QK_FORMATS",
    "attention_rotation",
    "attention_scale",
    "attention_kv_stats",
    "attention_quantize_kv",
    "attention_fp8_reference",
    "attention_e4m3_terms",
    "attention_residual_heads",
    "RESIDUAL_RATIO",
]


# ================================================================================================
# Fused producers (sixbit_kernels/norm_quant.py, sixbit_kernels/gelu_quant.py): what they compute, in plain torch
# ================================================================================================
#
# Each is "the 16-bit output the model computes, then the INT8 route's activation quantization":
# ``quantize_int8(block_hadamard(y, b), check_finite=False)`` of that output ``y`` — the operand the W8A8 /
# W4A8 GEMM consumes. The kernels never write ``y``; they agree with these functions up to the documented
# one-ulp differences of ``y`` (summation order of the LayerNorm statistics, the GELU's tanh) and the
# fused rotation's rare one-step code flips (see sixbit_kernels/hadamard_quant.py).


def norm_modulate(parts, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """diffusers' ``CogVideoXLayerNormZero`` output of each part ``(x [B, S_i, K], one_plus [B, K],
    shift [B, K])`` — ``LayerNorm(x) · one_plus + shift`` in the model dtype — concatenated along the
    sequence in the order given (``[text; video]``: what to_q/to_k/to_v and ff.net.0.proj read)."""
    outs = [torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps) * op[:, None, :] + sh[:, None, :]
            for x, op, sh in parts]
    return torch.cat(outs, dim=1)


def _int8_operand(y: torch.Tensor, hadamard_block: int | None) -> Int8Tensor:
    y2 = y.reshape(-1, y.shape[-1])
    q = quantize_int8(block_hadamard(y2, hadamard_block) if hadamard_block else y2.float(), check_finite=False)
    q.orig_dtype = y.dtype
    return q


def norm_modulate_int8(parts, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
                       hadamard_block: int | None) -> Int8Tensor:
    """Per-token INT8 (rows ``[B·ΣS_i, K]``) of the rotated :func:`norm_modulate` output."""
    return _int8_operand(norm_modulate(parts, weight, bias, eps), hadamard_block)


def gelu_int8(x: torch.Tensor, hadamard_block: int | None) -> Int8Tensor:
    """Per-token INT8 (rows ``[M, K]``) of the rotated ``gelu(x, approximate="tanh")`` (model dtype)."""
    return _int8_operand(torch.nn.functional.gelu(x, approximate="tanh"), hadamard_block)


def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """diffusers' ``x + gate * y`` (CogVideoX's gated residual; ``gate`` ``[B, 1, C]``): the product rounded
    to the dtype, then the sum — the reference of ``sixbit_kernels/gated_residual.py``, bit for bit."""
    return x + gate * y


#: activations a GEMM epilogue applies to a linear's output (``ops.linear(..., activation=)``), each with the
#: kernels' ``ACT`` constexpr: CogVideoX's and Wan's feed-forward GELU (``ff.net.0``), whose 16-bit input is
#: then never written
ACTIVATIONS = {None: 0, "gelu_tanh": 1}


def act_code(activation: str | None) -> int:
    """The ``ACT`` constexpr of ``activation``, or a ValueError naming the choices."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    return ACTIVATIONS[activation]


def activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """``activation`` of a linear's (model-dtype) output — the reference of the GEMM epilogues'
    (``sixbit_kernels/_common.store_value``): PyTorch's GELU of a 16-bit tensor runs in fp32 and rounds once."""
    return y if act_code(activation) == 0 else torch.nn.functional.gelu(y, approximate="tanh")


__all__ += ["norm_modulate", "norm_modulate_int8", "gelu_int8", "gated_residual", "ACTIVATIONS", "act_code",
            "activate"]
