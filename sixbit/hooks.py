"""The diffusers hooks that run the method; each owns its logic and its per-context state.

Both are stateful ``diffusers.hooks.ModelHook``\\ s with a ``StateManager``, so every ``cache_context``
(CFG branch: ``"cond_uncond"`` for CogVideoX, ``"cond"`` and ``"uncond"`` for Wan) has its own state,
reset by the pipeline's ``maybe_free_model_hooks()`` at the end of every call:

* :class:`DenoiserHook`, on the transformer: counts the steps of each branch, starts a new run (fresh
  caches, fresh trace) when a call begins — also if the previous call died without the reset (a new run
  is recognised by a changed input shape or a timestep that went up: schedulers run timesteps downwards,
  second-order ones may repeat one) — times each step, and frees the cached deltas after the last one;
* :class:`BlockHook`, on every transformer block (``new_forward``): skip or compute (``tdc.decide``, or
  a replayed :class:`~sixbit.tdc.SkipSchedule`); for a computed block the routes (``dmpq.route``, after
  PDR's measurement where ``pdr.applies``), the block itself, its statistics (Γ, the delta change), the
  cache refresh; and the block's row of the trace;
* :class:`AttentionHook`, on every block's self-attention when ``tdc_scope="attention"``: passes the call
  through, or lets the block hook capture its output or return the cached one instead
  (:meth:`BlockHook.attend`; the cache is the block's, per context, like the deltas).
* :class:`PartHook`, on each of a block's gated parts (``Adapter.gated_parts``) where ``tdc_regate`` may apply:
  reports the part's output to the block hook (:meth:`BlockHook.capture`), which keeps the block's update as gated
  pieces and recomposes a skip with the skipped step's gates (``sixbit.tdc``, ``tdc_regate``).

Both write a :class:`Run` — the trace of the current run, the call in progress, the run's counters — that
the handle (``sixbit.engine``) reads. The rules are pure functions in the files named after them; the
hooks measure, call them, and apply and record what they return.

Context parallelism: every decision statistic is an additive sum held in a tensor — Γ's and the delta
change's sums (one stacked tensor per computed block, ``ops.block_stats`` on the GPU), PDR's outlier
counts — and :meth:`Run.read` is the one place where they leave the device: ``Run.reduce_stats`` (an
all-reduce across ranks, when set) is applied there first, so every rank takes the same decision from the
global sums. The accumulated skip error is derived from the reduced change rates, so it agrees too.

Host reads (each one waits for the device): a computed block's Γ and delta change decide only at later
steps, so its read is *deferred* (:meth:`Run.defer`) and all of a call's deferred reads leave the device
together — at the next read that cannot wait, or when the call ends (one transfer, one all-reduce).
Reads that decide now: step mode's probe (its drift decides the rest of the step) and PDR's counts (they
pick the block's routes before it runs). Per call: one transfer at the end, the probe's, PDR's where PDR
checks (each also carrying what was deferred before it), the timestep (run detection) and, on CUDA with
``sync_timing``, one synchronize; none for a skipped block. Before session 14 every computed block read at
once: ~30 device waits per 2B step with the host's next launches exposed after each (docs/ENGINE.md).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from diffusers.hooks.hooks import BaseState, CacheContext, ModelHook, StateManager

from sixbit import attention, dmpq, pdr, tdc
from sixbit.linear import int8_route_on, ops
from sixbit.routes import SKIPPED, display, nvfp4_as_int8

if TYPE_CHECKING:
    from sixbit.adapters import Adapter
    from sixbit.config import SixBitConfig
    from sixbit.linear import SixBitLinear
    from sixbit.policy import LinearFit
    from sixbit.trace import Trace

__all__ = ["Run", "Call", "Method", "DenoiserHook", "BlockHook", "BlockState", "Span", "AttentionHook", "PartHook",
           "block_stats", "DENOISER_HOOK", "BLOCK_HOOK", "ATTENTION_HOOK", "PART_HOOK"]

DENOISER_HOOK = "sixbit_denoiser"
BLOCK_HOOK = "sixbit_block"
ATTENTION_HOOK = "sixbit_attention_reuse"
PART_HOOK = "sixbit_gated_part"
DEFAULT_CONTEXT = "default"


@dataclass
class Call:
    """The transformer call in progress: its branch (cache context), step, step count and trace record."""

    branch: str
    step: int
    num_steps: int | None
    rec: Any
    t0: float
    skip_rest: bool = False  # step mode: the probe block decided that the rest of this call skips
    scale: float = 1.0  # step mode, tdc_reuse="scaled": the probe's magnitude ratio the skipped deltas take
    threshold: float | None = None  # step mode: the probe threshold of this step (tdc.probe_threshold)


class Run:
    """What the hooks write and the handle reads: the live trace, the call in progress, the counters."""

    def __init__(self, new_trace: Callable[[], Trace]):
        self.new_trace = new_trace
        self.trace = new_trace()
        self.call: Call | None = None
        self.active = False
        self.schedule_overrides = 0
        #: optional ``fn(tensor) -> tensor`` applied to every statistics tensor before it is read (all-reduce)
        self.reduce_stats: Callable[[torch.Tensor], torch.Tensor] | None = None
        #: deferred statistics reads: (tensor, resolve) in the order they were issued (:meth:`defer`)
        self.pending: list[tuple[torch.Tensor, Callable[[list[float]], None]]] = []

    @property
    def device(self) -> torch.device:
        return torch.device(self.trace.device)

    def start(self) -> None:
        self.pending = []  # a call that died mid-way leaves reads for a trace that is gone
        self.trace = self.new_trace()
        self.schedule_overrides = 0
        self.active = True

    def end(self) -> None:
        self.flush()
        if self.active and self.trace.steps:
            self.trace.close_step(len(self.trace.steps) - 1)
        self.trace.finished = True
        self.active = False
        self.call = None

    def read(self, stats: torch.Tensor) -> list[float]:
        """The one place where decision statistics are reduced across ranks and read to the host: ``stats``
        now, together with every read deferred since the last one (:meth:`defer`) — one transfer, one
        all-reduce."""
        return self._transfer(stats)

    def defer(self, stats: torch.Tensor, resolve: Callable[[list[float]], None]) -> None:
        """A read that no decision of the current transformer call needs: ``resolve(values)`` runs at the next
        read or :meth:`flush` (at the latest when the call ends), so a computed block does not wait for the
        device — the host keeps queueing work while the GPU runs."""
        self.pending.append((stats, resolve))

    def flush(self) -> None:
        """Resolve every deferred read now (one transfer; nothing when none is pending)."""
        if self.pending:
            self._transfer(None)

    def _transfer(self, stats: torch.Tensor | None) -> list[float]:
        pending, self.pending = self.pending, []
        parts = [s for s, _ in pending] + ([stats] if stats is not None else [])
        t = torch.cat([p.reshape(-1).to(torch.float64) for p in parts]) if len(parts) > 1 else parts[0].to(torch.float64)
        if self.reduce_stats is not None:
            t = self.reduce_stats(t)
        vals, k = t.tolist(), 0
        for s, resolve in pending:
            n = s.numel()
            resolve(vals[k:k + n])
            k += n
        return vals[k:]


_NATIVE_FP4: dict[torch.device, bool] = {}


def _nvfp4_as_int8(cfg, device: torch.device) -> bool:
    """``routes.nvfp4_as_int8`` for a block running on ``device`` (its FP4 capability read once; ``int8_route``
    as it runs there, ``linear.int8_route_on``)."""
    if device not in _NATIVE_FP4:
        _NATIVE_FP4[device] = ops().native_fp4(device)
    return nvfp4_as_int8(cfg.nvfp4_route, int8_route_on(cfg.int8_route, device, cfg.backend), _NATIVE_FP4[device])


@dataclass(frozen=True)
class Method:
    """What the handle resolved once and every block hook decides with."""

    cfg: SixBitConfig
    adapter: Adapter
    schedule: tdc.SkipSchedule | None
    tau: float
    rho: float
    tau_attn: float | None = None  # the 8-bit attention's threshold (None: no attention fits)
    probe_profile: Any = None  # step mode, tdc_threshold_rule="profile": the policy's ProbeProfile (None: "steps")


# ---------------------------------------------------------------------------------------- denoiser


class StepState(BaseState):
    def __init__(self):
        self.reset()

    def reset(self, *args, **kwargs):
        self.step = 0
        self.last_t: float | None = None
        self.shape: tuple | None = None


def _arg(module, name: str, args: tuple, kwargs: dict):
    """Argument ``name`` of ``module.forward`` from a call's args/kwargs (None when absent)."""
    if name in kwargs:
        return kwargs[name]
    params = _PARAMS.get(type(module))
    if params is None:
        params = _PARAMS[type(module)] = list(inspect.signature(type(module).forward).parameters)[1:]
    i = params.index(name) if name in params else None
    return args[i] if i is not None and i < len(args) else None


_PARAMS: dict[type, list[str]] = {}


class DenoiserHook(ModelHook):
    """On the transformer: run detection, step counting per branch, step timing (module docstring)."""

    _is_stateful = True

    def __init__(self, run: Run, blocks: list[BlockHook], *, pipe, sync_timing: bool, span: Span | None = None):
        super().__init__()
        self.run = run
        self.blocks = blocks
        self.span = span
        self.pipe = pipe
        self.sync_timing = sync_timing
        self.state_manager = StateManager(StepState)
        self._own_context = False

    def managers(self) -> list[StateManager]:
        return [self.state_manager] + [b.state_manager for b in self.blocks] + \
            ([self.span.state_manager] if self.span is not None else [])

    def forget(self) -> None:
        """Drop every cache and counter now (the next transformer call starts a new run)."""
        for m in self.managers():
            m.reset()
        self.run.active = False
        self.run.call = None

    def _start_run(self, ctx: CacheContext) -> None:
        for m in self.managers():
            m.reset()
            m.set_context(ctx)
        self.run.start()
        if self.run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.run.device)

    def pre_forward(self, module, *args, **kwargs):
        mgr, run = self.state_manager, self.run
        if mgr._context is None:  # called outside a pipeline's cache_context
            ctx = CacheContext(DEFAULT_CONTEXT)
            for m in self.managers():
                m.set_context(ctx)
            self._own_context = True
        ctx = mgr.context
        if self.span is not None:  # not a hook's own manager: the pipeline's cache_context does not reach it
            self.span.state_manager.set_context(ctx)
        hs = _arg(module, "hidden_states", args, kwargs)
        t = _arg(module, "timestep", args, kwargs)
        t_val = float(t.detach().float().max()) if isinstance(t, torch.Tensor) else float(t if t is not None else 0)
        enc = _arg(module, "encoder_hidden_states", args, kwargs)
        shape = (tuple(hs.shape), tuple(enc.shape) if isinstance(enc, torch.Tensor) else None)
        st = mgr.get_state()
        if not run.active or (st.step > 0 and (shape != st.shape or t_val > st.last_t)):
            self._start_run(ctx)
            st = mgr.get_state()
        step = st.step
        st.step += 1
        st.last_t, st.shape = t_val, shape
        if step > 0 and ctx.name == next(iter(run.trace.steps[step - 1].branches), None):
            run.trace.close_step(step - 1)
        num_steps = ctx.num_inference_steps or getattr(self.pipe, "_num_timesteps", None)
        run.call = Call(ctx.name, step, num_steps, run.trace.branch(step, ctx.name, t_val), time.perf_counter())
        if self.span is not None and self.span.method.cfg.tdc and step == 0:  # what the skipped blocks keep
            b = self.span.bounds(run.call)
            run.trace.extra.setdefault("tdc_store", {})[ctx.name] = "blocks" if b is None else f"span {b[0]}-{b[1]}"
            method = self.span.method
            run.trace.extra.setdefault("tdc_regate", {})[ctx.name] = bool(
                method.adapter.gated_parts and tdc.regates(method.cfg, num_steps))
        return args, kwargs

    def post_forward(self, module, output):
        run, call = self.run, self.run.call
        if call is None:
            return output
        run.flush()  # the statistics of this call's computed blocks (the next call decides with them)
        dev = run.device
        if dev.type == "cuda":
            if self.sync_timing:
                torch.cuda.synchronize(dev)
            run.trace.peak_mem_bytes = int(torch.cuda.max_memory_allocated(dev))
        run.trace.add_time(call.step, time.perf_counter() - call.t0)
        run.trace.extra["schedule_overrides"] = run.schedule_overrides
        # what really ran: the kernels' load-time self-check may have replaced a route during this step
        run.trace.compute_path = attention.label_emulation(ops().compute_path(dev), dev,
                                                           run.trace.extra.get("attention_fp8_emulated", False))
        if call.num_steps is not None and call.step >= call.num_steps - 1:
            # the last step: no later step can reuse a cached Δ, so free them now rather than at the next
            # run's start — otherwise they stay allocated through the VAE decode (CogVideoX-2B: ~4 GB)
            for m in self.managers()[1:]:
                m.get_state().drop_deltas()
        run.call = None
        if self._own_context:
            for m in self.managers():
                m.set_context(None)
            self._own_context = False
        return output

    def reset_state(self, module):
        self.run.end()
        self.state_manager.reset()
        return module


# ------------------------------------------------------------------------------------------- block


class BlockState(BaseState):
    """Per block, per cache context: the cached deltas and the host values the decisions read."""

    def __init__(self, size: Callable[[torch.Tensor], torch.Tensor] = tdc.l1_size) -> None:
        self.size = size  # "magnitude"'s size of one tensor (l1_size: the Triton pass on the GPU)
        self.reset()

    def reset(self, *args, **kwargs) -> None:
        # cached Δ per stream (step mode's probe: its reference), or with tdc_regate the block's gated pieces
        self.delta: list[torch.Tensor] | None = None
        # the computed Δ before it (forecasting reuse; "magnitude": its sizes only)
        self.prev_delta: list[torch.Tensor] | None = None
        self.prev_step: int | None = None  # the step of prev_delta
        # "magnitude": the sizes of ``delta`` (tdc.l1_size per tensor, 0-d), measured once when first read (sizes())
        self.delta_sizes: list[torch.Tensor] | None = None
        self.prev2_delta: list[torch.Tensor] | None = None  # and the one before that (tdc_reuse="quadratic")
        self.prev2_step: int | None = None
        self.gamma: float | None = None  # Γ at the last computed step
        self.delta_sim: float | None = None  # change rate between the last two computed deltas
        self.acc_err: float = 0.0
        self.last_step: int | None = None  # last computed step
        self.skipped_last: bool = False  # the previous evaluation was a skip (no fresh Γ)
        self.ref_norm: float | None = None  # step mode's probe: ‖Δ₀‖₁ (video) of its reference
        self.run_skips: int = 0  # consecutive skips (step mode's probe: skipped steps) since the last compute
        # tdc_scope="attention": the self-attention's outputs at the last computed step (and the ones before it,
        # for a forecast, at prev_step / prev2_step), whether the call returned a tuple, and the input shapes they match
        self.attn: list[torch.Tensor] | None = None
        self.prev_attn: list[torch.Tensor] | None = None
        self.prev2_attn: list[torch.Tensor] | None = None
        self.attn_tuple = False
        self.attn_shapes: list[tuple] | None = None
        # the span's state (:class:`Span`): its first block's input streams while a computed step runs through it
        self.span_input: list[torch.Tensor] | None = None

    def drop_deltas(self) -> None:
        self.delta = self.prev_delta = self.prev2_delta = self.attn = self.prev_attn = self.prev2_attn = None
        self.delta_sizes = self.span_input = None

    def sizes(self) -> list[torch.Tensor]:
        """The sizes of the held ``delta`` (``"magnitude"``), measured at the first read after it was kept: the skips
        that reuse one delta and the shift of :meth:`keep` read it once, not one pass over every tensor each."""
        if self.delta_sizes is None:
            self.delta_sizes = [self.size(t) for t in self.delta]
        return self.delta_sizes

    def magnitude_ratios(self, step: int) -> list[torch.Tensor] | None:
        """``"magnitude"``'s factor per held tensor at ``step`` (fp32, 0-d), or None while there is no earlier delta
        (the held one is reused as it is)."""
        if not tdc.extrapolates(self.prev_delta, self.prev_step, self.last_step):
            return None
        return tdc.magnitude_ratios(self.delta, self.prev_delta, step, self.last_step, self.prev_step, self.sizes())

    def reused(self, step: int, order: int, onto: list[torch.Tensor] | None = None,
               magnitude: bool = False) -> list[torch.Tensor]:
        """What a skip at ``step`` adds to the block's input: the cached Δ (order 0) or its forecast (``magnitude``:
        the last Δ with its size extrapolated, ``tdc_reuse="magnitude"``); with ``onto`` (the block's input
        streams), their sum."""
        if not order:
            return self.delta if onto is None else [x + d for x, d in zip(onto, self.delta)]
        return tdc.forecast(self.delta, self.prev_delta, step, self.last_step, self.prev_step,
                            self.prev2_delta if order > 1 else None, self.prev2_step, onto=onto, magnitude=magnitude,
                            sizes=self.sizes() if magnitude else None)

    def forecast_attention(self, step: int, order: int) -> list[torch.Tensor]:
        """Attention scope: the cached attention output (order 0) or its forecast at ``step``."""
        if not order:
            return self.attn
        return tdc.forecast(self.attn, self.prev_attn, step, self.last_step, self.prev_step,
                            self.prev2_attn if order > 1 else None, self.prev2_step)

    def keep(self, value: list[torch.Tensor], order: int, attention: bool, sizes_only: bool = False) -> None:
        """Store a computed cell's Δ (or attention output, or gated pieces), the earlier ones (at ``last_step``,
        ``prev_step``) shifted back as far as the forecast of ``order`` reads. The steps are shared: a cell keeps
        one kind. ``sizes_only`` (``tdc_reuse="magnitude"``, which reads only the earlier one's size): the earlier
        one is kept as its per-tensor sizes (0-d, :func:`sixbit.tdc.l1_size`), not as tensors."""
        cur, prev, prev2 = ("attn", "prev_attn", "prev2_attn") if attention else ("delta", "prev_delta", "prev2_delta")
        if order and getattr(self, cur) is not None:
            if order > 1:
                setattr(self, prev2, getattr(self, prev))
                self.prev2_step = self.prev_step
            held = getattr(self, cur)
            setattr(self, prev, self.sizes() if sizes_only and not attention else held)
            self.prev_step = self.last_step
        setattr(self, cur, value)
        if not attention:
            self.delta_sizes = None


class Span:
    """Step mode's combined residual (``tdc_store``, ``sixbit.tdc``): the blocks that skip together keep one residual
    per stream, ``R = out(last) − in(first)`` of the last computed step (and the earlier ones for a forecast), in a
    :class:`BlockState` per cache context — instead of a delta per block. A skipped step's first span block returns
    ``in + R`` (or its forecast), the others their input; which blocks form the span is decided per branch and
    step count (:func:`sixbit.tdc.uses_span`, :func:`~sixbit.tdc.live_span`, a replay's
    :meth:`~sixbit.tdc.SkipSchedule.span`)."""

    def __init__(self, method: Method, num_blocks: int):
        self.method = method
        self.num_blocks = num_blocks
        self.state_manager = StateManager(BlockState, init_kwargs={"size": sizer(method.cfg.backend)})
        self._bounds: dict[tuple, tuple[int, int] | None] = {}

    def bounds(self, call: Call) -> tuple[int, int] | None:
        """(first, last) block of the span in this call's branch at its step count, or None (a Δ per block)."""
        key = (call.branch, call.num_steps)
        if key not in self._bounds:
            cfg, sched = self.method.cfg, self.method.schedule
            b = None
            if tdc.uses_span(cfg, call.num_steps):
                b = tdc.live_span(cfg, self.num_blocks) if sched is None else sched.span(call.branch)
            self._bounds[key] = b
        return self._bounds[key]

    def state(self) -> BlockState:
        return self.state_manager.get_state()


def sizer(backend: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``"magnitude"``'s size of a held tensor (:func:`sixbit.tdc.l1_size`): one Triton pass where ``ops.l1_size``
    serves it (the GPU), the torch reference elsewhere."""
    def size(t: torch.Tensor) -> torch.Tensor:
        k = ops()
        return k.l1_size(t) if k.l1_size_supported(t, backend) else tdc.l1_size(t)
    return size


def block_stats(outs, streams, old, keep: bool, backend: str):
    """(Δ per stream, [‖Δ‖₁, ‖in‖₁ of the video stream (Γ), and with ``old`` the delta-change sums]) —
    one pass per stream with the Triton kernel on the GPU, the torch reference elsewhere."""
    k = ops()
    if k.block_stats_supported(outs, streams, old, backend):
        deltas, sums = k.block_stats(outs, streams, old, write=keep)
        return deltas, (sums if old is not None else sums[:2])
    deltas = [o - s for o, s in zip(outs, streams)]
    stats = [*dmpq.gamma_sums(deltas[0], streams[0])]
    if old is not None:
        stats += [*tdc.delta_change_sums(deltas, old)]
    return deltas, torch.stack([s.to(torch.float64) for s in stats])


class BlockHook(ModelHook):
    """On one transformer block: skip or compute, route, measure, refresh, record (module docstring)."""

    _is_stateful = True

    def __init__(self, index: int, run: Run, method: Method, linears: range, layers: list[SixBitLinear],
                 fits: list[LinearFit] | None):
        super().__init__()
        self.index = index
        self.run = run
        self.method = method
        self.linears = linears  # this block's routed linears: indices into the trace's linear list
        self.layers = layers  # their SixBitLinear modules (none with quantization off)
        self.fits = fits  # their calibrated lines (DMPQ only)
        self.attention_fit: LinearFit | None = None  # the block's 8-bit attention line (set by the engine)
        self.attn_procs: list = []  # its sixbit attention processors (sixbit.attention.block_processors)
        self.state_manager = StateManager(BlockState, init_kwargs={"size": sizer(method.cfg.backend)})
        self.span: Span | None = None  # step mode's combined residual (set by the engine; Span.bounds says if used)
        self.attn_action: str | None = None  # tdc_scope="attention", this forward: "capture", "reuse" or None
        self._attn_ctx: tuple | None = None
        self._attn_linears: set[int] | None = None
        self._parts: dict | None = None  # tdc_regate: the gated parts' outputs of the forward in progress

    def new_forward(self, module, *args, **kwargs):
        call = self.run.call
        if call is None:  # called outside a transformer call: plain forward
            return self.fn_ref.original_forward(*args, **kwargs)
        st: BlockState = self.state_manager.get_state()
        streams = self.method.adapter.streams_in(module, args, kwargs)
        span = self.span_state(call)
        regate = self.regates(call)
        if self.attention_scope() and not self.probes():  # what a skip reuses: the attention output
            cached = st.attn is not None and st.attn_shapes == [tuple(s.shape) for s in streams]
        elif regate:  # the gated pieces, each its stream's shape
            held = st.delta
            cached = held is not None and all(p.shape == streams[i].shape
                                              for p, i in zip(held, self.method.adapter.piece_streams))
        else:
            held = (st if span is None else span).delta
            cached = held is not None and all(d.shape == s.shape for d, s in zip(held, streams))
        if self._skips(call, st, cached):
            if self.attention_scope():
                return self._attention_reuse(call, st, streams, args, kwargs)
            return self._reuse(call, st, streams, (module, args, kwargs) if regate else None)
        routing, oratio = self._route(call, st, streams)
        for m, r in zip(self.layers, routing.routes):
            m.route = r
        attn = self._route_attention(call, st, routing)
        capture = self.attention_scope() and not self.probes() and self.caches()
        self._parts = {} if regate else None
        try:
            output = self._forward("capture" if capture else None, st, streams, args, kwargs)
            pieces = self.method.adapter.pieces(self._parts, streams) if regate else None
        finally:
            self._parts = None
        decision = self._refresh(call, st, streams, self.method.adapter.streams_out(output), cached, pieces)
        self._record(call, st, routing, oratio, decision)
        self._record_attention(call, attn)
        return output

    def _skips(self, call: Call, st: BlockState, cached: bool) -> bool:
        sched = self.method.schedule
        if sched is None:
            cfg = self.method.cfg
            if tdc.fixed(self.index, len(self.run.trace.blocks), cfg):
                return False
            if cfg.tdc_mode == "step":
                return cached and call.skip_rest
            return cached and tdc.decide(st.delta_sim, st.acc_err, call.step, call.num_steps, cfg, st.run_skips)
        skip = not sched.computed(call.branch, call.step, self.index)
        if skip and not cached:  # a replayed skip with nothing cached computes instead
            self.run.schedule_overrides += 1
            return False
        return skip

    def regates(self, call: Call) -> bool:
        """This block keeps its update as gated pieces and recomposes its skips with the skipped step's gates
        (``tdc_regate``): where :func:`sixbit.tdc.regates` says so for the run, the model family has gated pieces,
        and the block caches (not the probe, whose delta is the decision's reference, nor a tail block)."""
        return (bool(self.method.adapter.gated_parts) and tdc.regates(self.method.cfg, call.num_steps)
                and self.caches() and not self.probes())

    def capture(self, name: str, output) -> None:
        """A gated part's output in the forward in progress (:class:`PartHook`, or the fused forward's own call)."""
        if self._parts is not None:
            self._parts[name] = output

    def span_state(self, call: Call) -> BlockState | None:
        """The span's state when this block is one of the span's in this call (``tdc_store``), else None."""
        b = None if self.span is None else self.span.bounds(call)
        return self.span.state() if b is not None and b[0] <= self.index <= b[1] else None

    def caches(self) -> bool:
        """This block keeps what a skip reuses or decides from (a delta, or in attention scope its attention
        output): TDC on or a replayed schedule, and not a tail block (which computes every step)."""
        return (self.method.cfg.tdc or self.method.schedule is not None) and not self.tail()

    def attention_scope(self) -> bool:
        """``tdc_scope="attention"``: a skipped cell runs the block with its self-attention's cached output."""
        return self.method.cfg.tdc_scope == "attention"

    def _forward(self, action: str | None, st: BlockState, streams, args, kwargs):
        """The block's own forward, its self-attention captured (``"capture"``) or reused (``"reuse"``) by
        :meth:`attend` (the :class:`AttentionHook` calls it), or left alone (None)."""
        self.attn_action = action
        self._attn_ctx = (st, [tuple(s.shape) for s in streams])
        try:
            return self.fn_ref.original_forward(*args, **kwargs)
        finally:
            self.attn_action = self._attn_ctx = None

    def attend(self, run_attention: Callable[[], Any]):
        """The self-attention's call inside this block's forward: ``run_attention()`` itself; with "capture"
        its output is also cached (the earlier ones kept for a forecast); with "reuse" the cached
        output (or its forecast) is returned and the attention — projections included — does not run."""
        action, self.attn_action = self.attn_action, None  # one self-attention call per block forward
        if action is None:
            return run_attention()
        st, shapes = self._attn_ctx
        order = tdc.forecast_order(self.method.cfg, self.run.call.num_steps)
        if action == "reuse":
            out = st.forecast_attention(self.run.call.step, order)
            return tuple(out) if st.attn_tuple else out[0]
        out = run_attention()
        st.attn_tuple = isinstance(out, tuple)
        st.keep(list(out) if st.attn_tuple else [out], order, attention=True)
        st.attn_shapes = shapes
        return out

    def _attention_linears(self) -> set[int]:
        """Positions (in this block's routed linears) of the layers inside its self-attention module."""
        if self._attn_linears is None:
            prefix = f"{self.run.trace.blocks[self.index]}.{self.method.adapter.self_attention}."
            self._attn_linears = {k for k, j in enumerate(self.linears) if self.run.trace.linears[j].startswith(prefix)}
        return self._attn_linears

    def _attention_reuse(self, call: Call, st: BlockState, streams, args, kwargs):
        """A skipped cell in attention scope: the block runs on its fresh input with the cached attention
        output; its other linears route as a computed block's (DMPQ by Γ, which this cell measures afresh when
        DMPQ routes, so the next step has a fresh Γ: no after-skip step), no PDR check (nothing is cached)."""
        cfg, sched = self.method.cfg, self.method.schedule
        replayed = None if sched is None else sched.block_routes(call.branch, call.step, self.index, len(self.linears))
        routing = dmpq.route(cfg, call.step, len(self.linears), gamma=st.gamma, skipped_last=st.skipped_last,
                             fits=self.fits, tau=self.method.tau, replayed=replayed,
                             nvfp4_as_int8=_nvfp4_as_int8(cfg, streams[0].device))
        attn_linears = self._attention_linears()
        for k, (m, r) in enumerate(zip(self.layers, routing.routes)):
            if k not in attn_linears:
                m.route = r
        output = self._forward("reuse", st, streams, args, kwargs)
        measured = cfg.quant == "dmpq"
        st.skipped_last = not measured
        st.run_skips += 1
        rec = call.rec
        rec.blocks[self.index] = {"computed": True, "skipped": True, "pdr": False, "gamma": None,
                                  "delta_sim": st.delta_sim, "acc_err": st.acc_err, "outlier_ratio": None,
                                  "mode": routing.mode,
                                  "tdc": "attn_forecast" if tdc.forecast_order(cfg, call.num_steps) else "attn_reuse"}
        for k, j in enumerate(self.linears):
            skipped = k in attn_linears
            rec.routes[j] = SKIPPED if skipped else display(routing.routes[k])
            rec.pred_err[j] = None if skipped else routing.pred_err[k]
            rec.lin_outliers[j] = None if skipped or not self.layers else self.layers[k].last_outliers
        rec.attention[self.index] = {"route": SKIPPED, "pred_err": None, "why": "attn_reuse", "emulated": False}
        if measured:  # Γ of this evaluation (its residual holds the reused attention), read with the call's others
            _, sums = block_stats(self.method.adapter.streams_out(output), streams, None, False, cfg.backend)
            self.run.defer(sums, self._resolver(call, st, compare=False, forecasted=False))
        return output

    def probes(self) -> bool:
        """Step mode's probe: block 0, always computed, its delta the step's decision (not with a replay)."""
        return self.index == 0 and self.method.schedule is None and self.method.cfg.tdc_mode == "step"

    def tail(self) -> bool:
        """One of the ``tdc_tail`` last blocks: always computed, its delta never cached (not with a replay)."""
        cfg = self.method.cfg
        return cfg.tdc and self.method.schedule is None and self.index >= len(self.run.trace.blocks) - cfg.tdc_tail

    def _reuse(self, call: Call, st: BlockState, streams, regate: tuple | None = None):
        """A skipped block: its input plus the cached Δ or its forecast (the span's first block: the combined
        residual; the span's other blocks: their input). ``regate`` = (block, args, kwargs) with ``tdc_regate``:
        the cached gated pieces (or their forecast, each piece on its own) times this step's gates."""
        reuse = tdc.resolve_reuse(self.method.cfg, call.num_steps)
        order = tdc.ORDER.get(reuse, 0)
        span, held = self.span_state(call), st
        if span is not None:  # the span's first block adds the combined residual, the others pass through
            held = span if self.index == self.span.bounds(call)[0] else None
        if regate is not None:
            adapter = self.method.adapter
            gates = adapter.gates(*regate)
            if reuse == "scaled":
                pieces = [call.scale * p for p in st.delta]
            elif reuse == "magnitude":  # each piece's size factor folded into its (small) gate: no scaled copy
                pieces, ratios = st.delta, st.magnitude_ratios(call.step)
                if ratios is not None:
                    gates = [r if g is None else g.float() * r for g, r in zip(gates, ratios)]
            else:
                pieces = st.reused(call.step, order)
            out = adapter.recompose(streams, pieces, gates)
        elif held is None:
            out = list(streams)
        elif reuse == "scaled":
            out = [s + call.scale * d for s, d in zip(streams, held.delta)]
        else:
            out = held.reused(call.step, order, onto=streams, magnitude=reuse == "magnitude")
        st.acc_err = tdc.accumulate(st.acc_err, st.delta_sim)
        st.skipped_last = True
        st.run_skips += 1
        call.rec.blocks[self.index] = {"computed": False, "skipped": True, "pdr": False, "gamma": None,
                                       "delta_sim": st.delta_sim, "acc_err": st.acc_err, "outlier_ratio": None,
                                       "mode": "skip", "tdc": "scaled" if reuse == "scaled" else "forecast" if order else "reuse"}
        for j in self.linears:
            call.rec.routes[j] = SKIPPED
            call.rec.pred_err[j] = None
        call.rec.attention[self.index] = {"route": SKIPPED, "pred_err": None, "why": "skip", "emulated": False}
        return self.method.adapter.rebuild(out)

    def _route(self, call: Call, st: BlockState, streams) -> tuple[dmpq.Routing, float | None]:
        cfg, sched, i = self.method.cfg, self.method.schedule, call.step
        next_skip = replayed = None
        if sched is not None:
            next_skip = not sched.computed(call.branch, i + 1, self.index)
            replayed = sched.block_routes(call.branch, i, self.index, len(self.linears))
        elif self.probes() or self.tail():
            next_skip = False  # the probe's delta is the decision's reference, a tail's is not kept: never reused
        oratio = None
        if pdr.applies(cfg, i, call.num_steps, next_skip):  # decides this block's routes: read now
            counter = lambda x, k: ops().outlier_count(x, k, cfg.backend)  # noqa: E731
            oratio = pdr.outlier_ratio(*self.run.read(pdr.outlier_sums(streams, cfg.pdr_k_sigma, counter)))
        routing = dmpq.route(cfg, i, len(self.linears), gamma=st.gamma, skipped_last=st.skipped_last,
                             fits=self.fits, tau=self.method.tau, outlier_ratio=oratio, rho=self.method.rho,
                             replayed=replayed, probe=cfg.tdc and self.probes(),
                             nvfp4_as_int8=_nvfp4_as_int8(cfg, streams[0].device))
        return routing, oratio

    def _route_attention(self, call: Call, st: BlockState, routing: dmpq.Routing) -> dmpq.AttentionRouting:
        sched = self.method.schedule
        replayed = None if sched is None else sched.attention_route(call.branch, call.step, self.index)
        a = dmpq.attention_route(self.method.cfg, routing, gamma=st.gamma, skipped_last=st.skipped_last,
                                 fit=self.attention_fit, tau_attn=self.method.tau_attn, replayed=replayed)
        for p in self.attn_procs:
            p.attention_route = a.route
        return a

    def _record_attention(self, call: Call, a: dmpq.AttentionRouting) -> None:
        """What ran (the processor may fall back to bf16), the prediction and why."""
        ran = [p.last_attention_route for p in self.attn_procs if p.last_attention_route is not None]
        emulated = any(p.last_attention_emulated for p in self.attn_procs)
        if emulated:
            self.run.trace.extra["attention_fp8_emulated"] = True
        call.rec.attention[self.index] = {"route": "fp8" if "fp8" in ran else "bf16", "pred_err": a.pred_err,
                                          "why": a.why, "emulated": emulated}

    def _refresh(self, call: Call, st: BlockState, streams, outs, cached: bool,
                 pieces: list[torch.Tensor] | None = None) -> str:
        """Measure the computed block (Γ, its delta's change: read now for the probe, whose drift decides this
        step, deferred to the call's end otherwise), update the cache; returns the
        trace's TDC decision of the cell: "compute", a tail block's "tail_compute", or the probe's
        "probe_skip"/"probe_compute"/"probe_capped" (under the threshold, computed by ``tdc_max_skips``)."""
        cfg = self.method.cfg
        probe = self.probes()
        # attention scope: only the probe keeps its delta (the decision's reference); the others cache attention;
        # a span block keeps none (the span keeps the combined residual, below)
        span = self.span_state(call)
        keep = self.caches() and (probe or not self.attention_scope()) and span is None
        # tdc_regate: the block keeps its gated pieces (``pieces``) instead of its delta, and compares nothing
        keep_delta = keep and pieces is None
        compare = cached and keep_delta
        order = tdc.forecast_order(cfg, call.num_steps)
        mag = tdc.resolve_reuse(cfg, call.num_steps) == "magnitude"
        # the probe is compared with what the skipped blocks will use (the forecast, when forecasting), or with
        # its last computed delta (tdc_probe_reference="last")
        ref_order = order if cfg.tdc_probe_reference == "forecast" else 0
        ref = (st.reused(call.step, ref_order, magnitude=mag) if probe else st.delta) if compare else None
        deltas, sums = block_stats(outs, streams, ref, keep_delta, cfg.backend)
        # block mode's live decisions only: the error of the forecast this refresh replaces, charged to the budget
        # (two more torch passes over the block's streams; step mode's probe decides, a replay reads its schedule)
        forecasted = (compare and order > 0 and not probe and st.prev_delta is not None
                      and cfg.tdc_mode == "block" and self.method.schedule is None)
        if forecasted:
            fnum, fden = tdc.delta_change_sums(deltas, st.reused(call.step, order, magnitude=mag))
            sums = torch.cat([sums, torch.stack([fnum, fden]).to(sums)])
        st.skipped_last = False
        capped = False
        if probe:  # the step's decision: read now
            vals = self.run.read(sums)
            st.gamma = dmpq.ratio(vals[0], vals[1])
            st.delta_sim = dmpq.ratio(vals[2], vals[3]) if compare else None
            call.threshold = tdc.probe_threshold(call.step, call.num_steps, cfg, self.method.probe_profile)
            skips = tdc.step_skips(st.delta_sim, call.step, call.num_steps, cfg, call.threshold)
            capped = skips and tdc.capped(st.run_skips, cfg)
            call.skip_rest = skips and not capped
            if call.skip_rest:  # the reference stays the last computed step's
                st.run_skips += 1
                call.scale = vals[0] / st.ref_norm if st.ref_norm else 1.0
                return "probe_skip"
            st.ref_norm = vals[0]
        else:  # Γ and the change rate decide at later steps only: read when the call ends (Run.defer)
            self.run.defer(sums, self._resolver(call, st, compare, forecasted))
        if keep:
            st.keep(deltas if pieces is None else pieces, order, attention=False, sizes_only=mag)
        if span is not None:
            self._keep_span(call, span, streams, outs, order, mag)
        st.acc_err = 0.0
        st.run_skips = 0
        st.last_step = call.step
        if probe:
            return "probe_capped" if capped else "probe_compute"
        return "tail_compute" if self.tail() else "compute"

    def _keep_span(self, call: Call, span: BlockState, streams, outs, order: int, mag: bool) -> None:
        """A computed step through the span: its first block holds its input, its last stores ``out − in(first)``."""
        first, last = self.span.bounds(call)
        if self.index == first:
            span.span_input = list(streams)
        if self.index == last and span.span_input is not None:
            span.keep([o - i for o, i in zip(outs, span.span_input)], order, attention=False, sizes_only=mag)
            span.last_step, span.span_input = call.step, None

    def _resolver(self, call: Call, st: BlockState, compare: bool, forecasted: bool) -> Callable[[list[float]], None]:
        """What a computed block's deferred statistics read sets: Γ and (with ``compare``) the change rate per
        step since the block's previous computed step, in its state and in its trace row."""
        rec, index, step, last_step = call.rec, self.index, call.step, st.last_step

        def resolve(vals: list[float]) -> None:
            st.gamma = dmpq.ratio(vals[0], vals[1])
            if compare:
                st.delta_sim = tdc.change_rate(*(vals[4:6] if forecasted else vals[2:4]), step, last_step)
            row = rec.blocks[index]
            if row is not None:  # else the block's row is written after this, from the state
                row["gamma"], row["delta_sim"] = st.gamma, st.delta_sim
        return resolve

    def _record(self, call: Call, st: BlockState, routing: dmpq.Routing, oratio: float | None,
                decision: str) -> None:
        rec = call.rec
        rec.blocks[self.index] = {"computed": True, "skipped": False, "pdr": routing.pdr, "gamma": st.gamma,
                                  "delta_sim": st.delta_sim, "acc_err": st.acc_err, "outlier_ratio": oratio,
                                  "mode": routing.mode, "tdc": decision}
        if routing.nvfp4_as_int8:
            rec.blocks[self.index]["nvfp4_as_int8"] = routing.nvfp4_as_int8
        if decision.startswith("probe_"):  # the threshold the step decided with (tdc.probe_threshold)
            rec.blocks[self.index]["threshold"] = call.threshold
        for k, j in enumerate(self.linears):
            rec.routes[j] = display(routing.routes[k])
            rec.pred_err[j] = routing.pred_err[k]
            if self.layers:
                rec.lin_outliers[j] = self.layers[k].last_outliers

    def reset_state(self, module):
        self.state_manager.reset()
        return module


class AttentionHook(ModelHook):
    """On a block's self-attention (``tdc_scope="attention"``): its call goes through the block hook's
    :meth:`BlockHook.attend`, which runs it, caches its output, or returns the cached output instead."""

    def __init__(self, block: BlockHook):
        super().__init__()
        self.block = block

    def new_forward(self, module, *args, **kwargs):
        return self.block.attend(lambda: self.fn_ref.original_forward(*args, **kwargs))


class PartHook(ModelHook):
    """On one of a block's gated parts (``Adapter.gated_parts``, ``tdc_regate``): reports its output to the block
    hook (:meth:`BlockHook.capture`, which keeps it only while the block computes a regated cell)."""

    def __init__(self, block: BlockHook, name: str):
        super().__init__()
        self.block = block
        self.name = name

    def post_forward(self, module, output):
        self.block.capture(self.name, output)
        return output
