"""Event handlers of the demo, called as functions, on the embedded sixbit-mini with the real engine.

Small sizes keep this fast on 2 CPU cores: 32x32, 9 frames, 3-4 steps.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest

import app
from sixbit import metrics
from sixbit.video import mp4_top_level_atoms, read_mp4
from ui import config_form
from ui.handlers import OUTPUTS

# one intra-op thread: on 2 cores the pipeline thread and the UI thread otherwise contend (see conftest)
pytestmark = pytest.mark.usefixtures("one_thread")

IDX = {n: i for i, n in enumerate(OUTPUTS)}
SMALL = dict(model="", prompt=None, negative="", seed=7, steps=3, frames=9, resolution="32x32", guidance=5.0,
             preset="balanced")


@pytest.fixture(scope="module")
def ctrl():
    demo, controller = app.create_app(allow_hub=False, queue_size=4)
    controller.pristine = _snapshot(app.store().pipeline(app.store().default_id))
    yield controller
    controller.files.cleanup()


@pytest.fixture
def gate(monkeypatch):
    """Hold the pipeline thread after a chosen step until Stop is pressed, so a stop lands on a known step
    whatever the relative speed of the pipeline and of the UI thread."""
    where = {}
    real = app._run_pipeline

    def gated(pipe, gen_defaults, params, phase, handle, emit, stop):
        def emit_then_wait(ev):
            emit(ev)
            if ev[0] == "step" and (ev[1]["phase"], ev[1]["step"]) == where.get("at"):
                assert stop.wait(timeout=60), "the test never pressed Stop"
        return real(pipe, gen_defaults, params, phase, handle, emit_then_wait, stop)

    monkeypatch.setattr(app, "_run_pipeline", gated)
    return where


@pytest.fixture(scope="module")
def prompt():
    return app.example_prompts(app.store().default_id)[0]


def req(session="t"):
    return SimpleNamespace(session_hash=session)


def call(ctrl, session="t", adv=None, **kw):
    """The generate generator with the form's values (SMALL, overridden by kw)."""
    a = {**SMALL, **kw}
    adv = adv if adv is not None else config_form.preset_values(ctrl.config_cls, a["preset"], ctrl.specs)
    form_preset = a["preset"] if a["preset"] in config_form.PRESETS else "balanced"
    return ctrl.generate(req(session), a["model"], a["prompt"], a["negative"], a["seed"], a["steps"], a["frames"],
                         a["resolution"], a["guidance"], a["preset"], form_preset, *adv)


def is_skip(v):
    return isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1


def final(updates):
    """The last non-skip value of every output across a run's updates."""
    out = {}
    for u in updates:
        for name, v in zip(OUTPUTS, u):
            if not is_skip(v):
                out[name] = v
    return out


def test_full_run_streams_diagnostics_and_ends_with_videos_and_metrics(ctrl, prompt):
    ctrl.baselines.clear()
    updates = list(call(ctrl, prompt=prompt, steps=4))
    # live: the heatmaps are redrawn while the 6Bit run streams (one draw per step at most)
    drawn = [u for u in updates if isinstance(u[IDX["precision"]], go.Figure) and u[IDX["precision"]].data]
    assert len(drawn) >= 2, "the precision heatmap must update during the run, not only at the end"
    statuses = [u[IDX["status"]] for u in updates if isinstance(u[IDX["status"]], str)]
    assert any("Baseline · step 1/4" in s for s in statuses)
    assert any("6Bit · step 4/4" in s for s in statuses)
    assert any("ETA" in s for s in statuses)
    out = final(updates)
    assert 'data-state="done"' in out["status"]
    for key in ("baseline_video", "sixbit_video"):
        path = Path(out[key])
        assert path.is_file() and path.suffix == ".mp4"
        atoms = mp4_top_level_atoms(path)
        assert atoms.index("moov") < atoms.index("mdat")
        frames = read_mp4(path)
        assert frames.shape == (9, 256, 256, 3)  # 32x32 shown 8x (nearest) so the browser does not blur it
    # the heatmaps show every linear (+ each block's attention row) / block of the model for every step
    prec, skips = out["precision"], out["skips"]
    trace = json.loads(Path(out["trace_file"]).read_text())
    assert len(prec.data[0].z) == len(trace["linears"]) + len(trace["blocks"]) and len(prec.data[0].z[0]) == 4
    assert all(v is not None for row in prec.data[0].z for v in row)
    assert len(skips.data[0].z) == len(trace["blocks"])
    assert [t.name for t in out["curves"].data].count("mean over blocks") == 2
    rows = {r[0]: r[1:] for r in out["metrics"]}
    for name in ("wall time (whole pipeline call)", "speed-up (wall time)", "peak GPU memory (denoising + decode)",
                 "average activation bits", "blocks skipped (TDC)", "PSNR vs baseline", "SSIM vs baseline",
                 "temporal flicker (mean |ΔY| per frame)"):
        assert name in rows, name
    assert rows["peak GPU memory (denoising + decode)"][0] == "n/a (CPU)"
    assert float(rows["SSIM vs baseline"][1]) <= 1.0
    assert trace["compute_path"] == "cpu-reference"
    assert "cpu-reference" in out["path_info"] and "CPU reference" in out["path_info"]
    bits = rows["average activation bits"][1]  # shown to 3 significant digits
    assert bits == f"{trace['summary']['avg_act_bits']:.3g}" and float(bits) < 16
    # PDR firings with the ρ they were judged against and where that ρ came from
    cfg = trace["config"]
    assert rows["PDR refreshes"][1] == (f"{trace['summary']['pdr_count']} (ρ {cfg['pdr_rho_resolved']:.2g}, "
                                         f"from the {cfg['pdr_rho_source']})")


def test_rerun_with_new_thresholds_reuses_the_baseline(ctrl, prompt, monkeypatch):
    ctrl.baselines.clear()
    calls = []
    real = ctrl.job_fn

    def spy(**kw):
        calls.append(kw["need_baseline"])
        return real(**kw)

    monkeypatch.setattr(ctrl, "job_fn", spy)
    first = final(call(ctrl, prompt=prompt))
    adv = config_form.preset_values(ctrl.config_cls, "balanced", ctrl.specs)
    adv[[s.name for s in ctrl.specs].index("tdc_threshold")] = 0.5
    second_updates = list(call(ctrl, prompt=prompt, adv=adv))
    second = final(second_updates)
    assert calls == [True, False]
    assert second["baseline_video"] == first["baseline_video"]
    assert any("baseline: cached" in u[IDX["status"]] for u in second_updates if isinstance(u[IDX["status"]], str))
    assert 'data-state="done"' in second["status"] and "(cached)" in second["status"]
    # the edited threshold reached the engine (the trace records the config it ran with)
    ran = json.loads(Path(second["trace_file"]).read_text())["config"]
    assert ran["tdc_threshold"] == 0.5 and ran["tdc_budget"] == ctrl.config_cls.preset("balanced").tdc_budget
    # another seed is another baseline (see test_app_ui for every key field); it is computed
    ctrl.baselines.clear()
    fresh = final(call(ctrl, prompt=prompt))
    assert calls == [True, False, True]
    # the cached baseline is the same video a fresh run makes (deterministic seed)
    assert metrics.psnr(read_mp4(fresh["baseline_video"]), read_mp4(first["baseline_video"])) == np.inf


@pytest.mark.parametrize("change, message", [
    (dict(prompt=""), "enter a prompt"),
    (dict(prompt="a red circle " * 300), "too long"),
    (dict(steps=0), "Steps must be between 1 and 100"),
    (dict(steps=1000), "Steps must be between 1 and 100"),
    (dict(seed=-3), "Seed must be between"),
    (dict(guidance=50), "Guidance scale must be between"),
    (dict(frames=5), "8·k\\+1 frames"),
    (dict(frames=25), "Frames must be 8·k\\+1 frames up to 17"),
    (dict(seed=1.5), "Seed must be a whole number"),  # Gradio's Number would have rounded it silently
    (dict(steps=2.5), "Steps must be a whole number"),
    (dict(resolution="100000x100000"), "largest size this model takes is 64x64"),
    (dict(resolution="36x36"), "multiples of 8"),
    (dict(resolution="128x128"), "largest size"),
    (dict(model="THUDM/CogVideoX-2b"), "Unknown model"),
    (dict(model="/etc"), "Unknown model"),
    (dict(preset="turbo"), "Unknown 6Bit preset"),
])
def test_invalid_inputs_raise_gr_error_before_any_work(ctrl, prompt, change, message, monkeypatch):
    monkeypatch.setattr(ctrl, "job_fn", lambda **kw: pytest.fail("no job may start for an invalid request"))
    kw = {"prompt": prompt, **change}
    adv = None if kw.get("preset", "balanced") in config_form.PRESETS else \
        config_form.preset_values(ctrl.config_cls, "balanced", ctrl.specs)
    with pytest.raises(gr.Error, match=message):
        next(call(ctrl, adv=adv, **kw))
    assert ctrl.jobs.running() == 0


def test_invalid_advanced_value(ctrl, prompt):
    adv = config_form.preset_values(ctrl.config_cls, "balanced", ctrl.specs)
    names = [s.name for s in ctrl.specs]
    adv[names.index("pdr_rho")] = 5.0  # rho is a fraction
    with pytest.raises(gr.Error, match=r"PDR ρ \(outlier ratio\) must be a number from 0 to 1, or empty; got 5.0"):
        next(call(ctrl, prompt=prompt, adv=adv))


def test_preset_handler_fills_the_advanced_fields(ctrl):
    *vals, form_preset = ctrl.preset_values("aggressive")
    assert form_preset == "aggressive"
    cfg = ctrl.config_cls.preset("aggressive")
    for spec, v in zip(ctrl.specs, vals):
        assert config_form.to_display(spec, getattr(cfg, spec.name)) == v
    with pytest.raises(gr.Error):
        ctrl.preset_values("warp")


def _snapshot(pipe):
    """Everything a run could leave behind on the pipeline: module types, hooks, parameters."""
    tr = pipe.transformer
    mods = [(n, type(m).__name__, len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in tr.named_modules()]
    # (diffusers itself leaves an empty registry on the transformer after any call: cache_context)
    regs = [(n, sorted(m._diffusers_hook.hooks)) for n, m in tr.named_modules()
            if hasattr(m, "_diffusers_hook") and m._diffusers_hook.hooks]
    fwd = [n for n, m in tr.named_modules() if "forward" in vars(m)]
    params = {n: p.detach().clone() for n, p in tr.named_parameters()}
    return mods, regs, fwd, params, getattr(pipe, "_interrupt", False)


def _same(a, b):
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2] and a[4] == b[4]
    assert a[3].keys() == b[3].keys() and all(torch_equal(a[3][k], b[3][k]) for k in a[3])


def torch_equal(x, y):
    import torch

    return torch.equal(x, y)


def test_stop_interrupts_at_next_step_and_leaves_nothing_behind(ctrl, prompt, gate):
    pipe = app.store().pipeline(app.store().default_id)
    ctrl.baselines.clear()
    reference = final(call(ctrl, prompt=prompt, steps=4))
    ctrl.baselines.clear()

    # Stop during the baseline: the run ends at that step and nothing is cached
    gate["at"] = ("baseline", 1)
    gen = call(ctrl, session="s1", prompt=prompt, steps=4)
    for u in gen:
        if isinstance(u[IDX["status"]], str) and "Baseline · step 1/4" in u[IDX["status"]]:
            assert "Stopped" in ctrl.stop(req("s1"))
            break
    out = final(gen)
    assert "Stopped at step 1/4 of the baseline run. Nothing was kept" in out["status"]
    assert len(ctrl.baselines) == 0 and ctrl.jobs.running() == 0

    # Stop during the 6Bit run: no 6Bit video, the baseline (complete) stays cached
    gate["at"] = ("sixbit", 2)
    gen = call(ctrl, session="s2", prompt=prompt, steps=4)
    for u in gen:
        if isinstance(u[IDX["status"]], str) and "6Bit · step 2/4" in u[IDX["status"]]:
            said = ctrl.stop(req("s2"))  # exactly what is kept, no stale ETA
            assert "Kept: the baseline video" in said and "ETA" not in said and "Nothing" not in said, said
            break
    out = final(gen)
    assert "Stopped at step 2/4 of the 6Bit run. Kept: the baseline video" in out["status"]
    assert out.get("sixbit_video") is None and len(ctrl.baselines) == 1
    assert "Nothing is running" in ctrl.stop(req("s2"))
    with app.GPU_LOCK:  # the job has released the pipeline
        _same(ctrl.pristine, _snapshot(pipe))

    # the next run is exactly the run that would have happened without the stops
    gate.clear()
    again = final(call(ctrl, prompt=prompt, steps=4))
    assert metrics.psnr(read_mp4(again["sixbit_video"]), read_mp4(reference["sixbit_video"])) == np.inf
    assert metrics.psnr(read_mp4(again["baseline_video"]), read_mp4(reference["baseline_video"])) == np.inf


def test_closing_the_generator_like_gradio_cancel_does(ctrl, prompt):
    """Gradio's `cancels` closes the handler's generator: the job must stop and free the pipeline."""
    pipe = app.store().pipeline(app.store().default_id)
    ctrl.baselines.clear()
    gen = call(ctrl, session="c", prompt=prompt, steps=4)
    for u in gen:
        if isinstance(u[IDX["status"]], str) and "step 1/4" in u[IDX["status"]]:
            break
    gen.close()
    assert ctrl.jobs.running() == 0
    acquired = app.GPU_LOCK.acquire(timeout=30)
    assert acquired, "the interrupted job did not release the pipeline"
    try:
        _same(ctrl.pristine, _snapshot(pipe))
    finally:
        app.GPU_LOCK.release()
    assert len(ctrl.baselines) == 0


def test_one_job_at_a_time(ctrl, prompt):
    """Two sessions calling at once (bypassing Gradio's queue): the pipeline runs one job at a time."""
    active, peak = [0], [0]
    lock = threading.Lock()
    real = app._run_pipeline

    def counting(*a, **k):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return real(*a, **k)
        finally:
            with lock:
                active[0] -= 1

    app._run_pipeline = counting
    try:
        ctrl.baselines.clear()
        results = {}
        threads = [threading.Thread(target=lambda s=s: results.setdefault(s, final(call(ctrl, session=s, steps=2,
                                                                                        prompt=prompt))))
                   for s in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    finally:
        app._run_pipeline = real
    assert peak[0] == 1
    assert all('data-state="done"' in results[s]["status"] for s in ("a", "b"))


def test_queue_is_bounded_and_generate_is_serialised():
    demo, controller = app.create_app(allow_hub=False, queue_size=3)
    controller.files.cleanup()
    assert demo._queue.max_size == 3
    gen_id, gen = next((i, fn) for i, fn in demo.fns.items() if fn.api_name == "generate")
    assert gen.concurrency_limit == 1 and gen.concurrency_id == "gpu"
    assert [c.elem_id for c in gen.show_progress_on] == ["sb-status-box"]  # plots stay visible
    assert any(gen_id in fn.cancels for fn in demo.fns.values()), "Stop must cancel the generate event"
    assert demo.delete_cache == (3600, 3600)


def test_a_failing_job_is_reported_and_leaves_no_job_behind(ctrl, prompt, monkeypatch):
    def broken(**kw):
        yield ("phase", {"phase": "baseline", "steps": 3})
        raise RuntimeError("boom")

    monkeypatch.setattr(ctrl, "job_fn", broken)
    ctrl.baselines.clear()
    gen = call(ctrl, prompt=prompt)
    seen = []
    with pytest.raises(gr.Error, match="Generation failed: RuntimeError: boom"):
        for u in gen:
            seen.append(u)
    assert 'data-state="error"' in seen[-1][IDX["status"]]
    assert ctrl.jobs.running() == 0 and len(ctrl.baselines) == 0


def test_a_hub_model_that_cannot_be_loaded_is_an_unknown_model(prompt, monkeypatch):
    """With the model field enabled, a typed Hub id is loaded on demand; offline (HF_HUB_OFFLINE=1 in
    tests) or nonexistent, it is refused with a clear error and the served model stays loaded."""
    demo, controller = app.create_app(allow_hub=True, queue_size=2)
    try:
        assert demo.sixbit_components["model"].visible
        with pytest.raises(gr.Error, match="Unknown model 'nobody/no-such-model'"):
            next(call(controller, prompt=prompt, model="nobody/no-such-model"))
        assert app.store().default_id in app.store()._pipes
    finally:
        controller.files.cleanup()


def test_text_encoder_4bit_setting_packs_the_encoder_and_says_so(monkeypatch, tmp_path):
    from sixbit.testing import save_and_reload, tiny_cogvideox_pipeline

    folder = tmp_path / "tiny"
    save_and_reload(tiny_cogvideox_pipeline(seed=0), folder)
    monkeypatch.setenv("SIXBIT_TEXT_ENCODER_4BIT", "1")
    st = app.ModelStore(str(folder), device="cpu")
    pipe = st.pipeline(str(folder))
    assert pipe.sixbit_text_encoder is not None
    assert any(type(m).__name__ == "SixBitLinear" for m in pipe.text_encoder.modules())
    assert "text encoder in 4-bit weights" in st.info(str(folder)).display_name
    monkeypatch.setenv("SIXBIT_TEXT_ENCODER_4BIT", "0")
    st = app.ModelStore(str(folder), device="cpu")
    assert st.pipeline(str(folder)).sixbit_text_encoder is None
    assert "4-bit" not in st.info(str(folder)).display_name


def _replay_block() -> str:
    readme = (Path(app.ROOT) / "README.md").read_text()
    start = readme.index("<!-- replay")
    return readme[readme.index("```python", start) + len("```python"):readme.index("```", readme.index("```python", start) + 9)]


def test_trace_json_reproduces_the_run_bit_for_bit_and_names_no_server_path(ctrl, prompt, tmp_path, monkeypatch):
    """Issue 16, items 7 and 13: trace.json names the model as users see it (no install path anywhere) and
    holds everything a replay needs; the README's replay code, run as written, gives the same pixels."""
    ctrl.baselines.clear()
    out = final(call(ctrl, prompt=prompt, negative="blurry", seed=11))
    text = Path(out["trace_file"]).read_text()
    assert str(app.ROOT) not in text and "/assets/" not in text
    trace = json.loads(text)
    assert trace["model"] == "sixbit-mini (embedded)"
    run = trace["run"]
    kw = run["pipeline_kwargs"]
    assert (kw["prompt"], kw["negative_prompt"], kw["num_inference_steps"], kw["num_frames"], kw["width"],
            kw["height"], kw["guidance_scale"]) == (prompt, "blurry", 3, 9, 32, 32, 5.0)
    assert run["generator"] == {"device": "cpu", "seed": 11}
    assert run["sixbit_config"] == ctrl.config_cls.preset("balanced").to_dict()
    assert run["model"]["id"] == "sixbit-mini (embedded)" and run["model"]["revision"].startswith("sha256:")
    assert run["policy"]["calibrated"] and len(run["policy"]["sha256"]) == 64
    assert run["device"] == "cpu" and run["compute_path"] == "cpu-reference"
    assert {"python", "sixbit", "torch", "diffusers", "transformers", "numpy"} <= set(run["packages"])
    assert run["outputs"]["sixbit"].startswith("sha256:") and run["outputs"]["baseline"] != run["outputs"]["sixbit"]
    # the README's replay, verbatim, in a folder holding the downloaded trace.json
    (tmp_path / "trace.json").write_text(text)
    monkeypatch.chdir(tmp_path)
    import sixbit

    pipe = app.store().pipeline(app.store().default_id)
    monkeypatch.setattr(sixbit, "load_pipeline", lambda *a, **k: pipe)  # the already loaded sixbit-mini
    with app.GPU_LOCK:
        exec(compile(_replay_block(), "README.md (replay)", "exec"), {})  # asserts the digests itself
    _same(ctrl.pristine, _snapshot(pipe))


def test_model_errors_never_show_server_paths(ctrl, prompt):
    with pytest.raises(gr.Error) as e:
        next(call(ctrl, prompt=prompt, model="THUDM/CogVideoX-2b"))
    assert "sixbit-mini (embedded)" in e.value.message and str(app.ROOT) not in e.value.message
