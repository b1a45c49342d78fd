"""DMPQ calibration: least squares fit, τ for a bit target, the policy file, and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

import sixbit
import sixbit.calibrate as cal
from sixbit import Policy, SixBitConfig
from sixbit.calibrate import calibrate, fit_line, main, read_prompts, transformer_fingerprint
from sixbit.testing import COGVIDEOX_CALL, generate, save_and_reload, tiny_cogvideox_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = {k: COGVIDEOX_CALL[k] for k in ("height", "width", "num_frames", "max_sequence_length")}


def test_fit_line_is_least_squares():
    x = [0.1, 0.2, 0.3, 0.4]
    a, b, r2, ss_res, _ = fit_line(x, [0.5 * v + 0.02 for v in x])
    assert (a, b, r2) == pytest.approx((0.5, 0.02, 1.0)) and ss_res == pytest.approx(0.0, abs=1e-15)
    a, b, r2, _, _ = fit_line(x, [1.0, 0.0, 1.0, 0.0])
    assert a == pytest.approx(-2.0) and b == pytest.approx(1.0) and r2 == pytest.approx(0.2)
    assert fit_line([0.3, 0.3], [0.1, 0.2])[:3] == pytest.approx((0.0, 0.15, 0.0))  # constant Γ: the mean
    assert fit_line([0.1, 0.2], [0.1, 0.1])[2] is None  # constant E: R² undefined


def test_calibrate_writes_a_policy_that_loads_back_and_drives_routing(tmp_path):
    pipe = tiny_cogvideox_pipeline(seed=0)
    ref = generate(pipe)
    policy, report = calibrate(pipe, ["red circle", "blue square"], steps=5, call_kwargs=CALL, target_bits=6.0)
    assert torch.equal(generate(pipe), ref)  # calibration leaves the model as it was
    names = [f"transformer_blocks.{b}.{n}" for b in range(3)
             for n in ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "ff.net.0.proj", "ff.net.2")]
    assert list(policy.linears) == names
    assert all(f.n == 2 * 4 for f in policy.linears.values())  # 2 prompts × steps 1..4
    layer = report["layers"][0]
    assert 0 < layer["mean_err_int8"] < layer["mean_err_nvfp4"] < 0.5
    assert report["r2_overall"] is not None and report["r2_overall"] <= 1.0
    # τ hits the bit target on the calibration samples, and the table is monotone
    assert report["avg_act_bits_at_tau"] == pytest.approx(6.0, abs=0.3)
    taus = [policy.tau_table[b] for b in sorted(policy.tau_table)]
    assert taus == sorted(taus, reverse=True) and policy.tau == pytest.approx(policy.tau_for_bits(6.0))

    # PDR's ρ: the 95th percentile of the block-input outlier ratios at the steps PDR checks with the default
    # config (past its 2 warm-up steps and tdc_first <= t+1 < steps - tdc_last: t = 2), 3 blocks x 2 prompts
    assert policy.pdr_n == 1 * 3 * 2 and policy.pdr_k_sigma == SixBitConfig().pdr_k_sigma
    assert policy.pdr_rho == report["pdr_ratio_quantiles"]["0.95"] and 0.0 <= policy.pdr_rho <= 1.0
    assert report["pdr_ratio_quantiles"]["0.05"] <= policy.pdr_rho <= report["pdr_ratio_quantiles"]["0.99"]

    path = policy.save(tmp_path / "policy.json")
    loaded = Policy.load(path)
    assert loaded.to_dict() == json.loads(path.read_text())
    handle = sixbit.apply(pipe, SixBitConfig.preset("dmpq_only", policy=str(path), target_bits=6.0,
                                                   warmup_steps=0))  # τ = policy.tau
    generate(pipe)
    d = handle.trace.to_dict()
    assert d["config"]["policy_resolved"].startswith("calibrated")
    for prev, s in zip(d["steps"], d["steps"][1:]):
        for j, name in enumerate(d["linears"]):
            g = prev["blocks"][j // 6]["gamma"]
            e = loaded.linears[name].predict(g)
            assert s["pred_err"][j] == pytest.approx(e)
            assert s["routes"][j] == ("int8" if e > loaded.tau else "nvfp4")


def test_calibrate_cli(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "tiny"
    save_and_reload(tiny_cogvideox_pipeline(seed=0, num_layers=2), folder)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# calibration prompts\nred circle\n\ngreen triangle\n")
    assert read_prompts(prompts) == ["red circle", "green triangle"]
    out = tmp_path / "out" / "policy.json"
    rc = main(["--model", str(folder), "--prompts", str(prompts), "--out", str(out), "--steps", "5",
               "--frames", "9", "--height", "32", "--width", "32", "--device", "cpu", "--target-bits", "5.5"])
    assert rc == 0
    pol = Policy.load(out)
    assert len(pol.linears) == 12 and pol.target_bits == 5.5 and "sixbit.calibrate" in pol.meta["command"]
    md = out.with_suffix(".md").read_text()
    assert "R² pooled within layers" in md and "transformer_blocks.1.ff.net.2" in md and "PDR ρ =" in md
    assert "wrote" in capsys.readouterr().out
    assert pol.meta["transformer_sha256"] == transformer_fingerprint(folder)
    # weights that change while calibrating: refused, nothing written
    hashes = iter(["before", "after"])
    monkeypatch.setattr(cal, "transformer_fingerprint", lambda path: next(hashes))
    out2 = tmp_path / "out" / "refused.json"
    rc = main(["--model", str(folder), "--prompts", str(prompts), "--out", str(out2), "--steps", "2",
               "--frames", "9", "--height", "32", "--width", "32", "--device", "cpu"])
    assert rc == 1 and not out2.exists() and "changed while calibrating" in capsys.readouterr().err
    bad = tmp_path / "empty.txt"
    bad.write_text("# nothing\n")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(bad)


def test_calibrate_fits_the_8bit_attention_error_per_block():
    """Head dim 32 (the kernel's smallest): every block gets a line of the 8-bit attention's error against
    SDPA (the emulation on the CPU), measured on the block's own q/k/v; τ_attn is the target's quantile.
    Head dim 16 (no 8-bit attention): no attention fits, and the policy says its attention stays bf16."""
    pipe = tiny_cogvideox_pipeline(seed=0, head_dim=32)
    policy, report = calibrate(pipe, ["red circle"], steps=4, call_kwargs=CALL, attention_target=0.5)
    assert list(policy.attention) == [f"transformer_blocks.{b}" for b in range(3)]
    assert all(f.n == 3 for f in policy.attention.values())  # steps 1..3
    errs = [a["mean_err"] for a in report["attention"]]
    assert all(0 < e < 0.2 for e in errs)
    assert policy.attention_target == 0.5 and policy.attention_tau == pytest.approx(policy.attention_tau_for(0.5))
    taus = [policy.attention_tau_table[f] for f in sorted(policy.attention_tau_table)]
    assert taus == sorted(taus) and "block attention" in cal.report_markdown(report)
    assert Policy.from_dict(policy.to_dict()).to_dict() == policy.to_dict()
    plain, _ = calibrate(tiny_cogvideox_pipeline(seed=0), ["red circle"], steps=3, call_kwargs=CALL)
    assert plain.attention == {} and "bf16 attention" in plain.describe()
