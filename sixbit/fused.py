"""Quantize fused into its producer: CogVideoX's norm + modulate emits the INT8 operand of the linears it feeds.

Engineering, not the method (config ``fused_producers``, default on; the Triton backend only). In a
CogVideoX block, ``norm1`` (``CogVideoXLayerNormZero``: LayerNorm, ``· (1 + scale)``, ``+ shift``, for the
video and the text stream) feeds only to_q/to_k/to_v — through the attention processor's ``torch.cat([text;
video])`` — and ``norm2`` feeds only ff.net.0.proj, through the same concatenation. When every one of
those consumers runs an INT8-activation route this step (``w8a8``, or W4A8's ``int8``; read from each
``SixBitLinear`` after the engine's block hook set the routes — :meth:`SixBitLinear.operand_form`), the
16-bit norm output is never needed: ``ops.norm_modulate_int8`` (``sixbit_kernels/norm_quant.py``) reads each
stream once and writes the per-token INT8 codes of the rotated ``[text; video]`` rows, and the linears take
that ``ops.QuantizedInput`` instead of a tensor (their GEMM alone runs). When the consumers are all on
quantized routes but do not read one INT8 operand (an NVFP4 or W4A16 route among them, an outlier count to
take), the same kernel writes the 16-bit ``[text; video]`` output instead (``ops.norm_modulate``: one pass where
diffusers runs LayerNorm, a multiply, an add and the concatenation; a value may differ from diffusers' by one
ulp of the model dtype — the LayerNorm statistics' summation order) and the linears quantize it as usual. A
consumer on the 16-bit route with its original weights (DMPQ's full-precision steps and PDR's refreshes where
those are kept; without them the route resolves to W4A16), an observer, the torch backend or the CPU: the
block's own ops run, unchanged.

Measured on the H200 at 2B shapes (``benchmarks/results/fused_quant_h200.md``, the kernel before it loaded
its per-column operands once per program): diffusers' norm + modulate + concatenation + sixbit's INT8
quantize 0.653 ms per call, fused 0.268 ms — two calls per block; one W8A8 block 16.82 → 15.96 ms, 25.8 ms
per computed step. Model dims up to :data:`MAX_DIM` are fused (CogVideoX-5B's 3072 included; its timing:
``python -m benchmarks fused_quant --model 5b``). The GELU → INT8 kernel (``sixbit_kernels/gelu_quant.py``) measured slower than GELU + quantize
(1.05 vs 0.55 ms) and is not wired (docs/KERNELS.md).

:class:`FusedProducersHook` is a ``diffusers.hooks.ModelHook`` on each block, registered *inside* the
engine's block hook (before it), so it runs after the routes are set; its forward is
``CogVideoXBlock.forward`` (diffusers 0.42) with the producers swapped where they apply. The attention after
the projections is the fused processor's (``FusedQKNormRopeProcessor.attend_projected``): norm1 is fused
only where that processor takes the call. Where the self-check sent a consumer's route to the torch
reference, nothing is fused for it (a broken GEMM then runs exactly the reference path).

The block's four gated residuals (``hidden + gate · out`` per stream, after the attention and after the
feed-forward) run as one Triton pass each (``ops.gated_residual``, bit for bit diffusers' two ops) on every
route (H200: 0.104 ms per 2B video-stream call against PyTorch's 0.279; docs/KERNELS.md "Session 28").

:class:`GeluEpilogueHook` (config ``gelu_epilogue``, default on; on each diffusers ``GELU(approximate="tanh")`` whose
projection is a ``SixBitLinear``: CogVideoX's and Wan's ``ff.net.0``) runs the GELU in the projection's GEMM epilogue
(``SixBitLinear.forward(x, activation="gelu_tanh")``): the GEMM writes ``gelu(y)`` instead of ``y`` and PyTorch's
GELU pass over ``[M, 4·dim]`` (a read and a write of 0.55 GB per 2B block) goes. The 16-bit route, the torch
reference and an observed layer apply PyTorch's GELU after the linear instead — the same function.
"""

from __future__ import annotations

import torch
from diffusers.hooks.hooks import ModelHook
from torch import nn

from sixbit.attention import FusedQKNormRopeProcessor
from sixbit.linear import SixBitLinear, ops
from sixbit.routes import FP16

__all__ = ["FUSED_HOOK", "GELU_HOOK", "MAX_DIM", "SIXTEEN_BIT", "FusedProducersHook", "GeluEpilogueHook", "applies", "common_form",
           "gelu_epilogue_applies"]

FUSED_HOOK = "sixbit_fused_producers"
GELU_HOOK = "sixbit_gelu_epilogue"
#: widest model dim fused: a token in one register step of at most 64 chunks of 64 (2B's 1920: two tokens
#: per step, measured on the H200; 5B's 3072 and up to 4096: one token per step, ``norm_quant.default_warps``);
#: wider models run the block's own forward
MAX_DIM = 4096


def applies(block: nn.Module) -> bool:
    """A block of the shape the fused forward reproduces: diffusers' ``CogVideoXBlock`` with its two
    ``CogVideoXLayerNormZero`` norms and a FeedForward whose first module is a GELU projection."""
    if type(block).__name__ != "CogVideoXBlock":
        return False
    net = getattr(getattr(block, "ff", None), "net", None)
    return (net is not None and type(net[0]).__name__ == "GELU" and hasattr(net[0], "proj")
            and type(block.norm1).__name__ == type(block.norm2).__name__ == "CogVideoXLayerNormZero")


#: the producer's form where its consumers read the 16-bit activation (``ops.norm_modulate``)
SIXTEEN_BIT = ("16-bit", None)


def common_form(layers, like: torch.Tensor, rows: int) -> tuple[str, int | None] | None:
    """What the producer emits for ``layers`` this step, for a ``rows``-row input like ``like``: (operand form,
    Hadamard block) when every layer reads the same INT8 operand; :data:`SIXTEEN_BIT` when every layer is a
    ``SixBitLinear`` on a quantized route but they do not all read one INT8 operand (an NVFP4 / W4A16 route, an
    outlier count to take: the 16-bit output, written in one pass); ``None`` otherwise — a layer that is not a
    ``SixBitLinear``, one on the 16-bit route with its original weights (those full-precision steps stay diffusers'
    own ops, bit for bit; a 16-bit decision without them resolves to W4A16, a quantized route), one
    whose route runs the torch reference (the torch backend, or a kernel its self-check refused: then the block is
    exactly the reference path) or feeding an observer (calibration sees the model's own values)."""
    forms = set()
    for m in layers:
        if not isinstance(m, SixBitLinear) or m.observer is not None:
            return None
        route = m.resolve(m.route)
        if route == FP16 or not ops().route_runs_kernel(m.packed, route, like=like, rows=rows, backend=m.backend):
            return None
        forms.add((m.operand_form(like, rows), m.packed.hadamard_block))
    form, block = forms.pop() if len(forms) == 1 else (None, None)
    return SIXTEEN_BIT if form is None else (form, block)  # block None: unrotated layers, still INT8 codes


class FusedProducersHook(ModelHook):
    """On one CogVideoX block: the norm producers emit INT8 where the consumers' routes read it."""

    def __init__(self, backend: str, attention=None, capture=None):
        super().__init__()
        self.backend = backend
        #: the block hook when ``tdc_scope="attention"`` (``sixbit.hooks.BlockHook.attend`` captures or reuses the
        #: self-attention's output, also on the fused path; a reused attention needs no fused operand)
        self.attention = attention
        #: ``tdc_regate``: ``capture(part, output)`` (``BlockHook.capture``) for the self-attention's output where the
        #: fused path computes it without calling the attention module (its ``PartHook`` does not see that call)
        self.capture = capture
        #: how many producer calls emitted INT8 / the 16-bit output / ran diffusers' own ops (tests, the curious)
        self.fused = 0
        self.sixteen = 0
        self.unfused = 0

    def _operand(self, norm, temb, hs, enc, form):
        """The fused producer's output for ``[text; video]`` — the ``QuantizedInput`` of an INT8 ``form``, the
        16-bit tensor for :data:`SIXTEEN_BIT` — and the two gates, or ``None``."""
        if form is None or hs.shape[-1] > MAX_DIM or not ops().producers_supported(hs, self.backend):
            return None
        shift, scale, gate, enc_shift, enc_scale, enc_gate = norm.linear(norm.silu(temb)).chunk(6, dim=1)
        ln = norm.norm
        parts = [(enc, 1 + enc_scale, enc_shift), (hs, 1 + scale, shift)]
        if form == SIXTEEN_BIT:
            q = ops().norm_modulate(parts, ln.weight, ln.bias, ln.eps, backend=self.backend)
        else:
            q = ops().norm_modulate_int8(parts, ln.weight, ln.bias, ln.eps, form[1], dense=form[0] == "int8-dense",
                                         backend=self.backend)
        return None if q is None else (q, gate[:, None, :], enc_gate[:, None, :])

    def new_forward(self, block, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                    attention_kwargs=None):
        if attention_kwargs:  # nothing CogVideoX's pipelines pass; the original handles it
            return self.fn_ref.original_forward(hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                                attention_kwargs)
        text_len = encoder_hidden_states.size(1)
        rows = hidden_states.shape[0] * (hidden_states.shape[1] + text_len)
        attn = block.attn1
        proc = attn.processor
        fast = isinstance(proc, FusedQKNormRopeProcessor) and proc._fast(attn, hidden_states, None, image_rotary_emb)
        fast = fast and not (self.attention is not None and self.attention.attn_action == "reuse")
        form = common_form((attn.to_q, attn.to_k, attn.to_v), hidden_states, rows) if fast else None
        op = self._operand(block.norm1, temb, hidden_states, encoder_hidden_states, form)
        if op is not None:
            q, gate_msa, enc_gate_msa = op
            project = lambda: proc.attend_projected(attn, attn.to_q(q), attn.to_k(q), attn.to_v(q), text_len,  # noqa: E731
                                                    image_rotary_emb)
            attn_hs, attn_enc = project() if self.attention is None else self.attention.attend(project)
            if self.capture is not None:
                self.capture("attn1", (attn_hs, attn_enc))
        else:
            n_hs, n_enc, gate_msa, enc_gate_msa = block.norm1(hidden_states, encoder_hidden_states, temb)
            attn_hs, attn_enc = attn(hidden_states=n_hs, encoder_hidden_states=n_enc,
                                     image_rotary_emb=image_rotary_emb)
        self._count(op, form)
        hidden_states = self._residual(hidden_states, gate_msa, attn_hs)
        encoder_hidden_states = self._residual(encoder_hidden_states, enc_gate_msa, attn_enc)

        form = common_form((block.ff.net[0].proj,), hidden_states, rows)
        op = self._operand(block.norm2, temb, hidden_states, encoder_hidden_states, form)
        if op is not None:
            ff_in, gate_ff, enc_gate_ff = op
        else:
            n_hs, n_enc, gate_ff, enc_gate_ff = block.norm2(hidden_states, encoder_hidden_states, temb)
            ff_in = torch.cat([n_enc, n_hs], dim=1)
        self._count(op, form)
        ff_output = block.ff(ff_in)  # ff.net.0 is GELU(proj(x)): proj takes the QuantizedInput or 16-bit output
        hidden_states = self._residual(hidden_states, gate_ff, ff_output[:, text_len:])
        encoder_hidden_states = self._residual(encoder_hidden_states, enc_gate_ff, ff_output[:, :text_len])
        return hidden_states, encoder_hidden_states

    def _residual(self, x, gate, y):
        """``x + gate * y`` in one pass where the kernel serves (``ops.gated_residual``: the same values)."""
        return ops().gated_residual(x, gate, y, backend=self.backend)

    def _count(self, op, form) -> None:
        if op is None:
            self.unfused += 1
        elif form == SIXTEEN_BIT:
            self.sixteen += 1
        else:
            self.fused += 1


def gelu_epilogue_applies(module: nn.Module) -> bool:
    """A diffusers ``GELU`` with the tanh approximation whose projection is a ``SixBitLinear``."""
    return (type(module).__name__ == "GELU" and getattr(module, "approximate", None) == "tanh"
            and isinstance(getattr(module, "proj", None), SixBitLinear))


class GeluEpilogueHook(ModelHook):
    """On one ``GELU(approximate="tanh")`` module: its projection's GEMM applies the GELU (module docstring)."""

    def __init__(self):
        super().__init__()
        #: calls that went through the projection with the activation (for tests and the curious)
        self.calls = 0

    def new_forward(self, module, hidden_states):
        if hidden_states.device.type == "mps":  # diffusers' own forward works around fp16 GELU there
            return self.fn_ref.original_forward(hidden_states)
        self.calls += 1
        return module.proj(hidden_states, activation="gelu_tanh")
