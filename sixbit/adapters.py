"""Model families: where the blocks are, how a block is called, which linears to quantize, how CFG runs.

The engine knows nothing about CogVideoX or Wan; it asks an :class:`Adapter`:

* ``blocks(transformer)``      → ``[(name, block), ...]`` in execution order;
* ``block_linears(block)``     → the block's ``nn.Linear`` layers that DMPQ routes (names relative to the
  block). Modulation linears (``norm1.linear``/``norm2.linear`` of CogVideoX: M = batch rows, tiny
  compute, large error impact), embedders and ``proj_out`` are outside this list and stay in full
  precision unless the config asks for weight-only 4-bit storage (``outer_linears`` lists the
  embedders; ``proj_out`` always stays). With fused projections (``fuse_qkv_projections()`` before ``apply``) the fused layer is
  quantized and the unused unfused ones are left alone;
* ``streams_in(args, kwargs)`` / ``streams_out(output)`` / ``rebuild(output, streams)`` — the token
  streams a block updates residually. CogVideoX blocks update two streams and return
  ``(hidden_states, encoder_hidden_states)``; Wan blocks update one (the text enters cross-attention
  unchanged) and return ``hidden_states``. Stream 0 is always the video-token stream: Γ is measured on it;
  the delta cache and the outlier statistic cover all streams;
* ``gated_parts`` / ``pieces(outputs, streams)`` / ``gates(block, args, kwargs)`` / ``recompose(...)`` — the
  block's residual update as a sum of gated pieces, for ``SixBitConfig.tdc_regate`` (``sixbit.tdc``): the outputs
  of the submodules named in ``gated_parts`` (captured while the block computes) split into pieces, each added to
  its stream (``piece_streams``) times a gate the block computes from the timestep embedding (or ungated). A
  CogVideoX block adds ``gate_msa ⊙ attn1`` and ``gate_ff ⊙ ff`` to each of its two streams (four pieces; gates
  from ``norm1.linear``/``norm2.linear`` on ``silu(temb)``); a Wan block adds ``gate_msa ⊙ attn1``, the ungated
  cross-attention ``attn2`` and ``c_gate_msa ⊙ ffn`` (gates from ``scale_shift_table + temb``). So
  ``recompose(streams, pieces(...), gates(...))`` is the block's own output, to rounding
  (tests/test_tdc_regate.py), and with another step's gates it is what a skip returns;
* ``cfg``: ``"batched"`` (CogVideoX: cond and uncond in one call under ``cache_context("cond_uncond")``)
  or ``"separate"`` (Wan: one call per branch, ``cache_context("cond")`` / ``("uncond")``). The engine keeps
  state per cache context either way; this field is descriptive (trace, docs).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["Adapter", "COGVIDEOX", "WAN", "ADAPTERS", "get_adapter"]


@dataclass
class Adapter:
    family: str
    transformer_classes: tuple[str, ...]
    block_list: str
    stream_args: tuple[str, ...]
    """block-forward argument names of the residual streams, video stream first"""
    output_streams: tuple[int, ...] | None
    """positions of the streams in a tuple output (``None``: the block returns stream 0 alone)"""
    cfg: str
    fp_patterns: tuple[str, ...] = (r"(^|\.)norm\d*\.linear$",)
    """regexes of block-relative linear names that stay in full precision"""
    output_linears: tuple[str, ...] = ("proj_out",)
    """linears outside the blocks that always stay 16-bit: the model's output projection"""
    self_attention: str = "attn1"
    """the block's self-attention module, the one ``tdc_scope="attention"`` caches (its call's whole output)"""
    gated_parts: tuple[str, ...] = ()
    """the block's submodules whose outputs make up its residual update (``tdc_regate``; empty: not supported)"""
    piece_streams: tuple[int, ...] = ()
    """the stream each of :meth:`pieces`' pieces adds to"""
    split_pieces: Callable | None = None
    """``(outputs by part name, input streams) -> pieces``"""
    block_gates: Callable | None = None
    """``(block, temb) -> one gate per piece`` (None: ungated), broadcastable to the piece"""
    temb_arg: str = "temb"
    """the block-forward argument the gates are computed from"""
    _arg_index: dict = field(default_factory=dict, repr=False)

    def matches(self, transformer: nn.Module) -> bool:
        return type(transformer).__name__ in self.transformer_classes

    def blocks(self, transformer: nn.Module) -> list[tuple[str, nn.Module]]:
        blocks = getattr(transformer, self.block_list)
        return [(f"{self.block_list}.{i}", b) for i, b in enumerate(blocks)]

    def block_linears(self, block: nn.Module, *, modulation: bool = False) -> list[tuple[str, nn.Linear]]:
        """The routed linears of ``block`` (or, with ``modulation=True``, the ones ``fp_patterns`` keep in
        full precision)."""
        fused_unused = set()
        for name, mod in block.named_modules():
            if getattr(mod, "fused_projections", False):
                pre = f"{name}." if name else ""
                if hasattr(mod, "to_qkv"):
                    fused_unused |= {pre + "to_q", pre + "to_k", pre + "to_v"}
                if hasattr(mod, "to_kv"):
                    fused_unused |= {pre + "to_k", pre + "to_v"}
                if hasattr(mod, "to_added_kv"):
                    fused_unused |= {pre + "add_k_proj", pre + "add_v_proj"}
        out = []
        for name, mod in block.named_modules():
            if not isinstance(mod, nn.Linear) or name in fused_unused:
                continue
            if any(re.search(p, name) for p in self.fp_patterns) != modulation:
                continue
            out.append((name, mod))
        return out

    def outer_linears(self, transformer: nn.Module) -> list[tuple[str, nn.Linear]]:
        """The ``nn.Linear`` layers outside the blocks (text/time embedders, the final modulation), without
        the output projection; names relative to the transformer. Candidates for weight-only 4-bit storage
        (``SixBitConfig.embedder_weights``)."""
        prefix = self.block_list + "."
        return [(n, m) for n, m in transformer.named_modules()
                if isinstance(m, nn.Linear) and not n.startswith(prefix) and n not in self.output_linears]

    # ---------------------------------------------------------------------------------------- call
    def _index(self, block: nn.Module) -> dict[str, int]:
        cls = type(block)
        if cls not in self._arg_index:
            params = list(inspect.signature(cls.forward).parameters)[1:]
            self._arg_index[cls] = {p: i for i, p in enumerate(params)}
        return self._arg_index[cls]

    def streams_in(self, block: nn.Module, args: tuple, kwargs: dict) -> list[torch.Tensor]:
        idx = self._index(block)
        out = []
        for name in self.stream_args:
            if name in kwargs:
                out.append(kwargs[name])
            else:
                out.append(args[idx[name]])
        return out

    def streams_out(self, output) -> list[torch.Tensor]:
        if self.output_streams is None:
            return [output]
        return [output[i] for i in self.output_streams]

    # ------------------------------------------------------------------------------ gated pieces
    def pieces(self, outputs: dict, streams: list[torch.Tensor]) -> list[torch.Tensor]:
        """The block's residual update as pieces, from its ``gated_parts``' outputs (``outputs``) and its input
        streams (the pieces' shapes are their streams')."""
        missing = [n for n in self.gated_parts if n not in outputs]
        if missing:
            raise RuntimeError(f"tdc_regate: the block's {missing} did not report an output (a forward that "
                               "bypasses the module call)")
        return self.split_pieces(outputs, streams)

    def gates(self, block: nn.Module, args: tuple, kwargs: dict) -> list[torch.Tensor | None]:
        """Each piece's gate at this call (the block's modulation of its timestep-embedding argument)."""
        temb = kwargs[self.temb_arg] if self.temb_arg in kwargs else args[self._index(block)[self.temb_arg]]
        return self.block_gates(block, temb)

    def recompose(self, streams: list[torch.Tensor], pieces: list[torch.Tensor],
                  gates: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """``stream + Σ gate ⊙ piece`` over the pieces of each stream (new tensors; the input streams are not
        written): one pass per piece, the second and later pieces of a stream added in place."""
        out, own = list(streams), [False] * len(streams)
        for p, g, i in zip(pieces, gates, self.piece_streams):
            if g is None:
                out[i] = out[i].add_(p) if own[i] else out[i] + p
            else:
                out[i] = out[i].addcmul_(p, g.to(p.dtype)) if own[i] else out[i].addcmul(p, g.to(p.dtype))
            own[i] = True
        return out

    def rebuild(self, streams: list[torch.Tensor]):
        if self.output_streams is None:
            return streams[0]
        out = [None] * (max(self.output_streams) + 1)
        for i, s in zip(self.output_streams, streams):
            out[i] = s
        return tuple(out)


def _cogvideox_pieces(outputs: dict, streams: list[torch.Tensor]) -> list[torch.Tensor]:
    a_hs, a_enc = outputs["attn1"]
    ff, t = outputs["ff"], streams[1].shape[1]  # ff runs on [text; video]
    return [a_hs, a_enc, ff[:, t:], ff[:, :t]]


def _cogvideox_gates(block: nn.Module, temb: torch.Tensor) -> list[torch.Tensor]:
    """``CogVideoXLayerNormZero``: ``linear(silu(temb))`` = shift, scale, gate, enc_shift, enc_scale, enc_gate."""
    out = []
    for norm in (block.norm1, block.norm2):
        c = norm.linear(norm.silu(temb)).chunk(6, dim=1)
        out += [c[2][:, None, :], c[5][:, None, :]]
    return out


def _wan_pieces(outputs: dict, streams: list[torch.Tensor]) -> list[torch.Tensor]:
    return [outputs["attn1"], outputs["attn2"], outputs["ffn"]]


def _wan_gates(block: nn.Module, temb: torch.Tensor) -> list[torch.Tensor | None]:
    """``scale_shift_table + temb`` = shift, scale, gate (attn1), c_shift, c_scale, c_gate (ffn); per token when
    ``temb`` is 4-d (Wan 2.2 TI2V); the cross-attention is ungated."""
    if temb.ndim == 4:
        c = [x.squeeze(2) for x in (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)]
    else:
        c = (block.scale_shift_table + temb.float()).chunk(6, dim=1)
    return [c[2], None, c[5]]


COGVIDEOX = Adapter(
    family="cogvideox",
    transformer_classes=("CogVideoXTransformer3DModel",),
    block_list="transformer_blocks",
    stream_args=("hidden_states", "encoder_hidden_states"),
    output_streams=(0, 1),
    cfg="batched",
    gated_parts=("attn1", "ff"),
    piece_streams=(0, 1, 0, 1),
    split_pieces=_cogvideox_pieces,
    block_gates=_cogvideox_gates,
)

WAN = Adapter(
    family="wan",
    transformer_classes=("WanTransformer3DModel",),
    block_list="blocks",
    stream_args=("hidden_states",),
    output_streams=None,
    cfg="separate",
    gated_parts=("attn1", "attn2", "ffn"),
    piece_streams=(0, 0, 0),
    split_pieces=_wan_pieces,
    block_gates=_wan_gates,
)

ADAPTERS = [COGVIDEOX, WAN]


def get_adapter(transformer: nn.Module) -> Adapter:
    for a in ADAPTERS:
        if a.matches(transformer):
            return a
    known = [c for a in ADAPTERS for c in a.transformer_classes]
    raise TypeError(
        f"sixbit has no adapter for {type(transformer).__name__}; supported transformers: {known} "
        "(add one in sixbit/adapters.py)"
    )
