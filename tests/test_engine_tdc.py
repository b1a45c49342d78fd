"""Temporal Delta Cache, Purified Delta Refresh and skip schedules on a tiny random CogVideoX pipeline."""

from __future__ import annotations

import math

import pytest
import torch

import sixbit
from sixbit import SixBitConfig, SkipSchedule, tdc
from sixbit import pdr as pdr_rule
from sixbit.testing import generate, tiny_cogvideox_pipeline, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

FORCE = dict(tdc_mode="block", tdc_threshold=math.inf, tdc_budget=math.inf, tdc_first=0, tdc_last=0)


def _capture(block):
    """Record (inputs, outputs) of every call of a block (torch hooks run around the diffusers hook)."""
    calls = []

    def pre(mod, args, kwargs):
        calls.append({"in": (kwargs["hidden_states"].clone(), kwargs["encoder_hidden_states"].clone())})

    def post(mod, args, kwargs, out):
        calls[-1]["out"] = (out[0].clone(), out[1].clone())

    block.register_forward_pre_hook(pre, with_kwargs=True)
    block.register_forward_hook(post, with_kwargs=True)
    return calls


def test_forced_skip_returns_input_plus_cached_delta_exactly():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **FORCE))
    calls = _capture(pipe.transformer.transformer_blocks[1])
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    pattern = [s["blocks"][1]["skipped"] for s in d["steps"]]
    # steps 0 and 1 compute (two deltas are needed for a similarity), then every step skips
    assert pattern == [False, False, True, True, True]
    delta = [o - i for o, i in zip(calls[1]["out"], calls[1]["in"])]  # Δ of the last computed step
    for c in calls[2:]:
        for s in range(2):  # both token streams
            assert torch.equal(c["out"][s], c["in"][s] + delta[s])
    # the skip error accumulates by the change rate measured at the last refresh
    rate = d["steps"][1]["blocks"][1]["delta_sim"]
    assert rate > 0
    assert [s["blocks"][1]["acc_err"] for s in d["steps"][2:]] == pytest.approx([rate, 2 * rate, 3 * rate])
    assert all(s["routes"][6:12] == ["skipped"] * 6 for s in d["steps"][2:])


def test_accumulated_error_budget_forces_a_refresh():
    pipe = tiny_cogvideox_pipeline(seed=0)
    budget = 0.8
    cfg = SixBitConfig.preset("tdc_only", tdc_mode="block", tdc_threshold=math.inf, tdc_budget=budget, tdc_first=0, tdc_last=0)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=12)
    d = handle.trace.to_dict()
    refreshes = 0
    for b in range(3):
        prev = None
        for s in d["steps"]:
            blk = s["blocks"][b]
            if prev is not None and prev["delta_sim"] is not None:
                rate, acc = prev["delta_sim"], prev["acc_err"]
                assert blk["skipped"] == (acc + rate <= budget), (b, s["step"])
                if blk["computed"] and prev["skipped"]:
                    refreshes += 1  # computed because the budget would have been exceeded
                    assert acc + rate > budget and blk["acc_err"] == 0.0
            if blk["skipped"]:
                assert blk["acc_err"] <= budget
            prev = blk
    assert refreshes >= 3
    assert 0.2 < d["summary"]["skip_fraction"] < 0.9


def test_first_and_last_steps_never_skip_and_threshold_blocks_skipping():
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("tdc_only", tdc_mode="block", tdc_threshold=math.inf, tdc_budget=math.inf, tdc_first=3, tdc_last=2)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=8)
    steps = handle.trace.to_dict()["steps"]
    skipped = [any(b["skipped"] for b in s["blocks"]) for s in steps]
    assert skipped == [False, False, False, True, True, True, False, False]
    handle.remove()
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_mode="block", tdc_threshold=1e-6, tdc_budget=math.inf))
    generate(pipe, num_inference_steps=8)
    assert handle.trace.to_dict()["summary"]["skip_fraction"] == 0.0


def test_pdr_fires_on_injected_outliers_not_on_clean_input():
    # the tiny model is 32 wide: no element can exceed sqrt(32) = 5.7 token RMS, so k_σ = 4 here
    cfg = SixBitConfig.preset("full", policy=None, warmup_steps=0, pdr_rho=1e-3, pdr_k_sigma=4.0,
                              **{**FORCE, "tdc_threshold": 0.0})
    # clean: the random model's block inputs have no 4σ outliers
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe)
    d = handle.trace.to_dict()
    checked = [b for s in d["steps"][1:-1] for b in s["blocks"]]
    # the last step's delta is never reused, so PDR does not check it
    assert all(b["outlier_ratio"] is None for b in d["steps"][-1]["blocks"])
    assert all(b["outlier_ratio"] is not None and b["outlier_ratio"] < 1e-3 for b in checked)
    assert d["summary"]["pdr_count"] == 0

    # dirty: inject outliers into the last block's input from step 2 on
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, cfg)
    calls = {"n": 0}

    def inject(mod, args, kwargs):
        calls["n"] += 1
        if calls["n"] >= 3:
            h = kwargs["hidden_states"].clone()
            h[:, ::3, 5] = 1000.0  # one large channel in every third token
            kwargs["hidden_states"] = h
        return args, kwargs

    pipe.transformer.transformer_blocks[2].register_forward_pre_hook(inject, with_kwargs=True)
    generate(pipe)
    d = handle.trace.to_dict()
    for s in d["steps"][2:-1]:
        blk = s["blocks"][2]
        assert blk["pdr"] and blk["mode"] == "pdr" and blk["outlier_ratio"] > 1e-3
        assert s["routes"][12:18] == ["fp16"] * 6  # w4a16: full-precision activations
        assert not any(b["pdr"] for b in s["blocks"][:2])
    assert d["summary"]["pdr_count"] == len(d["steps"]) - 3


def test_first_computed_step_after_a_skip_uses_int8():
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("dmpq_tdc", policy=None, warmup_steps=0, tau=1.0, tdc_mode="block", tdc_threshold=math.inf, tdc_budget=0.8,
                              tdc_first=0, tdc_last=0)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=10)
    d = handle.trace.to_dict()
    n_after = 0
    for prev, s in zip(d["steps"], d["steps"][1:]):
        for b, blk in enumerate(s["blocks"]):
            routes = s["routes"][6 * b: 6 * b + 6]
            if blk["computed"] and prev["blocks"][b]["skipped"]:
                n_after += 1
                assert blk["mode"] == "after_skip" and routes == ["int8"] * 6
            elif blk["computed"] and s["step"] >= 1:
                assert blk["mode"] == "dmpq" and routes == ["nvfp4"] * 6  # τ = 1 > every Γ
    assert n_after >= 2


def test_skip_schedule_record_and_replay_and_resample(tmp_path):
    cfg = SixBitConfig.preset("balanced", policy=None, warmup_steps=0, tdc_mode="block", tdc_threshold=math.inf, tdc_budget=0.8, tdc_first=1)
    pipe = tiny_cogvideox_pipeline(seed=0)
    h = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=8)
    sched = h.trace.skip_schedule()
    assert 0 < sched.skip_fraction < 1 and list(sched.branches) == ["cond_uncond"]
    path = sched.save(tmp_path / "schedule.json")

    # replay on a different model (other seed, other depth): the pattern is imposed, not decided
    other = tiny_cogvideox_pipeline(seed=5, num_layers=5)
    replay_cfg = SixBitConfig.preset("balanced", policy=None, warmup_steps=0, tdc_mode="block", tdc_threshold=0.0)  # TDC alone would never skip
    h2 = sixbit.apply(other, replay_cfg, schedule=path)
    calls = []
    h2.reduce_stats = lambda t: (calls.append(t.numel()), t)[1]
    generate(other, num_inference_steps=8)
    got = h2.trace.skip_schedule()
    expected = SkipSchedule.load(path).resample(5)
    assert got.branches == expected.branches and got.num_blocks == 5
    assert h2.trace.to_dict()["summary"]["schedule_overrides"] == 0
    # every decision statistic passes the reduce hook, whole: (Γ, delta change) sums of 2 or 4 per computed
    # block, deferred and sent together (at most one transfer per call beside PDR's reads, which decide now)
    n_pdr = sum(b["computed"] and pdr_rule.applies(replay_cfg, s["step"], 8, not got.computed("cond_uncond", s["step"] + 1, i))
                for s in h2.trace.to_dict()["steps"] for i, b in enumerate(s["blocks"]))
    assert calls and all(n % 2 == 0 for n in calls) and len(calls) <= 8 + n_pdr
    assert expected.resample(3).branches == sched.branches  # resampling back recovers the pattern
    assert expected.resample(3).routes == sched.routes

    # the recorded DMPQ/PDR routes are replayed too: every computed cell runs the recorded letters
    rows = h2.trace.skip_schedule().routes["cond_uncond"]
    assert rows == expected.routes["cond_uncond"]
    modes = {b["mode"] for s in h2.trace.to_dict()["steps"] for b in s["blocks"]}
    assert modes <= {"replay", "skip"} and "replay" in modes
    assert set("".join(c for row in rows for c in row)) >= {"i", "n"}  # both routes occur

    # dense(): every block computed, every cell replaying recorded routes (the step profile's mode)
    h2.remove()
    h3 = sixbit.apply(other, replay_cfg, schedule=expected.dense())
    generate(other, num_inference_steps=8)
    d3 = h3.trace.to_dict()
    assert d3["summary"]["skip_fraction"] == 0
    assert {b["mode"] for s in d3["steps"] for b in s["blocks"]} == {"replay"}
    h3.remove()


def test_skip_schedule_routes_resample_validate_and_load_version_1():
    sched = SkipSchedule(2, 2, {"c": [[True, False], [True, True]]}, routes={"c": [["nif", ""], ["nn", "i"]]})
    d = sched.to_dict()
    assert d["version"] == 2 and SkipSchedule.from_dict(d).routes == sched.routes
    assert sched.block_routes("c", 0, 0, 3) == ["nvfp4", "int8", "fp16"]
    assert sched.block_routes("c", 0, 0, 5) == ["nvfp4", "nvfp4", "int8", "fp16", "fp16"]  # by relative position
    assert sched.block_routes("c", 0, 1, 3) is None and sched.block_routes("c", 9, 0, 3) is None
    assert sched.block_routes("other", 1, 1, 2) == ["int8", "int8"]  # unknown branch: the first one
    fr = sched.route_fractions
    assert fr == {"nvfp4": 3 / 6, "int8": 2 / 6, "fp16": 1 / 6}
    v1 = {k: v for k, v in d.items() if k not in ("routes", "route_fractions")} | {"version": 1}
    old = SkipSchedule.from_dict(v1)
    assert old.routes is None and old.block_routes("c", 0, 0, 3) is None and old.to_dict()["version"] == 1
    d2 = SkipSchedule(2, 3, {"c": [[True, True], [False, False], [True, False]]},
                      routes={"c": [["nn", "ii"], ["", ""], ["ff", ""]]}).dense()
    assert d2.skip_fraction == 0 and d2.routes["c"] == [["nn", "ii"], ["nn", "ii"], ["ff", "ii"]]
    with pytest.raises(ValueError, match="routes"):
        old.dense()
    for bad in ({"c": [["nx", ""], ["n", "i"]]}, {"c": [["n", "i"], ["n", "i"]]}, {"c": [["n", ""]]},
                {"z": [["n", ""], ["n", "i"]]}):
        with pytest.raises(ValueError, match="routes"):
            SkipSchedule.from_dict(d | {"routes": bad})


def test_after_skip_route_can_use_the_last_measured_gamma():
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("dmpq_tdc", policy=None, tau=1.0, tdc_mode="block", tdc_threshold=math.inf, tdc_budget=0.8,
                              tdc_first=0, tdc_last=0, after_skip="dmpq", warmup_steps=1)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=10)
    d = handle.trace.to_dict()
    modes = {b["mode"] for s in d["steps"][1:] for b in s["blocks"]}
    assert modes == {"dmpq", "skip"}
    assert d["summary"]["route_counts"]["int8"] == 0 and d["summary"]["route_counts"]["skipped"] > 0


def test_pdr_rho_comes_from_the_config_else_the_policy_else_the_fallback(tmp_path):
    from sixbit.policy import LinearFit, Policy

    names = [f"transformer_blocks.{b}.{n}" for b in range(3)
             for n in ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.0.proj", "ff.net.2")]

    def policy(rho, k_sigma=4.0):
        return Policy(linears={n: LinearFit(1.0, 0.0) for n in names}, tau=0.5, target_bits=None,
                      pdr_rho=rho, pdr_k_sigma=None if rho is None else k_sigma, pdr_quantile=0.95, pdr_n=10)

    base = dict(pdr_k_sigma=4.0, **{**FORCE, "tdc_threshold": 0.0})

    def run(pol, **kw):
        pipe = tiny_cogvideox_pipeline(seed=0)
        calls = {"n": 0}

        def inject(mod, args, kwargs):  # outliers in the last block's input from step 2 on (PDR fires there)
            calls["n"] += 1
            if calls["n"] >= 3:
                h = kwargs["hidden_states"].clone()
                h[:, ::3, 5] = 1000.0
                kwargs["hidden_states"] = h
            return args, kwargs

        pipe.transformer.transformer_blocks[2].register_forward_pre_hook(inject, with_kwargs=True)
        handle = sixbit.apply(pipe, SixBitConfig.preset("full", **base, **kw), policy=pol)
        generate(pipe)
        d = handle.trace.to_dict()
        handle.remove()
        return d, handle.warnings

    d_pol, w = run(policy(1e-3))  # config empty: the policy's ρ
    assert (d_pol["config"]["pdr_rho_resolved"], d_pol["config"]["pdr_rho_source"]) == (1e-3, "policy") and not w
    d_cfg, _ = run(policy(0.9), pdr_rho=1e-3)  # the config's ρ wins over the policy's
    assert d_cfg["config"]["pdr_rho_source"] == "config"
    fired = [[b["pdr"] for b in s["blocks"]] for s in d_pol["steps"]]
    assert fired == [[b["pdr"] for b in s["blocks"]] for s in d_cfg["steps"]] and any(map(any, fired))
    d_hi, _ = run(policy(0.9))  # a ρ above every ratio: never fires
    assert d_hi["summary"]["pdr_count"] == 0
    # no ρ in the policy, or one measured at another k_σ: the fallback, with a warning
    for pol in (policy(None), policy(1e-3, k_sigma=8.0)):
        d, w = run(pol)
        assert (d["config"]["pdr_rho_resolved"], d["config"]["pdr_rho_source"]) == (pdr_rule.FALLBACK_RHO, "fallback")
        assert any("no PDR ρ" in x for x in w)


def test_cached_deltas_are_freed_after_the_last_step():
    pipe = tiny_cogvideox_pipeline(seed=0)
    ref_handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **FORCE))
    ref = generate(pipe)
    ref_handle.remove()
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **FORCE))
    held = []

    def watch(mod, args, output):  # after every transformer call: how many blocks hold a cached delta
        held.append(sum(st.delta is not None for h in handle.block_hooks
                        for st in h.state_manager._state_cache.values()))

    pipe.transformer.register_forward_hook(watch)
    out = generate(pipe)
    assert torch.equal(out, ref)  # freeing after the last step changes nothing
    assert held[:-1] and all(n == 3 for n in held[:-1])  # every block caches its delta during the run
    assert held[-1] == 0  # and none is kept after the last step (e.g. through the VAE decode)
    assert handle.trace.to_dict()["summary"]["skip_fraction"] > 0


# ------------------------------------------------------------------------------- the TDC variants
STEP = dict(tdc_mode="step", tdc_probe_threshold=math.inf, tdc_first=0, tdc_last=0)


def test_step_mode_probes_block_0_and_skips_the_rest_with_their_combined_residual():
    pipe = tiny_cogvideox_pipeline(seed=0)
    # plain reuse (the paper's; "auto" resolves to the magnitude forecast at 5 steps, tested on its own)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **STEP, tdc_reuse="last"))
    blocks = pipe.transformer.transformer_blocks
    calls = [_capture(b) for b in blocks]
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    assert [[b["tdc"] for b in s["blocks"]] for s in d["steps"]] == \
        [["probe_compute", "compute", "compute"]] + [["probe_skip", "reuse", "reuse"]] * 4
    assert d["config"]["tdc_mode"] == "step"
    # the probe runs at every step; blocks 1.. return in + Δ of step 0, so the step returns in₁ + Σ Δ_b
    assert len(calls[0]) == 5 and all(len(c) == 5 for c in calls)  # torch hooks see skipped calls too
    for t in range(1, 5):
        for s in range(2):
            combined = sum(calls[b][0]["out"][s] - calls[b][0]["in"][s] for b in (1, 2))
            assert torch.allclose(calls[2][t]["out"][s], calls[1][t]["in"][s] + combined, atol=1e-6)
    # the probe's statistic is its drift from the reference, which stays step 0's while the steps skip
    ref = [o - i for o, i in zip(calls[0][0]["out"], calls[0][0]["in"])]
    for t in range(1, 5):
        delta = [o - i for o, i in zip(calls[0][t]["out"], calls[0][t]["in"])]
        drift = sum((a - b).abs().sum() for a, b in zip(delta, ref)) / sum(b.abs().sum() for b in ref)
        assert d["steps"][t]["blocks"][0]["delta_sim"] == pytest.approx(float(drift), rel=1e-5)


@pytest.mark.parametrize("reference", ["forecast", "last"])
def test_the_probe_is_compared_with_its_forecast_or_its_last_delta(reference):
    """Second-order reuse, every step computed (threshold 0): the probe's statistic at step t is its drift from
    the forecast of its delta ("forecast") or from its delta at step t − 1 ("last", cache-dit's rule)."""
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("tdc_only", **{**STEP, "tdc_probe_threshold": 0.0}, tdc_reuse="quadratic",
                              tdc_probe_reference=reference)
    handle = sixbit.apply(pipe, cfg)
    calls = _capture(pipe.transformer.transformer_blocks[0])
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    deltas = [[o - i for o, i in zip(c["out"], c["in"])] for c in calls]
    for t in range(3, 5):
        if reference == "last":
            ref = deltas[t - 1]
        else:
            ref = tdc.forecast(deltas[t - 1], deltas[t - 2], t, t - 1, t - 2, deltas[t - 3], t - 3)
        drift = sum((a - b).abs().sum() for a, b in zip(deltas[t], ref)) / sum(b.abs().sum() for b in ref)
        assert d["steps"][t]["blocks"][0]["delta_sim"] == pytest.approx(float(drift), rel=1e-4)
    with pytest.raises(sixbit.config.ConfigError, match="tdc_probe_reference"):
        cfg.replace(tdc_probe_reference="next")


def test_step_mode_does_not_forecast_for_the_blocks_the_probe_decides_for(monkeypatch):
    """Step mode with second-order reuse, every step computed: only the probe's statistic is against the forecast;
    the other blocks' change rate is against their last delta (fused in the block pass), and no forecast is
    computed for them — session 21's profile: that forecast and its error cost every computed 2B step ~24 ms of
    torch passes, for a statistic only block mode decides with. Block mode still charges it. (With a delta per
    block, ``tdc_store="blocks"``; the span keeps no per-block delta: no change rate, no forecast either.)"""
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("tdc_only", **{**STEP, "tdc_probe_threshold": 0.0}, tdc_reuse="quadratic",
                              tdc_store="blocks", tdc_regate="off")
    handle = sixbit.apply(pipe, cfg)
    calls = _capture(pipe.transformer.transformer_blocks[1])
    made = []
    real = tdc.forecast
    monkeypatch.setattr(tdc, "forecast", lambda *a, **k: made.append(1) or real(*a, **k))
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    deltas = [[o - i for o, i in zip(c["out"], c["in"])] for c in calls]
    for t in range(1, 5):
        drift = sum((a - b).abs().sum() for a, b in zip(deltas[t], deltas[t - 1]))
        drift = drift / sum(b.abs().sum() for b in deltas[t - 1])
        assert d["steps"][t]["blocks"][1]["delta_sim"] == pytest.approx(float(drift), rel=1e-4)
    assert made == []  # the probe compares with its last delta (the default tdc_probe_reference), the rest too
    handle.remove()
    handle = sixbit.apply(pipe, cfg.replace(tdc_store="span"))
    generate(pipe, num_inference_steps=5)
    assert made == [] and all(s["blocks"][1]["delta_sim"] is None for s in handle.trace.to_dict()["steps"])
    handle.remove()
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_reuse="linear", tdc_mode="block",
                                                    tdc_threshold=0.0, tdc_first=0, tdc_last=0))
    generate(pipe, num_inference_steps=4)
    assert made  # block mode: the forecast error of every cached block is charged


def test_step_mode_threshold_refreshes_the_whole_step_and_moves_the_reference():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**STEP, "tdc_probe_threshold": 0.0}))
    generate(pipe, num_inference_steps=4)
    d = handle.trace.to_dict()
    assert d["summary"]["skip_fraction"] == 0.0
    assert all(s["blocks"][0]["tdc"] == "probe_compute" for s in d["steps"])


def _forced_forecast(reuse: str):
    """Block 1 computed at steps 0-2 (a forecast needs two or three deltas), then forced to skip at 3-5 with
    ``tdc_reuse=reuse``: (trace dict, block 1's captured calls)."""
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_reuse=reuse, **{**FORCE, "tdc_first": 3}))
    calls = _capture(pipe.transformer.transformer_blocks[1])
    generate(pipe, num_inference_steps=6)
    d = handle.trace.to_dict()
    assert [s["blocks"][1]["tdc"] for s in d["steps"]] == ["compute"] * 3 + ["forecast"] * 3
    return d, calls


def _delta(call) -> list[torch.Tensor]:
    """A captured block call's Δ per stream (output − input)."""
    return [o - i for o, i in zip(call["out"], call["in"])]


def test_quadratic_reuse_returns_input_plus_the_second_order_forecast():
    _, calls = _forced_forecast("quadratic")
    dd = [_delta(calls[k]) for k in range(3)]  # Δ at steps 0, 1, 2
    for t in (3, 4, 5):
        for s in range(2):
            d1, d0 = dd[2][s] - dd[1][s], dd[1][s] - dd[0][s]  # unit spacing: Newton = Δ₂ + a·D₁ + a(a+1)/2·(D₁−D₀)
            want = dd[2][s] + (t - 2) * d1 + (t - 2) * (t - 1) / 2 * (d1 - d0)
            assert torch.allclose(calls[t]["out"][s], calls[t]["in"][s] + want, atol=1e-5)
    assert not torch.allclose(calls[3]["out"][0], calls[3]["in"][0] + 2 * dd[2][0] - dd[1][0], atol=1e-5)


def test_magnitude_reuse_returns_input_plus_the_last_delta_with_its_size_extrapolated():
    d, calls = _forced_forecast("magnitude")
    d1, d0 = _delta(calls[2]), _delta(calls[1])
    for t in (3, 4, 5):
        for s in range(2):
            r = (d1[s].abs().mean() / d0[s].abs().mean()).clamp(*tdc.MAGNITUDE_CLAMP) ** (t - 2)
            assert torch.allclose(calls[t]["out"][s], calls[t]["in"][s] + r * d1[s], atol=1e-5)
            assert not torch.allclose(calls[t]["out"][s], calls[t]["in"][s] + d1[s], atol=1e-5)  # not plain reuse
    # block mode charges the error of this forecast: at step 2 the one from steps 0, 1
    dm = _delta(calls[0])
    fc = [b * (b.abs().mean() / a.abs().mean()).clamp(*tdc.MAGNITUDE_CLAMP) for a, b in zip(dm, d0)]
    err = sum((x - y).abs().sum() for x, y in zip(d1, fc)) / sum(y.abs().sum() for y in fc)
    assert d["steps"][2]["blocks"][1]["delta_sim"] == pytest.approx(float(err), rel=1e-4)


def test_linear_reuse_returns_input_plus_the_first_order_forecast():
    d, calls = _forced_forecast("linear")
    d1, d0 = _delta(calls[2]), _delta(calls[1])
    for t in (3, 4, 5):
        for s in range(2):
            assert torch.allclose(calls[t]["out"][s], calls[t]["in"][s] + d1[s] + (t - 2) * (d1[s] - d0[s]), atol=1e-6)
    # the budget is charged with the forecast's error: at step 2 the forecast from steps 0, 1 was checked
    fc = [2 * b - a for a, b in zip(_delta(calls[0]), d0)]
    err = sum((x - y).abs().sum() for x, y in zip(d1, fc)) / sum(y.abs().sum() for y in fc)
    assert d["steps"][2]["blocks"][1]["delta_sim"] == pytest.approx(float(err), rel=1e-5)


@pytest.mark.parametrize("mode,reuse,extra", [("block", "linear", {}), ("step", "last", {}), ("step", "linear", {}),
                                              ("step", "last", {"tdc_tail": 1, "tdc_max_skips": 2}),
                                              ("block", "last", {"tdc_tail": 1, "tdc_max_skips": 1}),
                                              ("step", "auto", {"tdc_forecast_steps": 1, "tdc_threshold_rule": "steps",
                                                                "tdc_forecast_threshold": math.inf}),
                                              ("step", "last", {"tdc_threshold_rule": "profile"})])
def test_variants_with_dmpq_and_pdr_route_after_skip_and_never_purify_the_probe(mode, reuse, extra):
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("full", policy=None, warmup_steps=0, tau=1.0, pdr_rho=0.0, pdr_k_sigma=1.0, tdc_mode=mode, tdc_reuse=reuse,
                              tdc_threshold=math.inf, tdc_budget=0.8, tdc_probe_threshold=math.inf,
                              tdc_first=2, tdc_last=1, **extra)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=8)
    d = handle.trace.to_dict()
    assert d["summary"]["skip_fraction"] > 0
    n_probe = sum(1 for name in d["linears"] if name.startswith(d["blocks"][0] + "."))
    assert n_probe > 0
    n_after = 0
    for t, s in enumerate(d["steps"]):
        for b, blk in enumerate(s["blocks"]):
            prev = d["steps"][t - 1]["blocks"][b] if t else None
            if not blk["computed"]:
                continue
            # PDR (ρ = 0 at k_σ = 1 fires wherever it checks) checks the deltas a later skip may reuse — never the
            # probe's or a tail block's (those never skip)
            fixed = (mode == "step" and b == 0) or b >= 3 - cfg.tdc_tail
            reusable = cfg.tdc_first <= t + 1 < 8 - cfg.tdc_last
            assert blk["pdr"] == (reusable and not fixed), (t, b, blk)
            # "the step after a skip" is the block's own previous evaluation skipped: no fresh Γ → INT8
            if blk["pdr"]:
                assert blk["mode"] == "pdr"
            elif mode == "step" and b == 0:  # the probe: 16-bit activations, bf16 attention (tdc_probe_route)
                assert blk["mode"] in ("probe", "warmup"), (t, blk)
                assert set(d["steps"][t]["routes"][:n_probe]) <= {"fp16", "w4a16"}, d["steps"][t]["routes"]
            elif prev is not None and prev["skipped"]:
                n_after += 1
                assert blk["mode"] == "after_skip"
            else:
                assert blk["mode"] in ("dmpq", "no_gamma")
    assert n_after >= 1
    if mode == "step":
        assert all(s["blocks"][0]["computed"] for s in d["steps"])


@pytest.mark.parametrize("mode,reuse,extra", [("block", "linear", {}), ("step", "linear", {}),
                                              ("step", "last", {"tdc_tail": 1, "tdc_max_skips": 2}),
                                              ("block", "last", {"tdc_max_skips": 2}),
                                              ("step", "auto", {"tdc_forecast_steps": 1, "tdc_forecast_threshold": math.inf}),
                                              ("step", "last", {"tdc_threshold_rule": "steps"})])
def test_variant_state_resets_between_calls_and_shapes(mode, reuse, extra):
    """A leaked delta (or forecast history, or skip count) from an earlier call would change the later calls'
    results."""
    cfg = SixBitConfig.preset("tdc_only", **{**FORCE, "tdc_mode": mode, "tdc_reuse": reuse, "tdc_probe_threshold": math.inf,
                                             **extra})
    fresh = {}
    for size in (16, 8):
        pipe = tiny_cogvideox_pipeline(seed=0)
        sixbit.apply(pipe, cfg)
        fresh[size] = generate(pipe, height=size, width=size, num_inference_steps=5)
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, cfg)
    for size in (16, 8, 16, 8):
        out = generate(pipe, height=size, width=size, num_inference_steps=5)
        assert torch.equal(out, fresh[size]), size
        assert handle.trace.to_dict()["summary"]["skip_fraction"] > 0
    assert all(st.delta is None and st.prev_delta is None for h in handle.block_hooks
               for st in h.state_manager._state_cache.values())


def test_step_mode_schedule_records_and_replays_the_joint_pattern():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**STEP, "tdc_first": 2}))
    out = generate(pipe, num_inference_steps=5)
    sched = handle.trace.skip_schedule()
    handle.remove()
    assert sched.branches["cond_uncond"] == [[True] * 3] * 2 + [[True, False, False]] * 3
    # replayed in block mode, the same cells skip with the same deltas: the same latents
    replay = sixbit.apply(pipe, SixBitConfig.preset("tdc_only"), schedule=sched)
    assert torch.equal(generate(pipe, num_inference_steps=5), out)
    assert replay.trace.skip_schedule().branches == sched.branches


def test_tail_blocks_compute_every_step_on_the_skipped_blocks_output():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**STEP, "tdc_tail": 1}, tdc_reuse="last"))
    blocks = pipe.transformer.transformer_blocks
    calls = [_capture(b) for b in blocks]
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    assert d["config"]["tdc_tail"] == 1
    assert [[b["tdc"] for b in s["blocks"]] for s in d["steps"]] == \
        [["probe_compute", "compute", "tail_compute"]] + [["probe_skip", "reuse", "tail_compute"]] * 4
    delta1 = [o - i for o, i in zip(calls[1][0]["out"], calls[1][0]["in"])]
    for t in range(1, 5):
        for s in range(2):  # the tail block runs on the fresh probe output + block 1's cached Δ
            assert torch.allclose(calls[2][t]["in"][s], calls[0][t]["out"][s] + delta1[s], atol=1e-6)
    assert d["summary"]["skip_fraction"] == pytest.approx(4 / 15)
    # in block mode too the tail never skips, and its delta is never cached
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**FORCE, "tdc_tail": 2}))
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    assert [s["blocks"][0]["skipped"] for s in d["steps"]] == [False, False, True, True, True]
    assert all(b["tdc"] == "tail_compute" for s in d["steps"] for b in s["blocks"][1:])


def test_max_skips_caps_consecutive_skipped_steps_in_both_modes():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**STEP, "tdc_max_skips": 2}))
    generate(pipe, num_inference_steps=8)
    d = handle.trace.to_dict()
    assert [s["blocks"][0]["tdc"] for s in d["steps"]] == \
        ["probe_compute", "probe_skip", "probe_skip", "probe_capped"] + ["probe_skip"] * 2 + ["probe_capped", "probe_skip"]
    # a capped step computes every block and moves the reference: the probe's drift restarts from it
    assert [s["blocks"][1]["computed"] for s in d["steps"]] == [True, False, False, True, False, False, True, False]
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**FORCE, "tdc_max_skips": 1}))
    generate(pipe, num_inference_steps=7)
    d = handle.trace.to_dict()
    for b in range(3):  # two computed deltas first, then skip / refresh alternately
        assert [s["blocks"][b]["skipped"] for s in d["steps"]] == [False, False, True, False, True, False, True]


def test_wan_tail_and_cap_keep_each_branch_s_own_count():
    pipe = tiny_wan_pipeline(seed=1)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**STEP, "tdc_tail": 1, "tdc_max_skips": 1}))
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    for s, want in zip(d["steps"], ["probe_compute", "probe_skip", "probe_capped", "probe_skip", "probe_capped"]):
        for br in (s, s["other_branches"]["uncond"]):
            assert [b["tdc"] for b in br["blocks"]] == [want, "tail_compute"]


def test_scaled_reuse_multiplies_the_cached_deltas_by_the_probe_magnitude_ratio():
    for store in ("blocks", "span"):
        pipe = tiny_cogvideox_pipeline(seed=0)
        handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**STEP, "tdc_reuse": "scaled"}, tdc_store=store,
                                                        tdc_regate="off"))
        blocks = pipe.transformer.transformer_blocks
        calls = [_capture(b) for b in blocks]
        generate(pipe, num_inference_steps=4)
        d = handle.trace.to_dict()
        assert [[b["tdc"] for b in s["blocks"]] for s in d["steps"]] == \
            [["probe_compute", "compute", "compute"]] + [["probe_skip", "scaled", "scaled"]] * 3
        probe = [calls[0][t]["out"][0] - calls[0][t]["in"][0] for t in range(4)]  # video stream of block 0
        for t in range(1, 4):
            r = probe[t].abs().sum() / probe[0].abs().sum()  # against the reference, step 0's delta
            for s in range(2):
                if store == "blocks":  # each block: its input + r · its own delta
                    for b in (1, 2):
                        delta = calls[b][0]["out"][s] - calls[b][0]["in"][s]
                        assert torch.allclose(calls[b][t]["out"][s], calls[b][t]["in"][s] + r * delta, atol=1e-5)
                else:  # the span's first block adds r · the combined residual, the last passes it through
                    combined = calls[2][0]["out"][s] - calls[1][0]["in"][s]
                    assert torch.allclose(calls[1][t]["out"][s], calls[1][t]["in"][s] + r * combined, atol=1e-5)
                    assert torch.equal(calls[2][t]["out"][s], calls[2][t]["in"][s])
        handle.remove()
    with pytest.raises(sixbit.config.ConfigError, match="tdc_reuse='scaled'.*tdc_mode='step'"):
        SixBitConfig.preset("tdc_only", tdc_mode="block", tdc_reuse="scaled")


def test_cap_and_fixed_block_rules():
    from sixbit import tdc

    c = SixBitConfig.preset("tdc_only", tdc_mode="block", tdc_max_skips=2, tdc_tail=1)
    assert not tdc.capped(1, c) and tdc.capped(2, c) and not tdc.capped(5, c.replace(tdc_max_skips=0))
    assert tdc.decide(0.1, 0.0, 5, 10, c, run_skips=1) and not tdc.decide(0.1, 0.0, 5, 10, c, run_skips=2)
    assert [tdc.fixed(b, 4, c) for b in range(4)] == [False, False, False, True]  # block mode: no probe
    step = c.replace(tdc_mode="step", tdc_tail=2)
    assert [tdc.fixed(b, 4, step) for b in range(4)] == [True, False, True, True]
    with pytest.raises(sixbit.config.ConfigError, match="tdc_max_skips"):
        c.replace(tdc_max_skips=-1)


def _untimed(d):
    """A trace dict without its timings (which differ between any two runs)."""
    if isinstance(d, dict):
        return {k: _untimed(v) for k, v in d.items() if k not in ("time_s", "setup_s", "peak_mem_bytes")}
    if isinstance(d, list):
        return [_untimed(v) for v in d]
    return d


@pytest.mark.parametrize("preset,fields,family", [
    ("full_paper", dict(tdc_threshold=0.5, tdc_budget=2.0, tdc_first=1, pdr_rho=6e-4, pdr_k_sigma=3.0), "cogvideox"),
    ("full", dict(tdc_probe_threshold=0.5, tdc_first=1, tdc_reuse="linear", pdr_rho=1.1e-3, pdr_k_sigma=3.0), "cogvideox"),
    ("full_attn", dict(tdc_probe_threshold=0.5, tdc_first=1), "cogvideox"),
    ("full_paper", dict(tdc_threshold=0.5, tdc_budget=2.0, tdc_first=1, tdc_reuse="linear"), "wan"),
])
def test_deferred_statistics_reads_change_nothing(monkeypatch, preset, fields, family):
    """Γ and the delta change of a computed block are read when the call ends (``Run.defer``), not at once:
    the same decisions, routes, trace values and output as reading every block's statistics immediately —
    in block mode (where the next step decides from them), step mode with PDR (whose reads, which cannot wait,
    carry what was deferred before them) and a forecast, attention scope, and separate CFG calls (Wan)."""
    from sixbit.hooks import Run

    def run(immediate: bool):
        if immediate:
            monkeypatch.setattr(Run, "defer", lambda self, stats, resolve: resolve(self.read(stats)))
        pipe = (tiny_cogvideox_pipeline if family == "cogvideox" else tiny_wan_pipeline)(seed=0)
        h = sixbit.apply(pipe, SixBitConfig.preset(preset, policy=None, warmup_steps=0, **fields))
        out = generate(pipe, num_inference_steps=8)
        monkeypatch.undo()
        return out, h.trace.to_dict()

    (a, da), (b, db) = run(False), run(True)
    assert torch.equal(a, b)
    assert _untimed(da) == _untimed(db)
    blocks = [blk for s in da["steps"] for blk in s["blocks"] if blk["computed"]]
    assert any(blk["skipped"] is False for blk in blocks) and 0 < da["summary"]["skip_fraction"] < 1
    assert all(isinstance(blk["gamma"], float) for blk in blocks)  # resolved in the trace, not left stale
    if "pdr_rho" in fields:  # PDR fired at some checks and not at others
        checked = [blk for blk in blocks if blk["outlier_ratio"] is not None]
        assert 0 < da["summary"]["pdr_count"] < len(checked)
