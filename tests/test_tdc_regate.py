"""``tdc_regate``: a skippable block keeps its update as gated pieces (CogVideoX: attention and MLP outputs per
stream before their gates; Wan: self-attention, cross-attention, MLP) and a skip recomposes them with the skipped
step's own gates — tested against the blocks' own arithmetic, not against sixbit's adapter functions."""

from __future__ import annotations

import math

import pytest
import torch

import sixbit
from sixbit import SixBitConfig, tdc
from sixbit.adapters import COGVIDEOX, WAN
from sixbit.config import ConfigError
from sixbit.testing import generate, tiny_cogvideox_pipeline, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

#: steps 0-2 computed, every later one skipped but the last (a magnitude forecast needs two computed pieces)
SKIP_AFTER_3 = dict(tdc_mode="step", tdc_probe_threshold=math.inf, tdc_first=3, tdc_last=1)


def _spy_block(block, calls: list):
    """Record each call's (input args, kwargs, output) of ``block`` (outside the sixbit hooks: what the model sees)."""
    def clone(v):
        return v.clone() if isinstance(v, torch.Tensor) else v

    def hook(module, args, kwargs, output):
        calls.append((tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()},
                      tuple(o.clone() for o in output) if isinstance(output, tuple) else output.clone()))
    block.register_forward_hook(hook, with_kwargs=True)


def _spy_output(module, outs: list):
    module.register_forward_hook(lambda m, a, o: outs.append(tuple(x.clone() for x in o) if isinstance(o, tuple)
                                                             else o.clone()))


@pytest.mark.parametrize("reuse", ["last", "magnitude"])
def test_a_skipped_cogvideox_block_is_its_last_pieces_under_this_step_s_gates(reuse):
    """Block 2 at a skipped step t returns ``h + g₁(t)·Â + g₂(t)·F̂`` (and the same on the text stream with the
    text gates), the gates from the block's own ``norm1``/``norm2`` at t, ``Â``/``F̂`` its attention / MLP outputs
    of the last computed step (2), or for ``"magnitude"`` each one scaled by its own size ratio to step 1's."""
    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
    h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse=reuse, tdc_regate="on"))
    block = pipe.transformer.transformer_blocks[2]
    calls, attn, ff = [], [], []
    _spy_block(block, calls)
    _spy_output(block.attn1, attn)
    _spy_output(block.ff, ff)
    generate(pipe, num_inference_steps=7)
    assert h.trace.extra["tdc_regate"] == {"cond_uncond": True}
    assert [s["blocks"][2]["tdc"] for s in h.trace.to_dict()["steps"]] == (
        ["compute"] * 3 + ["forecast" if reuse == "magnitude" else "reuse"] * 3 + ["compute"])
    assert len(attn) == len(ff) == 4  # steps 0, 1, 2 and 6: a skip runs neither
    text = calls[0][1]["encoder_hidden_states"].shape[1]
    pieces = {s: [attn[s][0], attn[s][1], ff[s][:, text:], ff[s][:, :text]] for s in (1, 2)}
    size = lambda t: t.abs().mean()  # noqa: E731
    for t in (3, 4, 5):
        _, kw, (out_h, out_e) = calls[t]
        hs, enc, temb = kw["hidden_states"], kw["encoder_hidden_states"], kw["temb"]
        _, _, g_msa, eg_msa = block.norm1(hs, enc, temb)
        _, _, g_ff, eg_ff = block.norm2(hs, enc, temb)  # the gates do not depend on the input
        p = pieces[2]
        if reuse == "magnitude":
            p = [a * ((size(a) / size(b)).clamp(*tdc.MAGNITUDE_CLAMP) ** (t - 2)) for a, b in zip(p, pieces[1])]
        torch.testing.assert_close(out_h, hs + g_msa * p[0] + g_ff * p[2])
        torch.testing.assert_close(out_e, enc + eg_msa * p[1] + eg_ff * p[3])


def test_recomposing_the_pieces_with_their_own_gates_is_the_block_s_output_cogvideox_and_wan():
    """What a regated block keeps after a computed step, recomposed with that step's gates, is the block's output
    of that step (the pieces and gates cover the whole update, in the right streams); the probe keeps its delta."""
    for pipe_fn, adapter, blocks in ((tiny_cogvideox_pipeline, COGVIDEOX, "transformer_blocks"),
                                     (tiny_wan_pipeline, WAN, "blocks")):
        pipe = pipe_fn(seed=0, num_layers=3)
        h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_regate="on"))
        block = getattr(pipe.transformer, blocks)[1]
        calls, seen = [], []
        _spy_block(block, calls)

        def spy(module, args, output, h=h, seen=seen):  # the transformer's first call (step 0; Wan: "cond")
            if not seen:
                seen.append([hk.state_manager.get_state().delta for hk in h.block_hooks])

        pipe.transformer.register_forward_hook(spy)
        generate(pipe, num_inference_steps=4)
        probe, pieces, tail = seen[0]
        args, kw, out = calls[0]
        streams = adapter.streams_in(block, args, kw)
        assert len(pieces) == len(adapter.piece_streams) and len(probe) == len(streams)
        assert all(p.shape == streams[i].shape for p, i in zip(pieces, adapter.piece_streams))
        before = [s.clone() for s in streams]
        back = adapter.recompose(streams, pieces, adapter.gates(block, args, kw))
        torch.testing.assert_close(adapter.rebuild(back), out, rtol=1e-5, atol=1e-5)
        assert all(torch.equal(s, b) for s, b in zip(streams, before))  # later pieces add in place: not the input
        assert h.trace.extra["tdc_regate"] == ({"cond_uncond": True} if adapter is COGVIDEOX
                                               else {"cond": True, "uncond": True})


def _constant_timestep_embedding(pipe):
    """Every call sees the first call's timestep embedding: every gate is the same at every step."""
    saved = {}
    if type(pipe.transformer).__name__.startswith("CogVideoX"):
        def hook(module, args, output):
            return saved.setdefault("temb", output)
        pipe.transformer.time_embedding.register_forward_hook(hook)
    else:
        def hook(module, args, output):
            return (output[0], saved.setdefault("proj", output[1]), *output[2:])
        pipe.transformer.condition_embedder.register_forward_hook(hook)


@pytest.mark.parametrize("pipe_fn", [tiny_cogvideox_pipeline, tiny_wan_pipeline])
def test_with_gates_that_do_not_move_regating_returns_what_the_block_delta_does(pipe_fn):
    """Σ gate·piece is the block's delta when the gates are the computed step's: with a timestep embedding held
    constant the regated run returns the per-block run's latents (CogVideoX's batched CFG, Wan's two branches —
    a piece shared between "cond" and "uncond" would break it), and with the real one it does not."""
    outs = {}
    for name, regate, const in (("delta", "off", True), ("regate", "on", True), ("moving", "on", False)):
        pipe = pipe_fn(seed=0, num_layers=3)
        if const:
            _constant_timestep_embedding(pipe)
        cfg = SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="last", tdc_store="blocks",
                                  tdc_regate=regate)
        h = sixbit.apply(pipe, cfg)
        outs[name] = generate(pipe, num_inference_steps=6)
        assert h.trace.to_dict()["summary"]["skip_fraction"] > 0.2  # steps 3-4 of 6, blocks 1-2 of 3
    torch.testing.assert_close(outs["regate"], outs["delta"], rtol=1e-5, atol=1e-5)
    ref = pipe_fn(seed=0, num_layers=3)
    sixbit.apply(ref, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="last", tdc_store="blocks",
                                          tdc_regate="off"))
    assert not torch.allclose(outs["moving"], generate(ref, num_inference_steps=6), rtol=1e-4, atol=1e-4)


def test_memory_pieces_per_block_sizes_for_the_magnitude_history_freed_at_the_end():
    """Mid-run a regated block holds its four pieces and, for ``"magnitude"``, only the earlier pieces' sizes (0-d);
    a per-block delta under ``"magnitude"`` keeps its earlier delta's sizes only too; all freed after the last step."""
    for regate in ("on", "off"):
        pipe = tiny_cogvideox_pipeline(seed=0, num_layers=3)
        h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="magnitude",
                                                   tdc_store="blocks", tdc_regate=regate))
        seen, calls = {}, []

        def spy(module, args, output, h=h, seen=seen, calls=calls):
            calls.append(1)
            if len(calls) == 3:
                st = h.block_hooks[1].state_manager.get_state()
                seen["held"] = (st.delta, st.prev_delta)
            if len(calls) == 5:  # after the last step
                seen["end"] = [hk.state_manager.get_state().delta for hk in h.block_hooks]

        pipe.transformer.register_forward_hook(spy)
        generate(pipe, num_inference_steps=5)
        delta, prev = seen["held"]
        assert len(delta) == (4 if regate == "on" else 2) and all(d.dim() == 3 for d in delta)
        assert len(prev) == len(delta) and all(p.dim() == 0 and p.dtype == torch.float32 for p in prev)
        assert seen["end"] == [None] * 3


@pytest.mark.parametrize("regate", ["on", "off"])
def test_magnitude_measures_each_kept_tensor_once_however_many_skips_reuse_it(regate, monkeypatch):
    """``"magnitude"``'s size of a held delta (or piece) is measured once — by the first skip that reads it, and kept
    for the next computed step's shift — not again at every skip: three skips reuse step 2's pieces here; each
    tensor ever measured is measured once, and the skips' outputs are those of the formula (the first test)."""
    measured, l1 = [], tdc.l1_size

    def spy(t):
        if t.dim():
            measured.append(t)  # held: no id is reused while the list lives
        return l1(t)

    monkeypatch.setattr(tdc, "l1_size", spy)
    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
    h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **SKIP_AFTER_3, tdc_reuse="magnitude",
                                               tdc_store="blocks", tdc_regate=regate))
    generate(pipe, num_inference_steps=7)
    assert [s["blocks"][2]["tdc"] for s in h.trace.to_dict()["steps"]][3:6] == ["forecast"] * 3
    assert measured and len({id(t) for t in measured}) == len(measured)


def test_auto_regates_where_step_mode_keeps_a_delta_per_block_and_not_on_the_span():
    """``"auto"``: on for the 20-step ``"magnitude"`` default (a delta per block), off where the span is kept
    (the forecast from ``tdc_forecast_steps``), off in block mode; ``"on"`` keeps a delta per block instead of
    the span ``tdc_store="auto"`` would take."""
    cases = [(dict(), True, "blocks"),
             (dict(tdc_forecast_steps=4), False, "span 1-3"),
             (dict(tdc_forecast_steps=4, tdc_regate="on"), True, "blocks"),
             (dict(tdc_mode="block"), False, "blocks")]
    for kw, regated, store in cases:
        pipe = tiny_cogvideox_pipeline(seed=0, num_layers=4)
        h = sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **{**dict(tdc_first=2), **kw}))
        generate(pipe, num_inference_steps=4)
        assert h.trace.extra["tdc_regate"] == {"cond_uncond": regated}, kw
        assert h.trace.extra["tdc_store"] == {"cond_uncond": store}, kw


@pytest.mark.parametrize("fields", [dict(tdc_mode="block"), dict(tdc_scope="attention"), dict(tdc_store="span")])
def test_regate_on_where_it_cannot_apply_is_an_error_naming_the_fields(fields):
    with pytest.raises(ConfigError, match="tdc_regate"):
        SixBitConfig.preset("tdc_only", tdc_regate="on", **fields)
