"""Metrics on synthetic videos whose answers are known in closed form."""

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter, shift

from sixbit import metrics


def _texture(h=64, w=64, seed=0):
    rng = np.random.default_rng(seed)
    img = gaussian_filter(rng.random((h, w)), 2.0)
    img = (img - img.min()) / (img.max() - img.min())
    return np.repeat(img[..., None], 3, axis=-1)


def _moving(dx=2.0, t=5, seed=0):
    """A smooth texture translated by dx px per frame (wrap-around), float in [0, 1]."""
    base = _texture(seed=seed)
    return np.stack([shift(base, (0, dx * i, 0), mode="grid-wrap", order=3) for i in range(t)]).clip(0, 1)


def test_psnr_known_value_and_identity():
    a = np.full((2, 8, 8, 3), 0.5)
    b = a + 0.1  # MSE = 0.01 -> 20 dB
    assert metrics.psnr(b, a) == pytest.approx(20.0)
    assert metrics.psnr(a, a) == math.inf


def test_uint8_and_float_agree():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    b = rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    assert metrics.psnr(a, b) == pytest.approx(metrics.psnr(a / 255.0, b / 255.0))
    assert metrics.ssim(a, b) == pytest.approx(metrics.ssim(a / 255.0, b / 255.0))


def test_ssim_identity_and_degradation():
    v = _moving(t=3)
    assert metrics.ssim(v, v) == pytest.approx(1.0)
    rng = np.random.default_rng(2)
    small = np.clip(v + rng.normal(0, 0.02, v.shape), 0, 1)
    large = np.clip(v + rng.normal(0, 0.2, v.shape), 0, 1)
    assert 1.0 > metrics.ssim(small, v) > metrics.ssim(large, v) > 0.0


def test_temporal_flicker():
    static = np.repeat(_texture()[None], 4, axis=0)
    assert metrics.temporal_flicker(static) == 0.0
    blink = static.copy()
    blink[1::2] = np.clip(blink[1::2] + 0.1, 0, 1.0)
    f = metrics.temporal_flicker(blink)
    assert 0.05 < f <= 0.1 + 1e-9
    assert metrics.temporal_flicker(static[:1]) == 0.0


def test_flow_measures_translation():
    v = _moving(dx=2.0)
    flow = metrics.optical_flow(v)
    assert flow.shape == (4, 64, 64, 2)
    inner = flow[:, 8:-8, 8:-8]  # away from the wrap-around seam
    assert np.median(inner[..., 0]) == pytest.approx(2.0, abs=0.25)
    assert abs(np.median(inner[..., 1])) < 0.25
    assert metrics.flow_score(v) == pytest.approx(2.0, abs=0.5)
    static = np.repeat(v[:1], 5, axis=0)
    assert metrics.flow_score(static) < 0.02  # Farnebäck leaves ~0.003 px of numerical noise


def test_flow_error_vs_baseline():
    v = _moving(dx=2.0)
    assert metrics.flow_error(v, v) == 0.0
    static = np.repeat(v[:1], 5, axis=0)
    assert metrics.flow_error(static, v) == pytest.approx(2.0, abs=0.5)


def test_compare_keys_and_consistency():
    v = _moving(dx=1.0)
    w = np.clip(v + 0.01, 0, 1)
    out = metrics.compare(w, v)
    assert set(out) == {"psnr_db", "ssim", "flicker", "flicker_ref", "flow_score", "flow_score_ref", "flow_error"}
    assert out["psnr_db"] == pytest.approx(metrics.psnr(w, v))
    assert out["flow_error"] == pytest.approx(metrics.flow_error(w, v))
    assert out["flow_score_ref"] == pytest.approx(metrics.flow_score(v))


def test_shape_and_type_errors():
    with pytest.raises(ValueError, match="differ in shape"):
        metrics.psnr(np.zeros((2, 8, 8, 3)), np.zeros((2, 8, 10, 3)))
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\]"):
        metrics.psnr(np.zeros((8, 8, 3)), np.zeros((8, 8, 3)))
    with pytest.raises(TypeError):
        metrics.ssim(np.zeros((1, 8, 8, 3), np.int32), np.zeros((1, 8, 8, 3), np.int32))
    with pytest.raises(ValueError, match="NaN"):
        metrics.psnr(np.full((1, 8, 8, 3), np.nan), np.zeros((1, 8, 8, 3)))
