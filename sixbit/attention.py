"""CogVideoX attention with the per-head q/k LayerNorm and the rotary embedding in one kernel.

Engineering, not the method (config ``fast_qk_norm``, default on; CUDA only). diffusers'
``CogVideoXAttnProcessor2_0`` normalizes q and k per head on the transposed ``[B, heads, S, 64]`` view
(PyTorch copies it to contiguous, then one 64-element row per thread block) and then applies
``apply_rotary_emb`` to the video tokens: about eight element-wise passes, several in fp32, plus a copy
back into the normalized tensor. On the H200 these were ~12 % + ~6 % of a CogVideoX-2B denoising step
(``benchmarks/results/step_profile_h200_2b*.md``). :class:`FusedQKNormRopeProcessor` runs the same
attention with ``sixbit_kernels/layernorm.py``'s ``layer_norm_rows(..., rope=...)``: one read of the strided
q (k) view, one write of the normalized, rotated result, in the reference's arithmetic (see that module).

It is installed with diffusers' own ``Attention.set_processor`` (no monkey-patching) on every attention
whose processor is exactly ``CogVideoXAttnProcessor2_0``, and keeps that processor: any call the kernel
does not cover — CPU tensors, an attention mask, no q/k LayerNorm, an unexpected rotary layout — runs the
original processor unchanged, so CPU outputs are bit-identical to diffusers'. ``handle.remove()`` puts
the original processors back.

The attention route (``attention_route``, one of :data:`ATTENTION_ROUTES`): ``"bf16"`` (default) is
PyTorch SDPA in the model dtype, as diffusers runs it; ``"fp8"`` is sixbit's 8-bit attention
(``sixbit_kernels/attention_fp8.py``, docs/ATTENTION.md) — set per processor, so a policy can choose it per
block and per step by assigning ``processor.attention_route`` before the block runs (what the linears'
``route`` attribute is to DMPQ). Where the 8-bit kernel cannot run (CPU without ``allow_cpu``, a GPU below
sm_89, an unsupported head dim, an attention mask) the call falls back to SDPA; ``last_attention_route``
records what actually ran, for the trace. The 8-bit route writes its output straight into the
``[B, S, H·D]`` layout ``to_out`` reads, so the transpose copy after SDPA disappears too; and where the
8-bit kernel runs (and no observer watches), the q/k norm and rotary are not run first at all: the kernels
apply them as they load the raw projections (``_norms_on_load``; ``attention_fp8``'s "Q/K norm on load"),
so the normalized q/k are never written.

Emulation (for quality on the CPU): where the kernel cannot run because the tensors are on the CPU (no
interpreter) or ``backend="torch"``, the ``"fp8"`` route runs ``formats.attention_fp8_reference`` — the
numerics module's spec of exactly what the kernel computes — on q/k/v built as diffusers builds them
(torch LayerNorm, diffusers' rotary code); ``last_attention_route`` is then ``"fp8"`` and
``last_attention_emulated`` True (the trace's blocks say so, and on a GPU its compute path:
:func:`label_emulation`; on the CPU ``cpu-reference`` already means every low-bit route is emulated). A GPU below sm_89 or an attention mask
still falls back to SDPA. ``observer`` (optional ``fn(q, k, v)``, calibration) sees every call's
``[B, H, S, D]`` q/k/v, the block's own, right before the attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ATTENTION_ROUTES", "FusedQKNormRopeProcessor", "attend", "fp8_attention", "fp8_supported", "install",
           "set_attention_route", "uninstall", "block_processors", "label_emulation", "EMULATED_PATH"]

#: "bf16": SDPA in the model dtype (diffusers' own); "fp8": the 8-bit attention kernel
ATTENTION_ROUTES = ("bf16", "fp8")
#: whether the 8-bit route also applies the q/k norm on load where the model has rotary embeddings (CogVideoX-5B,
#: 1.5). Off: measured on an H100 (``probe_normload_h100_s33.json``) the whole 8-bit call at 5B shapes took 14.10 ms
#: with the norm + rotary on load against 13.94 normalizing first (the K passes' extra arithmetic costs more than
#: the two norm launches save); at 2B (no rotary) 8.66 against 8.77, so the norm without rotary stays on load
NORM_ON_LOAD_ROTARY = False


def _fp8_module():
    import sixbit_kernels as kernels

    return kernels.attention_fp8


def fp8_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, allow_cpu: bool = False) -> bool:
    """Whether the 8-bit attention runs for these ``[B, H, S, D]`` tensors on their device: CUDA with
    compute capability ≥ 8.9 (e4m3 tensor cores; measured on sm_90) or, with ``allow_cpu``, the CPU
    interpreter; and a shape the kernel takes."""
    if q.is_cuda:
        if torch.cuda.get_device_capability(q.device) < (8, 9):
            return False
    elif not allow_cpu:
        return False
    return _fp8_module().supported(q, k, v)


def _emulable(q, k, v, emulate: bool) -> bool:
    return emulate and (not q.is_cuda or torch.cuda.get_device_capability(q.device) >= (8, 9)) \
        and _fp8_module().supported(q, k, v)


def fp8_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, allow_cpu: bool = False,
                  emulate: bool = False, norms=None) -> tuple[torch.Tensor, str] | None:
    """8-bit attention of ``[B, H, S, D]`` q/k/v as ``[B, S, H·D]`` in q's dtype, and how it ran (``"kernel"``
    or ``"emulated"``: ``formats.attention_fp8_reference``, instead of the kernel with ``emulate``); None
    where neither runs. ``norms``: ``(q_norm, k_norm)`` (``sixbit_kernels.layernorm.RowNorm``) that the kernel
    applies on load to the raw q and k (kernel only)."""
    B, H, S, D = q.shape
    if not emulate and fp8_supported(q, k, v, allow_cpu=allow_cpu):
        buf = torch.empty(B, S, H, D, dtype=q.dtype, device=q.device)
        q_norm, k_norm = norms or (None, None)
        _fp8_module().fp8_attention(q, k, v, out=buf.transpose(1, 2), q_norm=q_norm, k_norm=k_norm)
        return buf.view(B, S, H * D), "kernel"
    if norms is not None:
        raise ValueError("fp8_attention: norms on load need the 8-bit kernel, which cannot run on these tensors")
    if not _emulable(q, k, v, emulate):
        return None
    from sixbit.formats import attention_fp8_reference

    out = attention_fp8_reference(q, k, v, block_n=_fp8_module().CONFIGS[D][1]).to(q.dtype)
    return out.transpose(1, 2).reshape(B, S, H * D), "emulated"


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, route: str, *, allow_cpu: bool = False,
           emulate: bool = False, norms=None) -> tuple[torch.Tensor, str, bool]:
    """Joint attention of ``[B, H, S, D]`` q/k/v on ``route``; returns (``[B, S, H·D]`` output, the route that
    ran, whether it was the emulation). ``"fp8"`` falls back to ``"bf16"`` where :func:`fp8_attention`
    cannot run. ``norms``: see :func:`fp8_attention` (the ``"fp8"`` route on the kernel only)."""
    if route not in ATTENTION_ROUTES:
        raise ValueError(f"attention_route must be one of {ATTENTION_ROUTES}, got {route!r}")
    if norms is not None and route != "fp8":
        raise ValueError(f"attend: norms on load need the 'fp8' route, got {route!r}")
    B, H, S, D = q.shape
    if route == "fp8":
        got = fp8_attention(q, k, v, allow_cpu=allow_cpu, emulate=emulate, norms=norms)
        if got is not None:
            return got[0], "fp8", got[1] == "emulated"
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
    return out.transpose(1, 2).reshape(B, S, H * D), "bf16", False


def _cogvideox_processor_type():
    try:
        from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0
    except ImportError:  # pragma: no cover - diffusers without CogVideoX
        return None
    return CogVideoXAttnProcessor2_0


class FusedQKNormRopeProcessor:
    """``CogVideoXAttnProcessor2_0`` with q/k LayerNorm + rotary embedding fused (see the module docstring).

    ``original``: the processor it replaces (called for everything the fast path does not cover).
    ``kernels``: the ``sixbit_kernels.ops`` module. ``allow_cpu``: also take the fast path (and the 8-bit
    attention) on CPU tensors (only meaningful under ``TRITON_INTERPRET=1``; the tests use it).
    ``attention_route``: see the module docstring; ``last_attention_route`` is what the last call ran
    (``None`` before the first call or when the original processor ran)."""

    def __init__(self, original, kernels, backend: str = "auto", *, allow_cpu: bool = False,
                 attention_route: str = "bf16"):
        if attention_route not in ATTENTION_ROUTES:
            raise ValueError(f"attention_route must be one of {ATTENTION_ROUTES}, got {attention_route!r}")
        self.original = original
        self.kernels = kernels
        self.backend = backend
        self.allow_cpu = allow_cpu
        self.attention_route = attention_route
        self.last_attention_route: str | None = None
        self.last_attention_emulated = False
        self.observer = None
        #: 8-bit calls whose q/k norm (and rotary) the attention kernels applied on load (tests, the curious)
        self.norm_on_load_calls = 0

    def _fast(self, attn, x: torch.Tensor, attention_mask, rope) -> bool:
        if self.backend == "torch" or attention_mask is not None:
            return False
        if not (x.is_cuda or self.allow_cpu) or (x.is_cuda and self.kernels.compute_path(x.device) == "cuda-reference"):
            return False
        for norm in (attn.norm_q, attn.norm_k):
            if type(norm) is not nn.LayerNorm or len(norm.normalized_shape) != 1:
                return False
        return rope is None or (isinstance(rope, (tuple, list)) and len(rope) == 2)

    def _norm_rope(self, t: torch.Tensor, norm: nn.LayerNorm, rope, start: int) -> torch.Tensor:
        k = self.kernels
        if not k.layer_norm_supported(t, norm.normalized_shape):
            out = F.layer_norm(t, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
            if rope is not None:
                from diffusers.models.embeddings import apply_rotary_emb

                out[:, :, start:] = apply_rotary_emb(out[:, :, start:], rope)
            return out
        r = None if rope is None else (rope[0], rope[1], start)
        return k.layer_norm_rows(t, norm.weight, norm.bias, norm.eps, rope=r)

    def _emulates(self, attn, x: torch.Tensor, attention_mask) -> bool:
        """The torch path with q/k/v in hand: the 8-bit route's emulation, or an observer to feed."""
        if attention_mask is not None or attn.norm_q is None or attn.norm_k is None:
            return False
        return (self.attention_route == "fp8" and (self.backend == "torch" or not x.is_cuda)) \
            or self.observer is not None

    def _torch_qkv(self, attn, hidden_states, text_len, rope):
        """q, k, v ``[B, H, S, D]`` exactly as ``CogVideoXAttnProcessor2_0`` builds them."""
        batch = hidden_states.size(0)
        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = k.shape[-1] // attn.heads
        q, k, v = (t.view(batch, -1, attn.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = attn.norm_q(q), attn.norm_k(k)
        if rope is not None:
            from diffusers.models.embeddings import apply_rotary_emb

            q[:, :, text_len:] = apply_rotary_emb(q[:, :, text_len:], rope)
            if not attn.is_cross_attention:
                k[:, :, text_len:] = apply_rotary_emb(k[:, :, text_len:], rope)
        return q, k, v

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        self.last_attention_route = None
        self.last_attention_emulated = False
        fast = self._fast(attn, hidden_states, attention_mask, image_rotary_emb)
        if not fast and self._emulates(attn, hidden_states, attention_mask):
            text_len = encoder_hidden_states.size(1)
            joint = torch.cat([encoder_hidden_states, hidden_states], dim=1)
            q, k, v = self._torch_qkv(attn, joint, text_len, image_rotary_emb)
            return self._finish(attn, q, k, v, text_len, emulate=True)
        if not fast:
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask=attention_mask,
                                 image_rotary_emb=image_rotary_emb)
        text_len = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        return self.attend_projected(attn, attn.to_q(hidden_states), attn.to_k(hidden_states),
                                     attn.to_v(hidden_states), text_len, image_rotary_emb)

    def attend_projected(self, attn, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, text_len: int,
                         image_rotary_emb=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention after the q/k/v projections of ``[text; video]`` (``[B, S, H·D]`` each): what
        ``__call__`` does once the projections ran — also the entry of ``sixbit.fused``, whose producer
        hands to_q/to_k/to_v a pre-quantized input (call it only where ``_fast`` is true)."""
        self.last_attention_route = None
        batch, seq, _ = query.shape
        head_dim = key.shape[-1] // attn.heads
        if image_rotary_emb is not None and tuple(image_rotary_emb[0].shape) != (seq - text_len, head_dim):
            raise ValueError(f"rotary tables of shape {tuple(image_rotary_emb[0].shape)} do not match "
                             f"{seq - text_len} video tokens × head_dim {head_dim}")
        query = query.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch, -1, attn.heads, head_dim).transpose(1, 2)
        key_rope = None if attn.is_cross_attention else image_rotary_emb
        norms = self._norms_on_load(attn, query, key, value, image_rotary_emb, key_rope, text_len)
        if norms is None:
            query = self._norm_rope(query, attn.norm_q, image_rotary_emb, text_len)
            key = self._norm_rope(key, attn.norm_k, key_rope, text_len)
        return self._finish(attn, query, key, value, text_len, norms=norms)

    def _norms_on_load(self, attn, query, key, value, rope, key_rope, text_len: int):
        """``(q_norm, k_norm)`` for the 8-bit kernels to apply as they read the raw projections — the q/k
        norm's output is then never written (``attention_fp8``'s "Q/K norm on load") — where this call runs
        the 8-bit kernel and the norm kernel passed its self-check, and without rotary tables unless
        :data:`NORM_ON_LOAD_ROTARY`; else None (normalize first)."""
        if self.attention_route != "fp8" or self.observer is not None:
            return None
        if (rope is not None or key_rope is not None) and not NORM_ON_LOAD_ROTARY:
            return None
        if not fp8_supported(query, key, value, allow_cpu=self.allow_cpu):
            return None
        k = self.kernels
        if not (k.layer_norm_supported(query, attn.norm_q.normalized_shape)
                and k.layer_norm_supported(key, attn.norm_k.normalized_shape)):
            return None
        from sixbit_kernels.layernorm import RowNorm

        self.norm_on_load_calls += 1
        return tuple(RowNorm(n.weight, n.bias, n.eps, None if r is None else (r[0], r[1], text_len))
                     for n, r in ((attn.norm_q, rope), (attn.norm_k, key_rope)))

    def _finish(self, attn, query, key, value, text_len: int, emulate: bool = False, norms=None):
        if self.observer is not None:
            self.observer(query, key, value)
        emulate = emulate and (self.backend == "torch" or not (query.is_cuda or self.allow_cpu))
        out, self.last_attention_route, self.last_attention_emulated = attend(
            query, key, value, self.attention_route, allow_cpu=self.allow_cpu, emulate=emulate, norms=norms)
        out = attn.to_out[1](attn.to_out[0](out))
        encoder_hidden_states, hidden_states = out.split([text_len, out.size(1) - text_len], dim=1)
        return hidden_states, encoder_hidden_states


#: the compute-path part that says a GPU run's 8-bit attention was the torch emulation (backend="torch")
EMULATED_PATH = "attention-fp8-emulated"


def label_emulation(path: str, device, emulated: bool) -> str:
    """``ops.compute_path``'s string with :data:`EMULATED_PATH` joined to its head when a CUDA run emulated
    the 8-bit attention (on the CPU, ``cpu-reference`` already says that every low-bit route is emulated)."""
    if not emulated or torch.device(device).type != "cuda":
        return path
    head, sep, rest = path.partition("; ")
    return f"{head} + {EMULATED_PATH}{sep}{rest}"


def block_processors(block: nn.Module) -> list[FusedQKNormRopeProcessor]:
    """The :class:`FusedQKNormRopeProcessor`\\ s installed in ``block`` (what the block hook routes)."""
    return [m.processor for m in block.modules() if isinstance(getattr(m, "processor", None), FusedQKNormRopeProcessor)]


def set_attention_route(installed: list[tuple[nn.Module, object]], route: str) -> None:
    """Set ``attention_route`` on every processor :func:`install` put in (``route`` in ATTENTION_ROUTES)."""
    if route not in ATTENTION_ROUTES:
        raise ValueError(f"attention_route must be one of {ATTENTION_ROUTES}, got {route!r}")
    for m, _ in installed:
        m.processor.attention_route = route


def install(blocks, kernels, backend: str = "auto", attention_route: str = "bf16") -> list[tuple[nn.Module, object]]:
    """Give every attention of ``blocks`` (``[(name, block)]``) that runs exactly diffusers'
    ``CogVideoXAttnProcessor2_0`` a :class:`FusedQKNormRopeProcessor` (with ``attention_route``); returns
    ``[(attention, original)]`` for :func:`uninstall`."""
    cls = _cogvideox_processor_type()
    done = []
    if cls is None:
        return done
    for _, block in blocks:
        for m in block.modules():
            proc = getattr(m, "processor", None)
            if type(proc) is cls and hasattr(m, "set_processor"):
                m.set_processor(FusedQKNormRopeProcessor(proc, kernels, backend, attention_route=attention_route))
                done.append((m, proc))
    return done


def uninstall(installed: list[tuple[nn.Module, object]]) -> None:
    """Put the original processors back."""
    for m, proc in installed:
        m.set_processor(proc)
