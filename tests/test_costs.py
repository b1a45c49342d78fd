"""``sixbit.costs``: the step-time model the app reserves ZeroGPU time with."""

from __future__ import annotations

import pytest

from sixbit import costs

COGVIDEOX_2B = costs.TransformerShape(blocks=30, width=1920, ff_width=7680)
TOKENS_49x480x720 = 13 * 30 * 45 + 226  # 17,776


def test_the_model_reproduces_the_measured_h200_steps():
    """The two measured bf16 steps (2B 0.634 s, 5B 1.78 s per CFG-batched step) within 5 %."""
    assert costs.step_seconds(COGVIDEOX_2B, TOKENS_49x480x720, "NVIDIA H200") == pytest.approx(0.634, rel=0.05)
    assert costs.step_seconds(costs.COGVIDEOX_5B, TOKENS_49x480x720, "NVIDIA H200") == pytest.approx(1.78, rel=0.05)


def test_other_gpus_scale_by_rate_and_unknown_ones_err_long():
    h200 = costs.step_seconds(COGVIDEOX_2B, 5000, "NVIDIA H200")
    assert costs.step_seconds(COGVIDEOX_2B, 5000, "NVIDIA RTX PRO 6000 Blackwell Server Edition") == pytest.approx(2 * h200)
    slowest = min(costs.RELATIVE_RATE.values())
    assert costs.step_seconds(COGVIDEOX_2B, 5000, "Some Future GPU") == pytest.approx(h200 / slowest)
    assert costs.step_seconds(COGVIDEOX_2B, 5000, None) == pytest.approx(h200 / slowest)


def test_attention_is_quadratic_in_tokens():
    small, big = costs.step_flops(COGVIDEOX_2B, 1000), costs.step_flops(COGVIDEOX_2B, 2000)
    assert 2 < big / small < 4


def test_shape_from_a_real_transformer_config():
    from sixbit.testing import tiny_cogvideox_pipeline, tiny_wan_pipeline

    cog = tiny_cogvideox_pipeline(num_layers=3).transformer
    assert costs.TransformerShape.of(cog) == costs.TransformerShape(3, 32, 128)
    wan = tiny_wan_pipeline().transformer
    shape = costs.TransformerShape.of(wan)
    assert shape.ff_width == wan.config.ffn_dim and shape.blocks == wan.config.num_layers


def test_app_reserves_longer_for_bigger_requests_and_on_zerogpu(monkeypatch):
    import app

    monkeypatch.delenv("SIXBIT_GPU_NAME", raising=False)
    base = dict(frames=49, height=480, width=720, steps=50)
    monkeypatch.setenv("SIXBIT_GPU_NAME", "NVIDIA H200")
    on_h200 = app.gpu_duration(params=base, need_baseline=False)
    monkeypatch.setenv("SIXBIT_GPU_NAME", "NVIDIA RTX PRO 6000 Blackwell")
    on_pro6000 = app.gpu_duration(params=base, need_baseline=False)
    both = app.gpu_duration(params=base, need_baseline=True)
    assert 30 < on_h200 < on_pro6000 < both <= 300
    assert app.gpu_duration(params=dict(base, frames=9, height=240, width=360, steps=10)) <= 35
