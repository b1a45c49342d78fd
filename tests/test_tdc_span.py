"""Step mode's combined residual (``tdc_store="span"``): one residual per stream for the blocks that skip together
instead of a delta per block — the same output where the reuse is linear in the deltas, a fraction of the memory."""

from __future__ import annotations

import math

import pytest
import torch

import sixbit
from sixbit import SixBitConfig, SkipSchedule, tdc
from sixbit.testing import generate, tiny_cogvideox_pipeline, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

#: every step after the first three computed ones skips (a second-order forecast needs three deltas)
SKIP_AFTER_3 = dict(tdc_mode="step", tdc_probe_threshold=math.inf, tdc_first=3, tdc_last=0)


def _run(store: str, reuse: str, steps: int = 6, pipe_fn=tiny_cogvideox_pipeline, **kw):
    pipe = pipe_fn(seed=0, num_layers=4)
    kw.setdefault("tdc_regate", "off")  # a delta per block (tdc_regate="auto" would keep gated pieces there)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse=reuse, tdc_store=store, **kw))
    out = generate(pipe, num_inference_steps=steps)
    return out, handle


@pytest.mark.parametrize("reuse", ["last", "linear", "quadratic", "scaled"])
def test_span_returns_what_the_per_block_deltas_return_where_the_reuse_is_linear(reuse):
    """The forecast of the summed deltas is the sum of the blocks' forecasts (weights shared by every block):
    the same latents to fp32 rounding, the same skips; ``"auto"`` takes the span for these reuses."""
    ref, h_ref = _run("blocks", reuse)
    out, h = _run("span", reuse)
    auto, h_auto = _run("auto", reuse)
    skipped = [[b["tdc"] for b in s["blocks"]] for s in h_ref.trace.to_dict()["steps"]]
    assert skipped == [[b["tdc"] for b in s["blocks"]] for s in h.trace.to_dict()["steps"]]
    assert sum(r.count("compute") for r in skipped) < 4 * 6  # it skipped
    assert h_ref.trace.extra["tdc_store"] == {"cond_uncond": "blocks"}
    assert h.trace.extra["tdc_store"] == h_auto.trace.extra["tdc_store"] == {"cond_uncond": "span 1-3"}
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(auto, out)


def test_span_keeps_one_residual_per_stream_and_kept_order_not_one_per_block():
    """Mid-run (after the third computed step, second order): no span block holds a delta; the span holds three
    residuals per stream (R at steps 2, 1, 0), R = out of the last span block − in of the first; all freed after
    the last step."""
    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="quadratic", tdc_store="span"))
    blocks = pipe.transformer.transformer_blocks
    seen, calls = {}, []

    def spy(module, args, output):  # after the transformer call (and the hooks' post_forward)
        calls.append(1)
        if len(calls) == 3:
            seen["blocks"] = [h.state_manager.get_state().delta for h in handle.block_hooks]
            st = handle.span.state()
            seen["span"] = (st.delta, st.prev_delta, st.prev2_delta, st.last_step, st.prev_step, st.prev2_step)

    pipe.transformer.register_forward_hook(spy)
    ins, outs = [], []
    blocks[1].register_forward_pre_hook(lambda m, a, k: ins.append(k["hidden_states"].clone()), with_kwargs=True)
    blocks[3].register_forward_hook(lambda m, a, k, o: outs.append(o[0].clone()), with_kwargs=True)
    generate(pipe, num_inference_steps=6)
    assert seen["blocks"][0] is not None and all(d is None for d in seen["blocks"][1:])  # only the probe's
    delta, prev, prev2, *steps = seen["span"]
    assert steps == [2, 1, 0] and len(delta) == len(prev) == len(prev2) == 2
    torch.testing.assert_close(delta[0], outs[2] - ins[2])
    torch.testing.assert_close(prev2[0], outs[0] - ins[0])
    assert handle.span.state().delta is None and handle.span.state().span_input is None  # freed at the last step


def test_magnitude_on_the_span_extrapolates_the_combined_residual_s_size():
    """``"magnitude"`` is not linear in the deltas: ``"auto"`` keeps a delta per block for it, ``"span"`` scales
    R by its own size ratio (clamped, to the power of the step distance)."""
    _, h_auto = _run("auto", "magnitude")
    assert h_auto.trace.extra["tdc_store"] == {"cond_uncond": "blocks"}
    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
    sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="magnitude", tdc_store="span"))
    blocks = pipe.transformer.transformer_blocks
    ins, outs, firsts = [], [], []
    blocks[1].register_forward_pre_hook(lambda m, a, k: ins.append(k["hidden_states"].clone()), with_kwargs=True)
    blocks[1].register_forward_hook(lambda m, a, k, o: firsts.append(o[0].clone()), with_kwargs=True)
    blocks[3].register_forward_hook(lambda m, a, k, o: outs.append(o[0].clone()), with_kwargs=True)
    generate(pipe, num_inference_steps=6)
    r1, r2 = outs[2] - ins[2], outs[1] - ins[1]
    size = lambda t: t.abs().mean()  # noqa: E731
    for t in (3, 4, 5):
        ratio = (size(r1) / size(r2)).clamp(*tdc.MAGNITUDE_CLAMP) ** (t - 2)
        torch.testing.assert_close(firsts[t], ins[t] + r1 * ratio)
        torch.testing.assert_close(outs[t], firsts[t], rtol=0, atol=0)


def test_replayed_step_schedules_use_the_span_and_block_schedules_do_not(tmp_path):
    """A step-mode recording skips one contiguous span every skipped step (also resampled to another depth): its
    replay keeps the span and returns what the per-block replay does. A block-mode recording (blocks skip on their
    own) replays with a delta per block."""
    _, rec = _run("span", "quadratic", steps=6)
    sched = rec.trace.skip_schedule()
    # resampled to 7 blocks, block 1 reads the probe's column (nearest relative depth): the span starts at 2
    assert sched.span("cond_uncond") == (1, 3) and sched.resample(7).span("cond_uncond") == (2, 6)
    outs = {}
    for store in ("blocks", "span"):
        pipe = tiny_cogvideox_pipeline(seed=1, num_layers=4)
        h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_reuse="quadratic", tdc_store=store,
                                                   tdc_regate="off"), schedule=sched)
        outs[store] = generate(pipe, num_inference_steps=6)
        assert h.trace.to_dict()["summary"]["schedule_overrides"] == 0
        assert h.trace.extra["tdc_store"] == {"cond_uncond": "blocks" if store == "blocks" else "span 1-3"}
    torch.testing.assert_close(outs["span"], outs["blocks"], rtol=1e-5, atol=1e-5)
    mixed = SkipSchedule(4, 3, {"cond_uncond": [[True] * 4, [True, False, True, False], [True, False, False, True]]})
    assert mixed.span("cond_uncond") is None
    assert SkipSchedule(4, 2, {"c": [[True] * 4] * 2}).span("c") == (1, 3)  # nothing skipped: a live run's span
    pipe = tiny_cogvideox_pipeline(seed=1, num_layers=4)
    h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_store="auto"), schedule=mixed)
    generate(pipe, num_inference_steps=3)
    assert h.trace.extra["tdc_store"] == {"cond_uncond": "blocks"}


def test_span_state_is_per_branch_and_reset_between_calls_and_shapes():
    """Wan runs CFG as two calls per step ("cond", "uncond"): each branch has its own span state; a second call
    with other shapes starts clean (the span's residual of the first call never reaches it)."""
    out, h = _run("span", "linear", pipe_fn=tiny_wan_pipeline)
    ref, _ = _run("blocks", "linear", pipe_fn=tiny_wan_pipeline)
    assert h.trace.extra["tdc_store"] == {"cond": "span 1-3", "uncond": "span 1-3"}
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
    cfg = SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="linear", tdc_store="span")
    h = sixbit.apply(pipe, cfg)
    generate(pipe, num_inference_steps=6)
    fresh = tiny_cogvideox_pipeline(seed=0, num_layers=4)
    sixbit.apply(fresh, cfg)
    for p in (pipe, fresh):  # another frame count: another shape
        outs = generate(p, num_inference_steps=6, num_frames=5)
    torch.testing.assert_close(generate(pipe, num_inference_steps=6, num_frames=5), outs, rtol=0, atol=0)


def test_span_store_needs_step_mode_and_block_scope():
    for bad in (dict(tdc_mode="block"), dict(tdc_scope="attention", tdc_reuse="last")):
        with pytest.raises(sixbit.config.ConfigError, match="tdc_store='span'"):
            SixBitConfig.preset("tdc_only", tdc_store="span", **bad)
    with pytest.raises(sixbit.config.ConfigError, match="tdc_store"):
        SixBitConfig(tdc_store="one")
    assert tdc.live_span(SixBitConfig(tdc_tail=1), 30) == (1, 28) and tdc.live_span(SixBitConfig(tdc_tail=29), 30) is None
    assert not tdc.uses_span(SixBitConfig.preset("tdc_attn"), 20) and not tdc.uses_span(SixBitConfig(tdc=False), 50)
    assert tdc.uses_span(SixBitConfig(), 50) and not tdc.uses_span(SixBitConfig(), 20)  # quadratic / magnitude


def test_the_full_method_on_the_span_routes_and_returns_what_it_does_with_a_delta_per_block():
    """DMPQ + PDR + 8-bit attention by policy read Γ and the outlier counts, never a block's kept delta: with the
    span the full method takes the same routes and returns the same latents to fp32 rounding."""
    outs, modes = {}, {}
    for store in ("blocks", "span"):
        pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
        h = sixbit.apply(pipe, SixBitConfig.preset("full", policy=None, **SKIP_AFTER_3, tdc_reuse="quadratic",
                                                   tdc_store=store, tdc_regate="off"))
        outs[store] = generate(pipe, num_inference_steps=8)
        steps = h.trace.to_dict()["steps"]
        modes[store] = [([b["mode"] for b in s["blocks"]], s["routes"]) for s in steps]
    assert modes["span"] == modes["blocks"]
    torch.testing.assert_close(outs["span"], outs["blocks"], rtol=1e-5, atol=1e-5)
