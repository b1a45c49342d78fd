"""SixBitLinear: a drop-in replacement of ``nn.Linear`` that holds only packed weights.

Swapping is a module replacement (torchao style): :func:`swap_linears` puts a :class:`SixBitLinear` where
each selected ``nn.Linear`` was and returns the originals, which the engine keeps — offloaded to the CPU
by default — so that :func:`restore_linears` can put them back bit for bit.

The route of every call is chosen from outside: the engine sets ``module.route`` before the block runs
(DMPQ decides ``"nvfp4"``/``"int8"``, warm-up and PDR ask for full precision). The layer resolves

* ``"fp16"``  → ``F.linear`` with the original weights when they are kept on the device
  (``fp_weights="device"``), otherwise ``"w4a16"`` (16-bit activations × dequantized 4-bit weights);
* ``"int8"``  → ``"w8a8"`` when the packed weights hold an INT8 copy and the config asks for it;
* everything else goes to ``sixbit_kernels.ops.linear(x, packed, route)``.

The numerics of every route are those of ``sixbit.formats.reference_linear``; the kernels implement them
(Triton on the GPU, the torch reference on the CPU). Until the kernels package provides ``ops``, a
minimal fallback here packs with ``fmt.quantize_weight`` and multiplies dequantized values — it
exists only so the engine can be developed in parallel and disappears once ``ops`` lands.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sixbit import formats as fmt

__all__ = ["SixBitLinear", "swap_linears", "restore_linears", "ops", "effective_hadamard_block", "FP_ROUTES"]

#: routes that compute with unquantized activations
FP_ROUTES = ("fp16", "w4a16")


# ------------------------------------------------------------------------------------- kernel access


def ops():
    """``sixbit_kernels.ops`` if the kernels package provides it, else the interim fallback below."""
    global _OPS
    if _OPS is None:
        try:
            from sixbit._kernels import kernels  # noqa: F401  (registers ``sixbit_kernels``)

            _OPS = importlib.import_module("sixbit_kernels.ops")
        except ModuleNotFoundError:
            _OPS = _FallbackOps
    return _OPS


_OPS = None


@dataclass
class _FallbackPacked:
    w4: fmt.NVFP4Tensor | None
    w8: fmt.Int8Tensor | None
    bias: torch.Tensor | None
    hadamard_block: int | None
    in_features: int
    out_features: int

    @property
    def formats(self) -> tuple[str, ...]:
        return tuple(n for n, w in (("nvfp4", self.w4), ("int8", self.w8)) if w is not None)

    @property
    def nbytes(self) -> int:
        n = sum(w.nbytes for w in (self.w4, self.w8) if w is not None)
        return n + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())

    def to(self, device) -> _FallbackPacked:
        return _FallbackPacked(
            None if self.w4 is None else self.w4.to(device),
            None if self.w8 is None else self.w8.to(device),
            None if self.bias is None else self.bias.to(device),
            self.hadamard_block, self.in_features, self.out_features,
        )


class _FallbackOps:
    """Interim stand-in for ``sixbit_kernels.ops`` with the same contract (torch reference numerics)."""

    @staticmethod
    def pack_linear(weight, bias, formats=("nvfp4",), hadamard_block=None):
        fmts = formats
        w4 = fmt.quantize_weight(weight.detach(), "nvfp4", hadamard_block) if "nvfp4" in fmts else None
        w8 = fmt.quantize_weight(weight.detach(), "int8", hadamard_block) if "int8" in fmts else None
        b = None if bias is None else bias.detach().clone()
        return _FallbackPacked(w4, w8, b, hadamard_block, weight.shape[1], weight.shape[0])

    @staticmethod
    def linear(x, packed, route, *, k_sigma=None, backend="auto"):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        count = fmt.outlier_count(x2, k_sigma)[0] if k_sigma is not None else None
        hb = packed.hadamard_block
        xr = fmt.block_hadamard(x2, hb) if hb else x2.float()
        w = packed.w8 if route == "w8a8" else packed.w4
        if w is None:
            raise ValueError(f"route {route!r} needs weight format {'int8' if route == 'w8a8' else 'nvfp4'}, "
                             f"packed holds {packed.formats}")
        if route == "nvfp4":
            xq = fmt.quantize_nvfp4(xr, check_finite=False).dequantize(torch.float32)
        elif route in ("int8", "w8a8"):
            xq = fmt.quantize_int8(xr, check_finite=False).dequantize(torch.float32)
        elif route == "w4a16":
            xq = xr
        else:
            raise ValueError(f"unknown route {route!r}")
        y = xq @ w.dequantize(torch.float32).T
        if packed.bias is not None:
            y = y + packed.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], packed.out_features), count

    @staticmethod
    def compute_path(device) -> str:
        return "cpu-reference" if torch.device(device).type == "cpu" else "cuda-reference"


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
    ``fp_weights="device"`` — a reference to the original layer for true FP16 steps. Neither is a
    registered parameter: ``state_dict()`` of a quantized model does not contain the packed weights
    (sixbit quantizes at load time, it does not save quantized checkpoints).
    """

    def __init__(self, name: str, packed, in_features: int, out_features: int, *,
                 fp_linear: nn.Linear | None = None, int8_route: str = "int8", backend: str = "auto",
                 k_sigma: float | None = None):
        super().__init__()
        self.name = name
        self.in_features = in_features
        self.out_features = out_features
        self.packed = packed
        self.int8_route = int8_route
        self.backend = backend
        self.k_sigma = k_sigma
        object.__setattr__(self, "_fp", fp_linear)  # not a registered submodule
        self.route = "nvfp4"
        #: (outlier count tensor, element count) of the last call's input, when k_sigma is set
        self.last_outliers: tuple[torch.Tensor, int] | None = None
        #: the route the last call actually ran (after resolution)
        self.last_route: str | None = None
        #: optional ``fn(module, x, y)`` called after every forward (calibration)
        self.observer = None

    @property
    def has_fp_weights(self) -> bool:
        return self._fp is not None

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
        if route == "fp16":
            return "fp16" if self._fp is not None else "w4a16"
        if route == "int8" and self.int8_route == "w8a8":
            return "w8a8"
        return route

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        route = self.resolve(self.route)
        self.last_route = route
        if route == "fp16":
            y = F.linear(x, self._fp.weight, self._fp.bias)
            count = fmt.outlier_count(x, self.k_sigma)[0] if self.k_sigma is not None else None
        else:
            y, count = ops().linear(x, self.packed, route, k_sigma=self.k_sigma, backend=self.backend)
        self.last_outliers = None if count is None else (count, x.numel())
        if self.observer is not None:
            self.observer(self, x, y)
        return y

    def _apply(self, fn, recurse=True):
        # move the packed weights (and a device-resident original) with the module; never cast them
        super()._apply(fn, recurse)
        cur = _packed_device(self.packed)
        probe = fn(torch.empty(0, device=cur))
        if probe.device != cur:
            self.packed = self.packed.to(probe.device)
            if self._fp is not None:
                self._fp.to(probe.device)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"packed={getattr(self.packed, 'formats', '?')}, bytes={self.packed.nbytes}")


def _packed_device(packed) -> torch.device:
    dev = getattr(packed, "device", None)
    if dev is not None:
        return torch.device(dev)
    for v in vars(packed).values():
        if isinstance(v, torch.Tensor):
            return v.device
        for t in vars(v).values() if hasattr(v, "__dict__") else ():
            if isinstance(t, torch.Tensor):
                return t.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------- swapping


def _get_parent(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (root.get_submodule(parent_name) if parent_name else root), child


def swap_linears(root: nn.Module, names: list[str], *, formats_: tuple[str, ...], hadamard_block: int,
                 fp_weights: str, int8_route: str, backend: str, k_sigma: float | None):
    """Replace ``root.<name>`` (each an ``nn.Linear``) by a SixBitLinear.

    Returns ``(new_modules, originals)``: ``originals[name] = (module, device)``; with
    ``fp_weights="cpu"`` the original module has been moved to the CPU (packing happens first, on the
    layer's own device).
    """
    new, originals = {}, {}
    for name in names:
        parent, child = _get_parent(root, name)
        lin = getattr(parent, child)
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"{name} is a {type(lin).__name__}, expected nn.Linear")
        device = lin.weight.device
        hb = effective_hadamard_block(lin.in_features, hadamard_block)
        with torch.no_grad():
            packed = ops().pack_linear(lin.weight, lin.bias, formats=formats_, hadamard_block=hb)
        keep = lin if fp_weights == "device" else None
        mod = SixBitLinear(name, packed, lin.in_features, lin.out_features, fp_linear=keep,
                           int8_route=int8_route, backend=backend, k_sigma=k_sigma)
        mod.train(lin.training)
        setattr(parent, child, mod)
        if fp_weights == "cpu":
            lin.to("cpu")
        originals[name] = (lin, device)
        new[name] = mod
    return new, originals


def restore_linears(root: nn.Module, originals: dict) -> None:
    """Undo :func:`swap_linears`: move each original back to its device and put it in place."""
    for name, (lin, device) in originals.items():
        parent, child = _get_parent(root, name)
        lin.to(device)
        setattr(parent, child, lin)
