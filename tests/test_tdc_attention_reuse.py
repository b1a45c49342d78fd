"""TDC's attention scope (``tdc_scope="attention"``): a skipped cell runs its block with the cached attention output."""

from __future__ import annotations

import math

import pytest
import torch

import sixbit
from sixbit import SixBitConfig, SkipSchedule, tdc
from sixbit.config import ConfigError
from sixbit.testing import generate, tiny_cogvideox_pipeline, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

#: every step after the probe's first reference skips (steps 0 and 1 compute with tdc_first=2)
FORCE = dict(tdc_probe_threshold=math.inf, tdc_first=0, tdc_last=0, warmup_steps=0)


def _record(module, calls: list, clone_in: bool = False):
    """Append every call's (input stream 0, outputs) of ``module`` (torch hooks run around the diffusers hooks)."""
    def post(mod, args, kwargs, out):
        outs = tuple(o.clone() for o in out) if isinstance(out, tuple) else (out.clone(),)
        x = (kwargs.get("hidden_states", args[0] if args else None))
        calls.append({"in": x.clone() if clone_in and x is not None else None, "out": outs})
    return module.register_forward_hook(post, with_kwargs=True)


def _count(module) -> list[int]:
    n = [0]
    module.register_forward_hook(lambda *a: n.__setitem__(0, n[0] + 1))
    return n


def test_reused_attention_is_the_cached_output_and_the_mlp_runs_on_the_fresh_input():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_attn", **FORCE))
    block = pipe.transformer.transformer_blocks[1]
    attn, blk = [], []
    _record(block.attn1, attn)
    _record(block, blk, clone_in=True)
    q_calls, probe_q, ff_calls = _count(block.attn1.to_q), _count(pipe.transformer.transformer_blocks[0].attn1.to_q), \
        _count(block.ff)
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    assert [s["blocks"][1]["tdc"] for s in d["steps"]] == ["compute"] + ["attn_reuse"] * 4
    assert all(s["blocks"][0]["tdc"] in ("probe_compute", "probe_skip") for s in d["steps"])
    for c in attn[1:]:  # the attention returned exactly what step 0 computed, both streams
        assert len(c["out"]) == 2 and all(torch.equal(o, r) for o, r in zip(c["out"], attn[0]["out"]))
    assert q_calls[0] == 1 and probe_q[0] == 5  # the reused attention's projections did not run; the probe's did
    assert ff_calls[0] == 5  # the MLP ran at every step …
    delta0 = blk[0]["out"][0] - blk[0]["in"]
    for c in blk[1:]:  # … on the fresh input: the block is not in + Δ (what a whole-block skip returns)
        assert not torch.allclose(c["out"][0] - c["in"], delta0, atol=1e-6)
    summ = d["summary"]
    assert summ["skip_fraction"] == pytest.approx(8 / 15)  # blocks 1, 2 at steps 1-4: their attention calls
    assert all(s["attention"][1] == {"route": "skipped", "pred_err": None, "why": "attn_reuse", "emulated": False}
               for s in d["steps"][1:])
    # the attention's four linears show skipped, the MLP's two ran (quantization off: fp16)
    assert d["steps"][1]["routes"][6:12] == ["skipped"] * 4 + ["fp16"] * 2
    assert all(b["computed"] and b["skipped"] for s in d["steps"][1:] for b in s["blocks"][1:])


def _attention_forecast(reuse: str, computed: int):
    """Block 1's attention computed at the first ``computed`` steps, then reused as a forecast for 3 steps:
    its recorded attention calls."""
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset("tdc_attn", tdc_reuse=reuse, **{**FORCE, "tdc_first": computed})
    handle = sixbit.apply(pipe, cfg)
    attn = []
    _record(pipe.transformer.transformer_blocks[1].attn1, attn)
    generate(pipe, num_inference_steps=computed + 3)
    d = handle.trace.to_dict()
    assert [s["blocks"][1]["tdc"] for s in d["steps"]] == ["compute"] * computed + ["attn_forecast"] * 3
    return attn


def test_linear_forecast_of_the_attention_output():
    attn = _attention_forecast("linear", 2)
    a0, a1 = attn[0]["out"], attn[1]["out"]
    for t in (2, 3, 4):
        assert all(torch.equal(o, x1 + (t - 1) * (x1 - x0)) for o, x0, x1 in zip(attn[t]["out"], a0, a1))


def test_quadratic_forecast_of_the_attention_output():
    attn = _attention_forecast("quadratic", 3)
    a0, a1, a2 = (attn[k]["out"] for k in range(3))
    for t in (3, 4, 5):
        want = [tdc.forecast([x2], [x1], t, 2, 1, [x0], 0)[0] for x0, x1, x2 in zip(a0, a1, a2)]
        assert all(torch.equal(o, w) for o, w in zip(attn[t]["out"], want))


def test_state_resets_between_calls_and_shapes():
    cfg = SixBitConfig.preset("tdc_attn", tdc_reuse="linear", **FORCE)
    fresh = {}
    for h in (32, 48):
        pipe = tiny_cogvideox_pipeline(seed=0)
        with sixbit.apply(pipe, cfg):
            fresh[h] = generate(pipe, num_inference_steps=4, height=h, width=h)
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, cfg)
    for h in (32, 48, 48, 32):  # another shape, the same shape again: each call as if it were the first
        assert torch.equal(generate(pipe, num_inference_steps=4, height=h, width=h), fresh[h])
        assert handle.trace.to_dict()["steps"][0]["blocks"][1]["tdc"] == "compute"
    # the cached attention outputs live while later steps may reuse them and are dropped after the last step
    held = []

    def look(p, i, t, kw):
        held.append(sum(s.attn is not None for hook in handle.block_hooks for s in hook.state_manager._state_cache.values()))
        return {}

    generate(pipe, num_inference_steps=4, height=32, width=32, callback_on_step_end=look)
    assert held == [2, 2, 2, 0]  # blocks 1 and 2 (the probe keeps a delta, not an attention output)
    # a call that dies mid-run (no pipeline reset) must not leak its cache into the next one
    pipe._interrupt = False

    def boom(p, i, t, kw):
        if i == 1:
            raise RuntimeError("stop")
        return {}

    with pytest.raises(RuntimeError):
        generate(pipe, num_inference_steps=4, height=48, width=48, callback_on_step_end=boom)
    assert torch.equal(generate(pipe, num_inference_steps=4, height=32, width=32), fresh[32])


def test_batched_cfg_caches_both_halves_and_wan_each_branch_its_own():
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_attn", **FORCE))
    generate(pipe, num_inference_steps=3)
    assert handle.trace.to_dict()["steps"][1]["branch"] == "cond_uncond"
    handle.remove()

    pipe = tiny_wan_pipeline(seed=1)
    handle = sixbit.apply(pipe, SixBitConfig.preset("tdc_attn", **FORCE))
    attn = []
    _record(pipe.transformer.blocks[1].attn1, attn)
    generate(pipe, num_inference_steps=4)
    d = handle.trace.to_dict()
    for s in d["steps"][1:]:
        for br in (s, s["other_branches"]["uncond"]):
            assert [b["tdc"] for b in br["blocks"]] == ["probe_skip", "attn_reuse"]
    assert not torch.equal(attn[0]["out"][0], attn[1]["out"][0])  # cond and uncond differ …
    for step in (1, 2, 3):  # … and each branch reuses its own step-0 attention
        for branch in (0, 1):
            assert torch.equal(attn[2 * step + branch]["out"][0], attn[branch]["out"][0])
    assert d["summary"]["skip_fraction"] == pytest.approx(6 / 16)


def test_dmpq_routes_the_mlp_of_a_reused_cell_by_a_fresh_gamma_and_pdr_checks_only_what_is_cached():
    pipe = tiny_cogvideox_pipeline(seed=0)
    # pdr_rho=0: PDR fires wherever it checks, so every check is visible in the trace
    cfg = SixBitConfig.preset("full_attn", policy=None, pdr_rho=0.0, pdr_k_sigma=1.0, **{**FORCE, "tdc_first": 2})
    handle = sixbit.apply(pipe, cfg)
    q_calls = _count(pipe.transformer.transformer_blocks[1].attn1.to_q)
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    blocks = [[b["tdc"] for b in s["blocks"]] for s in d["steps"]]
    assert blocks == [["probe_compute", "compute", "compute"]] * 2 + [["probe_skip", "attn_reuse", "attn_reuse"]] * 3
    assert q_calls[0] == 2
    for s in d["steps"]:
        for b, blk in enumerate(s["blocks"]):
            routes = s["routes"][6 * b:6 * b + 6]
            if blk["tdc"] == "attn_reuse":
                # nothing is cached here: no PDR check; the MLP routes by DMPQ (Γ of the previous evaluation,
                # fresh: there is no after-skip step in this scope), and this cell measures Γ again
                assert blk["outlier_ratio"] is None and not blk["pdr"]
                assert blk["mode"] == "dmpq" and blk["gamma"] is not None
                assert routes[:4] == ["skipped"] * 4 and all(r in ("nvfp4", "int8") for r in routes[4:])
            elif b > 0 and s["step"] == 1:  # a computed cell whose attention output the next step may reuse: purified
                assert blk["pdr"] and blk["mode"] == "pdr" and routes == ["fp16"] * 6
    # the probe's delta is only the decision's reference: never purified after step 0 (which has no Γ)
    assert all(s["blocks"][0]["mode"] != "pdr" for s in d["steps"])
    assert not any(b["mode"] == "after_skip" for s in d["steps"] for b in s["blocks"])
    # without PDR firing: the cell after a reused one routes by DMPQ too (bf16 attention where no fit)
    handle.remove()
    pipe = tiny_cogvideox_pipeline(seed=0)
    handle = sixbit.apply(pipe, SixBitConfig.preset("full_attn", policy=None, tdc_max_skips=1, **FORCE))
    generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    assert [s["blocks"][1]["tdc"] for s in d["steps"]] == ["compute", "attn_reuse", "compute", "attn_reuse", "compute"]
    assert [s["blocks"][1]["mode"] for s in d["steps"][1:]] == ["dmpq"] * 4


@pytest.mark.parametrize("preset", ["tdc_attn", "full_attn"])
def test_schedule_records_the_scope_and_replays_it(tmp_path, preset):
    pipe = tiny_cogvideox_pipeline(seed=0)
    cfg = SixBitConfig.preset(preset, policy=None, **FORCE)
    handle = sixbit.apply(pipe, cfg)
    ref = generate(pipe, num_inference_steps=5)
    d = handle.trace.to_dict()
    sched = handle.trace.skip_schedule()
    handle.remove()
    assert sched.scope == "attention" and sched.skip_fraction == pytest.approx(d["summary"]["skip_fraction"])
    assert sched.to_dict()["scope"] == "attention"
    if preset == "full_attn":  # the reused cells' MLP routes are recorded, "-" for the attention's own linears
        assert all(r[1][:4] == "----" and len(r[1]) == 6 for r in sched.routes["cond_uncond"][1:])
        assert sum(sched.route_fractions.values()) == pytest.approx(1.0)  # over the linears that ran
    loaded = SkipSchedule.load(sched.save(tmp_path / "s.json"))
    assert loaded.scope == "attention" and loaded.routes == sched.routes
    with pytest.raises(ValueError, match="not a string of route letters"):  # "-" only where the scope says so
        SkipSchedule.from_dict({**sched.to_dict(), "scope": "block"})
    # a replay (no probe: the schedule decides) reproduces the run exactly
    replay_cfg = cfg.replace(tdc_probe_threshold=0.0)
    with sixbit.apply(pipe, replay_cfg, schedule=loaded) as h:
        assert torch.equal(generate(pipe, num_inference_steps=5), ref)
        r = h.trace.to_dict()
        assert [[b["tdc"] for b in s["blocks"][1:]] for s in r["steps"]] == \
            [[b["tdc"] for b in s["blocks"][1:]] for s in d["steps"]]
        assert r["summary"]["schedule_overrides"] == 0
        if preset == "full_attn":
            assert all(b["mode"] == "replay" for s in r["steps"] for b in s["blocks"])
    # resampled to another step count and densified, the scope stays
    assert sched.resample(3, 8).scope == "attention"
    if preset == "full_attn":
        dense = sched.dense()
        assert dense.scope == "attention" and all("-" not in c for row in dense.routes["cond_uncond"] for c in row)


def test_refusals_name_the_field():
    with pytest.raises(ConfigError, match="tdc_scope='attention' needs tdc_mode='step'"):
        SixBitConfig.preset("tdc_attn", tdc_mode="block")
    with pytest.raises(ConfigError, match="tdc_reuse='scaled'"):
        SixBitConfig.preset("tdc_attn", tdc_reuse="scaled")
    with pytest.raises(ConfigError, match="tdc_reuse='magnitude'"):
        SixBitConfig.preset("tdc_attn", tdc_reuse="magnitude")
    with pytest.raises(ConfigError, match="tdc_scope must be one of"):
        SixBitConfig(tdc_scope="mlp")
    pipe = tiny_cogvideox_pipeline(seed=0)
    with sixbit.apply(pipe, SixBitConfig.preset("tdc_only", **FORCE)) as h:
        generate(pipe, num_inference_steps=3)
        block_sched = h.trace.skip_schedule()
    assert block_sched.scope == "block" and "scope" not in block_sched.to_dict()
    with pytest.raises(ValueError, match="tdc_scope='block'.*SixBitConfig.tdc_scope is 'attention'"):
        sixbit.apply(pipe, SixBitConfig.preset("tdc_attn"), schedule=block_sched)
    with pytest.raises(ValueError, match="scope 'mlp'"):
        SkipSchedule.from_dict({**block_sched.to_dict(), "scope": "mlp"})
    # a block-scope schedule may not carry routes on skipped cells, nor the "-" letter
    bad = block_sched.to_dict()
    bad["routes"]["cond_uncond"][2][1] = "nnnnnn"
    with pytest.raises(ValueError, match="routes recorded for a skipped cell"):
        SkipSchedule.from_dict(bad)
    # the hooks go away with remove(): the model is the plain one again
    assert not hasattr(pipe.transformer.transformer_blocks[1].attn1, "_diffusers_hook")
