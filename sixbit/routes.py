"""The route table: every name, letter, display name and bit count of the ways a linear layer computes.

A *route* is how one routed linear layer computes one call. Every module reads the vocabulary from here
(the engine, the rules, the layer, the trace, schedules, the policy, calibration and the kernels'
``sixbit_kernels.ops``); this module imports nothing from sixbit, so the kernels can read it without
depending on the method (the import direction stays: routes ← formats ← kernels ← linear ← engine).

============  =======  =======  ========  =======  ================================================
route         trace    letter   act bits  weights  what it computes
============  =======  =======  ========  =======  ================================================
nvfp4         nvfp4    ``n``    4.5       nvfp4    W4A4: NVFP4 activations × NVFP4 weights
int8          int8     ``i``    8         nvfp4    W4A8: per-token INT8 activations × NVFP4 weights
w8a8          int8     —        8         int8     INT8 × INT8 (Hopper's int8 tensor cores)
w4a8_requant  int8     —        8         nvfp4    W4A8 on the int8 tensor cores: the NVFP4 weight
                                                   re-quantized to per-channel INT8 for each call
w4a16         fp16     —        16        nvfp4    16-bit activations × the dequantized NVFP4 weights
fp16          fp16     ``f``    16        —        the original layer (its 16-bit weights)
============  =======  =======  ========  =======  ================================================

* *trace*: the trace reports a route by its activation precision (its display name); the summary counts
  those three plus ``skipped``. NVFP4's 4.5 bits include its e4m3 scale per 16 elements.
* *letter*: a recorded :class:`~sixbit.tdc.SkipSchedule` stores each computed cell's routes as letters,
  one per routed linear (display routes only).
* *weights*: the packed weight format the kernel reads (``sixbit_kernels.ops.linear`` serves exactly the
  routes that have one); ``fp16`` needs the original layer instead.

The route called ``fp16`` ("full precision": warm-up, PDR, quantization off) runs as ``w4a16`` on a layer
that no longer holds its original weights (``fp_weights="cpu"``, the default), and a DMPQ ``int8``
decision runs as ``w8a8`` with ``int8_route="w8a8"`` (or ``w4a8_requant`` with ``int8_route="w4a8_requant"``):
:func:`resolve`. Either way the trace shows what the decision asked for, by activation precision:
``display(resolve(r)) == display(r)``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Route", "TABLE", "ROUTES", "NVFP4", "INT8", "W8A8", "W4A8_REQUANT", "INT8_ROUTES", "W4A16", "FP16",
           "SKIPPED", "KERNEL_ROUTES", "AUTO", "INT8_ROUTE_CHOICES", "int8_route_for",
           "WEIGHT_FORMAT", "DISPLAY_ROUTES", "TRACE_ROUTES", "BITS", "LETTERS", "FROM_LETTER", "STATIC",
           "display", "resolve", "nvfp4_as_int8"]


@dataclass(frozen=True)
class Route:
    name: str
    display: str  #: the trace's name: activation precision
    act_bits: float  #: activation bits per element (NVFP4 counts its block scales)
    weights: str | None  #: packed weight format the kernel reads; None: the original layer
    letter: str | None = None  #: skip-schedule letter (display routes only)


NVFP4, INT8, W8A8, W4A16, FP16 = "nvfp4", "int8", "w8a8", "w4a16", "fp16"
#: W4A8 on the int8 tensor cores: 4-bit weights resident, re-quantized to per-channel INT8 for each call
#: (``formats.requantize_int8``): one more rounding of the weight than ``int8``, none of ``w8a8``'s 8-bit copies
W4A8_REQUANT = "w4a8_requant"
#: the trace's name of a block evaluation that reused its cached delta
SKIPPED = "skipped"

TABLE: dict[str, Route] = {r.name: r for r in (
    Route(NVFP4, NVFP4, 4.5, "nvfp4", "n"),
    Route(INT8, INT8, 8.0, "nvfp4", "i"),
    Route(W8A8, INT8, 8.0, "int8"),
    Route(W4A8_REQUANT, INT8, 8.0, "nvfp4"),
    Route(W4A16, FP16, 16.0, "nvfp4"),
    Route(FP16, FP16, 16.0, None, "f"),
)}
#: every route name (``formats.reference_linear`` defines each one's numerics)
ROUTES = tuple(TABLE)
#: the routes ``sixbit_kernels.ops.linear`` serves, and the packed weight format each reads
KERNEL_ROUTES = tuple(r.name for r in TABLE.values() if r.weights is not None)
WEIGHT_FORMAT = {r.name: r.weights for r in TABLE.values() if r.weights is not None}
#: what the trace reports (activation precision), and with ``skipped`` what its summary counts
DISPLAY_ROUTES = tuple(r.name for r in TABLE.values() if r.display == r.name)
TRACE_ROUTES = (*DISPLAY_ROUTES, SKIPPED)
#: activation bits of each display route: the trace's ``avg_act_bits`` and the policy's τ-for-bits table
BITS = {r: TABLE[r].act_bits for r in DISPLAY_ROUTES}
#: skip-schedule letters
LETTERS = {r.name: r.letter for r in TABLE.values() if r.letter is not None}
FROM_LETTER = {v: k for k, v in LETTERS.items()}
#: the routes whose activations are per-token INT8 (the one operand a fused producer can emit), and what an
#: INT8 decision can run (``SixBitConfig.int8_route``)
INT8_ROUTES = (INT8, W8A8, W4A8_REQUANT)
#: ``SixBitConfig.int8_route``'s device-dependent choice (:func:`int8_route_for`)
AUTO = "auto"
INT8_ROUTE_CHOICES = (*INT8_ROUTES, AUTO)
#: the static baselines: quantization mode (``SixBitConfig.quant``) → the one route of every layer
STATIC = {"w4a4": NVFP4, "w4a8": INT8, "w8a8": W8A8}


def display(route: str) -> str:
    """The trace's name of ``route`` (its activation precision); ``skipped`` stays ``skipped``."""
    return route if route == SKIPPED else TABLE[route].display


def resolve(route: str, *, has_fp_weights: bool, int8_route: str = INT8) -> str:
    """The route a layer actually runs for a decided ``route``: ``fp16`` without the original weights on
    hand is ``w4a16``; ``int8`` is ``int8_route`` (one of :data:`INT8_ROUTES`)."""
    if route == FP16:
        return FP16 if has_fp_weights else W4A16
    if route == INT8:
        return int8_route
    return route


def int8_route_for(int8_route: str, kernels: bool) -> str:
    """The INT8 route ``int8_route`` names on a device: ``"auto"`` is ``w4a8_requant`` where sixbit's GPU kernels
    run (``kernels``: a CUDA device of capability ≥ 8.0 and a backend that is not ``"torch"`` — int8 tensor cores,
    on which the re-quantized weight multiplies at twice the 16-bit rate) and ``int8`` elsewhere (the CPU and the
    torch reference, where W4A8 costs the same and needs no second rounding of the weight); any other name is
    itself."""
    if int8_route == AUTO:
        return W4A8_REQUANT if kernels else INT8
    return int8_route


def nvfp4_as_int8(nvfp4_route: str, int8_route: str, native_fp4: bool) -> bool:
    """Whether an NVFP4 decision runs the INT8 route (``SixBitConfig.nvfp4_route``): ``"int8"`` always;
    ``"auto"`` when INT8 decisions run on the int8 tensor cores (``w8a8``, or ``w4a8_requant`` from the resident
    4-bit weights) on a device without FP4 tensor cores, where W4A4 is a 16-bit-rate GEMM behind a slower quantize
    pass than INT8's — for more error."""
    if nvfp4_route == "auto":
        return int8_route in (W8A8, W4A8_REQUANT) and not native_fp4
    return nvfp4_route == INT8
