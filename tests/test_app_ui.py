"""Unit tests of the app's pure parts: figures from a trace, input validation, the Advanced form,
the baseline cache, the job registry and the file store. No pipeline runs here."""

import dataclasses
import os
import time
from typing import Literal

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import pytest

from ui import config_form, figures
from ui.handlers import DemoController, Progress, status_html
from ui.state import BaselineCache, FileStore, JobRegistry, RunResult, baseline_key
from ui.validate import ModelLimits, parse_resolution, resolve_model_id, validate_request

BLOCKS = ["transformer_blocks.0", "transformer_blocks.1"]
LINEARS = [f"transformer_blocks.{b}.{n}" for b in range(2) for n in ("attn1.to_q", "ff.net.2")]


def make_trace(n_steps=3):
    """A schema-v1 trace dict as the engine emits it (2 blocks, 4 linears)."""
    steps = []
    for i in range(n_steps):
        skip1 = i == 2
        steps.append({
            "step": i, "timestep": 999.0 - 333 * i, "time_s": 0.1,
            "blocks": [
                {"computed": True, "skipped": False, "pdr": i == 1, "gamma": 0.5 / (i + 1), "delta_sim": None,
                 "acc_err": 0.0, "outlier_ratio": 1e-3},
                {"computed": not skip1, "skipped": skip1, "pdr": False, "gamma": None if skip1 else 0.3,
                 "delta_sim": 0.02, "acc_err": 0.05 * i, "outlier_ratio": None},
            ],
            "routes": ["fp16" if i == 1 else "nvfp4", "int8", "nvfp4", "skipped" if skip1 else "int8"],
            "pred_err": [0.01, 0.2, 0.02, None if skip1 else 0.3],
        })
    return {"version": 1, "model": "tiny", "device": "cpu", "compute_path": "cpu-reference",
            "config": {"tdc_budget": 0.25}, "blocks": BLOCKS, "linears": LINEARS, "steps": steps,
            "summary": {"avg_act_bits": 6.0, "skip_fraction": 1 / 6, "pdr_count": 1, "time_s": 0.3,
                        "peak_mem_bytes": None, "route_counts": {"nvfp4": 5, "int8": 5, "fp16": 1, "skipped": 1}}}


# ------------------------------------------------------------------------------------------- figures
def test_precision_figure_codes_every_cell():
    fig = figures.precision_figure(make_trace(), total_steps=5)
    hm = fig.data[0]
    assert isinstance(hm, go.Heatmap)
    z = [list(r) for r in hm.z]
    code = {r: i for i, r in enumerate(figures.ROUTES)}
    assert len(z) == 4 and len(z[0]) == 5  # the x axis spans the whole run while streaming
    assert z[0][:3] == [code["nvfp4"], code["fp16"], code["nvfp4"]]
    assert z[3][:3] == [code["int8"], code["int8"], code["skipped"]]
    assert z[0][3:] == [None, None]  # steps not yet run stay empty
    # rows grouped by block: one readable label per block, the layer's full name in the hover
    assert list(fig.layout.yaxis.ticktext) == ["block 0", "block 1"] and list(fig.layout.yaxis.tickvals) == [0.5, 2.5]
    assert hm.customdata[0][0][0] == "transformer_blocks.0.attn1.to_q" and "customdata[0]" in hm.hovertemplate
    assert [sh.y0 for sh in fig.layout.shapes] == [1.5]  # a separator between the blocks
    legend = [t.name for t in fig.data[1:]]
    assert any(name.startswith("NVFP4") and name.endswith("· 5") for name in legend)


def test_skip_figure_states_and_hover():
    fig = figures.skip_figure(make_trace())
    z = [list(r) for r in fig.data[0].z]
    assert z[0] == [0, 2, 0]  # computed, PDR, computed
    assert z[1] == [0, 0, 1]  # computed, computed, skipped
    assert fig.data[0].customdata[1][2][0] == "–"  # Γ of a skipped block is unknown


def test_curves_figure_has_block_lines_mean_and_budget():
    fig = figures.curves_figure(make_trace(), total_steps=3)
    names = [t.name for t in fig.data]
    assert names.count("mean over blocks") == 2
    gamma_mean = [t for t in fig.data if t.name == "mean over blocks"][0]
    assert gamma_mean.y[0] == pytest.approx((0.5 + 0.3) / 2)
    assert gamma_mean.y[2] == pytest.approx(0.5 / 3)  # the skipped block's missing Γ is not averaged in
    assert any(getattr(s, "y0", None) == 0.25 for s in fig.layout.shapes)  # the error budget line


def test_figures_of_an_empty_trace_are_placeholders():
    for fn in (figures.precision_figure, figures.skip_figure, figures.curves_figure):
        fig = fn({"blocks": [], "linears": [], "steps": []})
        assert len(fig.data) == 0 and fig.layout.annotations


def test_block_groups_of_a_real_model_layout():
    names = [f"transformer_blocks.{b}.{n}" for b in range(12) for n in ("attn1.to_q", "attn1.to_k", "ff.net.2")]
    groups = figures.block_groups(names + ["proj_out"])
    assert len(groups) == 13 and groups[0] == ("block 0", 0, 2) and groups[11] == ("block 11", 33, 35)
    assert groups[-1] == ("proj_out", 36, 36)


# ---------------------------------------------------------------------------------------- validation
LIM = ModelLimits(spatial_multiple=16, frame_step=8, max_width=128, max_height=96, max_frames=17,
                  min_side=32, max_prompt_tokens=20, count_tokens=lambda s: len(s.encode()) + 1)
GOOD = dict(prompt="a red ball", negative_prompt="", seed=3, steps=4, frames=9, resolution="64x64", guidance=5)


def test_validate_accepts_and_normalises():
    p = validate_request(LIM, **{**GOOD, "prompt": "  a red ball  ", "seed": 3.0})
    assert p == dict(prompt="a red ball", negative_prompt="", seed=3, steps=4, frames=9, width=64, height=64,
                     guidance=5.0)


@pytest.mark.parametrize("change, message", [
    ({"prompt": "   "}, "enter a prompt"),
    ({"prompt": "x" * 5000}, "too long"),
    ({"prompt": "x" * 25}, "26 tokens"),
    ({"negative_prompt": "y" * 30}, "Negative prompt is too long"),
    ({"seed": -1}, "Seed must be between 0 and 4294967295"),
    ({"seed": 1.5}, "Seed must be a whole number between 0 and 4294967295, got 1.5"),
    ({"seed": None}, "Seed is empty"),
    ({"seed": True}, "Seed must be a whole number"),
    ({"steps": 0}, "Steps must be between 1 and 100"),
    ({"steps": 2.5}, "Steps must be a whole number between 1 and 100, got 2.5"),
    ({"steps": 101}, "Steps must be between"),
    ({"steps": "many"}, "Steps must be a number"),
    ({"frames": 5}, r"Frames must be 8·k\+1 frames up to 17 \(1, 9, 17\) for this model; got 5"),
    ({"frames": 25}, r"Frames must be 8·k\+1 frames up to 17"),
    ({"resolution": "70x64"}, "Resolution '70x64': width and height must be multiples of 16. This model takes "
                              "width x height, each a multiple of 16, from 32x32 to 128x96"),
    ({"resolution": "144x96"}, "largest size"),
    ({"resolution": "100000x100000"}, "largest size this model takes is 128x96"),
    ({"resolution": "16x16"}, "smallest size"),
    ({"resolution": "big"}, "Resolution 'big': not of the form width x height. This model takes width x height"),
    ({"resolution": 64}, "Resolution 64: not of the form"),
    ({"guidance": 0.5}, "Guidance scale must be between 1 and 20"),
    ({"guidance": float("nan")}, "Guidance scale must be a finite number"),
    ({"prompt": ["a", "list"]}, "Prompt must be text"),
])
def test_validate_rejects_with_clear_errors(change, message):
    with pytest.raises(gr.Error, match=message) as e:
        validate_request(LIM, **{**GOOD, **change})
    assert e.value.print_exception is False  # a refused input is one log line, not a traceback


def test_echoed_user_values_are_escaped_text():
    """Gradio renders an error toast as HTML: a typed value must come back as text (issue 16, item 2)."""
    for kw in ({"resolution": "<img src=x onerror=alert(1)>"}, {"seed": "<b>1</b>"}, {"steps": "<i>2</i>"}):
        with pytest.raises(gr.Error) as e:
            validate_request(LIM, **{**GOOD, **kw})
        assert "<" not in e.value.message and "&lt;" in e.value.message, e.value.message
    with pytest.raises(gr.Error) as e:
        resolve_model_id("<svg onload=x>", "/srv/model", allow_hub=True)
    assert "<" not in e.value.message
    with pytest.raises(gr.Error) as e:
        config_form.normal_preset("<img src=x>")
    assert "<" not in e.value.message and "off, balanced, aggressive" in e.value.message


def test_refused_input_logs_one_line(caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="sixbit.app"):
        with pytest.raises(gr.Error):
            validate_request(LIM, **{**GOOD, "steps": 0})
    lines = [r for r in caplog.records if r.name == "sixbit.app"]
    assert len(lines) == 1 and "Steps must be between" in lines[0].getMessage() and lines[0].exc_info is None


def test_parse_resolution_forms():
    assert parse_resolution("128 × 96", LIM) == (128, 96)
    assert parse_resolution("64X32", LIM) == (64, 32)


def test_limits_resolutions_are_on_the_grid():
    lim = ModelLimits(max_width=720, max_height=480)
    res = lim.resolutions()
    assert res[0] == "720x480"
    for r in res:
        w, h = map(int, r.split("x"))
        assert w % 16 == 0 and h % 16 == 0
    assert ModelLimits(max_frames=49).frame_choices == [1, 9, 17, 25, 33, 41, 49]


def test_resolve_model_id_never_takes_a_path():
    assert resolve_model_id("", "/srv/model", allow_hub=False) == "/srv/model"
    assert resolve_model_id("/srv/model", "/srv/model", allow_hub=False) == "/srv/model"
    with pytest.raises(gr.Error, match="only serves sixbit-mini") as e:
        resolve_model_id("THUDM/CogVideoX-2b", "/srv/model", allow_hub=False, served_name="sixbit-mini")
    assert "/srv" not in e.value.message  # the server's paths never reach a user
    assert resolve_model_id("THUDM/CogVideoX-2b", "/srv/model", allow_hub=True) == "THUDM/CogVideoX-2b"
    for bad in ("/etc/passwd", "../secrets", "./model", "a/b/c", "~/x", "..a/b..", "C:\\x"):
        with pytest.raises(gr.Error, match="Unknown model"):
            resolve_model_id(bad, "/srv/model", allow_hub=True)


# ----------------------------------------------------------------------------------- Advanced form
@dataclasses.dataclass
class DemoConfig:
    """A small config with every field kind the form must handle."""

    mode: Literal["a", "b"] = "a"
    block: int = dataclasses.field(default=64, metadata={"choices": (16, 64), "help": "block size"})
    tau: float | None = dataclasses.field(default=None, metadata={"min": 0.0})
    steps: int = dataclasses.field(default=1, metadata={"min": 0, "max": 10})
    on: bool = True
    policy: str | None = "auto"
    note: str = "free text is never rendered"
    table: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def preset(cls, name, **kw):
        base = {"off": dict(on=False), "balanced": {}, "aggressive": dict(tau=0.5)}[name]
        if kw.get("steps", 0) == 7:
            raise ValueError("steps=7 is unlucky")
        return cls(**{**base, **kw})


def test_form_covers_scalar_fields_only():
    specs = config_form.field_specs(DemoConfig)
    assert [(s.name, s.kind) for s in specs] == [
        ("mode", "choice"), ("block", "choice"), ("tau", "float"), ("steps", "int"), ("on", "bool"),
        ("policy", "mapped")]
    assert specs[1].info == "block size" and specs[2].optional


def test_form_components_show_the_preset_values():
    specs = config_form.field_specs(DemoConfig)
    vals = config_form.preset_values(DemoConfig, "balanced", specs)
    with gr.Blocks():
        comps = [config_form.make_component(s, v) for s, v in zip(specs, vals)]
    assert [c.value for c in comps] == vals
    assert isinstance(comps[0], gr.Dropdown) and isinstance(comps[4], gr.Checkbox)
    # no Gradio bounds or precision (they round silently or refuse without the field's name): _coerce checks
    assert isinstance(comps[3], gr.Number) and comps[3].minimum is None and comps[3].precision is None
    # an optional number is a text box that starts empty (a number box would show and send 0: issue 16, item 1)
    assert isinstance(comps[2], gr.Textbox) and comps[2].value == ""
    assert comps[1].choices == [("16", "16"), ("64", "64")]  # choices as text: the API documents what it accepts
    assert comps[1].info == "block size"


def test_form_overrides_are_the_changed_fields():
    specs = config_form.field_specs(DemoConfig)
    vals = config_form.preset_values(DemoConfig, "balanced", specs)
    assert vals == ["a", "64", "", 1, True, "auto (shipped policy for the model)"]
    assert config_form.overrides(DemoConfig, "balanced", specs, vals) == {}
    changed = ["b", "16", 0.3, 2.0, "false", "none (uncalibrated E = Γ)"]
    assert config_form.overrides(DemoConfig, "balanced", specs, changed) == dict(
        mode="b", block=16, tau=0.3, steps=2, on=False, policy=None)
    # overrides are the edits relative to the preset the form was filled from ...
    assert config_form.overrides(DemoConfig, "aggressive", specs, vals, form_preset="balanced") == {}
    # ... which is the chosen preset unless said otherwise
    assert config_form.overrides(DemoConfig, "aggressive", specs, vals) == {"tau": None}
    agg = config_form.preset_values(DemoConfig, "aggressive", specs)
    agg[3] = 4
    assert config_form.overrides(DemoConfig, "aggressive", specs, agg, form_preset="aggressive") == {"steps": 4}


@pytest.mark.parametrize("index, value, message", [
    (0, "c", "must be one of"), (1, 32, "must be one of"), (2, -1.0, "tau must be a number ≥ 0, or empty; got -1.0"),
    (3, 11, "steps must be a whole number from 0 to 10; got 11"),
    (3, 1.5, "whole number"), (3, None, "is empty"), (4, "maybe", "true or false"),
    (5, "/etc/passwd", "must be one of"),
])
def test_form_rejects_bad_values(index, value, message):
    specs = config_form.field_specs(DemoConfig)
    vals = config_form.preset_values(DemoConfig, "balanced", specs)
    vals[index] = value
    with pytest.raises(gr.Error, match=message):
        config_form.overrides(DemoConfig, "balanced", specs, vals)


def test_form_unknown_preset_and_engine_errors():
    specs = config_form.field_specs(DemoConfig)
    vals = config_form.preset_values(DemoConfig, "balanced", specs)
    with pytest.raises(gr.Error, match="Unknown 6Bit preset"):
        config_form.overrides(DemoConfig, "turbo", specs, vals)
    with pytest.raises(gr.Error, match="unlucky"):
        config_form.build_config(DemoConfig, "balanced", {"steps": 7})


def test_form_on_the_real_config():
    from sixbit.config import SixBitConfig

    specs = config_form.field_specs(SixBitConfig)
    names = {s.name for s in specs}
    thresholds = {f.name for f in dataclasses.fields(SixBitConfig)
                  if any(k in f.name for k in ("tau", "rho", "threshold", "budget", "warmup", "hadamard"))}
    assert thresholds and thresholds <= names  # every threshold is in the form
    for preset in config_form.PRESETS:
        vals = config_form.preset_values(SixBitConfig, preset, specs)
        assert config_form.overrides(SixBitConfig, preset, specs, vals) == {}
        config_form.build_config(SixBitConfig, preset, {})
    # issue 16: hadamard_block is offered as text and accepted as text or integer, the optional τ and ρ stay
    # empty (= from the policy), and the triton backend is not offered where it cannot run
    idx = {s.name: i for i, s in enumerate(specs)}
    vals = config_form.preset_values(SixBitConfig, "balanced", specs)
    assert vals[idx["tau"]] == "" and vals[idx["pdr_rho"]] == "" and vals[idx["hadamard_block"]] == "64"
    for hb in ("32", 32):
        vals[idx["hadamard_block"]] = hb
        assert config_form.overrides(SixBitConfig, "balanced", specs, vals) == {"hadamard_block": 32}
    cpu = config_form.restrict_choices(specs, {"backend": (("auto", "torch"), "(no CUDA GPU here)")})
    backend = next(s for s in cpu if s.name == "backend")
    assert backend.choices == ("auto", "torch") and backend.info.endswith("(no CUDA GPU here)")
    vals = config_form.preset_values(SixBitConfig, "balanced", cpu)
    vals[idx["backend"]] = "triton"
    with pytest.raises(gr.Error, match="Kernel backend must be one of 'auto', 'torch'; got 'triton'"):
        config_form.overrides(SixBitConfig, "balanced", cpu, vals)


def test_stop_text_says_exactly_what_was_kept():
    from ui.handlers import stopped_text

    assert stopped_text("baseline", 3, 20, False) == ("Stopped at step 3/20 of the baseline run. Nothing was kept: "
                                                       "no video, no cached baseline.")
    kept = stopped_text("sixbit", 5, 20, True)
    assert kept.startswith("Stopped at step 5/20 of the 6Bit run. Kept: the baseline video") and "ETA" not in kept


# ------------------------------------------------------------------------------------------ state
def _result(path=None):
    return RunResult(frames=np.zeros((1, 2, 2, 3), np.uint8), time_s=1.0, step_time_s=None, peak_mem_bytes=None,
                     act_bits=16.0, video_path=path)


def test_baseline_cache_lru_and_eviction_deletes_file(tmp_path):
    cache = BaselineCache(max_entries=2)
    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.mp4"
        p.write_bytes(b"x")
        paths.append(p)
        cache.put(("k", i), _result(str(p)))
        if i == 1:
            assert cache.get(("k", 0)) is not None  # touch 0: 1 becomes the oldest
    assert len(cache) == 2 and cache.get(("k", 1)) is None and not paths[1].exists()
    assert paths[0].exists() and paths[2].exists()
    assert cache.paths() == {str(paths[0]), str(paths[2])}


def test_baseline_key_ignores_nothing_that_changes_pixels():
    p = dict(prompt="a", negative_prompt="", seed=1, steps=2, frames=5, width=32, height=32, guidance=5.0)
    keys = {baseline_key("m", p)} | {baseline_key("m", {**p, k: v}) for k, v in
                                     dict(prompt="b", negative_prompt="c", seed=2, steps=3, frames=9, width=64,
                                          height=64, guidance=6.0).items()}
    assert len(keys) == 9 and baseline_key("m2", p) not in keys


def test_job_registry():
    reg = JobRegistry()
    assert not reg.stop("s")
    ev = reg.start("s")
    assert reg.get("s") is ev and reg.running() == 1
    assert reg.stop("s") and ev.is_set()
    reg.finish("s", ev)
    assert reg.running() == 0 and reg.get("s") is None


def test_file_store_prunes_old_files_but_keeps_cached(tmp_path):
    store = FileStore(tmp_path / "files", max_age_s=10)
    old, keep, new = (store.new_path(n, ".mp4") for n in ("old", "keep", "new/../../x"))
    assert new.parent == store.root  # a stem can never escape the folder
    for p in (old, keep, new):
        p.write_bytes(b"x")
    past = time.time() - 100
    os.utime(old, (past, past))
    os.utime(keep, (past, past))
    assert store.prune(keep={str(keep)}) == 1
    assert not old.exists() and keep.exists() and new.exists()
    store.cleanup()
    assert not store.root.exists()


# ------------------------------------------------------------------------------------ status / ETA
def test_progress_eta_and_text():
    prog = Progress(steps=4, need_baseline=True)
    assert prog.eta() is None and prog.fraction() == 0
    prog.start("baseline")
    prog.phase_start -= 2.0  # pretend 2 s passed for 2 steps
    prog.step("baseline", 2)
    assert prog.rate["baseline"] == pytest.approx(1.0, rel=0.05)
    assert prog.eta() == pytest.approx(6.0, rel=0.05)  # 2 + 4 steps left at 1 s/step
    assert prog.fraction() == pytest.approx(2 / 8)
    assert "Baseline · step 2/4" in prog.text(False) and "ETA 6 s" in prog.text(False)


def test_status_html_escapes_and_clamps():
    h = status_html("running", "<b>x</b>", 1.7)
    assert "&lt;b&gt;" in h and 'aria-valuenow="100"' in h


def test_out_fills_unnamed_outputs_with_skip():
    t = DemoController.out(status="s")
    assert t[0] == "s" and all(isinstance(x, dict) and x.get("__type__") == "update" for x in t[1:])
    with pytest.raises(KeyError):
        DemoController.out(nope=1)


def test_precision_figure_has_an_attention_row_per_block_after_its_linears():
    names = [f"transformer_blocks.{b}.{ln}" for b in range(2) for ln in ("attn1.to_q", "ff.net.2")]
    steps = [{"routes": ["nvfp4", "int8", "skipped", "skipped"], "pred_err": [0.1, 0.2, None, None],
              "attention": [{"route": "fp8", "pred_err": 0.03}, {"route": "skipped", "pred_err": None}]},
             {"routes": ["fp16", "fp16", "int8", "int8"], "pred_err": [None] * 4,
              "attention": [{"route": "bf16", "pred_err": None}, {"route": "bf16", "pred_err": 0.2}]}]
    trace = {"linears": names, "blocks": ["transformer_blocks.0", "transformer_blocks.1"], "steps": steps}
    fig = figures.precision_figure(trace, total_steps=3)
    hm = fig.data[0]
    code = {r: i for i, r in enumerate(figures.ROUTES + figures.ATTENTION_ROUTES)}
    assert len(hm.z) == 6  # 2 linears + 1 attention row per block
    assert [row[0] for row in hm.z] == [code["nvfp4"], code["int8"], code["attn_fp8"], code["skipped"],
                                        code["skipped"], code["skipped"]]
    assert [row[1] for row in hm.z][2] == code["attn_bf16"] and hm.z[5][1] == code["attn_bf16"]
    assert "transformer_blocks.0 · attention" in hm.customdata[2][0][0] and hm.customdata[2][0][1] == "0.0300"
    assert list(fig.layout.yaxis.ticktext) == ["block 0", "block 1"]
    # one white separator between the blocks, above block 1's first row (index 3 → y = 2.5)
    assert [(sh.type, sh.y0, sh.y1, sh.xref) for sh in fig.layout.shapes] == [("line", 2.5, 2.5, "paper")]
    legend = [t.name for t in fig.data[1:]]
    assert any(n.startswith("attention 8-bit (FP8) · 1") for n in legend)
    # a trace without attention routes (older traces): no attention rows
    old = figures.precision_figure({**trace, "steps": [{k: v for k, v in st.items() if k != "attention"}
                                                        for st in steps]}, total_steps=3)
    assert len(old.data[0].z) == 4
