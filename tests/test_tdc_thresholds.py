"""Step-mode TDC's threshold rules: the step-count scaling, the calibrated per-step profile, reuse="auto"."""

from __future__ import annotations

import pytest
import torch

import sixbit
from sixbit import Policy, SixBitConfig, tdc
from sixbit.calibrate import main
from sixbit.policy import PolicyError, ProbeProfile
from sixbit.tdc_calibrate import probe_profile
from sixbit.testing import (
    COGVIDEOX_CALL,
    generate,
    save_and_reload,
    tiny_cogvideox_pipeline,
    tiny_wan_pipeline,
)

pytestmark = pytest.mark.usefixtures("one_thread")

STEP = dict(tdc_mode="step", tdc_first=1, tdc_last=0, tdc_threshold_rule="fixed", tdc_reuse="last")


def _cfg(**kw) -> SixBitConfig:
    return SixBitConfig.preset("tdc_only", **{**STEP, **kw})
PROFILE = ProbeProfile(steps=3, probe_drift=[0.4, 0.1], rest_drift=[0.2, 0.2], n=2)  # rest/probe 0.5, 2


def _decisions(d):
    return [[b["tdc"] for b in s["blocks"]] for s in d["steps"]]


def _drifts(pipe, steps, **cfg):
    """The probe's one-step drifts of a full-compute run (threshold 0: no step skips, the reference moves)."""
    h = sixbit.apply(pipe, _cfg(tdc_probe_threshold=0.0, **cfg))
    generate(pipe, num_inference_steps=steps)
    d = h.trace.to_dict()
    h.remove()
    return [s["blocks"][0]["delta_sim"] for s in d["steps"][1:]]


def test_probe_threshold_rules_and_auto_reuse():
    c = _cfg(tdc_probe_threshold=0.2, tdc_forecast_threshold=0.05)
    assert tdc.probe_threshold(5, 50, c.replace(tdc_threshold_rule="fixed")) == 0.2
    assert tdc.probe_threshold(5, 50, c.replace(tdc_threshold_rule="steps")) == pytest.approx(0.08)
    assert tdc.probe_threshold(5, None, c.replace(tdc_threshold_rule="steps")) == 0.2  # unknown N: as given
    assert tdc.probe_threshold(5, 40, c.replace(tdc_threshold_rule="steps", tdc_threshold_steps=10)) == pytest.approx(0.05)
    prof = c.replace(tdc_threshold_rule="profile")
    assert tdc.probe_threshold(1, 3, prof, PROFILE) == pytest.approx(0.2 * 20 / 3 / 0.25)  # weight 0.5 / median 2
    assert tdc.probe_threshold(1, 3, prof, None) == tdc.probe_threshold(1, 3, c.replace(tdc_threshold_rule="steps"))
    auto = c.replace(tdc_reuse="auto", tdc_threshold_rule="steps", tdc_forecast_steps=40, tdc_probe_reference="forecast")
    assert [tdc.resolve_reuse(auto, n) for n in (20, 39, 40, 50, None)] == ["magnitude", "magnitude", "quadratic",
                                                                              "quadratic", "last"]
    assert tdc.probe_threshold(3, 50, auto) == pytest.approx(0.05 * 20 / 50)  # forecasting: its own threshold
    # the magnitude forecast below tdc_forecast_steps keeps the plain threshold, even compared with its forecast
    assert tdc.probe_threshold(3, 20, auto) == pytest.approx(0.2)
    assert tdc.resolve_reuse(auto.replace(tdc_mode="block"), 50) == "last"
    # the probe compared with its last delta: the plain threshold, forecast or not
    assert tdc.probe_threshold(3, 50, auto.replace(tdc_probe_reference="last")) == pytest.approx(0.2 * 20 / 50)
    assert tdc.resolve_reuse(c.replace(tdc_reuse="linear"), 5) == "linear"
    for field, bad in (("tdc_threshold_rule", "per_step"), ("tdc_threshold_steps", 0), ("tdc_forecast_steps", 0),
                       ("tdc_forecast_threshold", -0.1), ("tdc_reuse", "taylor")):
        with pytest.raises(sixbit.config.ConfigError, match=field):
            c.replace(**{field: bad})


def test_profile_weight_interpolates_in_normalised_time_and_round_trips():
    assert PROFILE.weight(1, 3) == pytest.approx(0.25) and PROFILE.weight(2, 3) == pytest.approx(1.0)
    assert PROFILE.weight(0, 3) == pytest.approx(0.25)  # clamped before the first drift
    # 5 steps: step 2 sits at u = 0.5, i.e. at calibration step 1 of 2 … halfway between steps 1 and 2 → 1.25/2
    assert PROFILE.weight(3, 5) == pytest.approx((0.5 + 0.5 * (2 - 0.5)) / 2)
    assert ProbeProfile.from_dict(PROFILE.to_dict()) == PROFILE
    for bad, msg in (({"steps": 3, "probe_drift": [0.1], "rest_drift": [0.1, 0.2]}, "tdc.probe_drift"),
                     ({"steps": 3, "probe_drift": [0.1, -1.0], "rest_drift": [0.1, 0.2]}, "tdc.probe_drift"),
                     ({"steps": 1, "probe_drift": [], "rest_drift": []}, "tdc.steps"),
                     ({"steps": 3, "probe_drift": [0.1, 0.2], "rest_drift": [0.1, "x"]}, r"tdc.rest_drift\[1\]")):
        with pytest.raises(PolicyError, match=msg):
            ProbeProfile.from_dict(bad)


def test_steps_rule_equals_the_fixed_rule_at_the_scaled_threshold():
    pipe = tiny_cogvideox_pipeline(seed=0)
    x = sorted(_drifts(pipe, 8))[3]  # a threshold that lets some steps skip
    fixed = sixbit.apply(pipe, _cfg(tdc_probe_threshold=x))
    want = generate(pipe, num_inference_steps=8)
    dw = fixed.trace.to_dict()
    fixed.remove()
    assert 0 < dw["summary"]["skip_fraction"] < 1 and dw["config"]["tdc_threshold_resolved"].startswith("fixed")
    steps = sixbit.apply(pipe, _cfg(tdc_threshold_rule="steps", tdc_probe_threshold=x * 8 / 20))
    assert torch.equal(generate(pipe, num_inference_steps=8), want)
    d = steps.trace.to_dict()
    assert _decisions(d) == _decisions(dw)
    assert d["config"]["tdc_threshold_rule"] == "steps" and d["config"]["tdc_threshold_resolved"] == "steps: threshold × 20/N"
    assert all(s["blocks"][0]["threshold"] == pytest.approx(x) for s in d["steps"])


@pytest.mark.parametrize("pipeline,branches", [(tiny_cogvideox_pipeline, 1), (tiny_wan_pipeline, 2)])
def test_auto_reuse_forecasts_on_dense_schedules_only(pipeline, branches):
    """CFG batched (CogVideoX) and separate (Wan): "auto" is "quadratic" from tdc_forecast_steps steps on — with
    the forecast threshold when the probe is compared with its forecast, with the probe threshold when it is
    compared with its last delta (the default) — and "magnitude" with the probe threshold below (compared with
    its last delta or with its forecast alike): the same runs as those set explicitly."""
    n = 6
    for forecast_steps, reuse, knob, ref in ((n, "quadratic", "tdc_forecast_threshold", "forecast"),
                                             (n, "quadratic", "tdc_probe_threshold", "last"),
                                             (n + 1, "magnitude", "tdc_probe_threshold", "last"),
                                             (n + 1, "magnitude", "tdc_probe_threshold", "forecast")):
        pipe = pipeline(seed=1)
        x = sorted(_drifts(pipe, n, tdc_reuse=reuse, tdc_probe_reference=ref))[2]
        explicit = sixbit.apply(pipe, _cfg(tdc_reuse=reuse, tdc_probe_threshold=x, tdc_probe_reference=ref))
        want = generate(pipe, num_inference_steps=n)
        dw = explicit.trace.to_dict()
        explicit.remove()
        cfg = _cfg(tdc_reuse="auto", tdc_threshold_rule="steps", tdc_forecast_steps=forecast_steps,
                   tdc_probe_threshold=1e9, tdc_forecast_threshold=1e9, tdc_probe_reference=ref)
        auto = sixbit.apply(pipe, cfg.replace(**{knob: x * n / 20}))
        assert torch.equal(generate(pipe, num_inference_steps=n), want)
        d = auto.trace.to_dict()
        assert _decisions(d) == _decisions(dw) and d["summary"]["skip_fraction"] > 0
        assert any(b == "forecast" for s in _decisions(d) for b in s)
        if branches == 2:
            assert [s["other_branches"]["uncond"]["blocks"][0]["tdc"] for s in d["steps"]] == \
                [s["other_branches"]["uncond"]["blocks"][0]["tdc"] for s in dw["steps"]]
        auto.remove()


def test_profile_rule_divides_by_the_calibrated_weight_and_falls_back_without_a_profile():
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = _cfg(tdc_threshold_rule="profile", tdc_probe_threshold=0.3)
    h = sixbit.apply(pipe, cfg.replace(policy=None))
    generate(pipe, num_inference_steps=5)
    d = h.trace.to_dict()
    h.remove()
    assert "the policy has no TDC probe profile" in d["config"]["tdc_threshold_resolved"]
    assert all(s["blocks"][0]["threshold"] == pytest.approx(0.3 * 20 / 5) for s in d["steps"])
    policy = Policy(linears={"x": sixbit.policy.LinearFit(1.0, 0.0)}, tau=0.1, probe_profile=PROFILE)
    h = sixbit.apply(pipe, cfg, policy=policy)
    generate(pipe, num_inference_steps=5)
    d = h.trace.to_dict()
    assert d["config"]["tdc_threshold_resolved"].startswith("profile:")
    for t, s in enumerate(d["steps"]):
        assert s["blocks"][0]["threshold"] == pytest.approx(0.3 * 20 / 5 / PROFILE.weight(t, 5))


def test_probe_profile_is_the_full_compute_drift_and_the_cli_writes_it(tmp_path, capsys):
    call = {k: COGVIDEOX_CALL[k] for k in ("height", "width", "num_frames", "max_sequence_length")}
    pipe = tiny_cogvideox_pipeline(seed=0)
    p = probe_profile(pipe, ["red circle", "blue square"], steps=5, call={"output_type": "latent", **call})
    assert p.steps == 5 and p.n == 2 and len(p.probe_drift) == len(p.rest_drift) == 4
    assert all(x > 0 for x in p.probe_drift + p.rest_drift)
    # the probe's drift is what step mode reads on a run that computes every step (same prompt and seed)
    h = sixbit.apply(pipe, _cfg(tdc_probe_threshold=0.0))
    pipe("red circle", negative_prompt="", num_inference_steps=5, generator=torch.Generator().manual_seed(0),
         output_type="latent", **call)
    one = [s["blocks"][0]["delta_sim"] for s in h.trace.to_dict()["steps"][1:]]
    h.remove()
    p1 = probe_profile(pipe, ["red circle"], steps=5, call={"output_type": "latent", **call})
    assert p1.probe_drift == pytest.approx(one, rel=1e-5)
    # the CLI: a full calibration writes the profile; --tdc-only rewrites only it in an existing policy
    folder = tmp_path / "tiny"
    save_and_reload(tiny_cogvideox_pipeline(seed=0, num_layers=2), folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("red circle\n")
    out = tmp_path / "policy.json"
    args = ["--model", str(folder), "--prompts", str(prompts), "--out", str(out), "--frames", "9", "--height", "32",
            "--width", "32", "--device", "cpu"]
    assert main([*args, "--steps", "3"]) == 0
    full = Policy.load(out)
    assert full.probe_profile is not None and full.probe_profile.steps == 3
    assert "## TDC probe profile" in out.with_suffix(".md").read_text()
    assert main([*args, "--steps", "4", "--tdc-only"]) == 0
    only = Policy.load(out)
    assert only.probe_profile.steps == 4 and only.linears == full.linears and only.tau == full.tau
    assert "--tdc-only" in only.meta["tdc_command"] and "wrote the TDC probe profile" in capsys.readouterr().out
    md = out.with_suffix(".md").read_text()
    assert md.count("## TDC probe profile") == 1 and "R² pooled" in md
    # an old policy file (no "tdc") still loads, with no profile
    d = only.to_dict()
    del d["tdc"]
    assert Policy.from_dict(d).probe_profile is None and "no TDC probe profile" in Policy.from_dict(d).describe()


@pytest.mark.parametrize("fields", [dict(tdc_reuse="auto", tdc_forecast_steps=1, tdc_threshold_rule="steps"),
                                    dict(tdc_reuse="last", tdc_threshold_rule="profile")])
def test_the_rules_add_no_statistics_read(fields):
    """The per-step threshold is host arithmetic: no statistics read added — per step the probe's read (its
    drift decides now) and one transfer of the other computed blocks' deferred statistics (2 or 4 sums each)."""
    pipe = tiny_cogvideox_pipeline(seed=0)
    h = sixbit.apply(pipe, _cfg(tdc_probe_threshold=1e9, tdc_forecast_threshold=1e9, **fields),
                     policy=Policy(linears={"x": sixbit.policy.LinearFit(1, 0)}, tau=0.1, probe_profile=PROFILE))
    reads = []
    h.reduce_stats = lambda t: reads.append(t.numel()) or t
    generate(pipe, num_inference_steps=5)
    d = h.trace.to_dict()
    computed = sum(b["computed"] for s in d["steps"] for b in s["blocks"])
    assert d["summary"]["skip_fraction"] > 0 and len(reads) <= 2 * len(d["steps"])
    assert 2 * computed <= sum(reads) <= 4 * computed


def test_the_default_follows_the_step_count():
    """Defaults: the probe threshold 0.2 at 20 steps, scaled by 20/N; below 40 steps the last delta with its size
    extrapolated, from 40 steps the second-order forecast, the probe compared with its last delta at the same
    0.2·20/N (aggressive 0.3·20/N)."""
    c = SixBitConfig()
    assert (c.tdc_threshold_rule, c.tdc_reuse, c.tdc_threshold_steps, c.tdc_forecast_steps) == ("steps", "auto", 20, 40)
    assert tdc.probe_threshold(5, 20, c) == pytest.approx(0.2) and tdc.resolve_reuse(c, 20) == "magnitude"
    assert tdc.probe_threshold(5, 30, c) == pytest.approx(0.2 * 20 / 30) and tdc.resolve_reuse(c, 30) == "magnitude"
    assert tdc.resolve_reuse(c, None) == "last"  # an unknown step count: plain reuse
    assert tdc.probe_threshold(5, 50, c) == pytest.approx(0.08) and tdc.resolve_reuse(c, 50) == "quadratic"
    assert c.tdc_probe_reference == "last"
    agg = SixBitConfig.preset("aggressive")
    assert tdc.probe_threshold(5, 20, agg) == pytest.approx(0.3) and tdc.probe_threshold(5, 50, agg) == pytest.approx(0.12)
    # attention scope: the first order at 0.05 from 40 steps (the second order lost there, docs/TDC.md §11)
    for name in ("tdc_attn", "full_attn"):
        att = SixBitConfig.preset(name)
        assert tdc.resolve_reuse(att, 50) == "linear" and tdc.probe_threshold(5, 50, att) == pytest.approx(0.02)
        assert tdc.resolve_reuse(att, 20) == "last"
    assert tdc.resolve_reuse(c.replace(tdc_scope="attention"), 50) == "linear"
    for name in ("tdc_paper", "full_paper"):  # the paper's rule: block mode, plain reuse
        assert tdc.resolve_reuse(SixBitConfig.preset(name), 50) == "last"
        assert tdc.resolve_reuse(SixBitConfig.preset(name), 20) == "last"
