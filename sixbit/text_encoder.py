"""Weight-only 4-bit storage for a pipeline's text encoder — memory engineering around the method.

CogVideoX's text encoder (T5-XXL encoder, 4.8 B parameters, 9.5 GB in bf16) is larger than the 2B
transformer and runs once per prompt. Its activations are never quantized here: each linear keeps NVFP4
weights (packed codes + e4m3 block scales, 4.5 bits per parameter) and computes at 16 bits (route
``w4a16``: 16-bit activations × the dequantized weights; on the CPU the torch reference). This is not part
of 6Bit-Diffusion; it is what a whole-pipeline memory figure needs besides the transformer.

    te = sixbit.quantize_text_encoder(pipe)      # packs where the text encoder is (CPU is fine: ~1 s per
    pipe.text_encoder.to("cuda")                 #   40 M parameters on 2 cores), then move it
    te.memory()                                  # packed / original / remaining bytes
    te.remove()                                  # the original layers, bit for bit

Which layers: every ``nn.Linear`` whose input width is a multiple of 16 (NVFP4 blocks), except the
feed-forward output ``wo`` of T5-family encoders: transformers' T5 feed-forward reads ``wo.weight.dtype``
to decide a cast (it keeps ``wo`` in fp32 for fp16 overflow), and a packed layer has no ``weight``. For
T5-XXL that leaves 24 % of the parameters 16-bit (the ``wo`` layers and the token embedding): 8.87 →
4.02 GiB, 2.21× (counted on a meta-device T5-XXL; NVFP4 is 0.5625 bytes per parameter) rather than 3.5×. The originals go to the CPU (for ``remove()``).

Measured cost on sixbit-mini's small T5 (``benchmarks/results/mini_text_encoder_4bit.json``): prompt
adherence 90.8% in-grammar, 90.5% held-out, against 91.8% / 91.7% with its fp32 encoder. Not measured on
T5-XXL.
"""

from __future__ import annotations

from torch import nn

from sixbit.linear import (
    SixBitLinear,
    nvfp4_packable,
    param_bytes,
    restore_linears,
    swap_weight_only,
    swapped_bytes,
)

__all__ = ["TextEncoderHandle", "quantize_text_encoder", "text_encoder_linears"]


def text_encoder_linears(module: nn.Module) -> list[str]:
    """Names of the linears :func:`quantize_text_encoder` packs (see the module docstring)."""
    t5 = "T5" in type(module).__name__
    return [n for n, m in module.named_modules()
            if isinstance(m, nn.Linear) and nvfp4_packable(m) and not (t5 and n.rpartition(".")[2] == "wo")]


class TextEncoderHandle:
    """What :func:`quantize_text_encoder` returns: the packed layers, their byte counts, ``remove()``."""

    def __init__(self, module: nn.Module, modules: dict[str, SixBitLinear], originals: dict):
        self.module = module
        self.modules = modules
        self._originals = originals
        self.removed = False

    def memory(self) -> dict[str, int]:
        """``packed_bytes`` (what the packed layers keep resident), ``original_bytes`` (what they held),
        ``other_bytes`` (the encoder's remaining parameters: embeddings, norms, ``wo``)."""
        packed, orig = swapped_bytes(self.modules.values(), self._originals)
        return {"packed_bytes": packed, "original_bytes": orig, "other_bytes": param_bytes(self.module)}

    def remove(self) -> None:
        """Put the original layers back (on the device the encoder is on now)."""
        if self.removed:
            return
        restore_linears(self.module, self._originals)
        self.modules, self._originals = {}, {}
        self.removed = True

    def __enter__(self) -> TextEncoderHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def quantize_text_encoder(pipe_or_module, *, backend: str = "auto") -> TextEncoderHandle:
    """Store the text encoder's linears as NVFP4, computing at 16 bits (see the module docstring).
    ``pipe_or_module``: a pipeline with a ``text_encoder`` or the encoder module itself."""
    module = getattr(pipe_or_module, "text_encoder", pipe_or_module)
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected a pipeline with a text_encoder or an nn.Module, got {type(pipe_or_module).__name__}")
    if any(isinstance(m, SixBitLinear) for m in module.modules()):
        raise ValueError("this text encoder is already quantized: remove() the earlier handle first")
    new, originals = swap_weight_only(module, text_encoder_linears(module), fp_weights="cpu", backend=backend)
    return TextEncoderHandle(module, new, originals)
