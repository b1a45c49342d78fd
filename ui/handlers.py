"""Event handlers of the demo: validate a request, stream a job's events into the UI, stop a job.

The controller never touches a model: it talks to a *job function* (in app.py, the only place that
runs a pipeline) through a small event protocol, so it is testable with any job that speaks it and
the job can run in another process (ZeroGPU) because every event is plain picklable data:

    ("phase",   {"phase": "baseline" | "sixbit", "steps": N})
    ("step",    {"phase", "step" (1-based), "steps", "trace": dict | None})
    ("done",    {"phase", "frames": uint8 [T,H,W,3], "time_s", "step_time_s", "peak_mem_bytes",
                 "act_bits", "trace": dict | None, "setup_s": float | None, "device": str})
    ("stopped", {"phase", "step"})
    ("tick",    {})        # nothing new; lets the ETA advance and lets Gradio close the generator

`generate` yields one tuple per update, in the order of `OUTPUTS`; ``gr.skip()`` leaves a component
as it is, so the plots are only redrawn when a step arrived.
"""

from __future__ import annotations

import html
import inspect
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr
import numpy as np

from sixbit import metrics as fidelity
from sixbit.video import digest, write_mp4
from ui import config_form, effects, figures
from ui.state import BaselineCache, FileStore, JobRegistry, RunResult, baseline_key
from ui.validate import LOG, ModelLimits, refuse, resolve_model_id, shown, validate_request

OUTPUTS = ("status", "precision", "skips", "curves", "baseline_video", "sixbit_video", "metrics",
           "path_info", "trace_file")

METRIC_HEADERS = ["metric", "baseline (full precision)", "6Bit"]

COMPUTE_PATHS = {
    "cpu-reference": "CPU reference — quantization is simulated in plain torch (fake-quant numerics); "
                     "no low-bit arithmetic speed-up exists on this path, so any speed-up comes from "
                     "skipped blocks (Temporal Delta Cache).",
    "cuda-reference": "CUDA reference — the plain-torch numerics on the GPU, not the fused kernels.",
    "hopper-triton": "Hopper Triton kernels — INT8 on tensor cores; NVFP4 weights are decoded to 16 bits "
                     "once per layer call and multiplied on the 16-bit tensor cores (Hopper has no FP4 units: "
                     "a memory win, not an FP4-compute win).",
    "portable-triton": "Portable Triton kernels (capability 8.0+, no Hopper-only features) — INT8 on tensor "
                       "cores; NVFP4 weights decoded to 16 bits and multiplied at 16-bit rate (a memory win). "
                       "Measured only on an H200 with the portable variant forced (docs/KERNELS.md).",
    "attention-fp8-emulated": "The 8-bit attention ran as a plain-torch emulation of the kernel's numerics "
                              "(backend 'torch'): its quality, not its speed.",
    "blackwell-native (unverified)": "Blackwell native FP4 tensor cores — unverified: this path has "
                                     "not been run by the project.",
}


def explain_compute_path(path: str) -> str:
    """The sentence for each part of ``ops.compute_path``'s string: ``[blackwell-native (unverified) + ]base``
    and, when the load-time self-check replaced a route, ``; self-check fallback: …`` (said as such)."""
    head, _, fallback = path.partition("; self-check fallback: ")
    parts = [COMPUTE_PATHS.get(p.strip(), "") for p in head.split(" + ")]
    if fallback:
        parts.append(f"**Self-check fallback:** a kernel failed its load-time check against the torch reference "
                     f"on this device, so these routes ran on a safe path instead: `{fallback}`.")
    return " ".join(p for p in parts if p)


@dataclass
class ModelInfo:
    """What the controller needs to know about a loaded model (provided by the app)."""

    model_id: str
    display_name: str
    limits: ModelLimits
    dtype_bits: int
    device: str
    device_class: str = "cpu"  # sixbit.costs.device_class of the device the jobs run on
    shape: object = None  # sixbit.costs.TransformerShape of the transformer (weight-memory estimate)


def _pdr_text(summary: dict, config: dict) -> str:
    """PDR firings, with the ρ they were judged against and where it came from (config / policy / fallback)."""
    text = str(summary.get("pdr_count", "n/a"))
    rho = config.get("pdr_rho_resolved")
    if config.get("pdr") and rho is not None:
        text += f" (ρ {rho:.2g}, from the {config.get('pdr_rho_source', '?')})"
    return text


def _fmt(x, unit: str = "", digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "∞ (identical)"
    return f"{x:.{digits}g}{unit}"


def _mib(b) -> str:
    return "n/a (CPU)" if b is None else f"{b / 2**20:,.0f} MiB"


def status_html(state: str, text: str, fraction: float | None = None) -> str:
    """The status line with a progress bar (the bar is omitted when ``fraction`` is None)."""
    bar = ""
    if fraction is not None:
        pct = max(0.0, min(1.0, fraction)) * 100
        bar = (f'<div class="sb-bar" role="progressbar" aria-valuenow="{pct:.0f}" aria-valuemin="0" '
               f'aria-valuemax="100"><div class="sb-bar-fill" style="width:{pct:.1f}%"></div></div>')
    return (f'<div class="sb-status" data-state="{state}"><div class="sb-status-text">{html.escape(text)}'
            f"</div>{bar}</div>")


def stopped_text(phase: str, step: int, steps: int, baseline_kept: bool) -> str:
    """What a Stop leaves behind, exactly: the finished baseline stays (on screen and cached), a partial run
    never does."""
    name = "baseline" if phase == "baseline" else "6Bit"
    text = f"Stopped at step {step}/{steps} of the {name} run. "
    if phase == "baseline" or not baseline_kept:
        return text + "Nothing was kept: no video, no cached baseline."
    return (text + "Kept: the baseline video (on screen, and cached for the next run with the same prompt and "
            "generation settings). The 6Bit run was discarded.")


def _eta(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "ETA …"
    seconds = max(0, int(round(seconds)))
    return f"ETA {seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"ETA {seconds} s"


class Progress:
    """Step counting and ETA over the phases of one request (baseline if not cached, then 6Bit)."""

    def __init__(self, steps: int, need_baseline: bool):
        self.steps = steps
        self.phases = (["baseline"] if need_baseline else []) + ["sixbit"]
        self.phase = self.phases[0]
        self.done_steps = {p: 0 for p in self.phases}
        self.phase_start = time.perf_counter()
        self.first_step_at: dict[str, float] = {}
        self.rate: dict[str, float] = {}  # seconds per step, per phase
        self.decode_s: float | None = None  # measured after the baseline: last step → frames
        self.last_step_at: float | None = None

    def start(self, phase: str):
        self.phase = phase
        self.phase_start = time.perf_counter()

    def step(self, phase: str, step: int):
        now = time.perf_counter()
        self.done_steps[phase] = step
        self.first_step_at.setdefault(phase, now)
        elapsed = now - self.phase_start
        self.rate[phase] = elapsed / step if step else elapsed
        self.last_step_at = now

    def finished(self, phase: str):
        if self.last_step_at is not None and self.decode_s is None:
            self.decode_s = time.perf_counter() - self.last_step_at
        self.done_steps[phase] = self.steps

    def fraction(self) -> float:
        total = self.steps * len(self.phases)
        return sum(self.done_steps.values()) / total if total else 0.0

    def eta(self) -> float | None:
        rate = self.rate.get(self.phase) or next(iter(self.rate.values()), None)
        if rate is None:
            return None
        remaining = sum(self.steps - self.done_steps[p] for p in self.phases)
        decodes = sum(1 for p in self.phases if self.done_steps[p] < self.steps)
        return remaining * rate + decodes * (self.decode_s or 0.0)

    def text(self, cached_baseline: bool) -> str:
        names = {"baseline": "Baseline", "sixbit": "6Bit"}
        parts = ["baseline: cached ✓"] if cached_baseline else []
        p = self.phase
        step = self.done_steps[p]
        rate = self.rate.get(p)
        now = f"{names[p]} · step {step}/{self.steps}"
        if rate:
            now += f" · {rate:.2f} s/step"
        if step >= self.steps:
            now += " · decoding video"
        parts.append(now)
        parts.append(_eta(self.eta()))
        return " · ".join(parts)


class DemoController:
    """Holds the server-side state and implements the event handlers."""

    def __init__(self, *, default_model: str, model_info: Callable[[str], ModelInfo],
                 job_fn: Callable[..., Iterator[tuple[str, dict]]], config_cls, allow_hub: bool = False,
                 baselines: BaselineCache | None = None, jobs: JobRegistry | None = None,
                 files: FileStore | None = None, fps: float = 8.0, available_choices: dict | None = None):
        self.default_model = default_model
        self.model_info = model_info
        self.job_fn = job_fn
        self.config_cls = config_cls
        # the Advanced fields, with choices cut to what this host can run (e.g. no Triton backend on a CPU)
        self.specs = config_form.restrict_choices(config_form.field_specs(config_cls), available_choices or {})
        self.allow_hub = allow_hub
        self.baselines = baselines or BaselineCache()
        self.jobs = jobs or JobRegistry()
        self.files = files or FileStore()
        self.fps = fps
        self._last: dict[str, str] = {}  # session -> last status text
        self._progress: dict[str, tuple[Progress, bool]] = {}  # session -> (progress, baseline kept) for Stop
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def out(**kw) -> tuple:
        """A tuple in `OUTPUTS` order; components not named are left unchanged (``gr.skip()``)."""
        unknown = set(kw) - set(OUTPUTS)
        if unknown:
            raise KeyError(f"unknown outputs {unknown}")
        return tuple(kw[name] if name in kw else gr.skip() for name in OUTPUTS)

    def preset_values(self, preset: str) -> list:
        """Handler of the preset radio: the preset's value for every Advanced field, then the preset
        itself (stored as the form's preset: edits are measured against it)."""
        preset = config_form.normal_preset(preset)
        return [*config_form.preset_values(self.config_cls, preset, self.specs), preset]

    def expected_markdown(self, preset: str, model_id: str | None = None, overrides: dict | None = None) -> str:
        """The expected effect of ``preset`` (with ``overrides``) on the served model's device, before a run."""
        preset = config_form.normal_preset(preset)
        info = self.model_info(model_id or self.default_model)
        cfg = config_form.build_config(self.config_cls, preset, overrides or {})
        return effects.expected_markdown(cfg, info.device_class, info.shape, config_form.PRESET_LABELS[preset])

    def _upscale(self, width: int, height: int) -> int:
        return max(1, min(8, math.ceil(256 / min(width, height))))

    def _write_video(self, frames: np.ndarray, stem: str, params: dict) -> str:
        path = self.files.new_path(stem, ".mp4")
        write_mp4(frames, path, fps=self.fps, upscale=self._upscale(params["width"], params["height"]))
        return str(path)

    def metrics_rows(self, base: RunResult, six: RunResult, cfg=None, info: ModelInfo | None = None
                     ) -> list[list[str]]:
        trace = six.trace or {}
        summary = trace.get("summary", {})
        m = fidelity.compare(six.frames, base.frames)
        speed = base.time_s / six.time_s if six.time_s else None
        step_speed = (base.step_time_s / six.step_time_s
                      if base.step_time_s and six.step_time_s else None)
        skip = summary.get("skip_fraction")
        counts = summary.get("route_counts") or {}
        rows = [
            ["wall time (whole pipeline call)", _fmt(base.time_s, " s"), _fmt(six.time_s, " s")],
            ["speed-up (wall time)", "1×", _fmt(speed, "×")],
            ["time per denoising step (steps 2..N)", _fmt(base.step_time_s, " s"), _fmt(six.step_time_s, " s")],
            ["speed-up (per step)", "1×", _fmt(step_speed, "×")],
            ["peak GPU memory (denoising + decode)", _mib(base.peak_mem_bytes), _mib(six.peak_mem_bytes)],
            ["average activation bits", _fmt(base.act_bits), _fmt(summary.get("avg_act_bits", six.act_bits))],
            ["blocks skipped (TDC)", "0%", _fmt(None if skip is None else 100 * skip, "%")],
            ["PDR refreshes", "0", _pdr_text(summary, trace.get("config") or {})],
            ["linear calls NVFP4 / INT8 / FP16 / skipped", "—",
             " / ".join(str(counts.get(k, 0)) for k in ("nvfp4", "int8", "fp16", "skipped"))],
            ["PSNR vs baseline", "—", _fmt(m["psnr_db"], " dB")],
            ["SSIM vs baseline", "—", _fmt(m["ssim"], digits=4)],
            ["temporal flicker (mean |ΔY| per frame)", _fmt(m["flicker_ref"], digits=4), _fmt(m["flicker"], digits=4)],
            ["optical-flow magnitude (px/frame)", _fmt(m["flow_score_ref"]), _fmt(m["flow_score"])],
            ["optical-flow error vs baseline (px/frame)", "—", _fmt(m["flow_error"])],
        ]
        setup = six.extra.get("setup_s")
        if setup is not None:
            rows.append(["6Bit setup (sixbit.apply, not in wall time)", "—", _fmt(setup, " s")])
        if cfg is not None and info is not None:
            rows += effects.measured_rows(info.device_class, cfg, summary, step_speed)
        check = six.extra.get("self_check_s")
        if check:
            rows.append(["kernel self-check, first use on this device (in wall time)", "—", _fmt(check, " s")])
        return rows

    def path_markdown(self, info: ModelInfo, six: RunResult, base: RunResult | None = None) -> str:
        trace = six.trace or {}
        path = trace.get("compute_path", "unknown")
        device = trace.get("device") or six.extra.get("device") or info.device
        explain = explain_compute_path(path)
        compiled = (trace.get("summary") or {}).get("kernels_compiled_s")
        if compiled is not None:
            explain += f" Kernels compiled in {compiled:.1f} s at `sixbit.apply` (not in the step times)."
        text = f"**Compute path: `{path}`** on `{device}` · model `{info.display_name}`\n\n{explain}"
        steps = base is not None and base.step_time_s and six.step_time_s
        b_s, s_s, per = (base.step_time_s, six.step_time_s, "per step") if steps else (
            base.time_s if base is not None else None, six.time_s, "wall time")
        if b_s and s_s and s_s > b_s:  # a slower 6Bit run is never shown without its recorded reasons
            why = effects.slower_reasons(info.device_class, trace.get("summary") or {}, path,
                                         six.extra.get("self_check_s"))
            text += (f"\n\n**Why 6Bit was slower here ({b_s / s_s:.2f}× {per}):** "
                     + ("; ".join(why) if why else "no recorded cause (timing noise or host load)") + ".")
        return text

    # ---------------------------------------------------------------- handlers
    def stop(self, request: gr.Request) -> str:
        session = getattr(request, "session_hash", None) or "local"
        if self.jobs.stop(session):
            prog, kept = self._progress.get(session, (None, False))
            if prog is None:
                return status_html("stopped", "Stopped before the first step. Nothing was kept.")
            kept = kept or prog.phase == "sixbit" or prog.done_steps.get("baseline", 0) >= prog.steps
            return status_html("stopped", stopped_text(prog.phase, prog.done_steps[prog.phase], prog.steps, kept))
        return status_html("idle", "Nothing is running.")

    def api_generate(self) -> Callable:
        """`generate` with one named parameter per Advanced field, so API clients see ``tdc_budget=…``
        instead of ``param_13`` and may leave any of them out (default: the form's preset value)."""
        base = list(inspect.signature(self.generate).parameters)
        base = [n for n in base if n != "advanced"]
        names = [s.name if s.name not in base else f"adv_{s.name}" for s in self.specs]

        def generate(*args):
            yield from self.generate(*args)

        P = inspect.Parameter
        params = [P(n, P.POSITIONAL_OR_KEYWORD) for n in base]
        params += [P(n, P.POSITIONAL_OR_KEYWORD, default=None) for n in names]
        generate.__signature__ = inspect.Signature(params)
        generate.__annotations__ = {"request": gr.Request}
        generate.__doc__ = self.generate.__doc__
        return generate

    def generate(self, request: gr.Request, model_text, prompt, negative_prompt, seed, steps, frames, resolution,
                 guidance, preset, form_preset, *advanced):
        """The Generate button: a generator of `OUTPUTS` tuples (see the module docstring)."""
        session = getattr(request, "session_hash", None) or "local"
        served = self.model_info(self.default_model).display_name
        model_id = resolve_model_id(model_text, self.default_model, self.allow_hub, served_name=served)
        try:
            info = self.model_info(model_id)
        except gr.Error:
            raise
        except Exception as e:  # load failures: not a CogVideoX pipeline, not found, no network...
            # the exception's text may hold paths of this server: the log gets it, the user its type only
            LOG.warning("model %r could not be loaded: %s: %s", model_id, type(e).__name__, e)
            raise refuse(f"Unknown model {shown(model_text)}: it could not be loaded as a CogVideoX pipeline "
                         f"({type(e).__name__}).", title="Unknown model") from None
        params = validate_request(info.limits, prompt, negative_prompt, seed, steps, frames, resolution, guidance)
        preset = config_form.normal_preset(preset)
        over = config_form.overrides(self.config_cls, preset, self.specs, list(advanced), form_preset)
        cfg = config_form.build_config(self.config_cls, preset, over)  # validate now, before any work
        expected = effects.expected_markdown(cfg, info.device_class, info.shape, config_form.PRESET_LABELS[preset])

        key = baseline_key(model_id, params)
        cached = self.baselines.get(key)
        prog = Progress(params["steps"], need_baseline=cached is None)
        stop = self.jobs.start(session)
        self._progress[session] = (prog, cached is not None)
        self.files.prune(keep=self.baselines.paths())
        n = params["steps"]
        base: RunResult | None = cached
        wait_msg = "the 6Bit run starts after the baseline" if cached is None else "waiting for the first step"
        last_draw, draw_s = 0.0, 0.0
        trace = None
        job = None
        try:
            yield self.out(
                status=status_html("running", "starting…" + (" (baseline cached ✓)" if cached else ""), 0.0),
                precision=figures.placeholder("Activation precision per layer × step", wait_msg),
                skips=figures.placeholder("Block decisions per step (Temporal Delta Cache / PDR)", wait_msg),
                curves=figures.placeholder("Γ and accumulated cache error", wait_msg),
                baseline_video=cached.video_path if cached else None, sixbit_video=None,
                metrics=None, path_info="**Before the run** — " + expected, trace_file=None,
            )
            job = self.job_fn(job_id=session, model_id=model_id, params=params, preset=preset, overrides=over,
                              need_baseline=cached is None)
            for kind, ev in job:
                if kind == "phase":
                    prog.start(ev["phase"])
                    self._last[session] = prog.text(cached is not None)
                    yield self.out(status=status_html("running", self._last[session], prog.fraction()))
                elif kind == "step":
                    prog.step(ev["phase"], ev["step"])
                    self._last[session] = prog.text(cached is not None)
                    upd = dict(status=status_html("running", self._last[session], prog.fraction()))
                    now = time.perf_counter()
                    if ev.get("trace") is not None:
                        trace = ev["trace"]
                        # cap redraws at ~4 per second, and at a fifth of the time: drawing is Python in
                        # this process and takes the GIL from the generation thread's kernel launches
                        if now - last_draw >= max(0.25, 4 * draw_s) or ev["step"] >= n:
                            upd.update(precision=figures.precision_figure(trace, n),
                                       skips=figures.skip_figure(trace, n),
                                       curves=figures.curves_figure(trace, n))
                            last_draw = time.perf_counter()
                            draw_s = last_draw - now
                    yield self.out(**upd)
                elif kind == "tick":
                    if session in self._last:
                        self._last[session] = prog.text(cached is not None)
                        yield self.out(status=status_html("running", self._last[session], prog.fraction()))
                    else:
                        yield self.out()
                elif kind == "stopped":
                    phase = "baseline" if ev.get("phase") == "baseline" else "sixbit"
                    yield self.out(status=status_html(
                        "stopped", stopped_text(phase, ev.get("step", 0), n, base is not None), None))
                    return
                elif kind == "done" and ev["phase"] == "baseline":
                    prog.finished("baseline")
                    base = self._result(ev, params, "baseline")
                    self.baselines.put(key, base)
                    yield self.out(status=status_html("running", prog.text(False), prog.fraction()),
                                   baseline_video=base.video_path,
                                   precision=figures.placeholder("Activation precision per layer × step"),
                                   skips=figures.placeholder("Block decisions per step (Temporal Delta Cache / PDR)"),
                                   curves=figures.placeholder("Γ and accumulated cache error"))
                elif kind == "done" and ev["phase"] == "sixbit":
                    prog.finished("sixbit")
                    six = self._result(ev, params, "sixbit")
                    trace = six.trace or trace or {}
                    if base is None:
                        raise RuntimeError("the job finished without a baseline")
                    rows = self.metrics_rows(base, six, cfg, info)
                    trace_path = self.files.new_path("trace", ".json")
                    trace_path.write_text(json.dumps(self.trace_file_dict(trace, info, ev.get("run"), base, six),
                                                     indent=1))
                    total = (base.time_s if cached is None else 0.0) + six.time_s
                    yield self.out(
                        status=status_html("done", f"Done · 6Bit {six.time_s:.1f} s vs baseline {base.time_s:.1f} s"
                                           + (" (cached)" if cached else "") + f" · total compute {total:.1f} s", 1.0),
                        precision=figures.precision_figure(trace, n), skips=figures.skip_figure(trace, n),
                        curves=figures.curves_figure(trace, n), baseline_video=base.video_path,
                        sixbit_video=six.video_path, metrics=rows,
                        path_info=self.path_markdown(info, six, base) + "\n\n**Expected before the run:** "
                        + expected, trace_file=str(trace_path))
        except Exception as e:  # the job failed: say so in the status line and in Gradio's error modal
            if isinstance(e, gr.Error):
                raise
            yield self.out(status=status_html("error", f"Failed: {type(e).__name__}: {e}", None))
            raise gr.Error(f"Generation failed: {type(e).__name__}: {html.escape(str(e), quote=False)}",
                           title="Generation failed") from e
        finally:
            # Reached on success, on error, and when Gradio closes the generator (Stop / tab closed):
            # the job sees the flag at its next step and unwinds (hooks removed, nothing cached).
            stop.set()
            if job is not None and hasattr(job, "close"):
                job.close()
            self.jobs.finish(session, stop)
            self._last.pop(session, None)
            self._progress.pop(session, None)

    @staticmethod
    def trace_file_dict(trace: dict, info: ModelInfo, run: dict | None, base: RunResult, six: RunResult) -> dict:
        """trace.json: the engine's trace with the model named as users see it (the engine records its load
        path, a path on this server), and the ``run`` section (sixbit.trace.run_record) with the digests of
        both videos, so that a replay can be compared bit for bit."""
        out = dict(trace, model=info.display_name)
        if run is not None:
            out["run"] = dict(run, outputs={"sixbit": digest(six.frames), "baseline": digest(base.frames)})
        return out

    def _result(self, ev: dict, params: dict, stem: str) -> RunResult:
        frames = np.asarray(ev["frames"])
        res = RunResult(frames=frames, time_s=float(ev["time_s"]), step_time_s=ev.get("step_time_s"),
                        peak_mem_bytes=ev.get("peak_mem_bytes"), act_bits=float(ev.get("act_bits", 16)),
                        trace=ev.get("trace"), extra={"setup_s": ev.get("setup_s"), "device": ev.get("device"),
                                                      "self_check_s": ev.get("self_check_s")})
        res.video_path = self._write_video(frames, stem, params)
        return res
