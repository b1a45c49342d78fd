"""Compile every Triton kernel configuration a run will use before its first step (issue 18 item 4).

Triton compiles a kernel the first time it meets a new specialisation (constexpr block sizes, dtypes,
which integer arguments are divisible by 16). Without a warm-up that happens inside the first steps that
use a route — in a 20-step 2B bench run, steps 5 and 12 took 1.0–1.5 s instead of 0.6 s — and inside a
user's first video. :func:`warm` runs, once and on a small problem, everything :func:`plan` says the
configured run can reach:

* every routed linear (one per distinct layer shape, weight formats and rotation) on every route the
  config can decide — DMPQ's NVFP4 and INT8 (or W8A8), the 16-bit route of warm-up/PDR steps, a static
  baseline's one route — and the weight-only W4A16 layers, through the layer itself (``SixBitLinear``:
  the same resolution, activation cache and kernel options as the run); the feed-forward projections whose
  GEMM applies the GELU (``sixbit/fused.py``) once more on each kernel route, with that epilogue;
* the block-statistics kernel (Γ alone, and with the delta change when TDC keeps deltas) and PDR's
  outlier count, on the blocks' stream widths;
* each distinct attention (heads × head dim) through sixbit's processor: the fused q/k LayerNorm + rotary
  kernel and every attention route the config can take (bf16 SDPA, 8-bit);
* the fused norm + modulate → INT8 producer (``sixbit/fused.py``) of each distinct block width up to
  ``fused.MAX_DIM`` (CogVideoX-2B's 1920, 5B's 3072), both operand forms, where the config can route INT8
  (its own self-check runs on that first call; the kernel does not specialise on token counts, so the
  small problem compiles what a video's two streams launch — tests/test_kernels_fused.py).

It reuses the load-time self-check instead of adding a pass of its own: the first call of a route on a
device *is* its self-check (``sixbit_kernels/selfcheck.py``: the check runs the kernel on an input of the
caller's width and compares it with the torch reference), so a warmed route is checked and compiled and
the run's first real call finds both cached. Rows: ``rows`` (default :data:`ROWS`, a multiple of 16 and in
the GEMMs' large size class, like a real video's M = 2 × 17,776) — a run whose row count is not a multiple
of 16, or below the large class, may still compile a GEMM once more (the token-resident quantization
kernel — PDR's per-stream outlier count included — and the fused norm producer do not specialise on the
row count, so the small problem compiles what a video meets).

On the CPU it does nothing unless asked (``force=True``: the plan runs on the torch reference, or in
Triton's interpreter under ``selfcheck.interpreter_dispatch`` — what the tests use to count the visits).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from sixbit import tdc
from sixbit.routes import FP16, INT8, NVFP4, STATIC, W4A16, W8A8

__all__ = ["ROWS", "Warmup", "plan", "warm", "linear_routes", "attention_routes"]

LOG = logging.getLogger("sixbit")
#: rows of the warm-up problems: the GEMMs' large size class (``gemm_w4.DECODE_ONCE_MIN_M``), a multiple of 16
ROWS = 1024
_TEXT, _VIDEO = 16, 112  # attention warm-up tokens: text + video = 128 (one key block)


@dataclass
class Warmup:
    """What :func:`warm` ran: ``items`` (one name per kernel configuration visited) and the seconds it took."""

    seconds: float = 0.0
    items: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"kernels compiled in {self.seconds:.1f} s ({len(self.items)} configurations)"


def linear_routes(cfg) -> list[str]:
    """The routes a routed linear can be given under ``cfg`` (before the layer resolves them)."""
    if not cfg.quantized:
        return []
    if cfg.quant in STATIC:
        return [STATIC[cfg.quant]]
    out = [NVFP4, INT8]
    if cfg.warmup_steps > 0 or cfg.pdr:
        out.append(FP16)
    return out


def attention_routes(cfg, has_fits: bool) -> list[str]:
    """The attention routes a computed block can take under ``cfg`` (``has_fits``: the policy has fits)."""
    fp8 = cfg.attention == "fp8" or (cfg.attention == "policy" and has_fits)
    return ["bf16", "fp8"] if fp8 else ["bf16"]


def plan(handle) -> list[tuple[str, object]]:
    """``[(name, fn)]``: one call per kernel configuration the handle's run can use (see the module docstring)."""
    cfg, items, seen = handle.cfg, [], set()
    for m in handle.modules:
        for r in linear_routes(cfg):
            key = ("linear", m.in_features, m.out_features, m.packed.formats, m.packed.hadamard_block, m.resolve(r))
            if key not in seen:
                seen.add(key)
                items.append((f"linear {m.in_features}→{m.out_features} {m.resolve(r)}", _linear(m, r)))
    for m, _ in getattr(handle, "gelu_epilogue", ()):  # the same GEMMs with the GELU epilogue (sixbit/fused.py)
        for r in linear_routes(cfg):
            if m.resolve(r) == FP16:  # the 16-bit route's GELU is PyTorch's, after the linear
                continue
            key = ("linear", m.in_features, m.out_features, m.packed.formats, m.packed.hadamard_block, m.resolve(r),
                   "gelu_tanh")
            if key not in seen:
                seen.add(key)
                items.append((f"linear {m.in_features}→{m.out_features} (GELU epilogue) {m.resolve(r)}",
                              _linear(m, r, "gelu_tanh")))
    for m in handle.weight_only_modules:
        key = ("linear", m.in_features, m.out_features, m.packed.formats, None, W4A16)
        if key not in seen:
            seen.add(key)
            items.append((f"linear {m.in_features}→{m.out_features} {W4A16}", _linear(m, W4A16)))
    widths = sorted(set(_stream_widths(handle)))
    keep = cfg.tdc or handle.schedule is not None
    # a block that keeps no delta (no TDC; the span's blocks under tdc_store, regated blocks under tdc_regate,
    # sixbit.tdc) writes none: another variant
    span = tdc.span_possible(cfg) or tdc.regate_possible(cfg)
    for w in widths:
        if not keep or span:
            items.append((f"block_stats {w}", _block_stats(w, None, False, cfg.backend)))
        if keep:
            items.append((f"block_stats {w} + delta", _block_stats(w, None, True, cfg.backend)))
            items.append((f"block_stats {w} + delta change", _block_stats(w, True, keep, cfg.backend)))
            items.append((f"l1_size {w}", _l1_size(w, cfg.backend)))  # "magnitude"'s size of a held piece
        if cfg.pdr and cfg.quant == "dmpq":
            items.append((f"outlier_count {w}", _outliers(w, cfg)))
    has_fits = any(h.attention_fit is not None for h in handle.block_hooks)
    # the rotary tables' presence selects a kernel variant: warm the one the model's calls will use
    rope = bool(getattr(getattr(handle.transformer, "config", None), "use_rotary_positional_embeddings", False))
    for hook in handle.block_hooks:
        for proc in hook.attn_procs:
            attn = _attention_module(handle, proc)
            if attn is None:
                continue
            key = ("attention", attn.heads, attn.to_k.out_features, attn.is_cross_attention)
            for r in attention_routes(cfg, has_fits):
                if key + (r,) not in seen:
                    seen.add(key + (r,))
                    items.append((f"attention {attn.heads}×{attn.to_k.out_features // attn.heads} {r}",
                                  _attention(attn, proc, r, rope, (linear_routes(cfg) or [None])[0])))
    if cfg.fused_producers and handle.adapter.family == "cogvideox":
        from sixbit import fused

        decided = set(linear_routes(cfg))
        int8 = bool({INT8, W8A8} & decided)  # the INT8 operand q/k/v read: their own Hadamard block, both forms
        # the 16-bit output, where a consumer runs NVFP4 / W4A16 or takes PDR's outlier count
        sixteen = bool(decided - {INT8, W8A8, FP16} or (cfg.quantized and cfg.pdr))
        for _, block in handle.adapter.blocks(handle.transformer):
            q = block.attn1.to_q if fused.applies(block) else None
            if q is None or not hasattr(q, "packed") or q.in_features > fused.MAX_DIM:
                continue
            forms = [("int8", q.packed.hadamard_block), ("int8-dense", q.packed.hadamard_block)] if int8 else []
            for form in forms + ([fused.SIXTEEN_BIT] if sixteen else []):
                if ("producer", q.in_features, form) not in seen:
                    seen.add(("producer", q.in_features, form))
                    name = (f"norm_modulate {q.in_features}" if form == fused.SIXTEEN_BIT else
                            f"norm_modulate_int8 {q.in_features}{' dense' if form[0] == 'int8-dense' else ''}")
                    items.append((name, _producer(block.norm1, form, cfg.backend)))
    if cfg.quantized and cfg.fused_producers and handle.adapter.family == "cogvideox":  # the fused block forward
        items += [(f"gated_residual {w}", _gated_residual(w, cfg.backend)) for w in widths]
    return items


def warm(handle, *, force: bool = False) -> Warmup | None:
    """Run :func:`plan` once, timed (on a CUDA device, or anywhere with ``force``); None when skipped."""
    dev = handle.run.device
    if dev.type != "cuda" and not force:
        return None
    t0 = time.perf_counter()
    out = Warmup()
    with torch.no_grad():
        for name, fn in plan(handle):
            fn(dev, _dtype(handle))
            out.items.append(name)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    out.seconds = time.perf_counter() - t0
    LOG.info("sixbit: %s on %s", out.line(), dev)
    return out


# ---------------------------------------------------------------------------------------- the calls
def _dtype(handle) -> torch.dtype:
    return next((p.dtype for p in handle.transformer.parameters() if p.is_floating_point()), torch.float32)


def _rand(*shape, device, dtype, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def _linear(m, route: str, activation: str | None = None):
    def run(dev, dtype):
        saved = m.route
        try:
            m.route = route
            m(_rand(1, ROWS, m.in_features, device=dev, dtype=dtype), activation)
        finally:
            m.route = saved
    return run


def _stream_widths(handle) -> list[int]:
    """Hidden widths of the blocks' streams: the input width of each block's first routed linear."""
    out = []
    for hook, (_, block) in zip(handle.block_hooks, handle.adapter.blocks(handle.transformer)):
        lins = hook.layers or [lin for _, lin in handle.adapter.block_linears(block)]
        if lins:
            out.append(lins[0].in_features)
    return out


def _block_stats(width: int, old, keep: bool, backend: str):
    def run(dev, dtype):
        from sixbit.hooks import block_stats

        ins = [_rand(1, ROWS // 8, width, device=dev, dtype=dtype, seed=1)]
        outs = [_rand(1, ROWS // 8, width, device=dev, dtype=dtype, seed=2)]
        block_stats(outs, ins, [o - i for o, i in zip(outs, ins)] if old else None, keep, backend)
    return run


def _outliers(width: int, cfg):
    def run(dev, dtype):
        from sixbit.linear import ops

        ops().outlier_count(_rand(1, ROWS // 8, width, device=dev, dtype=dtype, seed=3), cfg.pdr_k_sigma, cfg.backend)
    return run


def _l1_size(width: int, backend: str):
    """TDC's size of a held tensor (``hooks.sizer``) on a strided ``[B, S, C]`` piece like the regated ones."""
    def run(dev, dtype):
        from sixbit.hooks import sizer

        sizer(backend)(_rand(1, _TEXT + _VIDEO, width, device=dev, dtype=dtype, seed=13)[:, _TEXT:])
    return run


def _gated_residual(width: int, backend: str):
    """The fused block forward's ``x + gate · y`` (its video part of ``[text; video]`` is a strided view)."""
    def run(dev, dtype):
        from sixbit.linear import ops

        y = _rand(1, _TEXT + _VIDEO, width, device=dev, dtype=dtype, seed=10)[:, _TEXT:]
        ops().gated_residual(_rand(1, _VIDEO, width, device=dev, dtype=dtype, seed=11),
                             _rand(1, 1, width, device=dev, dtype=dtype, seed=12), y, backend)
    return run


def _producer(norm, form: tuple, backend: str):
    """The fused hook's own producer call (``FusedProducersHook._operand``) on a small [text; video] pair, for
    ``form`` (``("int8" | "int8-dense", hadamard block)`` or ``fused.SIXTEEN_BIT``)."""
    def run(dev, dtype):
        from sixbit.fused import FusedProducersHook

        w = norm.norm.normalized_shape[0]
        temb = _rand(1, norm.linear.in_features, device=dev, dtype=dtype, seed=9)
        FusedProducersHook(backend)._operand(norm, temb, _rand(1, _VIDEO, w, device=dev, dtype=dtype, seed=7),
                                             _rand(1, _TEXT, w, device=dev, dtype=dtype, seed=8), form)
    return run


def _attention_module(handle, proc):
    return next((m for m in handle.transformer.modules() if getattr(m, "processor", None) is proc), None)


def _attention(attn, proc, route: str, rope: bool, linear_route: str | None):
    """The attention module called alone: its projections get a route the config can give them (the block
    hook sets the real ones at run time; a static W8A8 layer holds no NVFP4 weight)."""
    from sixbit.linear import SixBitLinear

    def run(dev, dtype):
        lins = [m for m in attn.modules() if isinstance(m, SixBitLinear)]
        saved_routes = [m.route for m in lins]
        if linear_route is not None:
            for m in lins:
                m.route = linear_route
        width = attn.to_q.in_features
        head_dim = attn.to_k.out_features // attn.heads
        hs = _rand(1, _VIDEO, width, device=dev, dtype=dtype, seed=4)
        enc = _rand(1, _TEXT, width, device=dev, dtype=dtype, seed=5)
        angle = _rand(_VIDEO, head_dim, device=dev, dtype=torch.float32, seed=6)
        saved = proc.attention_route
        try:
            proc.attention_route = route
            attn(hs, encoder_hidden_states=enc, image_rotary_emb=(angle.cos(), angle.sin()) if rope else None)
        finally:
            proc.attention_route = saved
            for m, r in zip(lins, saved_routes):
                m.route = r
    return run

