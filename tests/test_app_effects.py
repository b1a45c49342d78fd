"""The app states the chosen preset's expected effect on this device before a run, the measured one after,
and why a slower 6Bit run was slower (sixbit-mini on the CPU, the real engine; other device classes through
the text functions)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import app
from sixbit import costs
from sixbit.config import SixBitConfig
from ui import config_form, effects
from ui.handlers import OUTPUTS

pytestmark = pytest.mark.usefixtures("one_thread")
IDX = {n: i for i, n in enumerate(OUTPUTS)}
TWO_B = costs.TransformerShape(30, 1920, 7680)


@pytest.fixture(scope="module")
def served():
    demo, controller = app.create_app(allow_hub=False, queue_size=4)
    yield demo, controller
    controller.files.cleanup()


def test_the_page_states_the_expected_effect_before_and_the_measured_one_after(served):
    demo, ctrl = served
    page = demo.sixbit_components["expected"].value
    assert "Expected on this CPU" in page and "simulated" in page and "`app_cpu.json`" in page
    assert "no weight-memory saving on the CPU" in page
    assert "Aggressive" in ctrl.expected_markdown("aggressive")
    assert ctrl.expected_markdown("off").endswith("1×.")
    adv = config_form.preset_values(ctrl.config_cls, "balanced", ctrl.specs)
    prompt = app.example_prompts(ctrl.default_model)[0]
    updates = list(ctrl.generate(SimpleNamespace(session_hash="fx"), "", prompt, "", 3, 3, 9, "32x32", 5.0,
                                 "balanced", "balanced", *adv))
    first = updates[0][IDX["path_info"]]
    assert first.startswith("**Before the run**") and "Expected on this CPU" in first
    done = [u for u in updates if isinstance(u[IDX["metrics"]], list)][-1]
    rows = {r[0]: r[1:] for r in done[IDX["metrics"]]}
    est = rows["expected per-step speed-up for this run's routes and skips (sixbit/costs.py)"][1]
    measured = rows["measured per-step speed-up"][1]
    assert est.endswith("×") and float(est[:-1]) > 0 and measured.endswith("×")
    assert any(k.startswith("transformer weights resident") for k in rows)
    path = done[IDX["path_info"]]
    assert "**Expected before the run:**" in path
    if float(measured[:-1]) < 1:  # a slower 6Bit run always comes with its reasons
        assert "Why 6Bit was slower here" in path and "simulated" in path


def test_hopper_text_says_memory_and_offers_the_speed_alternative_with_numbers():
    """The paper's routes optimise memory on Hopper (and the text names the speed alternatives); the default routes
    ("auto") and ``fast`` say every quantized layer runs on the int8 tensor cores, and from which weights."""
    paper = SixBitConfig.preset("balanced", int8_route="int8", nvfp4_route="nvfp4")
    text = effects.expected_markdown(paper, "sm_90", TWO_B, "Balanced")
    assert "Hopper (sm_90)" in text and "2.29× smaller" in text
    assert "optimises **memory (4-bit weights)**" in text and "INT8 route = auto" in text
    default = effects.expected_markdown(SixBitConfig.preset("balanced"), "sm_90", TWO_B)
    assert "every quantized layer" in default and "4-bit weight, re-quantized" in default
    assert "2.29× smaller" in default and "optimises **memory" not in default
    fast = effects.expected_markdown(SixBitConfig.preset("fast"), "sm_90", TWO_B)
    assert "every quantized layer" in fast and "INT8 weight copy" in fast and "1.21× smaller" in fast
    # traceable: tests/test_costs_effect.py
    assert "1.18×–1.23× with every block computed" in text and "2.24×–2.33× if TDC skips 50%" in text
    assert "1.34× with every block computed" in default and "2.52× if TDC skips 50%" in default
    static = effects.expected_markdown(SixBitConfig.preset("balanced", quant="w8a8"), "sm_90", TWO_B)
    assert "1.34× with every block computed" in static and "1.64× smaller" in static
    assert "skipped blocks and the 8-bit attention" in text
    assert f"(sixbit/costs.py; {costs.UNIT_COSTS['sm_90'].fit})." in text  # the model's measured error, stated
    ampere = effects.expected_markdown(paper, "sm_80-89", TWO_B)
    assert "8-bit attention on capability 8.9" in ampere


@pytest.mark.parametrize("cls", ["sm_120", "sm_80-89"])
def test_unmeasured_devices_say_not_measured_and_show_no_speed(cls):
    text = effects.expected_markdown(SixBitConfig.preset("balanced"), cls, TWO_B)
    assert "**not measured** on this device class" in text and "with every block computed" not in text
    row = effects.measured_rows(cls, SixBitConfig.preset("balanced"), {"route_counts": {"nvfp4": 5}}, 0.8)
    assert row[0][2] == "not measured on this device class" and row[1][2] == "0.80×"
    if cls == "sm_120":
        assert "no FP4 tensor cores" not in text  # Blackwell has them (unverified path)


def test_a_slower_run_on_random_weights_names_its_reasons():
    summary = {"skip_fraction": 0.0, "route_counts": {"nvfp4": 95, "int8": 5, "fp16": 0, "skipped": 0}}
    why = effects.slower_reasons("sm_90", summary, "hopper-triton", 3.2)
    assert any("nothing was skipped" in w for w in why)
    assert any("95% of computed linear calls ran NVFP4" in w for w in why)
    assert any("3.2 s" in w for w in why)
    assert any("self-check" in w for w in effects.slower_reasons(
        "sm_90", summary, "hopper-triton; self-check fallback: nvfp4/small → torch", None))


def test_a_model_without_a_shipped_policy_gets_a_run_record():
    """The app records every 6Bit run's policy; a model with no calibrated policy (a random-weight folder, a
    Hub model) runs DMPQ uncalibrated, and its record must not fail (it did: ``Policy.to_dict`` refuses)."""
    from sixbit.policy import Policy
    from sixbit.trace import policy_fingerprint

    a, b = policy_fingerprint(Policy.uncalibrated(0.5)), policy_fingerprint(Policy.uncalibrated(0.4))
    assert a["calibrated"] is False and len(a["sha256"]) == 64 and a["sha256"] != b["sha256"]


def test_the_device_class_on_zerogpu_comes_from_its_gpus_name(monkeypatch):
    """On ZeroGPU the GPU is not visible outside the GPU function: the class is read from the GPU's name."""
    monkeypatch.setattr(app, "spaces", SimpleNamespace(GPU=lambda **kw: (lambda fn: fn)))
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")
    monkeypatch.delenv("SIXBIT_GPU_NAME", raising=False)
    assert app.hardware_class("cuda") == "sm_120"
    assert app.hardware_class("cpu") == "cpu"
    text = effects.expected_markdown(SixBitConfig.preset("balanced"), "sm_120", TWO_B, "Balanced")
    assert "Blackwell (sm_120)" in text and "not measured" in text


@pytest.mark.parametrize("steps", [None, (0.5, 0.6)])
def test_a_slower_6bit_run_is_never_shown_without_reasons(served, steps):
    """With per-step times the check is per step; a one-step run (no step times) falls back to wall time."""
    import numpy as np

    from ui.state import RunResult

    _, ctrl = served
    info = ctrl.model_info(ctrl.default_model)
    frames = np.zeros((1, 8, 8, 3), np.uint8)
    trace = {"compute_path": "cpu-reference", "summary": {"skip_fraction": 0.0, "route_counts": {"nvfp4": 4}}}
    b, s = steps or (None, None)
    base = RunResult(frames, time_s=1.0, step_time_s=b, peak_mem_bytes=None, act_bits=32.0)
    six = RunResult(frames, time_s=1.3, step_time_s=s, peak_mem_bytes=None, act_bits=5.0, trace=trace)
    text = ctrl.path_markdown(info, six, base)
    assert "Why 6Bit was slower here" in text and "nothing was skipped" in text
    assert ("per step" if steps else "wall time") in text
