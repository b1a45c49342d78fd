"""The kernels' public surface: packed linear weights and one ``linear`` per route.

Contract (the engine, ``sixbit/linear.py``, codes against this):

``pack_linear(weight [N, K], bias, formats=("nvfp4",) | ("nvfp4", "int8"), hadamard_block=None)``
    Offline preparation: fold the block Hadamard into the weight (``formats.fold_hadamard``) and quantize
    it (``formats.quantize_weight``). Returns a :class:`PackedLinear` that keeps only packed codes, scales
    and the bias resident; ``.nbytes`` is the exact byte count. The kernels read ``sixbit.formats``'
    layouts directly (NVFP4 ``data [N, K/2]`` + ``scales [N, K/16]`` + fp32 tensor scale; INT8 ``[N, K]`` +
    ``[N, 1]`` scales), so no second copy in another layout is ever held.

``linear(x [..., K], packed, route, *, k_sigma=None, backend="auto", cache=None, options=None) -> (y [..., N] in x.dtype, count)``
    ``route`` in ``"nvfp4"`` (W4A4), ``"int8"`` (W4A8: NVFP4 weights, per-token INT8 activations),
    ``"w8a8"`` (needs ``"int8"`` in ``formats``), ``"w4a8_requant"`` (W4A8 on the int8 tensor cores: the NVFP4
    weight re-quantized to per-channel INT8 for the call, ``requant.py``), ``"w4a16"`` (unquantized activations
    × NVFP4 weights).
    Numerics: ``formats.reference_linear`` of the same route. With ``k_sigma``, ``count`` is the number of
    outliers of ``x`` (``formats.outlier_count``: ``|x| > k_sigma * rms(token)``, un-rotated input) as an
    int64 0-d tensor, computed inside the activation-quantization pass; else ``None``.
    ``backend``: ``"auto"`` (self-checked Triton on CUDA capability >= 8.0, torch reference on CPU),
    ``"triton"`` (forced, unchecked; on CPU it needs ``TRITON_INTERPRET=1`` before this package is
    imported), ``"torch"`` (the reference). ``options``: :class:`KernelOptions` (explicit switches).

``compute_path(device) -> str``
    What ``backend="auto"`` runs on that device (``targets`` dispatches by capability): ``"hopper-triton"``
    (9.x: TMA-descriptor GEMMs), ``"portable-triton"`` (any other capability >= 8.0: pointer-load GEMMs,
    nothing Hopper-only), ``"blackwell-native (unverified) + portable-triton"`` (>= 10: the nvfp4 route on
    native FP4 ``torch._scaled_mm``, never run on hardware), ``"cuda-reference"`` (< 8.0, no triton) or
    ``"cpu-reference"``; after a self-check fallback, ``"; self-check fallback: <route>/<size> → <impl>"``.
    Under ``auto`` every route is self-checked once per device before its first call (``selfcheck``):
    a route that raises or misses the bound against the torch reference falls back — hopper → portable →
    torch (native FP4 → hopper/portable → torch) — with a warning. ``backend="triton"`` runs unchecked.

``quantize_act(x2d, fmt, hadamard_block, k_sigma=None, backend="auto") -> (NVFP4Tensor | Int8Tensor, count)``
    The fused Hadamard + quantize (+ outlier count) on its own; ``fmt`` is ``"nvfp4"`` or ``"int8"``.

Pre-quantized inputs (quantize fused into the producer; ``sixbit/fused.py``): ``linear`` also takes a
:class:`QuantizedInput` for ``x`` — the INT8 operand a producer kernel emitted (``norm_modulate_int8``:
CogVideoX's norm + modulate; ``gelu_int8``) — and runs the GEMM alone; ``operand_form(packed, route)`` says
which operand a route reads (``"int8"``, ``"int8-dense"`` or ``None``), ``producers_supported(x, backend)``
whether the producer kernels run for such activations. Numerics: ``formats.norm_modulate_int8`` /
``formats.gelu_int8``, then the route's GEMM.

The engine's bookkeeping (same ``backend`` rule; the torch reference elsewhere):
``block_stats(outs, ins, olds=None, *, write=True)`` (where ``block_stats_supported``) — per stream ``Δ = out − in`` and the sums Γ and TDC
need, one pass each (``block_stats.py``); ``outlier_count(x, k_sigma)`` — ``formats.outlier_count`` in
one read (PDR's block-input check).

GEMM entry points (usable on their own): :func:`gemm_w4` (NVFP4 weights × NVFP4 / INT8 / dense 16-bit
activations), :func:`gemm_w8a8`, :func:`scaled_mm_nvfp4` (Blackwell, unverified).

Hopper detail. The W4A4 and W4A8 routes quantize the activations to exactly the NVFP4 / INT8 values of the
spec, but without FP4 tensor cores ``linear`` hands them to the GEMM as exact fp16 values
(``DenseAct``) rather than packed 4-bit codes (``KernelOptions.dense_activations``, default): same numbers,
no per-tile decode of A. Both forms are implemented and benchmarked (``python -m benchmarks.kernels``); on the H200
the fp16 form measured 0.72x bf16 end to end against 0.29x for packed codes (1920→5760; the 16-bit form also
lets ``gemm_w4`` decode the weight once per call), hence the default.
The packed form is what ``quantize_act`` returns.

Beyond the contract: ``PackedLinear`` also exposes ``w4`` / ``w8`` (the packed tensors), ``weight_nbytes``,
``bits_per_weight(fmt)`` and ``weight(fmt)``; ``quantize_act`` takes ``backend`` too; ``route="fp16"`` raises
(``PackedLinear`` does not hold the original weights). Costs and measurements: docs/KERNELS.md.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from functools import partial

import torch

from sixbit import formats as spec
from sixbit.routes import INT8_ROUTES, KERNEL_ROUTES, W4A8_REQUANT, W8A8, WEIGHT_FORMAT

from . import blackwell, selfcheck, targets

try:  # the Triton kernels; without triton (e.g. macOS) only backend="torch" works
    from .block_stats import delta_stats as _delta_stats_kernel
    from .block_stats import finite_l1_mean as _finite_l1_kernel
    from .block_stats import finite_l1_supported as _finite_l1_supported
    from .block_stats import supported as _delta_stats_supported
    from .gated_residual import gated_residual as _gated_residual_kernel
    from .gated_residual import supported as _gated_residual_supported
    from .gelu_quant import gelu_int8 as _gelu_int8_kernel
    from .gemm_w4 import DECODE_ONCE_MIN_M, DenseAct, gemm_w4
    from .gemm_w8a8 import gemm_w8a8
    from .hadamard_quant import outlier_count as _outlier_count_kernel
    from .hadamard_quant import quantize_int8_act, quantize_nvfp4_act, rotate_split, scale16_act
    from .layernorm import layer_norm_rows
    from .layernorm import supported as layer_norm_shape_ok
    from .norm_quant import norm_modulate as _norm_modulate_kernel
    from .requant import requantize_int8

    HAVE_TRITON = True
except ImportError as _e:  # pragma: no cover - triton ships with Linux torch
    HAVE_TRITON = False
    _TRITON_ERROR = _e

__all__ = [
    "PackedLinear",
    "native_fp4",
    "int8_tensor_cores",
    "ActCache",
    "layer_norm_rows",
    "layer_norm_supported",
    "block_stats",
    "block_stats_supported",
    "l1_size_supported",
    "l1_size",
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
    "KernelOptions",
    "self_check_status",
    "QuantizedInput",
    "operand_form",
    "route_runs_kernel",
    "producers_supported",
    "norm_modulate_int8",
    "norm_modulate",
    "gelu_int8",
    "gated_residual",
]

#: routes ``linear`` serves (``WEIGHT_FORMAT``: the weight format each needs), from ``sixbit.routes``
LINEAR_ROUTES = KERNEL_ROUTES


@dataclass(frozen=True)
class KernelOptions:
    """Explicit kernel switches of :func:`linear` (the defaults are what ``backend="auto"`` runs).

    ``dense_activations``: feed W4A4/W4A8 GEMMs the quantized activations as exact fp16 (see module
    docstring; never with native FP4). ``w4a16_split``: W4A16 on rotated (or fp32) activations as the
    fp32-exact bf16 ``[hi | lo]`` split (two GEMM passes) instead of one fp16 operand scaled per token
    (``scale16_act``, ~2**-12 relative). ``target``: a ``targets.Target`` (variant, configs) instead of
    the device's; with it, ``backend="auto"`` runs that variant unchecked."""

    dense_activations: bool = True
    w4a16_split: bool = False
    target: targets.Target | None = None


DEFAULT_OPTIONS = KernelOptions()

scaled_mm_nvfp4 = blackwell.scaled_mm_nvfp4


# ---------------------------------------------------------------------------------------- weights


@dataclass
class PackedLinear:
    """Packed weights of one linear layer (rotated by the block Hadamard when ``hadamard_block`` is set).

    ``w4``: NVFP4 (4.5 bits/weight + 4 bytes), ``w8``: per-output-channel INT8 (8 bits/weight + 4 bytes
    per row); either may be absent. ``bias`` keeps the layer's dtype.
    """

    w4: spec.NVFP4Tensor | None
    w8: spec.Int8Tensor | None
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

    def weight(self, fmt: str) -> spec.NVFP4Tensor | spec.Int8Tensor:
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
        spec.check_hadamard_block(K, hb)
    if "nvfp4" in fmts and K % spec.FP4_BLOCK:
        raise ValueError(f"NVFP4 weights need K divisible by {spec.FP4_BLOCK}, got K={K}")
    w = weight.detach()
    w4 = spec.quantize_weight(w, "nvfp4", hb) if "nvfp4" in fmts else None
    w8 = spec.quantize_weight(w, "int8", hb) if "int8" in fmts else None
    b = None if bias is None else bias.detach().clone()
    return PackedLinear(w4, w8, b, hb, K, N)


# ---------------------------------------------------------------------------------------- dispatch


def _cuda_target(dev: torch.device) -> targets.Target | None:
    """The dispatch target of a CUDA device, or ``None`` where the kernels do not run (capability < 8.0,
    no triton, no CUDA)."""
    if not torch.cuda.is_available() or not HAVE_TRITON:
        return None
    major, _ = torch.cuda.get_device_capability(dev)
    return targets.device_target(dev) if major >= 8 else None


def _kernel_target(dev: torch.device) -> targets.Target | None:
    """Where ``backend="auto"`` runs the checked Triton routes: CUDA capability ≥ 8.0, or CPU tensors inside
    ``selfcheck.interpreter_dispatch``."""
    if dev.type == "cuda":
        return _cuda_target(dev)
    return selfcheck.cpu_target() if dev.type == "cpu" and HAVE_TRITON else None


def _native_fp4(dev: torch.device) -> bool:
    return dev.type == "cuda" and blackwell.native_fp4_available(dev)


def native_fp4(device) -> bool:
    """Whether ``device`` multiplies NVFP4 × NVFP4 on FP4 tensor cores (capability ≥ 10: unverified);
    everywhere else the ``nvfp4`` route runs at 16-bit rate (``gemm_w4``) or in the torch reference."""
    return _native_fp4(torch.device(device))


def int8_tensor_cores(device) -> bool:
    """Whether sixbit's GPU kernels run on ``device`` (CUDA, capability ≥ 8.0): there the INT8 routes multiply on
    the int8 tensor cores (``routes.int8_route_for``: ``int8_route="auto"``)."""
    dev = torch.device(device)
    return dev.type == "cuda" and _kernel_target(dev) is not None


def compute_path(device) -> str:
    """What ``backend="auto"`` runs on ``device``: ``"cpu-reference"``, ``"cuda-reference"`` (capability
    < 8.0), ``"hopper-triton"`` (9.x), ``"portable-triton"`` (other capabilities ≥ 8.0), prefixed by
    ``"blackwell-native (unverified) + "`` on capability ≥ 10 — then, once the self-check has replaced a
    route (``selfcheck``), ``"; self-check fallback: <route> → <impl>, ..."``."""
    dev = torch.device(device)
    tgt = _kernel_target(dev)
    if tgt is None:
        return "cpu-reference" if dev.type != "cuda" else "cuda-reference"
    path = {targets.HOPPER: selfcheck.HOPPER_TRITON, targets.PORTABLE: selfcheck.PORTABLE_TRITON}[tgt.variant]
    if _native_fp4(dev):
        path = "blackwell-native (unverified) + " + path
    fb = selfcheck.fallbacks(dev)
    if fb:
        path += "; self-check fallback: " + ", ".join(f"{k} → {v}" for k, v in sorted(fb.items()))
    return path


def self_check_status(device) -> dict:
    """Every self-check made on ``device`` so far: ``{key: {"impl", "failures", "seconds"}}``."""
    return selfcheck.status(device)


def _resolve(backend: str, x: torch.Tensor) -> str:
    """``"torch"``, ``"triton"`` (forced, unchecked) or ``"checked"`` (``auto`` on a kernel device)."""
    if backend == "auto":
        return "checked" if _kernel_target(x.device) is not None else "torch"
    if backend not in ("triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "triton" and not HAVE_TRITON:  # pragma: no cover
        raise RuntimeError(f"backend='triton' needs triton, which failed to import: {_TRITON_ERROR}")
    return backend


def _checked(dev: torch.device, key: tuple, problem) -> bool:
    """Whether the (self-checked) Triton kernel serves ``key`` on ``dev`` (else the torch reference);
    ``problem()`` → (kernel run, reference) is built only on the first call per key, not on the hot path."""
    impl = selfcheck.cached(dev, key)
    if impl is None:
        run, ref = problem()
        impl = selfcheck.choose(dev, key, [(selfcheck.TRITON, run), (selfcheck.TORCH, None)], ref)
    return impl == selfcheck.TRITON


def quantize_act(x2d: torch.Tensor, fmt: str, hadamard_block: int | None = None, k_sigma: float | None = None,
                 backend: str = "auto"):
    """Fused ``block_hadamard`` → NVFP4 / per-token INT8 of ``x2d [M, K]`` (+ outlier count, int64 0-d)."""
    if fmt not in ("nvfp4", "int8"):
        raise ValueError(f"fmt must be 'nvfp4' or 'int8', got {fmt!r}")
    if _resolve(backend, x2d) == "torch":
        xr = spec.block_hadamard(x2d, hadamard_block) if hadamard_block else x2d.float()
        q = spec.quantize_nvfp4(xr, check_finite=False) if fmt == "nvfp4" else spec.quantize_int8(xr, check_finite=False)
        q.orig_dtype = x2d.dtype
        count = spec.outlier_count(x2d, k_sigma)[0] if k_sigma is not None else None
        return q, count
    fn = quantize_nvfp4_act if fmt == "nvfp4" else quantize_int8_act
    q, count = fn(x2d, hadamard_block, k_sigma)
    return q, (None if count is None else count.to(torch.int64))


def block_stats_supported(outs: list[torch.Tensor], ins: list[torch.Tensor], olds: list[torch.Tensor] | None = None,
                          backend: str = "auto") -> bool:
    """Whether :func:`block_stats` runs for these streams (the Triton path — self-checked once per device
    under ``auto``; else use the torch reference)."""
    olds_ = olds if olds is not None else [None] * len(outs)
    be = _resolve(backend, outs[0]) if HAVE_TRITON else "torch"
    if be == "torch" or not all(_delta_stats_supported(o, i, d) for o, i, d in zip(outs, ins, olds_)):
        return False
    return be == "triton" or _checked(outs[0].device, ("block_stats", outs[0].dtype),
                                      lambda: _block_stats_problem(outs[0]))


def _block_stats_problem(like: torch.Tensor):
    g = torch.Generator(device=like.device).manual_seed(0)
    o, i, d = (torch.randn(3, 16, 64, generator=g, device=like.device).to(like.dtype)).unbind(0)

    def ref():
        delta = o - i
        dd = (delta.float() - d.float()).to(like.dtype).float()
        return delta, torch.stack([delta.float().abs().sum(), i.float().abs().sum(), dd.abs().sum(),
                                   d.float().abs().sum()]).double()

    def run():
        deltas, sums = block_stats([o], [i], [d])
        return deltas[0], sums

    return run, ref


def layer_norm_supported(x: torch.Tensor, normalized_shape) -> bool:
    """Whether :func:`layer_norm_rows` takes this input (``layernorm.supported``) and, on a kernel device,
    passed its self-check there."""
    if not layer_norm_shape_ok(x, normalized_shape):
        return False
    if _kernel_target(x.device) is None:
        return True  # CPU tensors (interpreter tests with allow_cpu): unchecked, as before
    d = x.shape[-1]

    def problem():
        g = torch.Generator(device=x.device).manual_seed(0)
        t = (torch.randn(2, 3, 40, d, generator=g, device=x.device) * 3 + 1).to(x.dtype).transpose(1, 2)
        w, b = torch.randn(2, d, generator=g, device=x.device).to(x.dtype).unbind(0)
        return (lambda: layer_norm_rows(t, w, b, 1e-6),
                lambda: torch.nn.functional.layer_norm(t.float(), (d,), w.float(), b.float(), 1e-6).to(x.dtype))

    return _checked(x.device, ("layer_norm", d, x.dtype), problem)


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


def l1_size_supported(t: torch.Tensor, backend: str = "auto") -> bool:
    """Whether :func:`l1_size` runs the Triton kernel for ``t`` (``block_stats.finite_l1_supported``; under ``auto``
    self-checked once per device and dtype); else use ``sixbit.tdc.l1_size``."""
    if not HAVE_TRITON or not _finite_l1_supported(t):
        return False
    be = _resolve(backend, t)
    if be == "torch":
        return False
    return be == "triton" or _checked(t.device, ("l1_size", t.dtype), lambda: _l1_size_problem(t))


def l1_size(t: torch.Tensor) -> torch.Tensor:
    """TDC's ``"magnitude"`` size of ``t`` in one read (``block_stats.finite_l1_mean``; reference
    ``sixbit.tdc.l1_size``, equal to fp32 rounding); check :func:`l1_size_supported` first."""
    return _finite_l1_kernel(t)


def _l1_size_problem(like: torch.Tensor):
    from sixbit.tdc import l1_size as ref

    g = torch.Generator(device=like.device).manual_seed(4)
    y = (torch.randn(2, 41, 96, generator=g, device=like.device) * 3).to(like.dtype)
    y[1, 3, 5] = float("nan")
    y = y[:, 3:]  # strided like a regated piece
    return (lambda: _finite_l1_kernel(y)), (lambda: ref(y))


def outlier_count(x: torch.Tensor, k_sigma: float, backend: str = "auto") -> tuple[torch.Tensor, int]:
    """``formats.outlier_count(x, k_sigma)``: (int64 0-d count, element count); one read on the Triton path."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    be = _resolve(backend, x)
    if be != "torch" and x2.shape[-1] % 16 == 0 and x2.dtype in (torch.bfloat16, torch.float16, torch.float32):
        if be == "triton" or _checked(x.device, ("outlier_count", x2.dtype), lambda: _outlier_problem(x2, k_sigma)):
            return _outlier_count_kernel(x2, k_sigma).to(torch.int64), x2.numel()
    return spec.outlier_count(x, k_sigma)


def _outlier_problem(like: torch.Tensor, k_sigma: float):
    xs = _check_input(16, like.shape[-1], like.dtype, like.device)
    return (lambda: _outlier_count_kernel(xs, k_sigma).to(torch.int64)), (lambda: spec.outlier_count(xs, k_sigma)[0])


def _check_input(m: int, k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The self-check's deterministic activation: normal rows with two outlier channels."""
    g = torch.Generator(device=device).manual_seed(1234)
    x = torch.randn(m, k, generator=g, device=device)
    x[:, 1] *= 30.0
    x[:, k // 2] *= 12.0
    return x.to(dtype)


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


def _act_torch(x2: torch.Tensor, route: str, hb, k_sigma, reduce_amax=None):
    count = spec.outlier_count(x2, k_sigma)[0] if k_sigma is not None else None
    xr = spec.block_hadamard(x2, hb) if hb else x2.float()
    if route == "nvfp4":
        xq = spec.fake_quantize_nvfp4(xr, spec.nvfp4_tensor_scale(xr, reduce_amax), check_finite=False)
    elif route in INT8_ROUTES:
        xq = spec.quantize_int8(xr, check_finite=False).dequantize(torch.float32)
    else:
        xq = xr
    return xq, count


def _dense_weight(packed: PackedLinear, route: str) -> torch.Tensor:
    """The fp32 dequantized weight the torch reference multiplies on ``route`` (``w4a8_requant``: the NVFP4
    weight re-quantized, ``formats.requantize_int8``). On the CPU it is kept after the first call (the
    simulated path trades memory for time: 4 bytes per weight beside the packed ones); elsewhere it is
    rebuilt per call, so a GPU never holds a 32-bit copy."""
    def make():
        w = packed.weight(WEIGHT_FORMAT[route])
        return (spec.requantize_int8(w) if route == W4A8_REQUANT else w).dequantize(torch.float32)

    if packed.device.type != "cpu":
        return make()
    key = W4A8_REQUANT if route == W4A8_REQUANT else WEIGHT_FORMAT[route]
    cache = packed.__dict__.setdefault("_dense_cpu", {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _linear_torch(x2: torch.Tensor, packed: PackedLinear, route: str, k_sigma, cache=None, x=None,
                  reduce_amax=None):
    hb = packed.hadamard_block
    key = ("torch", "int8" if route in INT8_ROUTES else route, hb, k_sigma)
    xq, count = _cached(cache, x, key, lambda: _act_torch(x2, route, hb, k_sigma, reduce_amax))
    y = xq @ _dense_weight(packed, route).T
    if packed.bias is not None:
        y = y + packed.bias.float()
    return y.to(x2.dtype), count


def _act_form(route: str, dense: bool, w4a16_split: bool = False) -> str:
    """The GEMM operand a route needs: what ``_act_triton`` builds and the ``ActCache`` key (the int8 route
    with packed codes, w8a8 and w4a8_requant read the same tensor)."""
    if route == "nvfp4":
        return "nvfp4-dense" if dense else "nvfp4"
    if route in INT8_ROUTES:
        return "int8-dense" if route == "int8" and dense else "int8"
    return "w4a16-split" if w4a16_split else "w4a16"


def _act_triton(x2: torch.Tensor, form: str, hb, k_sigma, target=None, reduce_amax=None):
    """The operand of ``form`` (see :func:`_act_form`) for ``x2``: fused Hadamard + quantize, and the count."""
    t = {"target": target}
    if form == "nvfp4-dense":
        (vals, bs, ts), count = quantize_nvfp4_act(x2, hb, k_sigma, dense=True, reduce_amax=reduce_amax, **t)
        return DenseAct(vals, "nvfp4", tensor_scale=ts, block_scales=bs), count
    if form == "nvfp4":
        return quantize_nvfp4_act(x2, hb, k_sigma, reduce_amax=reduce_amax, **t)
    if form == "int8-dense":
        q, count = quantize_int8_act(x2, hb, k_sigma, dense=True, **t)
        return DenseAct(q.data, "int8", row_scale=q.scale), count
    if form == "int8":
        return quantize_int8_act(x2, hb, k_sigma, **t)
    # w4a16
    if hb or x2.dtype == torch.float32:
        return rotate_split(x2, hb, k_sigma, **t) if form == "w4a16-split" else scale16_act(x2, hb, k_sigma, **t)
    return x2, (_outlier_count_kernel(x2, k_sigma, **t) if k_sigma is not None else None)


def _linear_triton(x2: torch.Tensor, packed: PackedLinear, route: str, k_sigma, impl: str,
                   target: targets.Target | None, options: KernelOptions, cache=None, x=None, reduce_amax=None,
                   activation: str | None = None):
    """One route on one implementation: ``hopper-triton`` / ``portable-triton`` (``target`` of that
    variant) or ``blackwell-native`` (the nvfp4 route through ``torch._scaled_mm``, the activation after it)."""
    hb = packed.hadamard_block
    out_dtype = x2.dtype
    bias = packed.bias
    w = packed.weight(WEIGHT_FORMAT[route])
    native = impl == selfcheck.NATIVE
    form = _act_form(route, options.dense_activations and not native, options.w4a16_split)
    a, count = _cached(cache, x, ("triton", form, hb, k_sigma),
                       lambda: _act_triton(x2, form, hb, k_sigma, target, reduce_amax))
    if route in (W8A8, W4A8_REQUANT):
        y = gemm_w8a8(a, _int8_weight(w, route, target), bias, out_dtype, target=target, activation=activation)
    elif native:
        y = spec.activate(blackwell.scaled_mm_nvfp4(a, w, bias, out_dtype), activation)
    else:
        y = gemm_w4(a, w, bias, out_dtype, target=target, activation=activation)
    return y, (None if count is None else count.to(torch.int64))


def _int8_weight(w, route: str, target: targets.Target | None):
    """The INT8 weight operand of ``w8a8`` (resident) or ``w4a8_requant`` (re-quantized from NVFP4 for this call)."""
    return requantize_int8(w, target=target) if route == W4A8_REQUANT else w


def _variant_target(base: targets.Target, impl: str) -> targets.Target:
    """``base`` with the variant an implementation name stands for (native FP4 keeps ``base``)."""
    variant = {selfcheck.HOPPER_TRITON: targets.HOPPER, selfcheck.PORTABLE_TRITON: targets.PORTABLE}.get(impl)
    return base if variant in (None, base.variant) else replace(base, variant=variant)


def _impl_name(target: targets.Target) -> str:
    return selfcheck.HOPPER_TRITON if target.variant == targets.HOPPER else selfcheck.PORTABLE_TRITON


def _route_impl(x2, packed: PackedLinear, route: str, k_sigma) -> str:
    """The self-checked implementation of ``route`` on ``x2``'s device for ``x2``'s size class (the check
    runs on the first call: the layer's own weights, a random input of its width, ``selfcheck.BOUND``)."""
    dev = x2.device
    rows = x2.shape[0] if isinstance(x2, torch.Tensor) else x2.rows  # a tensor, QuantizedInput or _Rows
    large = rows >= DECODE_ONCE_MIN_M
    key = (route, "large" if large else "small")
    impl = selfcheck.cached(dev, key)
    if impl is not None:
        return impl
    tgt = _kernel_target(dev)
    m = DECODE_ONCE_MIN_M + rows % 16 if large else rows
    xs = _check_input(m, packed.in_features, x2.dtype, dev)
    cands = [(n, partial(_linear_triton, xs, packed, route, k_sigma, n, _variant_target(tgt, n), DEFAULT_OPTIONS))
             for n in selfcheck.ladder(route, tgt, _native_fp4(dev))]
    return selfcheck.choose(dev, key, cands, lambda: _linear_torch(xs, packed, route, k_sigma))


def linear(x: torch.Tensor, packed: PackedLinear, route: str, *, k_sigma: float | None = None,
           backend: str = "auto", cache: ActCache | None = None, options: KernelOptions | None = None,
           reduce_amax=None, activation: str | None = None):
    """``y = x @ W^T + b`` on ``route`` with packed weights; see the module docstring for the contract.
    ``cache``: an :class:`ActCache` shared by linears that may read the same ``x`` (quantize once).
    ``options``: explicit kernel switches (:class:`KernelOptions`). ``reduce_amax``: the nvfp4 route's
    per-tensor amax hook (``formats.nvfp4_tensor_scale``; ``sixbit.parallel``: MAX over the ranks). ``x`` may
    be a :class:`QuantizedInput` (its producer already quantized it): then the GEMM alone runs.
    ``activation`` (``"gelu_tanh"``, default None): ``F.gelu(y, approximate="tanh")`` of the output, in the
    GEMM's epilogue on the Triton paths (the 16-bit ``y`` is never written), after it on the torch reference."""
    spec.act_code(activation)  # a ValueError naming the choices, before any work
    if isinstance(x, QuantizedInput):
        return _linear_prequantized(x, packed, route, k_sigma, backend, options or DEFAULT_OPTIONS, activation)
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
    opts = options or DEFAULT_OPTIONS
    be = _resolve(backend, x2)
    if be == "checked" and opts.target is not None:  # an explicit target runs unchecked
        be, tgt, impl = "triton", opts.target, _impl_name(opts.target)
    elif be == "checked":
        impl = _route_impl(x2, packed, route, k_sigma)
        tgt = _variant_target(_kernel_target(x2.device), impl)
        be = "torch" if impl == selfcheck.TORCH else "triton"
    elif be == "triton":
        tgt = opts.target
        impl = _impl_name(tgt or targets.device_target(x2.device))
    if be == "torch":
        y, count = _linear_torch(x2, packed, route, k_sigma, cache, x, reduce_amax)
        y = spec.activate(y, activation)
    else:
        y, count = _linear_triton(x2, packed, route, k_sigma, impl, tgt, opts, cache, x, reduce_amax, activation)
    return y.reshape(*lead, packed.out_features), count


# ---------------------------------------------------------------------- pre-quantized inputs (producers)


@dataclass(frozen=True)
class QuantizedInput:
    """An activation its producer already quantized (``norm_quant``, ``gelu_quant``): the per-token INT8 of
    ``block_hadamard(x, hadamard_block)`` — exactly the operand :func:`linear`'s INT8 routes would build
    from ``x`` — for a tensor ``x`` of shape ``[*lead, K]`` and dtype ``dtype`` that was never written.
    ``act.data`` holds int8 codes (``form`` ``"int8"``: W8A8, or W4A8 without dense activations) or the
    same integers as fp16 (``"int8-dense"``: W4A8's Hopper operand)."""

    act: spec.Int8Tensor
    hadamard_block: int | None
    lead: tuple[int, ...]
    dtype: torch.dtype

    @property
    def form(self) -> str:
        return "int8-dense" if self.act.data.dtype == torch.float16 else "int8"

    @property
    def device(self) -> torch.device:
        return self.act.data.device

    @property
    def rows(self) -> int:
        return self.act.data.shape[0]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.lead, self.act.data.shape[1]))


def operand_form(packed: PackedLinear, route: str, options: KernelOptions | None = None, *,
                 like: torch.Tensor | None = None, rows: int = 0, backend: str = "auto") -> str | None:
    """The pre-quantized operand ``route`` reads on this layer (``"int8"`` / ``"int8-dense"``, a
    :class:`QuantizedInput`'s ``form``), or ``None`` where its activations are not per-token INT8 (NVFP4,
    W4A16) or its weight format is missing — what a producer asks before emitting INT8 for it. With
    ``like`` (an activation of the producer's device and dtype) and ``rows`` under ``backend="auto"``, also
    ``None`` where the route's self-check sent it to the torch reference (a broken kernel then runs exactly
    the reference path, producer included)."""
    if route not in INT8_ROUTES or WEIGHT_FORMAT[route] not in packed.formats:
        return None
    if like is not None and _resolve(backend, like) == "checked":
        if _route_impl(_Rows(like.device, rows, like.dtype), packed, route, None) == selfcheck.TORCH:
            return None
    return _act_form(route, (options or DEFAULT_OPTIONS).dense_activations)


def route_runs_kernel(packed: PackedLinear, route: str, *, like: torch.Tensor, rows: int,
                      backend: str = "auto") -> bool:
    """Whether ``route`` on this layer runs a Triton kernel for a ``rows``-row activation like ``like`` rather than
    the torch reference: the backend, and under ``auto`` the route's self-check (run here on first use) — what a
    producer asks before replacing the model's own ops for a consumer (a broken kernel then runs exactly the
    reference path, producer included)."""
    r = _resolve(backend, like)
    if r == "checked":
        return _route_impl(_Rows(like.device, rows, like.dtype), packed, route, None) != selfcheck.TORCH
    return r == "triton"


@dataclass(frozen=True)
class _Rows:
    """What :func:`_route_impl` reads of an activation: device, row count, dtype."""

    device: torch.device
    rows: int
    dtype: torch.dtype


def _linear_prequantized(x: QuantizedInput, packed: PackedLinear, route: str, k_sigma, backend: str,
                         opts: KernelOptions, activation: str | None = None):
    need = operand_form(packed, route, opts)
    if need is None or need != x.form:
        raise ValueError(f"route {route!r} on this layer reads {need or 'no pre-quantized'} operand; the producer "
                         f"emitted {x.form!r} (it must read the consumer's route first)")
    if x.hadamard_block != packed.hadamard_block or x.shape[-1] != packed.in_features:
        raise ValueError(f"pre-quantized input: Hadamard block {x.hadamard_block} and K={x.shape[-1]}, the layer "
                         f"has {packed.hadamard_block} and K={packed.in_features}")
    if k_sigma is not None:
        raise ValueError("a pre-quantized input carries no outlier count: k_sigma must be None")
    w = packed.weight(WEIGHT_FORMAT[route])
    be = _resolve(backend, x.act.data)
    tgt = opts.target
    if be == "checked":
        impl = _route_impl(x, packed, route, None)
        be = "torch" if impl == selfcheck.TORCH else "triton"
        tgt = tgt or _variant_target(_kernel_target(x.device), impl)
    if be == "torch":
        xq = x.act.data.float() * x.act.scale.float()
        y = xq @ _dense_weight(packed, route).T
        y = spec.activate((y + packed.bias.float() if packed.bias is not None else y).to(x.dtype), activation)
    elif route in (W8A8, W4A8_REQUANT):
        y = gemm_w8a8(x.act, _int8_weight(w, route, tgt), packed.bias, x.dtype, target=tgt, activation=activation)
    else:
        a = DenseAct(x.act.data, "int8", row_scale=x.act.scale) if x.form == "int8-dense" else x.act
        y = gemm_w4(a, w, packed.bias, x.dtype, target=tgt, activation=activation)
    return y.reshape(*x.lead, packed.out_features), None


def producers_supported(x: torch.Tensor, backend: str = "auto") -> bool:
    """Whether the fused producers (:func:`norm_modulate_int8`, :func:`norm_modulate`, :func:`gelu_int8`) run for
    activations like ``x``: the Triton backend (forced, or ``auto`` on a kernel device) and a 16-bit dtype on CUDA (fp32
    also in the interpreter). Elsewhere the model's own ops and :func:`linear`'s quantize run."""
    if not HAVE_TRITON or _resolve(backend, x) == "torch":
        return False
    return x.dtype in (torch.bfloat16, torch.float16) or (x.dtype == torch.float32 and not x.is_cuda)


def _producer_ok(key: tuple, dev: torch.device, problem, backend: str) -> bool:
    """``backend="triton"``: yes; ``auto``: the producer kernel's self-check on ``dev`` (:func:`_checked`)."""
    return backend == "triton" or _checked(dev, key, problem)


def _producer_probe(like: torch.Tensor, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The norm producers' self-check input: two random streams (3 and 17 tokens) of ``like``'s width, device and
    dtype, each with its ``1 + scale`` and ``shift``."""
    k, dev, dt = like.shape[-1], like.device, like.dtype
    g = torch.Generator(device=dev).manual_seed(seed)
    return [tuple(torch.randn(*shape, generator=g, device=dev).to(dt) for shape in ((2, n, k), (2, k), (2, k)))
            for n in (3, 17)]


def norm_modulate_int8(parts, weight, bias, eps: float, hadamard_block: int | None, *, dense: bool = False,
                       backend: str = "auto") -> QuantizedInput | None:
    """CogVideoX's norm + modulate of the streams ``parts`` (``[(x, 1 + scale, shift), ...]``, concatenated
    in that order) as the :class:`QuantizedInput` of the linears it feeds (``norm_quant.norm_modulate``;
    reference ``formats.norm_modulate_int8``), or ``None`` where the kernel does not serve (check
    :func:`producers_supported`; under ``auto`` the kernel is self-checked once per device, K and dtype)."""
    x0 = parts[0][0]
    k, dt = x0.shape[-1], x0.dtype

    def problem():
        probe = _producer_probe(x0, seed=2)
        return (lambda: _deq(_norm_modulate_kernel(probe, weight, bias, eps, hadamard_block)[0]),
                lambda: _deq(spec.norm_modulate_int8(probe, weight, bias, eps, hadamard_block)))

    if not _producer_ok(("norm_modulate_int8", k, dt, hadamard_block), x0.device, problem, backend):
        return None
    q, _ = _norm_modulate_kernel(parts, weight, bias, eps, hadamard_block, dense=dense)
    return QuantizedInput(q, hadamard_block, (x0.shape[0], sum(p[0].shape[1] for p in parts)), dt)


def norm_modulate(parts, weight, bias, eps: float, *, backend: str = "auto") -> torch.Tensor | None:
    """CogVideoX's norm + modulate of the streams ``parts`` (as :func:`norm_modulate_int8`), concatenated, in the
    model dtype ``[B, ΣS_i, K]`` — the same producer kernel writing the 16-bit output instead of codes (one read
    of each stream, one write; diffusers runs LayerNorm, a multiply, an add and the concatenation) for consumers
    that read the 16-bit activation; reference ``formats.norm_modulate`` (a value may differ by one ulp: the
    LayerNorm statistics' summation order). ``None`` where the kernel does not serve (check
    :func:`producers_supported`; under ``auto`` the kernel is self-checked once per device, K and dtype)."""
    x0 = parts[0][0]
    k, dt = x0.shape[-1], x0.dtype

    def problem():
        probe = _producer_probe(x0, seed=3)
        return (lambda: _norm_modulate_kernel(probe, weight, bias, eps, None, codes=False, norm=True)[1],
                lambda: spec.norm_modulate(probe, weight, bias, eps))

    if not _producer_ok(("norm_modulate", k, dt), x0.device, problem, backend):
        return None
    return _norm_modulate_kernel(parts, weight, bias, eps, None, codes=False, norm=True)[1]


def gelu_int8(x: torch.Tensor, hadamard_block: int | None, *, dense: bool = False,
              backend: str = "auto") -> QuantizedInput | None:
    """``gelu(x, approximate="tanh")`` as the :class:`QuantizedInput` of the linear it feeds
    (``gelu_quant.gelu_int8``; reference ``formats.gelu_int8``), or ``None`` where the kernel does not serve.
    Not wired into the engine: slower than GELU + quantize on the H200 (docs/KERNELS.md)."""
    k = x.shape[-1]

    def problem():
        probe = _check_input(19, k, x.dtype, x.device)
        return (lambda: _deq(_gelu_int8_kernel(probe, hadamard_block)),
                lambda: _deq(spec.gelu_int8(probe, hadamard_block)))

    if not _producer_ok(("gelu_int8", k, x.dtype, hadamard_block), x.device, problem, backend):
        return None
    return QuantizedInput(_gelu_int8_kernel(x, hadamard_block, dense=dense), hadamard_block, tuple(x.shape[:-1]),
                          x.dtype)


def gated_residual(x: torch.Tensor, gate: torch.Tensor, y: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """CogVideoX's ``x + gate * y`` (``formats.gated_residual``): one Triton pass where the backend serves
    (forced, or ``auto`` on a kernel device, self-checked once per device and dtype) and the tensors suit
    (``gated_residual.supported``); else PyTorch's two ops. The same values either way."""
    if HAVE_TRITON and _gated_residual_supported(x, gate, y) and _resolve(backend, x) != "torch":
        if backend == "triton" or _checked(x.device, ("gated_residual", x.dtype), lambda: _gated_residual_problem(x)):
            return _gated_residual_kernel(x, gate, y)
    return spec.gated_residual(x, gate, y)


def _gated_residual_problem(like: torch.Tensor):
    g = torch.Generator(device=like.device).manual_seed(3)
    x, y = (torch.randn(2, 2, 37, 96, generator=g, device=like.device) * 4).to(like.dtype).unbind(0)
    gate = torch.randn(2, 1, 96, generator=g, device=like.device).to(like.dtype)
    y = torch.cat([y[:, :5], y], dim=1)[:, 5:]  # strided like the feed-forward's video part
    return (lambda: _gated_residual_kernel(x, gate, y)), (lambda: spec.gated_residual(x, gate, y))


def _deq(q: spec.Int8Tensor) -> torch.Tensor:
    return q.data.float() * q.scale.float()
