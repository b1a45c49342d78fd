"""The engine: ``sixbit.apply(pipe, cfg)`` wires DMPQ, TDC and PDR into a diffusers pipeline.

Two kinds of diffusers hooks (``diffusers.hooks.HookRegistry`` / ``ModelHook``), both stateful with a
``StateManager`` so that every ``cache_context`` (CFG branch: ``"cond_uncond"`` for CogVideoX, ``"cond"``
and ``"uncond"`` for Wan) has its own state, reset by the pipeline's ``maybe_free_model_hooks()`` at the
end of every call:

* one **denoiser hook** on the transformer: counts the steps of each branch, starts a new run (fresh
  caches, fresh trace) when a call begins — also if the previous call died without the reset (a new run
  is recognised by a changed input shape or a timestep that went up: schedulers run timesteps downwards,
  second-order ones may repeat one) — and times each step;
* one **block hook** per transformer block (``new_forward``): decides skip or compute (TDC, or a
  replayed :class:`~sixbit.tdc.SkipSchedule`), picks each layer's route (warm-up → full precision;
  PDR → full precision; first computed step after a skip → INT8; otherwise DMPQ from Γ), runs the block,
  measures Γ and the delta change, refreshes the cache and writes the trace.

The linear layers are swapped for :class:`~sixbit.linear.SixBitLinear` (module replacement); the block
hook sets each layer's ``route`` just before the block runs. With ``fast_qk_norm`` (engineering, not the
method) CogVideoX's attentions get :class:`~sixbit.attention.FusedQKNormRopeProcessor` through diffusers'
``set_processor``. A computed block's Δ and statistics come from ``ops.block_stats`` (one pass per token
stream on the GPU; the torch reference elsewhere).

Host synchronisations: per computed block one read of a stacked statistics tensor (Γ sums and delta-
change sums), plus one for the PDR outlier ratio when PDR applies; none for a skipped block; per step one
for the timestep (run detection) and one GPU synchronize for the step time (``sync_timing``). All
statistics are additive sums; ``handle.reduce_stats`` (default ``None``) is applied to each stacked
tensor before it is read — set it to an all-reduce under context parallelism so every rank takes the
same decision.

Memory: by default (``fp_weights="cpu"``) the device holds only the packed weights of the routed layers;
the original ``nn.Linear`` modules are moved to the CPU and kept there so ``handle.remove()`` restores
the model exactly. TDC keeps one Δ per block and stream (model dtype) per CFG branch: that is the
method's own memory cost.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.hooks.hooks import BaseState, CacheContext, HookRegistry, ModelHook, StateManager
from torch import nn

from sixbit import attention
from sixbit import pdr as pdr_rule
from sixbit import tdc as tdc_rule
from sixbit.adapters import Adapter, get_adapter
from sixbit.config import UNCALIBRATED_TAU, SixBitConfig
from sixbit.dmpq import Router, gamma_sums, ratio
from sixbit.linear import (
    SixBitLinear,
    nvfp4_packable,
    ops,
    param_bytes,
    restore_linears,
    swap_linears,
    swap_weight_only,
    swapped_bytes,
)
from sixbit.policy import Policy
from sixbit.routes import FP16, INT8, SKIPPED, STATIC, display
from sixbit.tdc import BlockState, SkipSchedule
from sixbit.trace import Trace

__all__ = ["apply", "SixBitHandle", "POLICY_DIR"]

POLICY_DIR = Path(__file__).resolve().parent.parent / "assets" / "policies"
_DENOISER_HOOK = "sixbit_denoiser"
_BLOCK_HOOK = "sixbit_block"
_DEFAULT_CONTEXT = "default"


class _StepState(BaseState):
    def __init__(self):
        self.reset()

    def reset(self, *args, **kwargs):
        self.step = 0
        self.last_t: float | None = None
        self.shape: tuple | None = None


@dataclass
class _Current:
    branch: str
    step: int
    num_steps: int | None
    rec: Any
    t0: float


class _DenoiserHook(ModelHook):
    _is_stateful = True

    def __init__(self, engine: SixBitHandle):
        super().__init__()
        self.engine = engine
        self.state_manager = StateManager(_StepState)

    def pre_forward(self, module, *args, **kwargs):
        self.engine._begin_call(args, kwargs)
        return args, kwargs

    def post_forward(self, module, output):
        self.engine._end_call()
        return output

    def reset_state(self, module):
        self.engine._end_run()
        self.state_manager.reset()
        return module


class _BlockHook(ModelHook):
    _is_stateful = True

    def __init__(self, engine: SixBitHandle, index: int):
        super().__init__()
        self.engine = engine
        self.index = index
        self.state_manager = StateManager(BlockState)

    def new_forward(self, module, *args, **kwargs):
        return self.engine._run_block(self, module, args, kwargs)

    def reset_state(self, module):
        self.state_manager.reset()
        return module


def _arg(module: nn.Module, name: str, args: tuple, kwargs: dict):
    """Argument ``name`` of ``module.forward`` from a call's args/kwargs (None when absent)."""
    if name in kwargs:
        return kwargs[name]
    params = _PARAMS.get(type(module))
    if params is None:
        params = _PARAMS[type(module)] = list(inspect.signature(type(module).forward).parameters)[1:]
    i = params.index(name) if name in params else None
    return args[i] if i is not None and i < len(args) else None


_PARAMS: dict[type, list[str]] = {}


def _resolve_policy(cfg: SixBitConfig, policy, pipe, transformer) -> Policy:
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        return Policy.load(policy)
    p = cfg.policy
    if p in (None, ""):
        return Policy.uncalibrated(cfg.tau if cfg.tau is not None else UNCALIBRATED_TAU)
    if p == "auto":
        for cand in _model_names(pipe, transformer):
            f = POLICY_DIR / f"{cand}.json"
            if f.is_file():
                return Policy.load(f)
        return Policy.uncalibrated(cfg.tau if cfg.tau is not None else UNCALIBRATED_TAU)
    return Policy.load(p)


def _model_names(pipe, transformer) -> list[str]:
    names = []
    for src in (getattr(pipe, "name_or_path", None), getattr(getattr(transformer, "config", None), "_name_or_path", None)):
        if not src:
            continue
        p = Path(str(src).rstrip("/"))
        names += [p.name, p.parent.name] if p.name == "transformer" else [p.name]
    return [n for n in names if n]


class SixBitHandle:
    """What :func:`apply` returns: the live trace, the swapped layers, and ``remove()``."""

    def __init__(self, pipe, transformer: nn.Module, cfg: SixBitConfig, adapter: Adapter, policy: Policy,
                 schedule: SkipSchedule | None):
        self.pipe = pipe
        self.transformer = transformer
        self.cfg = cfg
        self.adapter = adapter
        self.policy = policy
        self.schedule = schedule
        #: optional ``fn(tensor) -> tensor`` applied to every statistics tensor before it is read (all-reduce)
        self.reduce_stats: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.warnings: list[str] = []
        self.removed = False
        self._cur: _Current | None = None
        self._run_active = False
        self._own_context = False
        self.schedule_overrides = 0

        blocks = adapter.blocks(transformer)
        self.block_names = [n for n, _ in blocks]
        self.linear_names: list[str] = []
        self.block_linear_idx: list[range] = []
        per_block_rel: list[list[str]] = []
        for bname, block in blocks:
            start = len(self.linear_names)
            rels = []
            for rel, lin in adapter.block_linears(block):
                if lin.in_features % 16:
                    self.warnings.append(f"{bname}.{rel}: width {lin.in_features} is not a multiple of 16; "
                                         "left in full precision")
                    continue
                rels.append(rel)
                self.linear_names.append(f"{bname}.{rel}")
            per_block_rel.append(rels)
            self.block_linear_idx.append(range(start, len(self.linear_names)))

        # τ and routers
        if cfg.tau is not None:
            self.tau = cfg.tau
        elif policy.calibrated and cfg.target_bits is not None:
            self.tau = policy.tau_for_bits(cfg.target_bits)
        else:
            self.tau = policy.tau
        if cfg.quant == "dmpq":
            if not policy.calibrated:
                self.warnings.append("no calibrated policy: DMPQ predicts E = Γ for every layer "
                                     f"(τ = {self.tau}); run `python -m sixbit.calibrate` for real α, β")
            elif policy.hadamard_block is not None and policy.hadamard_block != cfg.hadamard_block:
                self.warnings.append(f"policy was calibrated with hadamard_block={policy.hadamard_block}, "
                                     f"config uses {cfg.hadamard_block}")
            self.routers = [Router.for_block(policy, [self.linear_names[j] for j in idx], self.tau)
                            for idx in self.block_linear_idx]
        else:
            self.routers = None
        self.pdr_rho, self.pdr_rho_source = pdr_rule.resolve_rho(cfg, policy)
        if cfg.pdr and cfg.quant == "dmpq" and cfg.tdc and self.pdr_rho_source == "fallback" and policy.calibrated:
            self.warnings.append(f"the policy has no PDR ρ for k_σ = {cfg.pdr_k_sigma}: using {self.pdr_rho:g}; "
                                 "re-run `python -m sixbit.calibrate` to measure it for this model")

        # swap the layers
        self.modules: list[SixBitLinear] = []
        self._originals: dict = {}
        if cfg.quantized:
            int8_route = INT8 if cfg.quant == "w4a8" else cfg.int8_route
            new, self._originals = swap_linears(
                transformer, self.linear_names, formats_=cfg.weight_formats, hadamard_block=cfg.hadamard_block,
                fp_weights=cfg.fp_weights, int8_route=int8_route, backend=cfg.backend,
                k_sigma=cfg.pdr_k_sigma if cfg.trace_linear_outliers else None,
            )
            self.modules = [new[n] for n in self.linear_names]
        # weight-only 4-bit storage (route w4a16, never routed by DMPQ): modulation and embedder linears
        self.weight_only_modules: list[SixBitLinear] = []
        candidates = []
        if cfg.modulation_weights == "nvfp4":
            candidates += [(f"{bname}.{rel}", lin) for bname, block in blocks
                           for rel, lin in adapter.block_linears(block, modulation=True)]
        if cfg.embedder_weights == "nvfp4":
            candidates += adapter.outer_linears(transformer)
        new, orig = swap_weight_only(transformer, [n for n, lin in candidates if nvfp4_packable(lin)],
                                     fp_weights=cfg.fp_weights, backend=cfg.backend)
        self.weight_only_modules = list(new.values())
        self._originals.update(orig)

        # hooks
        self._created_registries: list[nn.Module] = []
        self._had_forward_attr: dict[int, bool] = {}
        self._hooked: list[nn.Module] = []
        self._denoiser_hook = _DenoiserHook(self)
        self._register(transformer, self._denoiser_hook, _DENOISER_HOOK)
        self._block_hooks = []
        for b, (_, block) in enumerate(blocks):
            hook = _BlockHook(self, b)
            self._register(block, hook, _BLOCK_HOOK)
            self._block_hooks.append(hook)
        # engineering, not the method: q/k LayerNorm + rotary embedding in one kernel (CogVideoX, CUDA)
        self._attn_processors = attention.install(blocks, ops(), cfg.backend) if cfg.fast_qk_norm else []
        HookRegistry.check_if_exists_or_initialize(transformer).invalidate_child_registries_cache()
        transformer._sixbit_handle = self
        self.trace = self._new_trace()

    # --------------------------------------------------------------------------------------- hooks
    def _register(self, module: nn.Module, hook: ModelHook, name: str) -> None:
        if not hasattr(module, "_diffusers_hook"):
            self._created_registries.append(module)
        self._had_forward_attr[id(module)] = "forward" in module.__dict__
        HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)
        self._hooked.append(module)

    def _managers(self) -> list[StateManager]:
        return [self._denoiser_hook.state_manager] + [h.state_manager for h in self._block_hooks]

    def _new_trace(self) -> Trace:
        try:
            device = next(p.device for p in self.transformer.parameters())
        except StopIteration:
            device = torch.device("cpu")
        self._device = device
        config = {**self.cfg.to_dict(), "policy_resolved": self.policy.describe(), "tau_resolved": self.tau,
                  "pdr_rho_resolved": self.pdr_rho, "pdr_rho_source": self.pdr_rho_source,
                  "family": self.adapter.family, "cfg_batching": self.adapter.cfg,
                  "schedule": None if self.schedule is None else self.schedule.source}
        return Trace(
            model=str(getattr(self.pipe, "name_or_path", "") or getattr(self.transformer.config, "_name_or_path", "")
                      or type(self.transformer).__name__),
            device=str(device), compute_path=ops().compute_path(device), config=config,
            blocks=self.block_names, linears=self.linear_names, block_linears=self.block_linear_idx,
            extra={"weight_bytes": self.memory()},
        )

    # ---------------------------------------------------------------------------------- run control
    def _start_run(self, ctx: CacheContext) -> None:
        for m in self._managers():
            m.reset()
            m.set_context(ctx)
        self.trace = self._new_trace()
        self.schedule_overrides = 0
        self._run_active = True
        if self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)

    def _end_run(self) -> None:
        if self._run_active and self.trace.steps:
            self.trace.close_step(len(self.trace.steps) - 1)
        self.trace.finished = True
        self._run_active = False
        self._cur = None

    def reset(self) -> None:
        """Forget every cache now (the next transformer call starts a new run)."""
        for m in self._managers():
            m.reset()
        self._run_active = False
        self._cur = None

    def _begin_call(self, args, kwargs) -> None:
        mgr = self._denoiser_hook.state_manager
        if mgr._context is None:  # called outside a pipeline's cache_context
            ctx = CacheContext(_DEFAULT_CONTEXT)
            for m in self._managers():
                m.set_context(ctx)
            self._own_context = True
        ctx = mgr.context
        hs = _arg(self.transformer, "hidden_states", args, kwargs)
        t = _arg(self.transformer, "timestep", args, kwargs)
        t_val = float(t.detach().float().max()) if isinstance(t, torch.Tensor) else float(t if t is not None else 0)
        enc = _arg(self.transformer, "encoder_hidden_states", args, kwargs)
        shape = (tuple(hs.shape), tuple(enc.shape) if isinstance(enc, torch.Tensor) else None)
        st = mgr.get_state()
        if not self._run_active or (st.step > 0 and (shape != st.shape or t_val > st.last_t)):
            self._start_run(ctx)
            st = mgr.get_state()
        step = st.step
        st.step += 1
        st.last_t, st.shape = t_val, shape
        if step > 0 and ctx.name == next(iter(self.trace.steps[step - 1].branches), None):
            self.trace.close_step(step - 1)
        num_steps = ctx.num_inference_steps or getattr(self.pipe, "_num_timesteps", None)
        rec = self.trace.branch(step, ctx.name, t_val)
        self._cur = _Current(ctx.name, step, num_steps, rec, time.perf_counter())

    def _end_call(self) -> None:
        cur = self._cur
        if cur is None:
            return
        if self._device.type == "cuda":
            if self.cfg.sync_timing:
                torch.cuda.synchronize(self._device)
            self.trace.peak_mem_bytes = int(torch.cuda.max_memory_allocated(self._device))
        self.trace.add_time(cur.step, time.perf_counter() - cur.t0)
        self.trace.extra["schedule_overrides"] = self.schedule_overrides
        if cur.num_steps is not None and cur.step >= cur.num_steps - 1:
            # the last step: no later step can reuse a cached Δ, so free them now rather than at the next
            # run's start — otherwise they stay allocated through the VAE decode (CogVideoX-2B: ~4 GB)
            for h in self._block_hooks:
                h.state_manager.get_state().delta = None
        self._cur = None
        if self._own_context:
            for m in self._managers():
                m.set_context(None)
            self._own_context = False

    @property
    def current(self) -> tuple[str, int] | None:
        """(branch, step) of the transformer call in progress, or None."""
        return None if self._cur is None else (self._cur.branch, self._cur.step)

    # ----------------------------------------------------------------------------------- one block
    def _block_stats(self, outs, streams, old, keep: bool):
        """(Δ per stream or None, [‖Δ‖₁, ‖in‖₁ of the video stream (Γ), and with ``old`` the delta-change
        sums]) — one pass per stream with the Triton kernel on the GPU, the torch reference elsewhere."""
        k = ops()
        if k.block_stats_supported(outs, streams, old, self.cfg.backend):
            deltas, sums = k.block_stats(outs, streams, old, write=keep)
            return deltas, (sums if old is not None else sums[:2])
        deltas = [o - s for o, s in zip(outs, streams)]
        stats = [*gamma_sums(deltas[0], streams[0])]
        if old is not None:
            stats += [*tdc_rule.delta_change_sums(deltas, old)]
        return deltas, torch.stack([s.to(torch.float64) for s in stats])

    def _outlier_count(self, x: torch.Tensor, k_sigma: float):
        """``formats.outlier_count`` through the kernels (one read on the GPU): PDR's counter."""
        return ops().outlier_count(x, k_sigma, self.cfg.backend)

    def _read(self, stats: torch.Tensor) -> list[float]:
        t = stats.to(torch.float64)
        if self.reduce_stats is not None:
            t = self.reduce_stats(t)
        return t.tolist()

    def _run_block(self, hook: _BlockHook, module: nn.Module, args, kwargs):
        cur = self._cur
        if cur is None:  # block called outside a transformer call: plain forward
            return hook.fn_ref.original_forward(*args, **kwargs)
        cfg, b, i, rec = self.cfg, hook.index, cur.step, cur.rec
        bs: BlockState = hook.state_manager.get_state()
        streams = self.adapter.streams_in(module, args, kwargs)
        idx = self.block_linear_idx[b]
        cached = bs.delta is not None and all(d.shape == s.shape for d, s in zip(bs.delta, streams))

        # ---- TDC: skip or compute
        if self.schedule is not None:
            skip = not self.schedule.computed(cur.branch, i, b)
            if skip and not cached:
                self.schedule_overrides += 1
                skip = False
        else:
            skip = cached and tdc_rule.decide(bs, i, cur.num_steps, cfg)
        if skip:
            out = [s + d for s, d in zip(streams, bs.delta)]
            bs.acc_err += bs.delta_sim or 0.0
            bs.skipped_last = True
            rec.blocks[b] = {"computed": False, "skipped": True, "pdr": False, "gamma": None,
                             "delta_sim": bs.delta_sim, "acc_err": bs.acc_err, "outlier_ratio": None,
                             "mode": "skip"}
            for j in idx:
                rec.routes[j] = SKIPPED
                rec.pred_err[j] = None
            return self.adapter.rebuild(out)

        # ---- routes
        n = len(idx)
        preds: list[float | None] = [None] * n
        fired, oratio = False, None
        if not cfg.quantized:
            mode, routes = "fp", [FP16] * n
        elif i < cfg.warmup_steps:
            mode, routes = "warmup", [FP16] * n
        elif cfg.quant in STATIC:
            mode, routes = "static", [STATIC[cfg.quant]] * n
        else:
            next_skip, replayed = None, None
            if self.schedule is not None:
                next_skip = not self.schedule.computed(cur.branch, i + 1, b)
                replayed = self.schedule.block_routes(cur.branch, i, b, n)
            mode = None
            if pdr_rule.applies(cfg, i, cur.num_steps, next_skip):
                c, tot = self._read(pdr_rule.outlier_sums(streams, cfg.pdr_k_sigma, self._outlier_count))
                oratio = c / tot if tot else 0.0
                if pdr_rule.purify(oratio, self.pdr_rho) and replayed is None:
                    fired, mode, routes = True, "pdr", [FP16] * n
            if replayed is not None:  # recorded routes (the live rule's cost above is still paid)
                mode, routes = "replay", replayed
            if mode is None:
                if bs.gamma is None or (bs.skipped_last and cfg.after_skip == "int8"):
                    mode, routes = ("after_skip" if bs.skipped_last else "no_gamma"), [INT8] * n
                else:
                    mode = "dmpq"
                    routes, preds = self.routers[b].route(bs.gamma)
        if self.modules:
            for k, j in enumerate(idx):
                self.modules[j].route = routes[k]

        # ---- compute, measure, refresh
        output = hook.fn_ref.original_forward(*args, **kwargs)
        outs = self.adapter.streams_out(output)
        keep = cfg.tdc or self.schedule is not None
        compare = cached and keep
        deltas, sums = self._block_stats(outs, streams, bs.delta if compare else None, keep)
        vals = self._read(sums)
        bs.gamma = ratio(vals[0], vals[1])
        if compare:
            bs.delta_sim = ratio(vals[2], vals[3]) / max(1, i - bs.last_step)
        if keep:
            bs.delta = deltas
        bs.acc_err = 0.0
        bs.last_step = i
        bs.skipped_last = False
        rec.blocks[b] = {"computed": True, "skipped": False, "pdr": fired, "gamma": bs.gamma,
                         "delta_sim": bs.delta_sim, "acc_err": 0.0, "outlier_ratio": oratio, "mode": mode}
        for k, j in enumerate(idx):
            if self.modules:
                m = self.modules[j]
                rec.routes[j] = display(routes[k])
                rec.lin_outliers[j] = m.last_outliers
            else:
                rec.routes[j] = FP16
            rec.pred_err[j] = preds[k]
        return output

    # -------------------------------------------------------------------------------------- public
    def memory(self) -> dict[str, int]:
        """Weight bytes: ``packed_bytes`` (the swapped layers' packed weights, resident with the model),
        ``original_bytes`` (what those layers held), ``fp_bytes_on_device`` (originals kept on the device,
        ``fp_weights="device"``), ``other_transformer_bytes`` (the transformer's remaining parameters:
        modulation, embedders, norms, proj_out). Transformer weights on the device = packed + fp_on_device
        + other."""
        packed, orig = swapped_bytes(self.modules + self.weight_only_modules, self._originals)
        on_dev = orig if self.cfg.fp_weights == "device" else 0
        rest = param_bytes(self.transformer)
        return {"packed_bytes": packed, "original_bytes": orig, "fp_bytes_on_device": on_dev,
                "other_transformer_bytes": rest}

    def step_callback(self, fn: Callable[[dict, int], Any] | None = None):
        """A ``callback_on_step_end`` that calls ``fn(trace_dict, step)`` after every step and returns
        ``{}`` (what diffusers expects). Use it to stream the trace while the pipeline runs."""

        def callback(pipe, step, timestep, callback_kwargs):
            if fn is not None:
                fn(self.trace.to_dict(), step)
            return {}

        return callback

    def remove(self) -> None:
        """Detach every hook and put the original linear layers back (bit-exact restore)."""
        if self.removed:
            return
        for module in self._hooked:
            reg = module._diffusers_hook
            for name in (_DENOISER_HOOK, _BLOCK_HOOK):
                reg.remove_hook(name, recurse=False)
            if not self._had_forward_attr[id(module)] and not reg.hooks:
                module.__dict__.pop("forward", None)
        for module in self._created_registries:
            if not module._diffusers_hook.hooks:
                del module._diffusers_hook
        if hasattr(self.transformer, "_diffusers_hook"):
            self.transformer._diffusers_hook.invalidate_child_registries_cache()
        attention.uninstall(self._attn_processors)
        self._attn_processors = []
        restore_linears(self.transformer, self._originals)
        self.modules = []
        self.weight_only_modules = []
        self._originals = {}
        del self.transformer._sixbit_handle
        self.removed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def apply(pipe, cfg: SixBitConfig | str | None = None, *, policy: Policy | str | Path | None = None,
          schedule: SkipSchedule | dict | str | Path | None = None) -> SixBitHandle:
    """Apply 6Bit-Diffusion to a diffusers pipeline (or its transformer). Returns a :class:`SixBitHandle`.

    ``cfg``: a :class:`SixBitConfig` or a preset name (default ``"balanced"``). ``policy``: a
    :class:`~sixbit.policy.Policy` or a policy JSON path, overriding ``cfg.policy``. ``schedule``: replay
    a recorded skip pattern (:class:`~sixbit.tdc.SkipSchedule`, its dict, or a JSON path) instead of
    TDC's own decisions; it is resampled to this model's depth if needed.
    """
    if cfg is None:
        cfg = SixBitConfig.preset("balanced")
    elif isinstance(cfg, str):
        cfg = SixBitConfig.preset(cfg)
    cfg.validate()
    transformer = getattr(pipe, "transformer", None) if not isinstance(pipe, nn.Module) else pipe
    if transformer is None:
        raise TypeError(f"sixbit.apply needs a diffusers pipeline with a .transformer, got {type(pipe).__name__}")
    if getattr(pipe, "transformer_2", None) is not None:
        raise NotImplementedError("two-transformer pipelines (Wan 2.2 A14B) are not supported yet")
    if hasattr(transformer, "_sixbit_handle"):
        raise RuntimeError("sixbit is already applied to this transformer; call handle.remove() first")
    if getattr(transformer, "is_cache_enabled", False):
        raise RuntimeError("a diffusers cache is enabled on this transformer (enable_cache); "
                           "call transformer.disable_cache() before sixbit.apply")
    adapter = get_adapter(transformer)
    pol = _resolve_policy(cfg, policy, pipe if pipe is not transformer else None, transformer)
    sched = None
    if schedule is not None:
        if not cfg.tdc:
            raise ValueError("replaying a skip schedule needs cfg.tdc=True (the delta cache)")
        if isinstance(schedule, (str, Path)):
            sched = SkipSchedule.load(schedule)
        elif isinstance(schedule, dict):
            sched = SkipSchedule.from_dict(schedule)
        else:
            sched = schedule
        n_blocks = len(adapter.blocks(transformer))
        if sched.num_blocks != n_blocks:
            sched = sched.resample(n_blocks)
    return SixBitHandle(pipe if pipe is not transformer else None, transformer, cfg, adapter, pol, sched)
