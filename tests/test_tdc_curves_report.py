"""benchmarks.tdc_curves' report: interpolation, the peer arena's points and margins, the redraw."""

from __future__ import annotations

import json

import pytest

from benchmarks import tdc_curves


def _pt(knob, skip, psnr):
    s = lambda m: {"mean": m, "std": 0.0, "n": 2}  # noqa: E731
    return {"knob": knob, "skip_fraction": s(skip), "psnr": s(psnr), "ssim": s(0.99), "adherence": s(90.0),
            "avg_act_bits": s(16.0)}


def _peers(path, steps):
    rows = {"fbc_0.2": ("fbc", 0.55, 41.0), "fbc_0.1": ("fbc", 0.75, 49.0), "pab_r3": ("pab", 0.5, 42.0),
            "baseline": ("baseline", 1.0, float("nan")), "torchao_int8": ("torchao_int8", 1.0, 51.0)}
    d = {"generation": {"num_inference_steps": steps}, "prompts": ["a"] * 12, "seeds": [0, 1],
         "environment": {"date": "today"},
         "rows": {k: {"label": k, "family": f, "summary": {"psnr": {"mean": p, "n": 2}, "computed_fraction":
                                                            {"mean": c}}} for k, (f, c, p) in rows.items()}}
    path.write_text(json.dumps(d))


def test_publish_compares_the_default_with_every_peer_cache_point_and_redraws(tmp_path):
    _peers(tmp_path / "peers_mini_20.json", 20)
    payload = {"generation": {"num_inference_steps": 20}, "prompts": ["a"] * 12, "seeds": 2,
               "variants": {"step": {"knob": "tdc_probe_threshold"}}, "default": "step",
               "fp32_adherence": {"mean": 90.0, "std": 0.0, "n": 2}, "environment": {"command": "x", "device": "cpu"},
               "results": {"step": [_pt(0.1, 0.3, 48.0), _pt(0.2, 0.5, 40.0)]}}
    md = tdc_curves.publish(payload, tmp_path / "c", None)
    assert payload["interpolated"]["step"] == {"30%": 48.0, "40%": 44.0, "50%": 40.0, "60%": None}
    fams = payload["peers"]["families"]
    assert set(fams) == {"fbc", "pab"}  # caches only; the baseline (∞) and quantization rows are left out
    assert [p["skip"] for p in fams["fbc"]] == pytest.approx([0.25, 0.45])
    # fbc 0.2 at 45 % skipped: the curve has 42.0 there (+1.0); pab at 50 %: 40.0 vs 42.0 (−2.0); fbc 0.1 outside
    assert "| fbc_0.2 | 0.450 | 41.00 | 42.00 | +1.00 |" in md
    assert "| pab_r3 | 0.500 | 42.00 | 40.00 | -2.00 |" in md
    assert "fbc_0.1" not in md
    if _has_matplotlib():
        assert (tmp_path / "c.png").stat().st_size > 0
    # the redraw reads the written JSON and whichever peers file is present now
    _peers(tmp_path / "peers_mini_20.json", 20)
    assert tdc_curves.main(["--redraw", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["peers"]["seeds"] == 2
    _peers(tmp_path / "peers_mini_20.json", 50)
    with pytest.raises(ValueError, match="50 steps, the curves have 20"):
        tdc_curves.main(["--redraw", str(tmp_path / "c.json")])


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_peer_file_with_fewer_cells_is_also_compared_on_exactly_its_cells():
    runs = lambda a, b: [{"prompt": "p1", "seed": 0, "psnr": a, "skip_fraction": 0.3},  # noqa: E731
                         {"prompt": "p2", "seed": 0, "psnr": b, "skip_fraction": 0.5}]
    payload = {"prompts": ["p1", "p2"], "seeds": 1,
               "results": {"step": [{**_pt(0.1, 0.4, 45.0), "runs": runs(50.0, 40.0)},
                                    {**_pt(0.2, 0.6, 35.0), "runs": runs(40.0, 30.0)}]}}
    pts = tdc_curves.on_cells(payload, "step", [["p1", 0]])
    assert [(p["skip_fraction"]["mean"], p["psnr"]["mean"]) for p in pts] == [(0.3, 50.0), (0.3, 40.0)]
    assert tdc_curves.on_cells(payload, "step", [["p1", 0], ["p2", 0]]) is None  # the same cells: nothing to add
    assert tdc_curves.on_cells(payload, "step", [["p3", 0]]) is None  # not a subset


def test_publish_before_the_default_variant_has_finished(tmp_path):
    """A sweep publishes after every finished variant; when the default comes later (session 12: the
    DMPQ-alone point of a full_step sweep finished first), the peer table says so instead of raising."""
    _peers(tmp_path / "peers_mini_20.json", 20)
    payload = {"generation": {"num_inference_steps": 20}, "prompts": ["a"] * 12, "seeds": 2,
               "variants": {}, "default": "step",
               "fp32_adherence": {"mean": 90.0, "std": 0.0, "n": 2}, "environment": {"command": "x", "device": "cpu"},
               "results": {"dmpq_only": _pt(None, 0.0, 35.0)}}
    md = tdc_curves.publish(payload, tmp_path / "c", str(tmp_path / "peers_mini_20.json"))
    assert "(the default variant 'step' has not finished yet)" in md


@pytest.mark.parametrize("variant", sorted(tdc_curves.VARIANTS))
def test_every_variant_makes_a_valid_config_with_its_rule_at_each_knob(variant):
    """A variant is the preset plus its fields: each knob value builds a config (no ConfigError) that carries them."""
    _, fields, knob, values = tdc_curves.VARIANTS[variant]
    for value in values:
        cfg = tdc_curves.variant_config(variant, value)
        for name, want in fields.items():
            assert getattr(cfg, name) == want, (variant, name)
        if knob != "scale":
            assert getattr(cfg, knob) == value
