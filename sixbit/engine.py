"""The engine: ``sixbit.apply(pipe, cfg)`` wires DMPQ, TDC and PDR into a diffusers pipeline.

``apply`` validates the request and returns a :class:`SixBitHandle`, which does the set-up and the
tear-down and holds nothing of the per-step logic:

* **policy**: resolves the calibrated policy (``cfg.policy``, ``"auto"`` → ``assets/policies/<model>.json``),
  τ (the config's, the policy's τ-for-bits table at ``target_bits``, or the policy's τ) and PDR's ρ
  (``pdr.resolve_rho``), with a warning for each fallback;
* **swap**: the routed linear layers become :class:`~sixbit.linear.SixBitLinear` (module replacement, packed
  weights); optionally the modulation and embedder linears become weight-only 4-bit (route ``w4a16``);
  with ``fast_qk_norm`` (engineering, not the method) CogVideoX's attentions get
  :class:`~sixbit.attention.FusedQKNormRopeProcessor` through diffusers' ``set_processor``;
* **register**: one :class:`~sixbit.hooks.DenoiserHook` on the transformer and one
  :class:`~sixbit.hooks.BlockHook` per block (``diffusers.hooks.HookRegistry``); they own the method's
  per-call logic and state and write a :class:`~sixbit.hooks.Run` — the handle's ``trace`` is the run's;
* **compile** (GPU, ``precompile``): :func:`sixbit.warmup.warm` runs every kernel configuration the run can
  use once on a small problem (their load-time self-checks included) — ``handle.kernels_compiled_s``;
* **memory**: :meth:`SixBitHandle.memory` reports the weight bytes;
* **remove**: hooks, processors and the original layers go back, bit for bit.

Memory: by default (``fp_weights="cpu"``) the device holds only the packed weights of the routed layers;
the original ``nn.Linear`` modules are moved to the CPU and kept there so ``handle.remove()`` restores
the model exactly. TDC keeps one Δ per block and stream (model dtype) per CFG branch: that is the
method's own memory cost. ``handle.reduce_stats`` sets ``Run.reduce_stats``, the all-reduce hook of every
decision statistic (``sixbit.hooks``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from diffusers.hooks.hooks import HookRegistry, ModelHook
from torch import nn

from sixbit import attention, fused, pdr, tdc, warmup
from sixbit.adapters import Adapter, get_adapter
from sixbit.config import UNCALIBRATED_TAU, ConfigError, SixBitConfig
from sixbit.hooks import (
    ATTENTION_HOOK,
    BLOCK_HOOK,
    DENOISER_HOOK,
    PART_HOOK,
    AttentionHook,
    BlockHook,
    DenoiserHook,
    Method,
    PartHook,
    Run,
    Span,
)
from sixbit.linear import (
    SixBitLinear,
    int8_route_on,
    nvfp4_packable,
    ops,
    param_bytes,
    restore_linears,
    swap_linears,
    swap_weight_only,
    swapped_bytes,
)
from sixbit.policy import Policy
from sixbit.routes import INT8
from sixbit.tdc import SkipSchedule
from sixbit.trace import Trace

__all__ = ["apply", "SixBitHandle", "POLICY_DIR"]

POLICY_DIR = Path(__file__).resolve().parent.parent / "assets" / "policies"


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


def _routed_linears(adapter: Adapter, blocks, warnings: list[str]) -> tuple[list[str], list[range]]:
    """Names of the routed linears, block by block, and each block's range in that list; a layer whose
    width NVFP4 cannot pack stays in full precision, with a warning."""
    names: list[str] = []
    ranges: list[range] = []
    for bname, block in blocks:
        start = len(names)
        for rel, lin in adapter.block_linears(block):
            if lin.in_features % 16:
                warnings.append(f"{bname}.{rel}: width {lin.in_features} is not a multiple of 16; "
                                "left in full precision")
                continue
            names.append(f"{bname}.{rel}")
        ranges.append(range(start, len(names)))
    return names, ranges


def _resolve_tau(cfg: SixBitConfig, policy: Policy) -> float:
    if cfg.tau is not None:
        return cfg.tau
    if policy.calibrated and cfg.target_bits is not None:
        return policy.tau_for_bits(cfg.target_bits)
    return policy.tau


def _policy_warnings(cfg: SixBitConfig, policy: Policy, tau: float, rho: float, rho_source: str) -> list[str]:
    out = []
    if cfg.quant == "dmpq":
        if not policy.calibrated:
            out.append("no calibrated policy: DMPQ predicts E = Γ for every layer "
                       f"(τ = {tau}); run `python -m sixbit.calibrate` for real α, β")
        elif policy.hadamard_block is not None and policy.hadamard_block != cfg.hadamard_block:
            out.append(f"policy was calibrated with hadamard_block={policy.hadamard_block}, "
                       f"config uses {cfg.hadamard_block}")
    if cfg.pdr and cfg.quant == "dmpq" and cfg.tdc and rho_source == "fallback" and policy.calibrated:
        out.append(f"the policy has no PDR ρ for k_σ = {cfg.pdr_k_sigma}: using {rho:g}; "
                   "re-run `python -m sixbit.calibrate` to measure it for this model")
    return out


def tdc_threshold(cfg: SixBitConfig, policy: Policy):
    """Step mode's probe profile (rule ``"profile"``, from the policy) and the trace's statement of the rule
    in force, with the fallback to ``"steps"`` when the policy has no profile (``sixbit.tdc.probe_threshold``)."""
    rule, s = cfg.tdc_threshold_rule, cfg.tdc_threshold_steps
    if not cfg.tdc or cfg.tdc_mode != "step":
        return None, "block mode: tdc_threshold/tdc_budget as given" if cfg.tdc else "TDC off"
    if rule == "fixed":
        return None, "fixed: the probe threshold at every step count"
    if rule == "profile" and policy.probe_profile is not None:
        p = policy.probe_profile
        return p, f"profile: threshold × {s}/N ÷ the policy's per-step weight ({p.steps}-step calibration, n={p.n})"
    why = " (the policy has no TDC probe profile: `python -m sixbit.calibrate` measures one)" if rule == "profile" else ""
    return None, f"steps: threshold × {s}/N{why}"


def _device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the CPU for a module without parameters)."""
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def _swap(transformer: nn.Module, blocks, adapter: Adapter, cfg: SixBitConfig, names: list[str]):
    """(routed SixBitLinears in ``names`` order, weight-only SixBitLinears, originals for the restore)."""
    modules: list[SixBitLinear] = []
    originals: dict = {}
    if cfg.quantized:
        # "auto": the route of the device the transformer is on now (routes.int8_route_for)
        int8_route = INT8 if cfg.quant == "w4a8" else int8_route_on(cfg.int8_route, _device(transformer), cfg.backend)
        new, originals = swap_linears(
            transformer, names, formats_=cfg.weight_formats, hadamard_block=cfg.hadamard_block,
            fp_weights=cfg.fp_weights, int8_route=int8_route, backend=cfg.backend,
            k_sigma=cfg.pdr_k_sigma if cfg.trace_linear_outliers else None,
        )
        modules = [new[n] for n in names]
    # weight-only 4-bit storage (route w4a16, never routed by DMPQ): modulation and embedder linears
    candidates = []
    if cfg.modulation_weights == "nvfp4":
        candidates += [(f"{bname}.{rel}", lin) for bname, block in blocks
                       for rel, lin in adapter.block_linears(block, modulation=True)]
    if cfg.embedder_weights == "nvfp4":
        candidates += adapter.outer_linears(transformer)
    new, orig = swap_weight_only(transformer, [n for n, lin in candidates if nvfp4_packable(lin)],
                                 fp_weights=cfg.fp_weights, backend=cfg.backend)
    originals.update(orig)
    return modules, list(new.values()), originals


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
        self.warnings: list[str] = []
        self.removed = False
        blocks = adapter.blocks(transformer)
        self.block_names = [n for n, _ in blocks]
        self.linear_names, self.block_linear_idx = _routed_linears(adapter, blocks, self.warnings)

        # policy: τ, ρ and the layers' fits (a calibrated policy lacking a layer fails here, before the swap)
        self.tau = _resolve_tau(cfg, policy)
        self.tau_attn = cfg.tau_attn if cfg.tau_attn is not None else policy.attention_tau_for(cfg.attention_target)
        self.pdr_rho, self.pdr_rho_source = pdr.resolve_rho(cfg, policy)
        self.warnings += _policy_warnings(cfg, policy, self.tau, self.pdr_rho, self.pdr_rho_source)
        fits = [[policy.fit(self.linear_names[j]) for j in idx] if cfg.quant == "dmpq" else None
                for idx in self.block_linear_idx]

        # swap, then the hooks that run the method and write the run the handle reads
        self.modules, self.weight_only_modules, self._originals = _swap(transformer, blocks, adapter, cfg,
                                                                        self.linear_names)
        self.probe_profile, self.tdc_threshold_resolved = tdc_threshold(cfg, policy)
        self.run = Run(self._new_trace)
        method = Method(cfg, adapter, schedule, self.tau, self.pdr_rho, self.tau_attn, self.probe_profile)
        self.block_hooks = [BlockHook(b, self.run, method, idx, [self.modules[j] for j in idx] if self.modules
                                      else [], fits[b]) for b, idx in enumerate(self.block_linear_idx)]
        self.span = Span(method, len(self.block_hooks))  # step mode's combined residual, where tdc_store uses it
        for hook in self.block_hooks:
            hook.span = self.span
        self.denoiser_hook = DenoiserHook(self.run, self.block_hooks, pipe=pipe, sync_timing=cfg.sync_timing,
                                          span=self.span)
        self._created_registries: list[nn.Module] = []
        self._had_forward_attr: dict[int, bool] = {}
        self._hooked: list[nn.Module] = []
        self._register(transformer, self.denoiser_hook, DENOISER_HOOK)
        # engineering: the norms emit the INT8 operand of INT8-route consumers (inside the block hook, which
        # sets the routes first; sixbit/fused.py)
        fuse = cfg.quantized and cfg.fused_producers and adapter.family == "cogvideox"
        reuse_attention = cfg.tdc_scope == "attention" and cfg.tdc
        if cfg.tdc_regate == "on" and not adapter.gated_parts:
            raise ConfigError(f"SixBitConfig.tdc_regate='on': sixbit does not know the gated pieces of "
                              f"{adapter.family}'s blocks (Adapter.gated_parts); use 'auto' or 'off'")
        regate = tdc.regate_possible(cfg) and bool(adapter.gated_parts)
        for hook, (bname, block) in zip(self.block_hooks, blocks):
            if fuse and fused.applies(block):
                self._register(block, fused.FusedProducersHook(cfg.backend, hook if reuse_attention else None,
                                                               capture=hook.capture if regate else None),
                               fused.FUSED_HOOK)
            self._register(block, hook, BLOCK_HOOK)
            if regate:  # tdc_regate: the parts whose outputs make the block's update report them to the block hook
                for part in adapter.gated_parts:
                    mod = block.get_submodule(part)
                    self._register(mod, PartHook(hook, part), PART_HOOK)
            if reuse_attention:  # the self-attention whose output a skipped cell reuses (TDC's attention scope)
                attn = getattr(block, adapter.self_attention, None)
                if not isinstance(attn, nn.Module):
                    raise TypeError(f"SixBitConfig.tdc_scope='attention': {bname} has no self-attention module "
                                    f"{adapter.self_attention!r}")
                self._register(attn, AttentionHook(hook), ATTENTION_HOOK)
        #: (projection, hook) of each feed-forward GELU run in its GEMM's epilogue (engineering; sixbit/fused.py)
        self.gelu_epilogue: list[tuple[nn.Module, ModelHook]] = []
        if cfg.quantized and cfg.gelu_epilogue:
            self.gelu_epilogue = [(m.proj, self._register(m, fused.GeluEpilogueHook(), fused.GELU_HOOK))
                                  for _, block in blocks for m in block.modules() if fused.gelu_epilogue_applies(m)]
        # engineering, not the method: q/k LayerNorm + rotary embedding in one kernel (CogVideoX, CUDA)
        self._attn_processors = attention.install(blocks, ops(), cfg.backend) if cfg.fast_qk_norm else []
        for hook, (bname, block) in zip(self.block_hooks, blocks):  # each block's attention, routed per step
            hook.attn_procs = attention.block_processors(block)
            hook.attention_fit = policy.attention_fit(bname) if policy.calibrated else None
        HookRegistry.check_if_exists_or_initialize(transformer).invalidate_child_registries_cache()
        transformer._sixbit_handle = self
        # engineering: compile every kernel configuration now, not inside a step (GPU; sixbit/warmup.py)
        w = warmup.warm(self) if cfg.precompile else None
        self.kernels_compiled_s = None if w is None else w.seconds
        self.kernels_compiled = [] if w is None else w.items
        if w is not None:
            self.run.trace.extra["kernels_compiled_s"] = w.seconds

    def _register(self, module: nn.Module, hook: ModelHook, name: str) -> ModelHook:
        if not hasattr(module, "_diffusers_hook"):
            self._created_registries.append(module)
        self._had_forward_attr.setdefault(id(module), "forward" in module.__dict__)  # before the first hook
        HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)
        self._hooked.append(module)
        return hook

    def _new_trace(self) -> Trace:
        device = _device(self.transformer)
        config = {**self.cfg.to_dict(), "policy_resolved": self.policy.describe(), "tau_resolved": self.tau,
                  "int8_route_resolved": self.modules[0].int8_route if self.modules else None,
                  "tau_attn_resolved": self.tau_attn, "pdr_rho_resolved": self.pdr_rho, "pdr_rho_source": self.pdr_rho_source,
                  "tdc_threshold_resolved": self.tdc_threshold_resolved,
                  "family": self.adapter.family, "cfg_batching": self.adapter.cfg,
                  "schedule": None if self.schedule is None else self.schedule.source}
        compiled = getattr(self, "kernels_compiled_s", None)
        return Trace(
            model=str(getattr(self.pipe, "name_or_path", "") or getattr(self.transformer.config, "_name_or_path", "")
                      or type(self.transformer).__name__),
            device=str(device), compute_path=ops().compute_path(device), config=config,
            blocks=self.block_names, linears=self.linear_names, block_linears=self.block_linear_idx,
            extra={"weight_bytes": self.memory(), **({} if compiled is None else {"kernels_compiled_s": compiled})},
        )

    # -------------------------------------------------------------------------------------- public
    @property
    def trace(self) -> Trace:
        """The record of the current (or last) pipeline call."""
        return self.run.trace

    @property
    def current(self) -> tuple[str, int] | None:
        """(branch, step) of the transformer call in progress, or None."""
        call = self.run.call
        return None if call is None else (call.branch, call.step)

    @property
    def reduce_stats(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Optional ``fn(tensor) -> tensor`` applied to every decision statistic before it is read: set
        it to an all-reduce under context parallelism (``sixbit.hooks.Run.read``)."""
        return self.run.reduce_stats

    @reduce_stats.setter
    def reduce_stats(self, fn: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.run.reduce_stats = fn

    def reset(self) -> None:
        """Forget every cache now (the next transformer call starts a new run)."""
        self.denoiser_hook.forget()

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
            # outer hooks first
            for name in (DENOISER_HOOK, BLOCK_HOOK, fused.FUSED_HOOK, ATTENTION_HOOK, PART_HOOK, fused.GELU_HOOK):
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
        self.gelu_epilogue = []
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
        if sched.scope != cfg.tdc_scope:
            raise ValueError(f"the skip schedule was recorded with tdc_scope={sched.scope!r} (its skipped cells reuse "
                             f"{'attention outputs' if sched.scope == 'attention' else 'whole blocks'}); "
                             f"SixBitConfig.tdc_scope is {cfg.tdc_scope!r}: replay it with the same scope")
        n_blocks = len(adapter.blocks(transformer))
        if sched.num_blocks != n_blocks:
            sched = sched.resample(n_blocks)
    return SixBitHandle(pipe if pipe is not transformer else None, transformer, cfg, adapter, pol, sched)
