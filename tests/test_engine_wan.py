"""sixbit on a tiny random Wan 2.1-style pipeline: separate CFG calls, one token stream per block."""

from __future__ import annotations

import json
import math

import pytest
import torch

import sixbit
from sixbit import SixBitConfig
from sixbit.testing import generate, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


def test_wan_apply_trace_and_round_trip():
    pipe = tiny_wan_pipeline(seed=0)
    ref = generate(pipe)
    cfg = SixBitConfig.preset("balanced", policy=None, tdc_mode="block", tdc_threshold=math.inf, tdc_budget=math.inf, tdc_first=1)
    handle = sixbit.apply(pipe, cfg)
    names = handle.linear_names
    assert names[:4] == ["blocks.0.attn1.to_q", "blocks.0.attn1.to_k", "blocks.0.attn1.to_v", "blocks.0.attn1.to_out.0"]
    assert "blocks.0.attn2.to_k" in names and "blocks.0.ffn.net.2" in names and len(names) == 2 * 10
    out = generate(pipe, num_inference_steps=6)
    assert out.shape == ref.shape and not torch.equal(out, ref)
    d = json.loads(json.dumps(handle.trace.to_dict(), allow_nan=False))
    assert d["config"]["family"] == "wan" and d["config"]["cfg_batching"] == "separate"
    assert len(d["steps"]) == 6
    for s in d["steps"]:
        # CFG runs as two calls: two cache contexts with their own state, both in the trace
        assert s["branch"] == "cond" and list(s["other_branches"]) == ["uncond"]
        unc = s["other_branches"]["uncond"]
        assert len(unc["blocks"]) == 2 and len(unc["routes"]) == len(names)
    counts = d["summary"]["route_counts"]
    assert sum(counts.values()) == 6 * len(names) * 2
    assert counts["skipped"] > 0 and d["summary"]["skip_fraction"] > 0
    handle.remove()
    assert torch.equal(generate(pipe), ref)


def test_wan_forced_skip_single_stream_is_exact():
    pipe = tiny_wan_pipeline(seed=1)
    cfg = SixBitConfig.preset("tdc_only", tdc_mode="block", tdc_threshold=math.inf, tdc_budget=math.inf, tdc_first=0, tdc_last=0)
    sixbit.apply(pipe, cfg)
    calls = []
    block = pipe.transformer.blocks[0]
    block.register_forward_hook(lambda m, a, out: calls.append((a[0].clone(), out.clone())))
    generate(pipe, num_inference_steps=4)
    # calls alternate cond, uncond per step; steps 0-1 compute, 2-3 skip with each branch's own delta
    assert len(calls) == 8
    for branch in (0, 1):
        x1, y1 = calls[2 + branch]
        delta = y1 - x1
        for step in (2, 3):
            x, y = calls[2 * step + branch]
            assert torch.equal(y, x + delta)


def test_wan_step_mode_decides_each_branch_with_its_own_probe():
    pipe = tiny_wan_pipeline(seed=1)
    cfg = SixBitConfig.preset("tdc_only", tdc_mode="step", tdc_reuse="linear", tdc_probe_threshold=math.inf,
                              tdc_first=0, tdc_last=0)
    handle = sixbit.apply(pipe, cfg)
    calls = []
    block = pipe.transformer.blocks[1]
    block.register_forward_hook(lambda m, a, out: calls.append((a[0].clone(), out.clone())))
    generate(pipe, num_inference_steps=4)
    d = handle.trace.to_dict()
    for s in d["steps"][1:]:
        for br in (s, s["other_branches"]["uncond"]):
            assert [b["tdc"] for b in br["blocks"]] == ["probe_skip", "forecast"]
    # block 1 forecasts from each branch's own deltas (steps 0 only: the forecast is that delta)
    for branch in (0, 1):
        x0, y0 = calls[branch]
        for step in (1, 2, 3):
            x, y = calls[2 * step + branch]
            assert torch.equal(y, x + (y0 - x0))
