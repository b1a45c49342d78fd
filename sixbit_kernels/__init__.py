"""sixbit's Triton kernels (never a top-level ``kernels``: that name is the PyPI package transformers imports).

* ``ops``            — the public surface: ``pack_linear``, ``linear``, ``quantize_act``, ``compute_path``
* ``hadamard_quant`` — fused block-Hadamard + NVFP4 / INT8 activation quantization (+ outlier count)
* ``gemm_w4``        — NVFP4-weight GEMMs (W4A4, W4A8, W4A16), weights decoded per tile or once per call
* ``gemm_w8a8``      — INT8 × INT8 GEMM on the int8 tensor cores
* ``requant``        — NVFP4 weights re-quantized to per-channel INT8 (the ``w4a8_requant`` route's operand)
* ``layernorm``      — LayerNorm over short strided rows (the attention's per-head q/k norm, + rotary)
* ``block_stats``    — the engine's per-block Δ, Γ and delta-change sums in one pass
* ``gated_residual`` — CogVideoX's ``x + gate · y`` in one pass (the fused block forward)
* ``norm_quant``, ``gelu_quant`` — fused producers: CogVideoX's norm + modulate / tanh-GELU emitting the
  INT8 operand of the linears they feed (shared tile quantize: ``rows_int8``)
* ``blackwell``      — native FP4 ``torch._scaled_mm`` path for capability ≥ 10 (unverified)

Importing this package does not import triton; ``sixbit_kernels.ops`` does. See docs/KERNELS.md.
"""

import importlib as _importlib

_SUBMODULES = ("ops", "hadamard_quant", "gemm_w4", "gemm_w8a8", "requant", "layernorm", "block_stats", "gated_residual", "blackwell",
               "norm_quant", "gelu_quant", "rows_int8",
               "attention_fp8")
_SUBMODULES += ("targets", "selfcheck", "aot")  # dispatch by capability, load-time self-check, AOT compiles


def __getattr__(name):  # lazy submodules: ``sixbit_kernels.ops`` without importing triton up front
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
