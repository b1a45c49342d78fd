"""SixBitLinear: a drop-in replacement of ``nn.Linear`` that holds only packed weights.

Swapping is a module replacement (torchao style): :func:`swap_linears` puts a :class:`SixBitLinear` where
each selected ``nn.Linear`` was and returns the originals, which the engine keeps — offloaded to the CPU
by default — so that :func:`restore_linears` can put them back bit for bit.

The route of every call is chosen from outside: the engine sets ``module.route`` before the block runs
(DMPQ decides ``"nvfp4"``/``"int8"``, warm-up and PDR ask for full precision). The layer resolves

* ``"fp16"``  → ``F.linear`` with the original weights: kept on the device (``fp_weights="device"``), or
  kept in (pinned) host memory and copied to the device for that call (``fp_weights="stream"``);
  otherwise (``fp_weights="cpu"``) ``"w4a16"`` (16-bit activations × dequantized 4-bit weights);
* ``"int8"``  → ``"w8a8"`` when the packed weights hold an INT8 copy and the config asks for it;
* everything else goes to ``sixbit_kernels.ops.linear(x, packed, route)``.

A fused producer (``sixbit.fused``) may hand the layer an ``ops.QuantizedInput`` instead of ``x``: the
INT8 operand of its current route, already quantized (:meth:`SixBitLinear.operand_form` says which form the
route reads); the layer then runs the GEMM alone.

The numerics of every route are those of ``sixbit.formats.reference_linear``; the kernels implement them
(Triton on the GPU, the torch reference on the CPU); this module holds no numerics of its own.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn

from sixbit import formats as fmt
from sixbit import routes

__all__ = ["SixBitLinear", "swap_linears", "swap_weight_only", "restore_linears", "nvfp4_packable", "param_bytes",
           "swapped_bytes", "ops", "effective_hadamard_block"]


# ------------------------------------------------------------------------------------- kernel access


def ops():
    """``sixbit_kernels.ops``: ``pack_linear``, ``linear``, ``compute_path`` (the kernels' contract)."""
    global _OPS
    if _OPS is None:
        _OPS = importlib.import_module("sixbit_kernels.ops")
    return _OPS


_OPS = None


# ------------------------------------------------------------------------------------------- module


def effective_hadamard_block(k: int, block: int) -> int | None:
    """The rotation used for a layer of width ``k``: ``block`` reduced to the largest power of two ≥ 16
    dividing ``k`` (``None`` when ``block`` is 0 or no such size exists)."""
    if not block:
        return None
    b = block
    while b >= 16 and k % b:
        b //= 2
    return b if b >= 16 else None


class _NoWeight(AttributeError):
    pass


class SixBitLinear(nn.Module):
    """A linear layer computing from packed 4/8-bit weights; ``route`` is set per call by the engine.

    Holds: ``packed`` (the kernels' PackedLinear: codes, scales, bias), and — only with
    ``fp_weights="device"`` or ``"stream"`` — a reference to the original layer for true FP16 steps (on the
    device, or in host memory). Neither is a registered parameter: ``state_dict()`` of a quantized model does not contain the packed weights
    (sixbit quantizes at load time, it does not save quantized checkpoints).
    """

    def __init__(self, name: str, packed, in_features: int, out_features: int, *,
                 fp_linear: nn.Linear | None = None, host_linear: nn.Linear | None = None,
                 int8_route: str = routes.INT8, backend: str = "auto", k_sigma: float | None = None):
        super().__init__()
        self.name = name
        self.in_features = in_features
        self.out_features = out_features
        self.packed = packed
        self.int8_route = int8_route
        self.backend = backend
        self.k_sigma = k_sigma
        object.__setattr__(self, "_fp", fp_linear)  # not a registered submodule
        object.__setattr__(self, "_host", host_linear)  # the original in host memory ("stream")
        self.route = routes.NVFP4
        #: (outlier count tensor, element count) of the last call's input, when k_sigma is set
        self.last_outliers: tuple[torch.Tensor, int] | None = None
        #: the route the last call actually ran (after resolution)
        self.last_route: str | None = None
        #: optional ``fn(module, x, y)`` called after every forward (calibration)
        self.observer = None
        #: ``sixbit_kernels.ops.ActCache`` shared with the layers that may read the same input (set by
        #: :func:`swap_linears`: one per swap, so Q, K and V quantize their common input once per route)
        self.act_cache = None
        #: ``fn(bits)``: MAX all-reduce of the nvfp4 route's activation amax (``sixbit.parallel``), else None
        self.reduce_amax = None

    @property
    def has_fp_weights(self) -> bool:
        """True FP16 steps possible: the original weights are on the device or streamed from the host."""
        return self._fp is not None or self._host is not None

    def __getattr__(self, name):
        # fuse_qkv_projections and friends read .weight: fail with a clear message (an AttributeError,
        # so hasattr(module, "weight") stays False)
        if name == "weight":
            raise _NoWeight(
                f"{self.name}: a SixBitLinear holds only packed weights. Fuse QKV projections "
                "(pipe.fuse_qkv_projections()) before sixbit.apply, or call handle.remove() first."
            )
        return super().__getattr__(name)

    def resolve(self, route: str) -> str:
        """The route this layer runs for a decided ``route`` (``sixbit.routes.resolve``)."""
        return routes.resolve(route, has_fp_weights=self.has_fp_weights, int8_route=self.int8_route)

    def operand_form(self, like: torch.Tensor, rows: int) -> str | None:
        """The pre-quantized operand (``ops.QuantizedInput.form``) this layer's current route reads for a
        ``rows``-row input like ``like`` — what a fused producer asks before emitting INT8 for it (after the
        engine set ``route``) — or ``None`` where it must get the 16-bit activation: a non-INT8 route, the
        torch backend or a route the self-check sent to it, an outlier count to take (``k_sigma``) or an
        observer to feed."""
        if self.backend == "torch" or self.k_sigma is not None or self.observer is not None:
            return None
        return ops().operand_form(self.packed, self.resolve(self.route), like=like, rows=rows, backend=self.backend)

    def forward(self, x, activation: str | None = None) -> torch.Tensor:
        """``x``: the activation, or an ``ops.QuantizedInput`` a fused producer emitted for this route.
        ``activation`` (``"gelu_tanh"``): return ``F.gelu(linear(x), approximate="tanh")`` — in the GEMM's
        epilogue where a kernel runs (``fused.GeluEpilogueHook``), after it otherwise (the 16-bit route, the
        torch reference, and whenever an observer must see the linear's own output)."""
        route = self.resolve(self.route)
        self.last_route = route
        fused_act = None if self.observer is not None else activation
        if isinstance(x, ops().QuantizedInput):
            self.last_outliers = None
            return ops().linear(x, self.packed, route, backend=self.backend, activation=activation)[0]
        if route == routes.FP16:
            # "device": .to() is a no-op; "stream": this layer's original weights are copied for this call
            # (from pinned memory: asynchronous on CUDA)
            src = self._fp if self._fp is not None else self._host
            w = src.weight.to(x.device, non_blocking=True)
            b = None if src.bias is None else src.bias.to(x.device, non_blocking=True)
            y = F.linear(x, w, b)
            count = fmt.outlier_count(x, self.k_sigma)[0] if self.k_sigma is not None else None
            fused_act = None
        else:
            y, count = ops().linear(x, self.packed, route, k_sigma=self.k_sigma, backend=self.backend,
                                    cache=self.act_cache, reduce_amax=self.reduce_amax, activation=fused_act)
        self.last_outliers = None if count is None else (count, x.numel())
        if self.observer is not None:
            self.observer(self, x, y)
        return y if fused_act == activation else fmt.activate(y, activation)

    def _apply(self, fn, recurse=True):
        # move the packed weights (and a device-resident original) with the module; never cast them
        super()._apply(fn, recurse)
        cur = self.packed.device
        probe = fn(torch.empty(0, device=cur))
        if probe.device != cur:
            self.packed = self.packed.to(probe.device)
            if self._fp is not None:
                self._fp.to(probe.device)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"packed={getattr(self.packed, 'formats', '?')}, bytes={self.packed.nbytes}")


# ---------------------------------------------------------------------------------------- swapping


def int8_route_on(int8_route: str, device, backend: str = "auto") -> str:
    """``SixBitConfig.int8_route`` as it runs on ``device`` with ``backend`` (``routes.int8_route_for``: ``"auto"``
    is ``w4a8_requant`` where sixbit's GPU kernels run and the backend is not ``"torch"``, else ``int8``)."""
    if int8_route != routes.AUTO:
        return int8_route
    return routes.int8_route_for(int8_route, backend != "torch" and ops().int8_tensor_cores(device))


def _get_parent(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (root.get_submodule(parent_name) if parent_name else root), child


def swap_linears(root: nn.Module, names: list[str], *, formats_: tuple[str, ...], hadamard_block: int,
                 fp_weights: str, int8_route: str, backend: str, k_sigma: float | None):
    """Replace ``root.<name>`` (each an ``nn.Linear``) by a SixBitLinear.

    Returns ``(new_modules, originals)``: ``originals[name] = (module, device)``; with
    ``fp_weights="cpu"`` or ``"stream"`` the original module has been moved to the CPU (packing happens
    first, on the layer's own device); ``"stream"`` also pins it when CUDA is available and hands it to
    the SixBitLinear for true FP16 steps.
    """
    new, originals = {}, {}
    cache = ops().ActCache()
    for name in names:
        parent, child = _get_parent(root, name)
        lin = getattr(parent, child)
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"{name} is a {type(lin).__name__}, expected nn.Linear")
        device = lin.weight.device
        hb = effective_hadamard_block(lin.in_features, hadamard_block)
        with torch.no_grad():
            packed = ops().pack_linear(lin.weight, lin.bias, formats=formats_, hadamard_block=hb)
        if fp_weights in ("cpu", "stream"):
            lin.to("cpu")
            if fp_weights == "stream" and torch.cuda.is_available():
                for prm in lin.parameters():
                    prm.data = prm.data.pin_memory()
        mod = SixBitLinear(name, packed, lin.in_features, lin.out_features,
                           fp_linear=lin if fp_weights == "device" else None,
                           host_linear=lin if fp_weights == "stream" else None,
                           int8_route=int8_route, backend=backend, k_sigma=k_sigma)
        mod.act_cache = cache
        mod.train(lin.training)
        setattr(parent, child, mod)
        originals[name] = (lin, device)
        new[name] = mod
    return new, originals


def nvfp4_packable(lin: nn.Linear) -> bool:
    """NVFP4 packs the input dimension in blocks of ``FP4_BLOCK`` (16)."""
    return lin.in_features % fmt.FP4_BLOCK == 0


def swap_weight_only(root: nn.Module, names: list[str], *, fp_weights: str, backend: str):
    """:func:`swap_linears` to weight-only NVFP4: route ``w4a16`` fixed (16-bit activations × the 4-bit
    weights, never routed by DMPQ), no Hadamard rotation, no outlier counting. Same return value."""
    new, originals = swap_linears(root, names, formats_=("nvfp4",), hadamard_block=0, fp_weights=fp_weights,
                                  int8_route=routes.INT8, backend=backend, k_sigma=None)
    for m in new.values():
        m.route = routes.W4A16
    return new, originals


def param_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s parameters."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def swapped_bytes(modules, originals: dict) -> tuple[int, int]:
    """(packed bytes the SixBitLinears ``modules`` keep, bytes their originals held): ``originals`` as
    returned by :func:`swap_linears`."""
    return (sum(int(m.packed.nbytes) for m in modules),
            sum(param_bytes(lin) for lin, _ in originals.values()))


def restore_linears(root: nn.Module, originals: dict) -> None:
    """Undo :func:`swap_linears`: put each original back, on the device its replacement is on now (the
    model may have been moved since), in the dtype it had when it was swapped out."""
    for name, (lin, device) in originals.items():
        parent, child = _get_parent(root, name)
        current = getattr(parent, child)
        if isinstance(current, SixBitLinear):
            device = current.packed.device
        lin.to(device)
        setattr(parent, child, lin)
