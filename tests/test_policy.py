"""Policy files (versioned JSON, validated on load) and SixBitConfig (presets, validation, help)."""

from __future__ import annotations

import json
import math
import re

import pytest

import sixbit
from sixbit.config import PRESETS, ConfigError, SixBitConfig
from sixbit.policy import LinearFit, Policy, PolicyError
from sixbit.testing import tiny_cogvideox_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


def _policy() -> Policy:
    return Policy(
        linears={"transformer_blocks.0.attn1.to_q": LinearFit(0.5, 0.01, 0.9, 12),
                 "transformer_blocks.0.ff.net.2": LinearFit(-0.25, 0.2, None, 12)},
        tau=0.05, model="tiny", target_bits=6.0, tau_table={4.5: 0.3, 6.0: 0.05, 8.0: 0.0}, hadamard_block=64,
        r2_overall=0.7, meta={"steps": 4}, pdr_rho=2.5e-3, pdr_k_sigma=8.0, pdr_quantile=0.95, pdr_n=40,
    )


def test_policy_round_trip(tmp_path):
    p = _policy()
    path = p.save(tmp_path / "p.json")
    q = Policy.load(path)
    assert q.to_dict() == p.to_dict()
    assert q.fit("transformer_blocks.0.attn1.to_q").predict(0.1) == pytest.approx(0.06)
    assert q.tau_for_bits(6.0) == pytest.approx(0.05)
    assert q.tau_for_bits(7.0) == pytest.approx(0.025)  # linear between the table points
    assert q.tau_for_bits(4.0) == 0.3 and q.tau_for_bits(9.0) == 0.0
    assert (q.pdr_rho, q.pdr_k_sigma, q.pdr_quantile, q.pdr_n) == (2.5e-3, 8.0, 0.95, 40)
    # a policy without PDR data (older files) still loads, and writes none
    d = p.to_dict()
    d.pop("pdr")
    old = Policy.from_dict(d)
    assert old.pdr_rho is None and "pdr" not in old.to_dict()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="other"), "format: expected 'sixbit-policy'"),
        (lambda d: d.update(version=2), "version: this sixbit reads policy version 1, got 2"),
        (lambda d: d.pop("tau"), "tau: expected a finite number, got None"),
        (lambda d: d.update(tau="0.1"), "tau: expected a finite number"),
        (lambda d: d["linears"]["transformer_blocks.0.attn1.to_q"].update(alpha="x"),
         re.escape("linears['transformer_blocks.0.attn1.to_q'].alpha: expected a finite number, got 'x'")),
        (lambda d: d["linears"]["transformer_blocks.0.ff.net.2"].pop("beta"),
         re.escape("linears['transformer_blocks.0.ff.net.2'].beta: expected a finite number, got None")),
        (lambda d: d["linears"]["transformer_blocks.0.ff.net.2"].update(n=-1), r"\.n: expected an integer >= 0"),
        (lambda d: d.update(linears={}), "linears: expected a non-empty object"),
        (lambda d: d.update(linears=[1, 2]), "linears: expected a non-empty object"),
        (lambda d: d.update(tau_table={"six": 0.1}), "tau_table: key 'six' is not a number"),
        (lambda d: d.update(tau_table={"6": None}), r"tau_table\['6'\]: expected a finite number"),
        (lambda d: d.update(hadamard_block=1.5), "hadamard_block: expected an integer"),
        (lambda d: d.update(gamma_stream="text"), "gamma_stream: only 'hidden'"),
        (lambda d: d.update(meta=[]), "meta: expected an object"),
        (lambda d: d.update(pdr=0.1), "pdr: expected an object"),
        (lambda d: d["pdr"].update(rho=2.0), r"pdr.rho: expected a fraction in \[0, 1\], got 2.0"),
        (lambda d: d["pdr"].pop("k_sigma"), "pdr.k_sigma: expected a finite number, got None"),
    ],
)
def test_corrupt_policy_gives_a_clear_error(tmp_path, mutate, message):
    d = _policy().to_dict()
    mutate(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(PolicyError, match=message) as e:
        Policy.load(path)
    assert str(path) in str(e.value)


def test_unreadable_policies(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "sixbit-policy", "version": 1, "tau": 0.1,')
    with pytest.raises(PolicyError, match="not valid JSON"):
        Policy.load(bad)
    bad.write_text('{"format": "sixbit-policy", "version": 1, "tau": NaN, "linears": {"a": {"alpha": 1, "beta": 0}}}')
    with pytest.raises(PolicyError, match="tau: expected a finite number, got nan"):
        Policy.load(bad)
    with pytest.raises(PolicyError, match="cannot read policy file"):
        Policy.load(tmp_path / "missing.json")
    with pytest.raises(PolicyError, match="top level"):
        Policy.from_dict([1])


def test_policy_missing_a_layer_is_refused_at_apply(tmp_path):
    pipe = tiny_cogvideox_pipeline(seed=0)
    path = _policy().save(tmp_path / "p.json")
    with pytest.raises(PolicyError, match=r"no entry for layer 'transformer_blocks.0.attn1.to_k'"):
        sixbit.apply(pipe, SixBitConfig.preset("balanced", policy=str(path)))
    # nothing was changed by the refused apply
    assert not hasattr(pipe.transformer, "_sixbit_handle")
    sixbit.apply(pipe, "off").remove()


def test_presets_and_ablation_switches():
    assert set(PRESETS) >= {"off", "balanced", "aggressive", "dmpq_only", "tdc_only", "dmpq_tdc", "full", "w4a4", "w8a8"}
    off = SixBitConfig.preset("off")
    assert not off.quantized and not off.tdc and not off.pdr
    full = SixBitConfig.preset("full")
    assert full.quant == "dmpq" and full.tdc and full.pdr
    assert SixBitConfig.preset("DMPQ+TDC").pdr is False  # names are forgiving
    assert SixBitConfig.preset("tdc_only").quant == "off"
    assert SixBitConfig.preset("dmpq_only").tdc is False
    w8 = SixBitConfig.preset("w8a8")
    assert w8.weight_formats == ("int8",) and not w8.tdc and w8.warmup_steps == 0
    assert SixBitConfig.preset("balanced", int8_route="w8a8").weight_formats == ("nvfp4", "int8")
    assert SixBitConfig.preset("aggressive").target_bits < SixBitConfig.preset("balanced").target_bits
    assert SixBitConfig.preset("balanced", tdc_first=5).tdc_first == 5
    assert SixBitConfig.from_dict(full.to_dict()) == full


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(quant="int4"), "SixBitConfig.quant must be one of"),
        (dict(pdr_rho=2.0), "SixBitConfig.pdr_rho must be <= 1.0"),
        (dict(tdc_budget=-1.0), "SixBitConfig.tdc_budget must be >= 0.0"),
        (dict(hadamard_block=48), "SixBitConfig.hadamard_block must be one of"),
        (dict(tau=math.nan), "SixBitConfig.tau must be finite"),
        (dict(nonsense=1), "unknown SixBitConfig field"),
    ],
)
def test_config_validation(kw, message):
    with pytest.raises((ConfigError, TypeError), match=message):
        SixBitConfig.preset("balanced", **kw) if "nonsense" not in kw else SixBitConfig().replace(**kw)
    with pytest.raises(ConfigError, match="unknown preset"):
        SixBitConfig.preset("turbo")


def test_every_field_has_help_text():
    fields = SixBitConfig.fields_help()
    assert {f["name"] for f in fields} >= {"tau", "target_bits", "tdc_threshold", "tdc_budget", "pdr_rho",
                                           "warmup_steps", "tdc_first", "tdc_last", "hadamard_block"}
    for f in fields:
        assert len(f["help"]) > 20, f["name"]
    assert next(f for f in fields if f["name"] == "quant")["choices"] == ("off", "dmpq", "w4a4", "w4a8", "w8a8")


def test_shipped_sixbit_mini_policy_loads_and_matches_the_model():
    from sixbit.calibrate import transformer_fingerprint
    from sixbit.engine import POLICY_DIR

    path = POLICY_DIR / "sixbit-mini.json"
    try:
        from sixbit.mini import MINI_PATH
    except ImportError:
        pytest.skip("sixbit-mini is not in this checkout")
    if not path.exists():
        pytest.skip("no shipped policy yet")
    pol = Policy.load(path)
    assert pol.meta["transformer_sha256"] == transformer_fingerprint(MINI_PATH), (
        "assets/policies/sixbit-mini.json was calibrated on other weights: re-run the command in its meta")
    assert pol.linears and pol.target_bits == 6.0
    assert pol.pdr_rho is not None and pol.pdr_k_sigma == SixBitConfig().pdr_k_sigma  # ρ measured for this model
    assert path.with_suffix(".md").exists()


def test_policy_attention_fits_round_trip_and_older_files_run_bf16_attention(tmp_path):
    p = _policy()
    d = p.to_dict()
    assert "attention" not in d and Policy.from_dict(d).attention_tau_for(0.75) is None  # an older file
    assert "no attention fit: bf16 attention" in Policy.from_dict(d).describe()
    p.attention = {"transformer_blocks.0": LinearFit(0.5, 0.02, 0.8, 12)}
    p.attention_tau, p.attention_target, p.attention_tau_table = 0.05, 0.75, {0.5: 0.04, 1.0: 0.08}
    q = Policy.load(p.save(tmp_path / "a.json"))
    assert q.to_dict() == p.to_dict() and "attention fits for 1 blocks" in q.describe()
    assert q.attention_fit("transformer_blocks.0").predict(0.1) == pytest.approx(0.07)
    assert q.attention_fit("transformer_blocks.1") is None
    assert q.attention_tau_for(None) == 0.05 and q.attention_tau_for(0.75) == pytest.approx(0.06)
    bad = q.to_dict()
    bad["attention"]["blocks"]["transformer_blocks.0"]["beta"] = "x"
    with pytest.raises(PolicyError, match=re.escape("attention.blocks['transformer_blocks.0'].beta")):
        Policy.from_dict(bad)
    bad["attention"] = [1]
    with pytest.raises(PolicyError, match="attention: expected an object"):
        Policy.from_dict(bad)
