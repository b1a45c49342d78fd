"""The method's decision rules without a pipeline: plain tensors, configs and numbers in, decisions out.

``dmpq.route`` (the whole route ladder of a computed block), ``pdr.applies``/``purify``/``outlier_sums``,
``tdc.decide``/``accumulate``/``change_rate``, and the statistics the block hook reads (additive sums, so an
all-reduce across ranks before ``Run.read`` gives the decision of the whole tensor).
"""

from __future__ import annotations

import math

import pytest
import torch

from sixbit import dmpq, pdr, routes, tdc
from sixbit.config import ConfigError, SixBitConfig
from sixbit.hooks import Run, block_stats
from sixbit.policy import LinearFit

N = 3
FITS = [LinearFit(1.0, 0.0), LinearFit(2.0, 0.1), LinearFit(0.5, 0.0)]  # E = Γ, 2Γ + 0.1, Γ / 2


def cfg(**kw) -> SixBitConfig:
    base = dict(quant="dmpq", tdc=True, pdr=True, warmup_steps=1, after_skip="int8", tdc_first=2, tdc_last=1,
                tdc_threshold=0.2, tdc_budget=0.5, policy=None)
    return SixBitConfig(**{**base, **kw})


def route(c, step=5, **kw):
    kw = {"gamma": 0.1, "fits": FITS, "tau": 0.2, "rho": 1e-3, **kw}
    return dmpq.route(c, step, N, **kw)


# ------------------------------------------------------------------------------------------ the ladder


def test_dmpq_routes_int8_exactly_where_the_predicted_error_exceeds_tau():
    r = route(cfg(), gamma=0.1, tau=0.2)
    assert r.mode == "dmpq" and not r.pdr
    assert r.pred_err == pytest.approx([0.1, 0.3, 0.05])
    assert r.routes == ["nvfp4", "int8", "nvfp4"]
    # E == τ stays NVFP4 (strictly greater goes INT8)
    assert route(cfg(), gamma=0.2, tau=0.2).routes == ["nvfp4", "int8", "nvfp4"]
    assert route(cfg(), gamma=0.0, tau=0.0).routes == ["nvfp4", "int8", "nvfp4"]
    assert route(cfg(), gamma=1.0, tau=10.0).routes == ["nvfp4"] * 3


def test_precedence_off_warmup_static_before_everything():
    dirty = dict(outlier_ratio=0.5, replayed=["int8"] * N, gamma=None, skipped_last=True)
    assert (route(cfg(quant="off"), **dirty).mode, route(cfg(quant="off"), **dirty).routes) == ("fp", ["fp16"] * N)
    w = route(cfg(warmup_steps=6), step=5, **dirty)
    assert (w.mode, w.routes, w.pdr) == ("warmup", ["fp16"] * N, False)
    for quant, r in (("w4a4", "nvfp4"), ("w4a8", "int8"), ("w8a8", "w8a8")):
        s = route(cfg(quant=quant), **dirty)
        assert (s.mode, s.routes, s.pred_err) == ("static", [r] * N, [None] * N)


def test_nvfp4_decisions_run_int8_only_where_the_config_and_device_say():
    # the rule: "int8" always; "auto" only with INT8 weights resident (w8a8) and no FP4 tensor cores
    def rule(c, native_fp4):
        return routes.nvfp4_as_int8(c.nvfp4_route, c.int8_route, native_fp4)

    assert not rule(cfg(), native_fp4=False)
    assert rule(cfg(nvfp4_route="int8"), native_fp4=True)
    assert rule(cfg(nvfp4_route="auto", int8_route="w8a8"), native_fp4=False)
    assert not rule(cfg(nvfp4_route="auto", int8_route="w8a8"), native_fp4=True)
    assert not rule(cfg(nvfp4_route="auto", int8_route="int8"), native_fp4=False)
    assert rule(cfg(nvfp4_route="auto", int8_route="w4a8_requant"), native_fp4=False)
    assert [routes.int8_route_for("auto", k) for k in (True, False)] == ["w4a8_requant", "int8"]
    assert all(routes.int8_route_for(r, k) == r for r in routes.INT8_ROUTES for k in (True, False))
    assert cfg(int8_route="auto").weight_formats == ("nvfp4",)
    assert not rule(cfg(nvfp4_route="auto", int8_route="w4a8_requant"), native_fp4=True)
    with pytest.raises(ConfigError, match="nvfp4_route"):
        cfg(nvfp4_route="w8a8")
    # the DMPQ rule and a replayed schedule's NVFP4 cells run INT8, counted; the prediction is kept
    r = route(cfg(), gamma=0.1, tau=0.2, nvfp4_as_int8=True)
    assert (r.mode, r.routes, r.nvfp4_as_int8) == ("dmpq", ["int8"] * 3, 2)
    assert r.pred_err == pytest.approx([0.1, 0.3, 0.05])
    p = route(cfg(), replayed=["nvfp4", "fp16", "int8"], nvfp4_as_int8=True)
    assert (p.mode, p.routes, p.nvfp4_as_int8) == ("replay", ["int8", "fp16", "int8"], 1)
    # nothing else changes: no NVFP4 decision, full-precision steps, the static W4A4 baseline
    assert route(cfg(), gamma=1.0, tau=0.0, nvfp4_as_int8=True).nvfp4_as_int8 == 0
    assert route(cfg(), step=0, nvfp4_as_int8=True).routes == ["fp16"] * N
    assert route(cfg(quant="w4a4"), nvfp4_as_int8=True).routes == ["nvfp4"] * N
    assert route(cfg(), gamma=0.1, tau=0.2).routes == ["nvfp4", "int8", "nvfp4"]


def test_pdr_fires_above_rho_and_yields_to_a_replayed_route():
    p = route(cfg(), outlier_ratio=2e-3, rho=1e-3)
    assert (p.mode, p.routes, p.pdr, p.pred_err) == ("pdr", ["fp16"] * N, True, [None] * N)
    assert route(cfg(), outlier_ratio=1e-3, rho=1e-3).mode == "dmpq"  # strictly above ρ
    assert route(cfg(), outlier_ratio=None, rho=0.0).mode == "dmpq"  # not checked: no purification
    rep = route(cfg(), outlier_ratio=0.5, replayed=["int8", "fp16", "nvfp4"])
    assert (rep.mode, rep.routes, rep.pdr) == ("replay", ["int8", "fp16", "nvfp4"], False)


def test_the_probe_runs_its_own_route_after_warmup_and_static_and_yields_to_a_replay():
    """tdc_probe_route: step mode's probe block runs 16-bit (default) or INT8 activations every step, its
    attention bf16 — its delta only decides, and a quantized probe's drift has a noise floor (docs/TDC.md §9)."""
    p = route(cfg(), gamma=0.1, probe=True)
    assert (p.mode, p.routes, p.pred_err) == ("probe", ["fp16"] * N, [None] * N)
    assert route(cfg(tdc_probe_route="int8"), gamma=0.1, probe=True).routes == ["int8"] * N
    assert route(cfg(tdc_probe_route="policy"), gamma=0.1, probe=True).mode == "dmpq"
    assert route(cfg(), gamma=0.1, skipped_last=True, probe=True).mode == "probe"  # the probe never skips anyway
    assert route(cfg(), step=0, probe=True).mode == "warmup"
    assert route(cfg(quant="w8a8"), probe=True).mode == "static"  # static configs: every block the same
    assert route(cfg(), probe=True, replayed=["int8", "nvfp4", "int8"]).mode == "replay"
    a = dmpq.attention_route(cfg(attention="policy"), p, gamma=0.1, fit=LinearFit(0.0, 0.0), tau_attn=1.0)
    assert (a.route, a.why) == ("bf16", "probe")


def test_after_a_skip_or_without_gamma_every_layer_runs_int8():
    a = route(cfg(), gamma=0.1, skipped_last=True)
    assert (a.mode, a.routes, a.pred_err) == ("after_skip", ["int8"] * N, [None] * N)
    assert route(cfg(after_skip="dmpq"), gamma=0.1, skipped_last=True).mode == "dmpq"  # the stale Γ
    n = route(cfg(), gamma=None)
    assert (n.mode, n.routes) == ("no_gamma", ["int8"] * N)
    assert route(cfg(after_skip="dmpq"), gamma=None, skipped_last=True).mode == "after_skip"


# --------------------------------------------------------------------------------------------- PDR


def test_pdr_applies_where_the_delta_may_be_reused():
    c = cfg()  # warm-up 1, tdc_first 2, tdc_last 1, 10 steps: the next step must be in [2, 9)
    assert [pdr.applies(c, t, 10) for t in range(10)] == [False, True, True, True, True, True, True, True,
                                                          False, False]
    assert pdr.applies(c, 5, None)  # unknown length: no upper bound
    assert pdr.applies(c, 8, 10, next_skip=True) and not pdr.applies(c, 5, 10, next_skip=False)  # a replay
    for off in (dict(pdr=False), dict(tdc=False), dict(quant="off"), dict(quant="w4a4")):
        assert not any(pdr.applies(cfg(**off), t, 10, nxt) for t in range(10) for nxt in (None, True))
    assert not pdr.applies(cfg(warmup_steps=4), 3, 10, next_skip=True)


def test_outlier_statistic_is_additive():
    g = torch.Generator().manual_seed(0)
    clean = torch.randn(2, 64, 128, generator=g)
    dirty = clean.clone()
    dirty[0, :8, 3] = 1000.0
    text = torch.randn(2, 16, 128, generator=g)
    c = pdr.outlier_sums([clean, text], 8.0)
    d = pdr.outlier_sums([dirty, text], 8.0)
    assert c.tolist() == [0.0, clean.numel() + text.numel()]
    assert d[0] == 8 and d[1] == c[1]
    # the sums of two token slices (two ranks) add up to the whole: all-reducible
    halves = [pdr.outlier_sums([dirty[:, :32], text[:, :8]], 8.0), pdr.outlier_sums([dirty[:, 32:], text[:, 8:]], 8.0)]
    assert torch.equal(halves[0] + halves[1], d)
    assert pdr.outlier_ratio(*d.tolist()) == 8 / d[1].item() and pdr.outlier_ratio(0.0, 0.0) == 0.0
    assert pdr.purify(2e-3, 1e-3) and not pdr.purify(1e-3, 1e-3)


# --------------------------------------------------------------------------------------------- TDC


def test_tdc_skips_inside_the_window_under_threshold_and_budget():
    c = cfg()
    assert tdc.decide(0.1, 0.0, 5, 10, c)
    assert not tdc.decide(0.1, 0.0, 1, 10, c) and not tdc.decide(0.1, 0.0, 9, 10, c)  # first 2, last 1
    assert tdc.decide(0.1, 0.0, 9, None, c)  # unknown length: the last-K rule is off
    assert not tdc.decide(None, 0.0, 5, 10, c)  # one computed delta: no change rate yet
    assert tdc.decide(0.2, 0.0, 5, 10, c) and not tdc.decide(0.21, 0.0, 5, 10, c)  # threshold inclusive
    assert tdc.decide(0.2, 0.3, 5, 10, c) and not tdc.decide(0.2, 0.31, 5, 10, c)  # budget inclusive
    assert not tdc.decide(0.0, 0.0, 5, 10, cfg(tdc=False))


def test_skip_error_drifts_linearly_and_change_rate_is_per_step():
    acc = 0.0
    for _ in range(3):
        acc = tdc.accumulate(acc, 0.125)
    assert acc == 0.375 and tdc.accumulate(0.5, None) == 0.5
    assert tdc.change_rate(3.0, 4.0, 7, 4) == pytest.approx(0.25)  # 0.75 over three steps
    assert tdc.change_rate(3.0, 4.0, 5, 4) == 0.75
    assert tdc.change_rate(0.0, 0.0, 5, 4) == 0.0 and math.isinf(tdc.change_rate(1.0, 0.0, 5, 4))


def test_step_mode_skips_the_rest_inside_the_window_under_the_probe_threshold():
    c = cfg(tdc_mode="step", tdc_probe_threshold=0.2, tdc_threshold_rule="fixed")
    assert tdc.step_skips(0.2, 5, 10, c) and not tdc.step_skips(0.21, 5, 10, c)  # inclusive
    steps = c.replace(tdc_threshold_rule="steps")  # the default: 0.2 is the threshold at 20 steps, 0.4 at 10
    assert tdc.step_skips(0.4, 5, 10, steps) and not tdc.step_skips(0.41, 5, 10, steps)
    assert not tdc.step_skips(0.0, 1, 10, c) and not tdc.step_skips(0.0, 9, 10, c)  # first 2, last 1
    assert tdc.step_skips(0.0, 9, None, c)
    assert not tdc.step_skips(None, 5, 10, c)  # no reference yet
    assert not tdc.step_skips(0.0, 5, 10, cfg(tdc=False, tdc_mode="step"))
    # the per-block threshold and budget play no part in step mode, the probe threshold none in block mode
    assert tdc.step_skips(0.15, 5, 10, cfg(tdc_mode="step", tdc_threshold=0.0, tdc_budget=0.0))
    assert tdc.decide(0.15, 0.0, 5, 10, cfg(tdc_probe_threshold=0.0))


def test_forecast_extrapolates_the_last_two_deltas_to_first_order():
    g = torch.Generator().manual_seed(0)
    d0, d1 = [torch.randn(2, 5, 4, generator=g), torch.randn(2, 3, 4, generator=g)], \
        [torch.randn(2, 5, 4, generator=g), torch.randn(2, 3, 4, generator=g)]
    # computed at steps 2 and 4: at step 7 the slope per step (d1 − d0)/2 is applied 3 steps on
    for got, a, b in zip(tdc.forecast(d1, d0, 7, 4, 2), d1, d0):
        assert torch.allclose(got, a + 1.5 * (a - b))
    # a linear trajectory is forecast exactly; without an earlier delta the forecast is the last delta
    lin = [torch.full((3,), 1.0 + 0.5 * t) for t in (0, 1)]
    assert torch.allclose(tdc.forecast([lin[1]], [lin[0]], 5, 1, 0)[0], torch.full((3,), 3.5))
    assert tdc.forecast(d1, None, 7, 4, None) is d1 and tdc.forecast(d1, d0, 7, 4, 4) is d1


def test_quadratic_forecast_is_exact_on_a_quadratic_trajectory_with_uneven_spacing():
    # Δ(t) = c + b·t + a·t² per element, computed at steps 1, 3, 4 (uneven), forecast at 6 and 9: exact
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(2, 7, 3, generator=g) for _ in range(3))
    at = lambda t: [c + b * t + a * t * t]  # noqa: E731
    for t in (6, 9):
        got = tdc.forecast(at(4), at(3), t, 4, 3, at(1), 1)[0]
        assert torch.allclose(got, at(t)[0], atol=1e-4)
        # the first order misses the curvature; without prev2 (or a bad step order) it is the first order
        assert not torch.allclose(tdc.forecast(at(4), at(3), t, 4, 3)[0], at(t)[0], atol=1e-2)
        assert torch.equal(tdc.forecast(at(4), at(3), t, 4, 3, at(1), 3)[0], tdc.forecast(at(4), at(3), t, 4, 3)[0])
    # non-finite values stay where they are (no silent cleaning): a NaN in the oldest delta poisons its elements only
    old = at(1)[0].clone()
    old[0, 0, 0] = float("nan")
    got = tdc.forecast(at(4), at(3), 6, 4, 3, [old], 1)[0]
    assert got[0, 0, 0].isnan() and torch.isfinite(got.flatten()[1:]).all()
    assert tdc.forecast_order(SixBitConfig(tdc_reuse="quadratic"), 20) == 2
    assert tdc.forecast_order(SixBitConfig(), 50) == 2 and tdc.forecast_order(SixBitConfig(), 20) == 1  # magnitude
    assert tdc.forecast_order(SixBitConfig(), None) == 0
    assert tdc.forecast_order(SixBitConfig(tdc_reuse="linear"), 20) == 1


def test_magnitude_forecast_extrapolates_the_size_only_clamped_and_keeps_non_finite_elements_in_place():
    # Δ(t) = D·g^t per stream: the size ratio extrapolated is exact, whatever the spacing
    g = torch.Generator().manual_seed(2)
    D = [torch.randn(2, 7, 3, generator=g), torch.randn(2, 4, 3, generator=g)]
    at = lambda t, q=1.3: [x * q ** t for x in D]  # noqa: E731
    for t in (5, 8):
        got = tdc.forecast(at(4), at(2), t, 4, 2, magnitude=True)
        assert all(torch.allclose(a, b, rtol=1e-5) for a, b in zip(got, at(t)))
        onto = [torch.ones_like(x) for x in D]
        got = tdc.forecast(at(4), at(2), t, 4, 2, onto=onto, magnitude=True)
        assert all(torch.allclose(a, 1 + b, rtol=1e-5) for a, b in zip(got, at(t)))
    # a per-step ratio of 3 is clamped at 2 before it is extrapolated; without an earlier delta: the last one
    got = tdc.forecast(at(4, 3.0), at(3, 3.0), 6, 4, 3, magnitude=True)
    assert torch.allclose(got[0], at(4, 3.0)[0] * tdc.MAGNITUDE_CLAMP[1] ** 2, rtol=1e-5)
    assert torch.equal(tdc.forecast(at(4), None, 6, 4, None, magnitude=True)[0], at(4)[0])
    # a NaN / inf element stays where it is and does not move the stream's ratio
    last = at(4)[0].clone()
    last[0, 0, 0], last[1, 0, 0] = float("nan"), float("inf")
    got = tdc.forecast([last], [at(3)[0]], 5, 4, 3, magnitude=True)[0]
    assert got[0, 0, 0].isnan() and got[1, 0, 0].isinf()
    fin = torch.ones_like(last, dtype=torch.bool)
    fin[0, 0, 0] = fin[1, 0, 0] = False
    r = (torch.where(fin, last, 0).abs().mean() / at(3)[0].abs().mean()).clamp(*tdc.MAGNITUDE_CLAMP)
    assert torch.isfinite(got[fin]).all() and torch.allclose(got[fin], last[fin] * r, rtol=1e-5)
    assert tdc.forecast_order(SixBitConfig(tdc_reuse="magnitude"), 20) == 1


def test_tdc_mode_and_reuse_are_validated_and_the_paper_preset_keeps_the_papers_rule():
    from sixbit.config import ConfigError

    with pytest.raises(ConfigError, match="tdc_mode"):
        cfg(tdc_mode="blocks")
    with pytest.raises(ConfigError, match="tdc_reuse"):
        cfg(tdc_reuse="taylor")
    with pytest.raises(ConfigError, match="tdc_probe_threshold"):
        cfg(tdc_probe_threshold=-1.0)
    for name in ("tdc_paper", "full_paper"):
        p = SixBitConfig.preset(name)
        assert (p.tdc, p.tdc_mode, p.tdc_reuse, p.tdc_threshold, p.tdc_budget) == (True, "block", "last", 0.165, 0.4)


# ---------------------------------------------------------------------------------- the statistics


def test_block_statistics_are_additive_sums_read_in_one_place():
    g = torch.Generator().manual_seed(1)
    ins = [torch.randn(2, 40, 32, generator=g), torch.randn(2, 8, 32, generator=g)]
    outs = [x + 0.1 * torch.randn(x.shape, generator=g) for x in ins]
    old = [0.9 * (o - i) for o, i in zip(outs, ins)]
    deltas, sums = block_stats(outs, ins, old, keep=True, backend="torch")
    assert all(torch.equal(d, o - i) for d, o, i in zip(deltas, outs, ins))
    ref = torch.stack([*dmpq.gamma_sums(deltas[0], ins[0]), *tdc.delta_change_sums(deltas, old)]).double()
    assert sums.dtype == torch.float64 and torch.equal(sums, ref)
    assert block_stats(outs, ins, None, keep=False, backend="torch")[1].shape == (2,)  # Γ's two sums only
    # two token slices (ranks): their sums add up to the whole tensor's
    parts = [block_stats([o[:, s] for o in outs], [i[:, s] for i in ins], [d[:, s] for d in old], True, "torch")[1]
             for s in (slice(0, 4), slice(4, None))]
    assert torch.allclose(parts[0] + parts[1], sums, rtol=1e-5)
    # Run.read is where they would be all-reduced: the hook sees fp64 and its result is what is read
    run = Run(lambda: None)
    seen = []
    run.reduce_stats = lambda t: (seen.append(t.dtype), t * 2)[1]
    assert run.read(sums.float()) == pytest.approx((2 * sums).tolist()) and seen == [torch.float64]
    vals = Run(lambda: None).read(sums)
    assert dmpq.ratio(vals[0], vals[1]) == pytest.approx(float(deltas[0].abs().sum() / ins[0].abs().sum()), rel=1e-5)


# ------------------------------------------------------------------------------------ 8-bit attention


def test_attention_route_by_the_policy_and_its_precedence():
    fit = LinearFit(2.0, 0.125)  # E_attn = 2Γ + 1/8 (exact in binary)
    c = cfg(attention="policy")
    dm = route(c)

    def att(c=c, r=dm, **kw):
        kw = {"gamma": 0.0625, "fit": fit, "tau_attn": 0.25, **kw}
        return dmpq.attention_route(c, r, **kw)

    a = att()
    assert (a.route, a.why, a.pred_err) == ("fp8", "policy", 0.25)  # E == τ: 8-bit
    assert att(gamma=0.1).route == "bf16" and att(gamma=0.1).pred_err == pytest.approx(0.325)
    assert att(tau_attn=1.0).route == "fp8"
    # full precision (off, warm-up, PDR) before everything, even a replayed fp8
    for r in (route(cfg(quant="off")), route(cfg(warmup_steps=9), step=5), route(c, outlier_ratio=1.0, rho=1e-3)):
        x = att(r=r, replayed="fp8")
        assert (x.route, x.pred_err, x.why) == ("bf16", None, "full_precision")
    # replayed wins over the prediction and the missing Γ
    assert att(replayed="bf16").route == "bf16" and att(gamma=None, replayed="fp8").why == "replay"
    # no fresh Γ (after a skip, or none yet), no fit, no τ: bf16
    for kw in (dict(skipped_last=True), dict(gamma=None), dict(fit=None), dict(tau_attn=None)):
        assert att(**kw).route == "bf16" and att(**kw).pred_err is None
    assert att(skipped_last=True).why == "after_skip" and att(fit=None).why == "no_fit"
    assert att(gamma=None).why == att(gamma=None, skipped_last=True).why == "no_gamma"
    # "bf16" never, "fp8" always except full precision
    assert att(c=cfg(attention="bf16")).why == "off"
    assert att(c=cfg(attention="fp8"), gamma=None, fit=None).route == "fp8"
    assert att(c=cfg(attention="fp8"), r=route(cfg(warmup_steps=9), step=5)).route == "bf16"


def test_attention_after_skip_routes_the_first_step_after_a_skip():
    """attention_after_skip: bf16 (default), the policy on the stale Γ, or 8-bit; only after a skip."""
    fit = LinearFit(2.0, 0.125)

    def att(after, **kw):
        c = cfg(attention="policy", attention_after_skip=after)
        kw = {"gamma": 0.0625, "fit": fit, "tau_attn": 0.25, "skipped_last": True, **kw}
        return dmpq.attention_route(c, kw.pop("r", route(c)), **kw)

    assert SixBitConfig().attention_after_skip == "bf16"
    assert att("bf16") == dmpq.AttentionRouting("bf16", None, "after_skip")
    assert att("fp8") == dmpq.AttentionRouting("fp8", None, "after_skip_fp8")
    assert att("policy") == dmpq.AttentionRouting("fp8", 0.25, "stale_policy")  # E = 2·Γ + 1/8 ≤ τ
    assert att("policy", gamma=0.1) == dmpq.AttentionRouting("bf16", pytest.approx(0.325), "stale_policy")
    assert att("policy", fit=None).why == "no_fit" and att("fp8", fit=None).route == "fp8"
    for after in ("policy", "fp8"):
        assert att(after, gamma=None).why == "no_gamma"  # no Γ at all: bf16 whatever the option
        assert att(after, skipped_last=False) == dmpq.AttentionRouting("fp8", 0.25, "policy")  # a fresh Γ
        assert att(after, replayed="bf16").why == "replay"
        assert att(after, r=route(cfg(quant="off"))).why == "full_precision"
        assert dmpq.attention_route(cfg(attention="bf16", attention_after_skip=after), route(cfg()),
                                    gamma=0.0625, skipped_last=True, fit=fit, tau_attn=0.25).why == "off"
    with pytest.raises(ConfigError, match="attention_after_skip"):
        SixBitConfig(attention_after_skip="int8")


def test_attention_config_fields_are_validated_and_the_presets_choose():
    with pytest.raises(ConfigError, match="SixBitConfig.attention "):
        SixBitConfig(attention="int8")
    with pytest.raises(ConfigError, match="tau_attn"):
        SixBitConfig(tau_attn=-1.0)
    with pytest.raises(ConfigError, match="attention_target"):
        SixBitConfig(attention_target=1.5)
    for name in ("balanced", "full", "aggressive", "dmpq_only", "dmpq_tdc", "full_paper", "fast"):
        assert SixBitConfig.preset(name).attention == "policy", name
    fast = SixBitConfig.preset("fast")
    assert (fast.attention_after_skip, fast.int8_route, fast.nvfp4_route) == ("policy", "w8a8", "auto")
    assert (SixBitConfig.preset("full").nvfp4_route, SixBitConfig.preset("full").int8_route) == ("auto", "auto")
    assert (SixBitConfig.preset("full_paper").nvfp4_route, SixBitConfig.preset("full_paper").int8_route) == ("nvfp4", "int8")
    assert SixBitConfig.preset("full").attention_after_skip == "bf16"
    for name in ("off", "fp16", "w8a8", "w4a4", "w4a8", "tdc_only", "tdc_paper"):
        assert SixBitConfig.preset(name).attention == "bf16", name


def test_magnitude_ratios_stacked_equal_the_per_stream_formula_bit_for_bit():
    """``tdc.magnitude_ratios`` computes the streams' factors as one stacked chain (fewer launches per skipped block):
    the same bits as ``(‖Δ₀‖ / l1_size(prev).clamp_min(1e-30)).clamp(lo, hi).pow(s)`` one stream at a time — for
    held sizes (0-d, incl. 0, inf and NaN ones) and for held tensors."""
    lo, hi = tdc.MAGNITUDE_CLAMP
    g = torch.Generator().manual_seed(5)
    delta = [torch.randn(2, 5, 3, generator=g) * k for k in (1.0, 3.0, 1e-3, 0.0, 7.0)]
    sizes = [tdc.l1_size(d) for d in delta]
    held = [torch.randn(2, 5, 3, generator=g) * k for k in (0.9, 1.0, 1e-3, 2.0, 1e30)]
    held_sizes = [tdc.l1_size(p) for p in held[:3]] + [torch.tensor(0.0), torch.tensor(float("inf"))]
    for prev in (held, held_sizes, [*held_sizes[:4], torch.tensor(float("nan"))]):
        for step, last, before in ((7, 6, 4), (9, 6, 5)):
            s = (step - last) / (last - before)
            want = [(a / tdc.l1_size(p).clamp_min(1e-30)).clamp(lo, hi).pow(s) for a, p in zip(sizes, prev)]
            got = tdc.magnitude_ratios(delta, prev, step, last, before)
            assert len(got) == len(want) and all(x.dim() == 0 and torch.equal(x, y) for x, y in zip(got, want))
