"""The peer arena's rows: each a configuration of one library, applied to a CogVideoX pipeline through that
library's public API, and the one counter of computed work that every row is measured with.

A row is ``Row(name, family, label, apply, ...)``; ``apply(pipe, ctx)`` configures the pipeline and returns
an undo callable. ``ctx.mode`` is None for the row as documented, or ``"compute"`` / ``"skip"`` for the GPU
half's transfer protocol (``benchmarks/peers_speed.py``): the same library with its knob forced so that it
computes every unit, or skips every unit it can. Rows of one *family* share their unit costs at the big size
(a cache's threshold changes its decisions, not what a computed or skipped block costs), so the GPU half
times families and each row reuses its family's costs with its own work pattern from sixbit-mini.

How each peer is made to act on CogVideoX (whose blocks are ``transformer_blocks.<i>`` with one joint
attention ``attn1``):

* FirstBlockCache, MagCache, FasterCache, PyramidAttentionBroadcast find CogVideoX's blocks on their own
  (diffusers registers ``CogVideoXBlock`` with its hooks); PAB and FasterCache need
  ``current_timestep_callback=lambda: pipe.current_timestep`` (their docs' CogVideoX example).
* TaylorSeerCache's default identifiers (``^transformer_blocks.*attn``, fullmatch) match nothing in CogVideoX,
  whose attention module is named ``attn1``: the rows pass ``cache_identifiers=[r"transformer_blocks\\.\\d+"]``
  so every whole block is Taylor-forecast (a block returns the (video, text) pair; both are forecast).
* MagCache needs model-specific magnitude ratios: the rows run its documented calibration step
  (``MagCacheConfig(calibrate=True)``, one generation on a calibration prompt outside the evaluation set) and
  parse the ratios it prints (``ctx.mag_ratios``).
* cache-dit's DBCache computes the first ``Fn`` and last ``Bn`` blocks every step and caches the rest; its
  default Fn=8 would always compute 8 of sixbit-mini's 12 blocks, so the rows use its CogVideoX example's
  F1B0 (1 of 12 always computed, 11 cacheable; 1 of 30 at 2B). CogVideoX batches CFG, so
  ``enable_separate_cfg=False``.
* torchao: ``quantize_(pipe.transformer, Int8DynamicActivationInt8WeightConfig())`` or
  ``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``: every nn.Linear of the transformer. On
  the CPU torchao's fp8 config refuses to run ("requires CUDA compute capability ≥8.9"), although its
  ``Float8Tensor`` runs there (``torch._scaled_mm`` has a CPU kernel): the CPU quality run lifts that one check
  (``quant_api._check_hardware_support``) for the ``quantize_`` call, with the linears' weights in bf16 as on the
  GPU (:func:`fp8_on_cpu`) — weights and activations are quantized by torchao's own code to e4m3 with per-row
  scales, as on the H200; the products accumulate in fp32 on the CPU (cuBLAS fast accumulation on the H200), and the
  rest of the model runs FP32, as in the int8 row.
* SageAttention: CogVideoX's attention processor calls ``torch.nn.functional.scaled_dot_product_attention``
  directly (not diffusers' attention dispatcher), so the row uses SageAttention's documented plug-in, replacing
  that function by ``sageattn`` while the row is applied (GPU only: it is Triton/CUDA).

Computed work (:class:`WorkCounter`): a forward hook on each block's ``attn1.to_out[0]`` — the output
projection that runs right after the attention product, only when the attention is really computed — adds
the call's batch size (CFG-batched: 2 per block per step; FasterCache's skipped unconditional half: 1).
A cache that skips a block never reaches that layer, an attention cache (PAB, FasterCache) that reuses an
attention output neither, while a pre-hook on the block itself would fire for skipped blocks too. One
transformer call is one step (CogVideoX batches CFG).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

BLOCK_PATTERN = r"transformer_blocks\.\d+"
BIG = 10**9


@dataclass
class Ctx:
    steps: int
    device: torch.device
    mode: str | None = None  # None | "compute" | "skip"
    mag_ratios: list[float] | None = None
    schedule: dict | None = None  # sixbit rows: a recorded SkipSchedule dict (routes replayed at big sizes)
    num_blocks: int = 0
    #: forced modes: the step count of the denoising loop the timed steps stand for (``peers speed --steps``);
    #: sixbit rows resolve what depends on it (``tdc_reuse="auto"``: the forecast order, so its memory and the
    #: cost of a skip) for that loop, not for the few timed steps
    loop_steps: int | None = None


@dataclass
class Row:
    name: str
    family: str
    label: str
    apply: Callable[[Any, Ctx], Callable[[], None]]
    caching: bool = True
    gpu_only: bool = False
    settings: dict = field(default_factory=dict)
    note: str = ""
    reason: str = ""  # gpu_only rows: why the CPU quality run cannot run them (one line, in the tables)
    #: gpu_only speed rows whose numbers are a CPU row's (compilation fuses kernels, not the quantization): the
    #: tables and the goal give them that row's sixbit-mini quality and work pattern, marked as borrowed
    quality_from: str = ""


# ----------------------------------------------------------------------------------------- work counter


class WorkCounter:
    """Per transformer call, the batch rows each block's attention really computed (see the module
    docstring). ``with WorkCounter(transformer) as wc: pipe(...)``; then ``wc.steps[t][b]``.

    Each block's ``attn1.to_out[0]`` gets a 0-d counter buffer (a view into one tensor of all blocks' counts) and
    one forward hook, the same function for every block, that adds the batch rows to its module's buffer in place.
    The count is tensor data, not Python state: inside a ``torch.compile``-d block TorchDynamo traces the add as a
    buffer mutation and guards on nothing that changes, so the blocks compile once and stay compiled (session 17:
    a hook adding to a Python list made the counts guards, every step recompiled until the recompile limit sent
    the blocks back to eager, and both compile rows timed eager speed). Each transformer call snapshots the counts
    (a copy on the device, no synchronization inside a timed loop); they are read on exit."""

    BUFFER = "_peers_rows"

    def __init__(self, transformer):
        self.tr = transformer
        self.mods = [block.attn1.to_out[0] for block in transformer.transformer_blocks]
        self.steps: list[list[int]] = []
        self._snaps: list[torch.Tensor] = []
        self._hooks: list = []

    def __enter__(self) -> WorkCounter:
        dev = next(iter(self.tr.parameters()), torch.empty(0)).device
        counts = torch.zeros(len(self.mods), dtype=torch.int64, device=dev)

        def on_call(_mod, _args, _kwargs):
            if self._snaps:
                self._snaps[-1] = counts.clone()
            counts.zero_()
            self._snaps.append(counts)  # this call's counts: copied at the next call or on exit

        for b, m in enumerate(self.mods):
            m.register_buffer(self.BUFFER, counts[b], persistent=False)
            self._hooks.append(m.register_forward_hook(_count_rows))
        self._hooks.append(self.tr.register_forward_pre_hook(on_call, with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for m in self.mods:
            delattr(m, self.BUFFER)
        if self._snaps:
            self.steps = torch.stack(self._snaps).tolist()
        self._snaps.clear()

    def per_step_fraction(self, full: int | None = None) -> list[float]:
        """Computed fraction of each step's block evaluations (``full`` = rows per step when all compute)."""
        full = full or 2 * len(self.mods)
        return [sum(s) / full for s in self.steps]

    def fraction(self, full: int | None = None) -> float:
        f = self.per_step_fraction(full)
        return sum(f) / len(f) if f else 0.0


def _count_rows(mod, args, _out) -> None:
    getattr(mod, WorkCounter.BUFFER).add_(args[0].shape[0])


# ------------------------------------------------------------------------------------------ weight bytes


def tensor_bytes(t: torch.Tensor) -> int:
    """Storage bytes of a tensor, looking inside tensor subclasses (torchao's quantized weights)."""
    if hasattr(t, "__tensor_flatten__") and type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def module_bytes(module: torch.nn.Module) -> int:
    """Parameters + buffers of ``module`` in bytes (shared tensors once)."""
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        key = id(t)
        if key in seen or t.device.type == "meta":
            continue
        seen.add(key)
        total += tensor_bytes(t)
    return total


def weight_bytes(pipe) -> int:
    """The transformer's weight bytes as a row leaves it: for sixbit, packed weights + originals kept on the
    device + the layers it leaves alone + buffers (``handle.memory()``); otherwise :func:`module_bytes`."""
    handle = getattr(pipe, "_peers_sixbit", None)
    if handle is None:
        return module_bytes(pipe.transformer)
    mem = handle.memory()
    buffers = sum(b.numel() * b.element_size() for b in pipe.transformer.buffers())
    return int(mem["packed_bytes"] + mem["fp_bytes_on_device"] + mem["other_transformer_bytes"] + buffers)


# ------------------------------------------------------------------------------------- diffusers caches


def _enable(config) -> Callable:
    def apply(pipe, ctx: Ctx):
        pipe.transformer.enable_cache(config(pipe, ctx))
        return pipe.transformer.disable_cache
    return apply


def fbc(threshold: float):
    from diffusers import FirstBlockCacheConfig

    def cfg(pipe, ctx):
        t = {"compute": -1.0, "skip": float(BIG)}.get(ctx.mode, threshold)
        return FirstBlockCacheConfig(threshold=t)
    return _enable(cfg)


def taylorseer(interval: int, before: int = 3, order: int = 1):
    from diffusers import TaylorSeerCacheConfig

    def cfg(pipe, ctx):
        iv, bf = interval, before
        if ctx.mode == "compute":
            bf = BIG
        elif ctx.mode == "skip":
            iv, bf = BIG, 1
        return TaylorSeerCacheConfig(cache_interval=iv, disable_cache_before_step=bf, max_order=order,
                                     taylor_factors_dtype=torch.float32, cache_identifiers=[BLOCK_PATTERN])
    return _enable(cfg)


def magcache(threshold: float, max_skip: int = 3, retention: float = 0.2):
    from diffusers import MagCacheConfig

    def cfg(pipe, ctx):
        th, k, ret = threshold, max_skip, retention
        if ctx.mode == "compute":
            th = -1.0
        elif ctx.mode == "skip":
            th, k, ret = float(BIG), BIG, 0.0
        ratios = ctx.mag_ratios or [1.0] * ctx.steps  # forced modes ignore the ratios
        return MagCacheConfig(threshold=th, max_skip_steps=k, retention_ratio=ret, num_inference_steps=ctx.steps,
                              mag_ratios=ratios)
    return _enable(cfg)


def calibrate_magcache(pipe, call: dict) -> list[float]:
    """MagCache's documented calibration: one generation with ``calibrate=True``; the ratios it prints."""
    from diffusers import MagCacheConfig

    pipe.transformer.enable_cache(MagCacheConfig(calibrate=True, num_inference_steps=call["num_inference_steps"]))
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            pipe(**call)
    finally:
        pipe.transformer.disable_cache()
    found = re.findall(r"\[([0-9eE.,\s+-]+)\]", buf.getvalue())
    if not found:
        raise RuntimeError(f"MagCache calibration printed no ratios: {buf.getvalue()[-500:]!r}")
    return [float(x) for x in found[-1].split(",")]


def faster_cache(block_skip: int = 2, uncond_skip: int = 5):
    from diffusers import FasterCacheConfig

    def cfg(pipe, ctx):
        att, unc, unc_range, att_range = block_skip, uncond_skip, (-1, 641), (-1, 681)
        if ctx.mode == "compute":
            att_range = unc_range = (-2, -1)
        elif ctx.mode == "skip":
            att, unc, att_range, unc_range = BIG, BIG, (-1, BIG), (-1, BIG)
        # the documented CogVideoX example (diffusers' apply_faster_cache docstring)
        return FasterCacheConfig(spatial_attention_block_skip_range=att, spatial_attention_timestep_skip_range=att_range,
                                 low_frequency_weight_update_timestep_range=(99, 641),
                                 high_frequency_weight_update_timestep_range=(-1, 301),
                                 unconditional_batch_skip_range=unc, unconditional_batch_timestep_skip_range=unc_range,
                                 spatial_attention_block_identifiers=["transformer_blocks"],
                                 attention_weight_callback=lambda _: 0.3, tensor_format="BFCHW",
                                 current_timestep_callback=lambda: pipe.current_timestep)
    return _enable(cfg)


def pab(block_skip: int, timestep_range=(100, 800)):
    from diffusers import PyramidAttentionBroadcastConfig

    def cfg(pipe, ctx):
        r, rng = block_skip, timestep_range
        if ctx.mode == "compute":
            rng = (-2, -1)
        elif ctx.mode == "skip":
            r, rng = BIG, (-1, BIG)
        return PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=r,
                                               spatial_attention_timestep_skip_range=rng,
                                               current_timestep_callback=lambda: pipe.current_timestep)
    return _enable(cfg)


# --------------------------------------------------------------------------------------------- cache-dit


def dbcache(threshold: float, fn: int = 1, bn: int = 0, warmup: int = 8, taylorseer_order: int | None = None):
    def apply(pipe, ctx: Ctx):
        import cache_dit
        from cache_dit import DBCacheConfig, TaylorSeerCalibratorConfig

        th, wu = threshold, warmup
        if ctx.mode == "compute":
            th = 0.0
        elif ctx.mode == "skip":
            th, wu = float(BIG), 1
        cache = DBCacheConfig(Fn_compute_blocks=fn, Bn_compute_blocks=bn, residual_diff_threshold=th,
                              max_warmup_steps=wu, num_inference_steps=ctx.steps, enable_separate_cfg=False)
        cal = None if taylorseer_order is None else TaylorSeerCalibratorConfig(taylorseer_order=taylorseer_order)
        cache_dit.enable_cache(pipe, cache_config=cache, calibrator_config=cal)
        return lambda: cache_dit.disable_cache(pipe)
    return apply


# ---------------------------------------------------------------------------------- torchao, SageAttention


#: the blocks' modulation linears (CogVideoX's ``norm1.linear``/``norm2.linear``): one row per batch entry
MODULATION = (".norm1.linear", ".norm2.linear")


def torchao_quant(kind: str, modulation: bool = True):
    """torchao's dynamic quantization of every nn.Linear of the transformer (``modulation=False``: not the blocks'
    modulation linears — under torch.compile torchao's int8 matmul lowers to cuBLAS ``_int_mm``, which refuses
    fewer than 17 rows, and a modulation linear has 2)."""
    def apply(pipe, ctx: Ctx):
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            Int8DynamicActivationInt8WeightConfig,
            PerRow,
            quantize_,
        )

        cfg = (Int8DynamicActivationInt8WeightConfig() if kind == "int8"
               else Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
        keep = None if modulation else (  # None: torchao's default, every nn.Linear
            lambda m, fqn: isinstance(m, torch.nn.Linear) and not fqn.endswith(MODULATION))
        if kind == "fp8" and ctx.device.type == "cpu":
            with fp8_on_cpu(pipe.transformer):
                quantize_(pipe.transformer, cfg, filter_fn=keep)
        else:
            quantize_(pipe.transformer, cfg, filter_fn=keep)
        return _irreversible
    return apply


@contextlib.contextmanager
def fp8_on_cpu(model: torch.nn.Module):
    """torchao's fp8 quantization of an FP32 model on the CPU (module docstring), for the CPU quality run only:
    while active its fp8 configs skip their CUDA-capability check, and the linears' weights are bf16 — its
    per-row fp8 needs a bf16 weight, which the GPU runs' bf16 models have (fp32 → bf16 → e4m3 differs from
    fp32 → e4m3 only by rare double rounding), while the activations, biases and the rest of the model stay FP32,
    as in the int8 row. A linear torchao leaves unquantized gets its FP32 weight back."""
    from unittest import mock

    from torchao.quantization import quant_api

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.float32]
    kept = {m: m.weight for m in linears}
    for m in linears:
        m.weight = torch.nn.Parameter(m.weight.detach().to(torch.bfloat16), requires_grad=False)
    try:
        with mock.patch.object(quant_api, "_check_hardware_support", lambda *args, **kwargs: None):
            yield
    finally:
        for m, w in kept.items():
            if type(m.weight) in (torch.nn.Parameter, torch.Tensor) and m.weight.dtype == torch.bfloat16:
                m.weight = w


def _irreversible() -> None:
    """torchao's quantize_ replaces weights in place: the runner reloads the pipeline after such a row."""


def sage(pipe, ctx: Ctx):
    import torch.nn.functional as F
    from sageattention import sageattn

    orig = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        if attn_mask is not None or dropout_p or q.device.type != "cuda":
            return orig(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)
        if q.dtype in (torch.float16, torch.bfloat16):
            return sageattn(q, k, v, tensor_layout="HND", is_causal=is_causal)
        lo = [t.to(torch.bfloat16) for t in (q, k, v)]  # sageattn takes fp16/bf16 only
        return sageattn(*lo, tensor_layout="HND", is_causal=is_causal).to(q.dtype)

    F.scaled_dot_product_attention = sdpa

    def undo():
        F.scaled_dot_product_attention = orig
    return undo


def compile_blocks(pipe, ctx: Ctx):
    """Regional compilation (torch.compile of each transformer block, as torchao's docs pair it with; one
    graph serves every block): compiled by the warm-up call, never inside a timed one (the speed half counts
    the compiles of each call)."""
    for block in pipe.transformer.transformer_blocks:
        block.compile()
    return lambda: None


def fuse_int_mm_with_mul(pipe, ctx: Ctx):
    """The one inductor setting of torchao's ``recommended_inductor_config_setter`` that int8 dynamic
    quantization leans on: the row-scale multiply fused into the int8 matmul (its eager path writes an int32
    M×N product and rescales it in fp32, in separate passes). The tuning options it also sets only lengthen
    compilation; restored on undo."""
    import torch._inductor.config as inductor

    prev = inductor.force_fuse_int_mm_with_mul
    inductor.force_fuse_int_mm_with_mul = True

    def undo():
        inductor.force_fuse_int_mm_with_mul = prev
    return undo


def stack(*parts):
    def apply(pipe, ctx: Ctx):
        undos = [p(pipe, ctx) for p in parts]

        def undo():
            for u in reversed(undos):
                u()
        return undo
    return apply


# ------------------------------------------------------------------------------------------------ sixbit


def sixbit_row(preset: str, **overrides):
    def apply(pipe, ctx: Ctx):
        import sixbit

        cfg = sixbit.SixBitConfig.preset(preset, **overrides)
        sched = None
        if ctx.mode is not None:  # forced unit costs: the method's computed step (the report prices warm-up steps)
            cfg = cfg.replace(warmup_steps=0)
        if ctx.mode is not None and ctx.loop_steps and cfg.tdc_reuse == "auto":
            from sixbit.tdc import resolve_reuse

            cfg = cfg.replace(tdc_reuse=resolve_reuse(cfg, ctx.loop_steps))
        if ctx.mode is not None and cfg.tdc:
            sched = _forced_schedule(ctx, cfg.quantized, cfg.tdc_scope)
        handle = sixbit.apply(pipe, cfg, schedule=sched)
        pipe._peers_sixbit = handle
        return handle.remove
    return apply


def _forced_schedule(ctx: Ctx, quantized: bool, scope: str = "block"):
    """All-computed (with the routes recorded on sixbit-mini, when the row routes) or all-skipped schedule, its
    skips of the row's ``tdc_scope`` (whole blocks, or attention reuse)."""
    from sixbit import SkipSchedule

    nb, ns = ctx.num_blocks, ctx.steps
    if ctx.mode == "compute" and quantized and ctx.schedule and ctx.schedule.get("routes"):
        sched = SkipSchedule.from_dict(ctx.schedule).dense().resample(nb, ns)
    else:
        keep = ctx.mode == "compute"
        sched = SkipSchedule(nb, ns, {"all": [[keep] * nb for _ in range(ns)]}, {"forced": ctx.mode})
    sched.scope = scope
    return sched


# -------------------------------------------------------------------------------------------- the rows


def _none(pipe, ctx):
    return lambda: None


#: why the GPU-only rows have no sixbit-mini quality of their own (the mini runs on the CPU); the error is the
#: library's own
NO_SAGE = 'SageAttention on the CPU: "Input tensors must be on cuda." (Triton/CUDA kernels only)'


def build_rows() -> list[Row]:
    R = Row
    rows = [
        R("baseline", "baseline", "diffusers baseline (FP32 on CPU = the reference; bf16 on GPU)", _none, caching=False),
        # diffusers FirstBlockCache: documented default 0.05, sweep of its threshold
        *[R(f"fbc_{t:g}", "fbc", f"diffusers FirstBlockCache threshold={t:g}", fbc(t), settings={"threshold": t},
            note="default 0.05" if t == 0.05 else "") for t in (0.05, 0.1, 0.2, 0.3)],
        # TaylorSeerCache: documented example (interval 5, order 1, 3 warm-up steps), sweep of cache_interval
        *[R(f"taylorseer_i{i}", "taylorseer", f"diffusers TaylorSeerCache cache_interval={i} (whole blocks)",
            taylorseer(i), settings={"cache_interval": i, "max_order": 1, "disable_cache_before_step": 3,
                                     "cache_identifiers": [BLOCK_PATTERN]}) for i in (5, 3, 2)],
        # MagCache: documented threshold 0.06 / K=3 / retention 0.2 with calibrated ratios, sweep of threshold
        *[R(f"magcache_{t:g}", "magcache", f"diffusers MagCache threshold={t:g} (calibrated)", magcache(t),
            settings={"threshold": t, "max_skip_steps": 3, "retention_ratio": 0.2}) for t in (0.06, 0.12, 0.24)],
        # on sixbit-mini the threshold saturates at max_skip_steps=3 (0.12 and 0.24 skip alike): one row with K=6
        R("magcache_0.24_k6", "magcache", "diffusers MagCache threshold=0.24, max_skip_steps=6 (calibrated)",
          magcache(0.24, max_skip=6), settings={"threshold": 0.24, "max_skip_steps": 6, "retention_ratio": 0.2}),
        # FasterCache: diffusers' CogVideoX example, sweep of the attention skip range
        *[R(f"fastercache_r{r}", "fastercache", f"diffusers FasterCache attention skip range {r}", faster_cache(r),
            settings={"spatial_attention_block_skip_range": r, "unconditional_batch_skip_range": 5}) for r in (2, 3)],
        # PAB: diffusers' CogVideoX example (range 2, timesteps 100-800), sweep of the skip range
        *[R(f"pab_r{r}", "pab", f"diffusers PyramidAttentionBroadcast skip range {r}", pab(r),
            settings={"spatial_attention_block_skip_range": r, "timestep_range": [100, 800]}) for r in (2, 3, 4)],
        # cache-dit DBCache F1B0 (its CogVideoX example), sweep of the residual threshold; + TaylorSeer order 2
        *[R(f"dbcache_{t:g}", "dbcache", f"cache-dit DBCache F1B0 rdt={t:g}", dbcache(t),
            settings={"Fn": 1, "Bn": 0, "residual_diff_threshold": t, "max_warmup_steps": 8}) for t in (0.08, 0.12, 0.24)],
        *[R(f"dbcache_ts_{t:g}", "dbcache_ts", f"cache-dit DBCache F1B0 rdt={t:g} + TaylorSeer order 2",
            dbcache(t, taylorseer_order=2), settings={"Fn": 1, "Bn": 0, "residual_diff_threshold": t,
                                                      "max_warmup_steps": 8, "taylorseer_order": 2})
          for t in (0.12, 0.24)],
        R("torchao_int8", "torchao_int8", "torchao int8 dynamic activations × int8 weights", torchao_quant("int8"),
          caching=False),
        R("torchao_fp8", "torchao_fp8", "torchao fp8 dynamic activations × fp8 weights (per row)",
          torchao_quant("fp8"), caching=False, note="CPU: torchao's capability check lifted for quantize_"),
        # a speed row: compilation changes the kernels, not the numbers, so its quality is torchao_fp8's
        R("torchao_fp8_compile", "torchao_fp8_compile", "torchao fp8 dynamic + torch.compile of each block",
          stack(torchao_quant("fp8"), compile_blocks), caching=False, gpu_only=True, quality_from="torchao_fp8",
          reason="A GPU speed row (inductor's fused kernels): its quantization, so its quality, is torchao_fp8's."),
        # torchao's documented pairing: int8 dynamic quantization + torch.compile (eager int8 is 3x slower than bf16);
        # compiled, the 2-row modulation linears fail in cuBLAS int8 (session 16, H200), so they stay bf16
        R("torchao_int8_compile", "torchao_int8_compile",
          "torchao int8 dynamic (modulation linears bf16) + torch.compile of each block",
          stack(torchao_quant("int8", modulation=False), fuse_int_mm_with_mul, compile_blocks), caching=False,
          gpu_only=True, reason="A GPU speed row: compilation fuses kernels; its quantization (quality) is about "
          "torchao_int8's (the blocks' modulation linears stay bf16: compiled, cuBLAS int8 needs > 16 rows)."),
        R("sage", "sage", "SageAttention (sageattn for SDPA)", sage, caching=False, gpu_only=True, reason=NO_SAGE),
        # user-assembled stacks: the cache that leads on mini + quantization (+ SageAttention on GPU)
        R("stack_fbc_int8", "stack_fbc_int8", "FirstBlockCache 0.1 + torchao int8 dynamic",
          stack(torchao_quant("int8"), fbc(0.1)), settings={"threshold": 0.1}),
        R("stack_dbcache_int8", "stack_dbcache_int8", "cache-dit DBCache F1B0 0.12 + torchao int8 dynamic",
          stack(torchao_quant("int8"), dbcache(0.12)), settings={"residual_diff_threshold": 0.12}),
        R("stack_fbc_fp8", "stack_fbc_fp8", "FirstBlockCache 0.1 + torchao fp8 dynamic",
          stack(torchao_quant("fp8"), fbc(0.1)), settings={"threshold": 0.1},
          note="CPU: torchao's capability check lifted for quantize_"),
        R("stack_fbc_fp8_sage", "stack_fbc_fp8_sage", "FirstBlockCache 0.1 + torchao fp8 dynamic + SageAttention",
          stack(torchao_quant("fp8"), sage, fbc(0.1)), gpu_only=True, settings={"threshold": 0.1},
          reason=NO_SAGE),
        # the same cache with torchao's documented fp8 + compile pairing (the arena's fastest computed step); the
        # counter and FirstBlockCache's hooks compile with the blocks (the counter's counts are tensor data)
        R("stack_fbc_fp8_compile", "stack_fbc_fp8_compile",
          "FirstBlockCache 0.1 + torchao fp8 dynamic + torch.compile of each block",
          stack(torchao_quant("fp8"), fbc(0.1), compile_blocks), gpu_only=True, settings={"threshold": 0.1},
          quality_from="stack_fbc_fp8",
          reason="A GPU speed row (inductor's fused kernels): its quantization and cache, so its quality and "
          "decisions on sixbit-mini, are stack_fbc_fp8's."),
        # sixbit presets
        R("sixbit_tdc_only", "sixbit_tdc_only", "sixbit tdc_only (TDC, no quantization)", sixbit_row("tdc_only")),
        R("sixbit_full", "sixbit_full", "sixbit full (balanced: DMPQ+TDC+PDR)", sixbit_row("full")),
        R("sixbit_full_w8a8", "sixbit_full_w8a8", "sixbit full, INT8 decisions on W8A8", sixbit_row("full", int8_route="w8a8")),
        R("sixbit_w8a8_tdc", "sixbit_w8a8_tdc", "sixbit static W8A8 + TDC", sixbit_row("w8a8", tdc=True)),
        R("sixbit_fast", "sixbit_fast", "sixbit fast (full on W8A8; NVFP4 decisions run INT8 without FP4 tensor cores)",
          sixbit_row("fast")),
        R("sixbit_aggressive", "sixbit_aggressive", "sixbit aggressive", sixbit_row("aggressive")),
        # TDC alone with the second-order forecast (session 14; TaylorSeer's order 2), the probe compared with the
        # forecast (the default when these ran), a sweep of the probe threshold (given for 20 steps, × 20/N); and
        # session 13's default (first order, forecast-compared) at a looser threshold
        *[R(f"sixbit_tdc_q2_{t:g}", "sixbit_tdc_q2", f"sixbit tdc_only, second-order forecast, probe {t:g}×20/N",
            sixbit_row("tdc_only", tdc_reuse="quadratic", tdc_probe_threshold=t, tdc_probe_reference="forecast"),
            settings={"tdc_reuse": "quadratic", "tdc_probe_threshold": t, "tdc_probe_reference": "forecast"}) for t in (0.05, 0.075, 0.085, 0.1, 0.2)],
        # the same with the probe compared with its last computed delta (cache-dit DBCache's rule; session 14)
        *[R(f"sixbit_tdc_q2last_{t:g}", "sixbit_tdc_q2", f"sixbit tdc_only, second-order forecast, probe vs its last "
            f"delta, {t:g}×20/N", sixbit_row("tdc_only", tdc_reuse="quadratic", tdc_probe_threshold=t,
                                              tdc_probe_reference="last"),
            settings={"tdc_reuse": "quadratic", "tdc_probe_threshold": t, "tdc_probe_reference": "last"})
          for t in (0.1, 0.15, 0.2, 0.25, 0.3)],
        R("sixbit_tdc_auto_0.075", "sixbit_tdc_auto", "sixbit tdc_only, forecast threshold 0.075×20/N",
          sixbit_row("tdc_only", tdc_forecast_threshold=0.075, tdc_probe_reference="forecast"),
          settings={"tdc_forecast_threshold": 0.075, "tdc_probe_reference": "forecast"}),
        R("sixbit_tdc_attn", "sixbit_tdc_attn", "sixbit tdc_attn (TDC attention reuse, no quantization)",
          sixbit_row("tdc_attn")),
        # the memory row: the modulation linears (left in 16 bits by the presets) packed weight-only 4-bit too
        R("sixbit_full_mod4", "sixbit_full_mod4", "sixbit full, 4-bit modulation weights (modulation_weights=nvfp4)",
          sixbit_row("full", modulation_weights="nvfp4")),
        # the same weights with aggressive's routes and cache (session 21): the fastest 4-bit-weight row, for the memory
        # half at 50 steps, where the fastest peer at sixbit's PSNR keeps fp8 weights (1.65 GiB at 2B; 3x smaller than
        # that is below NVFP4's 4.5 bits, so only a 4-bit row faster than it can meet the half)
        R("sixbit_aggressive_mod4", "sixbit_aggressive_mod4",
          "sixbit aggressive, 4-bit modulation weights (modulation_weights=nvfp4)",
          sixbit_row("aggressive", modulation_weights="nvfp4")),
    ]
    names = [r.name for r in rows]
    assert len(names) == len(set(names)), "duplicate row names"
    assert all(bool(r.reason) == r.gpu_only for r in rows), "a GPU-only row says why it has no CPU quality"
    cpu = {r.name for r in rows if not r.gpu_only}
    assert all(r.gpu_only and r.quality_from in cpu for r in rows if r.quality_from), "quality borrowed from a CPU row"
    return rows


ROWS = {r.name: r for r in build_rows()}


def gpu_only_entry(name: str) -> dict:
    """A quality table's entry for a GPU-only row: no videos, its one-line reason."""
    row = ROWS[name]
    return {"name": name, "label": row.label, "family": row.family, "gpu_only": True, "n": 0, "reason": row.reason,
            "summary": {}}
