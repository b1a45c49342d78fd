"""The kernels' public surface: packed linear weights and one ``linear`` per route.

Contract (the engine, ``sixbit/linear.py``, codes against this):

``pack_linear(weight [N, K], bias, formats=("nvfp4",) | ("nvfp4", "int8"), hadamard_block=None)``
    Offline preparation: fold the block Hadamard into the weight (``formats.fold_hadamard``) and quantize
    it (``formats.quantize_weight``). Returns a :class:`PackedLinear` that keeps only packed codes, scales
    and the bias resident; ``.nbytes`` is the exact byte count. The kernels read ``sixbit.formats``'
    layouts directly (NVFP4 ``data [N, K/2]`` + ``scales [N, K/16]`` + fp32 tensor scale; INT8 ``[N, K]`` +
    ``[N, 1]`` scales), so no second copy in another layout is ever held.

``linear(x [..., K], packed, route, *, k_sigma=None, backend="auto") -> (y [..., N] in x.dtype, count)``
    ``route`` in ``"nvfp4"`` (W4A4), ``"int8"`` (W4A8: NVFP4 weights, per-token INT8 activations),
    ``"w8a8"`` (needs ``"int8"`` in ``formats``), ``"w4a16"`` (unquantized activations × NVFP4 weights).
    Numerics: ``formats.reference_linear`` of the same route. With ``k_sigma``, ``count`` is the number of
    outliers of ``x`` (``formats.outlier_count``: ``|x| > k_sigma * rms(token)``, un-rotated input) as an
    int64 0-d tensor, computed inside the activation-quantization pass; else ``None``.
    ``backend``: ``"auto"`` (Triton on CUDA, torch reference on CPU), ``"triton"`` (forced; on CPU it
    needs ``TRITON_INTERPRET=1`` before this package is imported), ``"torch"`` (the reference).

``compute_path(device) -> "cpu-reference" | "cuda-reference" | "hopper-triton" | "blackwell-native (unverified)"``
    What ``backend="auto"`` runs on that device. sm_90 runs the Triton kernels. Capability ≥ 10 runs
    the nvfp4 route through native FP4 ``torch._scaled_mm`` (never run here: unverified) and the other
    routes through the same Triton kernels. Other CUDA GPUs (and no Triton) use the torch reference.

``quantize_act(x2d, fmt, hadamard_block, k_sigma=None, backend="auto") -> (NVFP4Tensor | Int8Tensor, count)``
    The fused Hadamard + quantize (+ outlier count) on its own; ``fmt`` is ``"nvfp4"`` or ``"int8"``.

The engine's bookkeeping (same ``backend`` rule; the torch reference elsewhere):
``block_stats(outs, ins, olds=None, *, write=True)`` (where ``block_stats_supported``) — per stream ``Δ = out − in`` and the sums Γ and TDC
need, one pass each (``block_stats.py``); ``outlier_count(x, k_sigma)`` — ``formats.outlier_count`` in
one read (PDR's block-input check).

GEMM entry points (usable on their own): :func:`gemm_w4` (NVFP4 weights × NVFP4 / INT8 / dense 16-bit
activations), :func:`gemm_w8a8`, :func:`scaled_mm_nvfp4` (Blackwell, unverified).

Hopper detail. The W4A4 and W4A8 routes quantize the activations to exactly the NVFP4 / INT8 values of the
spec, but on sm_90 (no FP4 tensor cores) ``linear`` hands them to the GEMM as exact fp16 values
(``DenseAct``) rather than packed 4-bit codes when :data:`HOPPER_DENSE_ACTIVATIONS` is true: same numbers,
no per-tile decode of A. Both forms are implemented and benchmarked (``benchmarks/kernels.py``); on the H200
the fp16 form measured 0.72x bf16 end to end against 0.29x for packed codes (1920→5760; the 16-bit form also
lets ``gemm_w4`` decode the weight once per call), hence the default.
The packed form is what ``quantize_act`` returns.

Beyond the contract: ``PackedLinear`` also exposes ``w4`` / ``w8`` (the packed tensors), ``weight_nbytes``,
``bits_per_weight(fmt)`` and ``weight(fmt)``; ``quantize_act`` takes ``backend`` too; ``route="fp16"`` raises
(``PackedLinear`` does not hold the original weights). Costs and measurements: docs/KERNELS.md.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from sixbit import formats as F

from . import blackwell

try:  # the Triton kernels; without triton (e.g. macOS) only backend="torch" works
    from .block_stats import delta_stats as _delta_stats_kernel
    from .block_stats import supported as _delta_stats_supported
    from .gemm_w4 import DenseAct, gemm_w4
    from .gemm_w8a8 import gemm_w8a8
    from .hadamard_quant import outlier_count as _outlier_count_kernel
    from .hadamard_quant import quantize_int8_act, quantize_nvfp4_act, rotate_split, scale16_act
    from .layernorm import layer_norm_rows
    from .layernorm import supported as layer_norm_supported

    HAVE_TRITON = True
except ImportError as _e:  # pragma: no cover - triton ships with Linux torch
    HAVE_TRITON = False
    _TRITON_ERROR = _e

__all__ = [
    "PackedLinear",
    "ActCache",
    "layer_norm_rows",
    "layer_norm_supported",
    "block_stats",
    "block_stats_supported",
    "outlier_count",
    "pack_linear",
    "linear",
    "quantize_act",
    "compute_path",
    "gemm_w4",
    "gemm_w8a8",
    "scaled_mm_nvfp4",
    "DenseAct",
    "LINEAR_ROUTES",
    "WEIGHT_FORMAT",
    "HOPPER_DENSE_ACTIVATIONS",
    "W4A16_FP32_SPLIT",
]

#: routes ``linear`` serves, and the weight format each needs
LINEAR_ROUTES = ("nvfp4", "int8", "w8a8", "w4a16")
WEIGHT_FORMAT = {"nvfp4": "nvfp4", "int8": "nvfp4", "w8a8": "int8", "w4a16": "nvfp4"}
#: on sm_90, feed W4A4/W4A8 GEMMs the quantized activations as exact fp16 (see module docstring)
HOPPER_DENSE_ACTIVATIONS = True
#: W4A16 on rotated (or fp32) activations: False = one fp16 operand scaled per token (``scale16_act``,
#: ~2**-12 relative, one GEMM pass); True = the fp32-exact bf16 ``[hi | lo]`` split (two GEMM passes)
W4A16_FP32_SPLIT = False

scaled_mm_nvfp4 = blackwell.scaled_mm_nvfp4


# ---------------------------------------------------------------------------------------- weights


@dataclass
class PackedLinear:
    """Packed weights of one linear layer (rotated by the block Hadamard when ``hadamard_block`` is set).

    ``w4``: NVFP4 (4.5 bits/weight + 4 bytes), ``w8``: per-output-channel INT8 (8 bits/weight + 4 bytes
    per row); either may be absent. ``bias`` keeps the layer's dtype.
    """

    w4: F.NVFP4Tensor | None
    w8: F.Int8Tensor | None
    bias: torch.Tensor | None
    hadamard_block: int | None
    in_features: int
    out_features: int

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(n for n, w in (("nvfp4", self.w4), ("int8", self.w8)) if w is not None)

    @property
    def weight_nbytes(self) -> int:
        """Bytes of packed weights and their scales (no bias)."""
        return sum(w.nbytes for w in (self.w4, self.w8) if w is not None)

    @property
    def nbytes(self) -> int:
        """Exact bytes resident: packed weights + scales + bias."""
        b = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return self.weight_nbytes + b

    def bits_per_weight(self, fmt: str = "nvfp4") -> float:
        w = self.w4 if fmt == "nvfp4" else self.w8
        if w is None:
            raise ValueError(f"no {fmt} weights packed (formats={self.formats})")
        return 8.0 * w.nbytes / (self.in_features * self.out_features)

    @property
    def device(self) -> torch.device:
        w = self.w4 if self.w4 is not None else self.w8
        return w.data.device

    def to(self, device) -> PackedLinear:
        return PackedLinear(
            None if self.w4 is None else self.w4.to(device),
            None if self.w8 is None else self.w8.to(device),
            None if self.bias is None else self.bias.to(device),
            self.hadamard_block, self.in_features, self.out_features,
        )

    def weight(self, fmt: str) -> F.NVFP4Tensor | F.Int8Tensor:
        w = self.w4 if fmt == "nvfp4" else self.w8 if fmt == "int8" else None
        if w is None:
            raise ValueError(f"this PackedLinear holds weight formats {self.formats}; {fmt!r} was asked for")
        return w


def pack_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    formats: tuple[str, ...] = ("nvfp4",),
    hadamard_block: int | None = None,
) -> PackedLinear:
    """Quantize ``weight [N, K]`` (Hadamard folded first) into the given formats; see :class:`PackedLinear`."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
    fmts = tuple(formats)
    bad = [f for f in fmts if f not in ("nvfp4", "int8")]
    if bad or not fmts:
        raise ValueError(f"formats must be a non-empty subset of ('nvfp4', 'int8'), got {fmts}")
    N, K = weight.shape
    hb = int(hadamard_block) if hadamard_block else None
    if hb:
        F.check_hadamard_block(K, hb)
    if "nvfp4" in fmts and K % F.FP4_BLOCK:
        raise ValueError(f"NVFP4 weights need K divisible by {F.FP4_BLOCK}, got K={K}")
    w = weight.detach()
    w4 = F.quantize_weight(w, "nvfp4", hb) if "nvfp4" in fmts else None
    w8 = F.quantize_weight(w, "int8", hb) if "int8" in fmts else None
    b = None if bias is None else bias.detach().clone()
    return PackedLinear(w4, w8, b, hb, K, N)


# ---------------------------------------------------------------------------------------- dispatch


def compute_path(device) -> str:
    """What ``backend="auto"`` runs on ``device`` (see module docstring)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "cpu-reference"
    if not torch.cuda.is_available():
        return "cuda-reference"
    if not HAVE_TRITON:  # pragma: no cover - triton ships with CUDA torch
        return "cuda-reference"
    major, _ = torch.cuda.get_device_capability(dev)
    if major >= 10:
        return "blackwell-native (unverified)"
    if major == 9:
        return "hopper-triton"
    return "cuda-reference"


def _resolve(backend: str, x: torch.Tensor) -> str:
    if backend == "auto":
        return "torch" if compute_path(x.device) in ("cpu-reference", "cuda-reference") else "triton"
    if backend not in ("triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "triton" and not HAVE_TRITON:  # pragma: no cover
        raise RuntimeError(f"backend='triton' needs triton, which failed to import: {_TRITON_ERROR}")
    return backend


def _use_native_fp4(backend: str, x: torch.Tensor) -> bool:
    return backend == "auto" and compute_path(x.device).startswith("blackwell") and blackwell.native_fp4_available(x.device)


def quantize_act(x2d: torch.Tensor, fmt: str, hadamard_block: int | None = None, k_sigma: float | None = None,
                 backend: str = "auto"):
    """Fused ``block_hadamard`` → NVFP4 / per-token INT8 of ``x2d [M, K]`` (+ outlier count, int64 0-d)."""
    if fmt not in ("nvfp4", "int8"):
        raise ValueError(f"fmt must be 'nvfp4' or 'int8', got {fmt!r}")
    if _resolve(backend, x2d) == "torch":
        xr = F.block_hadamard(x2d, hadamard_block) if hadamard_block else x2d.float()
        q = F.quantize_nvfp4(xr, check_finite=False) if fmt == "nvfp4" else F.quantize_int8(xr, check_finite=False)
        q.orig_dtype = x2d.dtype
        count = F.outlier_count(x2d, k_sigma)[0] if k_sigma is not None else None
        return q, count
    fn = quantize_nvfp4_act if fmt == "nvfp4" else quantize_int8_act
    q, count = fn(x2d, hadamard_block, k_sigma)
    return q, (None if count is None else count.to(torch.int64))


def block_stats_supported(outs: list[torch.Tensor], ins: list[torch.Tensor], olds: list[torch.Tensor] | None = None,
                          backend: str = "auto") -> bool:
    """Whether :func:`block_stats` runs for these streams (the Triton path; else use the torch reference)."""
    olds_ = olds if olds is not None else [None] * len(outs)
    return HAVE_TRITON and _resolve(backend, outs[0]) == "triton" and all(
        _delta_stats_supported(o, i, d) for o, i, d in zip(outs, ins, olds_))


def block_stats(outs: list[torch.Tensor], ins: list[torch.Tensor], olds: list[torch.Tensor] | None = None, *,
                write: bool = True) -> tuple[list[torch.Tensor] | None, torch.Tensor]:
    """Per token stream ``Δ = out − in`` (model dtype; ``None`` without ``write``) and the fp64 sums
    ``[‖Δ_0‖₁, ‖in_0‖₁, Σ_s ‖Δ_s − old_s‖₁, Σ_s ‖old_s‖₁]`` — Γ's (first stream) and TDC's delta change
    (all streams; zeros without ``olds``), each stream read once (``block_stats.py``; check
    :func:`block_stats_supported` first). The reference is ``sixbit.dmpq.gamma_sums`` and
    ``sixbit.tdc.delta_change_sums``."""
    olds_ = olds if olds is not None else [None] * len(outs)
    res = [_delta_stats_kernel(o, i, d, write=write) for o, i, d in zip(outs, ins, olds_)]
    sums = torch.stack([res[0][1][0], res[0][1][1], sum(r[1][2] for r in res), sum(r[1][3] for r in res)])
    return ([r[0] for r in res] if write else None), sums


def outlier_count(x: torch.Tensor, k_sigma: float, backend: str = "auto") -> tuple[torch.Tensor, int]:
    """``formats.outlier_count(x, k_sigma)``: (int64 0-d count, element count); one read on the Triton path."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if (_resolve(backend, x) == "triton" and x2.shape[-1] % 16 == 0
            and x2.dtype in (torch.bfloat16, torch.float16, torch.float32)):
        return _outlier_count_kernel(x2, k_sigma).to(torch.int64), x2.numel()
    return F.outlier_count(x, k_sigma)


class ActCache:
    """The quantized form of one input, reused by every linear that reads that same tensor.

    CogVideoX's ``to_q``, ``to_k`` and ``to_v`` (and Wan's cross-attention ``to_k``/``to_v``) read one
    input; when DMPQ routes them alike, the fused Hadamard + quantize (+ outlier count) pass runs once
    instead of three times. An entry is keyed by the input *object* (a weak reference, so a new tensor
    never matches, and dropped as soon as that tensor is freed), its in-place version counter (none under
    ``torch.inference_mode``: there the object's identity alone), and what
    the operand depends on (activation format, Hadamard block, k_sigma, backend). Holding the operand
    costs one activation-sized buffer while the input itself is alive.
    """

    def __init__(self):
        self._ref = None
        self._version = -1
        self._ops: dict = {}
        self.hits = 0

    @staticmethod
    def _version_of(x: torch.Tensor):
        # inference-mode tensors carry no version counter: identity alone (diffusers' attention processors
        # never modify a projection input in place between its linears)
        return None if x.is_inference() else x._version

    def _holds(self, x: torch.Tensor) -> bool:
        return self._ref is not None and self._ref() is x and self._version_of(x) == self._version

    def get(self, x: torch.Tensor, key):
        if self._holds(x) and key in self._ops:
            self.hits += 1
            return self._ops[key]
        return None

    def put(self, x: torch.Tensor, key, value) -> None:
        if not self._holds(x):
            self.clear()
            self._ref = weakref.ref(x, self._dropped)
            self._version = self._version_of(x)
        self._ops[key] = value

    def _dropped(self, ref) -> None:
        if ref is self._ref:
            self.clear()

    def clear(self) -> None:
        self._ref = None
        self._ops = {}


def _cached(cache: ActCache | None, x: torch.Tensor, key, make):
    if cache is None:
        return make()
    hit = cache.get(x, key)
    if hit is None:
        hit = make()
        cache.put(x, key, hit)
    return hit


def _act_torch(x2: torch.Tensor, route: str, hb, k_sigma):
    count = F.outlier_count(x2, k_sigma)[0] if k_sigma is not None else None
    xr = F.block_hadamard(x2, hb) if hb else x2.float()
    if route == "nvfp4":
        xq = F.fake_quantize_nvfp4(xr, check_finite=False)
    elif route in ("int8", "w8a8"):
        xq = F.quantize_int8(xr, check_finite=False).dequantize(torch.float32)
    else:
        xq = xr
    return xq, count


def _dense_weight(packed: PackedLinear, fmt: str) -> torch.Tensor:
    """The fp32 dequantized weight the torch reference multiplies. On the CPU it is kept after the first
    call (the simulated path trades memory for time: 4 bytes per weight beside the packed ones); elsewhere
    it is rebuilt per call, so a GPU never holds a 32-bit copy."""
    w = packed.weight(fmt)
    if w.data.device.type != "cpu":
        return w.dequantize(torch.float32)
    cache = packed.__dict__.setdefault("_dense_cpu", {})
    if fmt not in cache:
        cache[fmt] = w.dequantize(torch.float32)
    return cache[fmt]


def _linear_torch(x2: torch.Tensor, packed: PackedLinear, route: str, k_sigma, cache=None, x=None):
    hb = packed.hadamard_block
    key = ("torch", "int8" if route == "w8a8" else route, hb, k_sigma)
    xq, count = _cached(cache, x, key, lambda: _act_torch(x2, route, hb, k_sigma))
    y = xq @ _dense_weight(packed, WEIGHT_FORMAT[route]).T
    if packed.bias is not None:
        y = y + packed.bias.float()
    return y.to(x2.dtype), count


def _act_form(route: str, dense: bool) -> str:
    """The GEMM operand a route needs: what ``_act_triton`` builds and the ``ActCache`` key (the int8 route
    with packed codes and w8a8 read the same tensor)."""
    if route == "nvfp4":
        return "nvfp4-dense" if dense else "nvfp4"
    if route in ("int8", "w8a8"):
        return "int8-dense" if route == "int8" and dense else "int8"
    return "w4a16-split" if W4A16_FP32_SPLIT else "w4a16"


def _act_triton(x2: torch.Tensor, form: str, hb, k_sigma):
    """The operand of ``form`` (see :func:`_act_form`) for ``x2``: fused Hadamard + quantize, and the count."""
    if form == "nvfp4-dense":
        (vals, bs, ts), count = quantize_nvfp4_act(x2, hb, k_sigma, dense=True)
        return DenseAct(vals, "nvfp4", tensor_scale=ts, block_scales=bs), count
    if form == "nvfp4":
        return quantize_nvfp4_act(x2, hb, k_sigma)
    if form == "int8-dense":
        q, count = quantize_int8_act(x2, hb, k_sigma, dense=True)
        return DenseAct(q.data, "int8", row_scale=q.scale), count
    if form == "int8":
        return quantize_int8_act(x2, hb, k_sigma)
    # w4a16
    if hb or x2.dtype == torch.float32:
        return rotate_split(x2, hb, k_sigma) if form == "w4a16-split" else scale16_act(x2, hb, k_sigma)
    return x2, (_outlier_count_kernel(x2, k_sigma) if k_sigma is not None else None)


def _linear_triton(x2: torch.Tensor, packed: PackedLinear, route: str, k_sigma, native_fp4: bool,
                   cache=None, x=None):
    hb = packed.hadamard_block
    out_dtype = x2.dtype
    bias = packed.bias
    w = packed.weight(WEIGHT_FORMAT[route])
    form = _act_form(route, HOPPER_DENSE_ACTIVATIONS and not native_fp4)
    a, count = _cached(cache, x, ("triton", form, hb, k_sigma), lambda: _act_triton(x2, form, hb, k_sigma))
    if route == "w8a8":
        return gemm_w8a8(a, w, bias, out_dtype), count
    if route == "nvfp4" and native_fp4:
        return blackwell.scaled_mm_nvfp4(a, w, bias, out_dtype), count
    return gemm_w4(a, w, bias, out_dtype), count


def linear(x: torch.Tensor, packed: PackedLinear, route: str, *, k_sigma: float | None = None,
           backend: str = "auto", cache: ActCache | None = None):
    """``y = x @ W^T + b`` on ``route`` with packed weights; see the module docstring for the contract.
    ``cache``: an :class:`ActCache` shared by linears that may read the same ``x`` (quantize once)."""
    if route not in LINEAR_ROUTES:
        raise ValueError(f"route must be one of {LINEAR_ROUTES}, got {route!r}"
                         + (" (the fp16 route uses the original layer, which PackedLinear does not hold)"
                            if route == "fp16" else ""))
    K = packed.in_features
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} features, the layer expects {K}")
    packed.weight(WEIGHT_FORMAT[route])  # raises when the route's weight format is missing
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.shape[0] == 0:
        y = torch.empty((*lead, packed.out_features), dtype=x.dtype, device=x.device)
        return y, (torch.zeros((), dtype=torch.int64, device=x.device) if k_sigma is not None else None)
    be = _resolve(backend, x2)
    if be == "torch":
        y, count = _linear_torch(x2, packed, route, k_sigma, cache, x)
    else:
        y, count = _linear_triton(x2, packed, route, k_sigma, _use_native_fp4(backend, x2), cache, x)
        count = None if count is None else count.to(torch.int64)
    return y.reshape(*lead, packed.out_features), count
