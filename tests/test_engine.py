"""sixbit.apply on a tiny random CogVideoX pipeline: round trips, trace, state per call, loading path."""

from __future__ import annotations

import json

import pytest
import torch

import sixbit
from sixbit import SixBitConfig, formats, hooks
from sixbit.linear import SixBitLinear
from sixbit.testing import generate, save_and_reload, tiny_cogvideox_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")

COMPUTE_PATHS = {"cpu-reference", "cuda-reference", "hopper-triton", "portable-triton", "blackwell-native (unverified)"}


@pytest.fixture()
def pipe():
    return tiny_cogvideox_pipeline(seed=0)


def test_apply_remove_round_trip_is_bit_identical(pipe):
    ref = generate(pipe)
    state = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    handle = sixbit.apply(pipe, SixBitConfig.preset("balanced", policy=None))
    assert handle.modules and all(isinstance(m, SixBitLinear) for m in handle.modules)
    quant = generate(pipe)
    assert not torch.equal(quant, ref)  # it really quantizes
    rel = float((quant - ref).norm() / ref.norm())
    assert 0 < rel < 0.2
    handle.remove()
    after = generate(pipe)
    assert torch.equal(after, ref)
    restored = pipe.transformer.state_dict()
    assert restored.keys() == state.keys() and all(torch.equal(restored[k], state[k]) for k in state)
    assert not any(isinstance(m, SixBitLinear) for m in pipe.transformer.modules())
    for block in pipe.transformer.transformer_blocks:
        assert "forward" not in block.__dict__ and not hasattr(block, "_diffusers_hook")
    # and it can be applied again
    sixbit.apply(pipe, "w8a8").remove()
    assert torch.equal(generate(pipe), ref)


def test_fused_attention_processor_installed_identical_on_cpu_and_removed(pipe):
    """fast_qk_norm gives every block's attn1 sixbit's fused q/k-norm + rotary processor (diffusers'
    set_processor); on the CPU it calls the original processor, so outputs are unchanged; remove() puts the
    original processors back."""
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    from sixbit.attention import FusedQKNormRopeProcessor

    ref = generate(pipe)
    attns = [b.attn1 for b in pipe.transformer.transformer_blocks]
    originals = [a.processor for a in attns]
    with sixbit.apply(pipe, SixBitConfig.preset("off")):
        assert all(type(a.processor) is FusedQKNormRopeProcessor for a in attns)
        assert [a.processor.original for a in attns] == originals
        assert torch.equal(generate(pipe), ref)
    assert [a.processor for a in attns] == originals
    assert all(type(a.processor) is CogVideoXAttnProcessor2_0 for a in attns)
    with sixbit.apply(pipe, SixBitConfig.preset("off", fast_qk_norm=False)):
        assert [a.processor for a in attns] == originals


def test_everything_off_is_identical_to_plain_pipeline(pipe):
    ref = generate(pipe)
    with sixbit.apply(pipe, SixBitConfig.preset("off")) as handle:
        out = generate(pipe)
        summary = handle.trace.to_dict()["summary"]
    assert torch.equal(out, ref)
    assert summary["route_counts"]["fp16"] == summary["num_steps"] * len(handle.linear_names)
    assert summary["skip_fraction"] == 0.0


def test_trace_schema_and_counts(pipe):
    handle = sixbit.apply(pipe, SixBitConfig.preset("balanced", policy=None, tdc_mode="block", tdc_threshold=10.0, tdc_budget=10.0, tdc_first=1,
                                                    warmup_steps=1))
    steps = 6
    generate(pipe, num_inference_steps=steps)
    d = json.loads(json.dumps(handle.trace.to_dict(), allow_nan=False))  # JSON-safe
    assert d["version"] == 1 and d["compute_path"] in COMPUTE_PATHS and d["device"] == "cpu"
    n_blocks, n_lin = len(d["blocks"]), len(d["linears"])
    assert d["blocks"] == [f"transformer_blocks.{i}" for i in range(3)]
    assert n_lin == 3 * 6 and d["linears"][0] == "transformer_blocks.0.attn1.to_q"
    assert not any("norm1.linear" in n or "norm2.linear" in n for n in d["linears"])
    assert [s["step"] for s in d["steps"]] == list(range(steps))
    for s in d["steps"]:
        assert len(s["blocks"]) == n_blocks and len(s["routes"]) == n_lin and len(s["pred_err"]) == n_lin
        assert s["time_s"] > 0 and isinstance(s["timestep"], float) and s["branch"] == "cond_uncond"
        assert set(s["routes"]) <= {"nvfp4", "int8", "fp16", "skipped"}
        for b, blk in enumerate(s["blocks"]):
            assert set(blk) >= {"computed", "skipped", "pdr", "gamma", "delta_sim", "acc_err", "outlier_ratio"}
            assert blk["computed"] != blk["skipped"]
            routes = [s["routes"][j] for j in range(6 * b, 6 * b + 6)]
            assert (set(routes) == {"skipped"}) == blk["skipped"]
    summ = d["summary"]
    counts = summ["route_counts"]
    assert sum(counts.values()) == steps * n_lin
    skipped_blocks = sum(blk["skipped"] for s in d["steps"] for blk in s["blocks"])
    assert counts["skipped"] == 6 * skipped_blocks and skipped_blocks > 0
    assert summ["skip_fraction"] == pytest.approx(skipped_blocks / (steps * n_blocks))
    computed = counts["nvfp4"] + counts["int8"] + counts["fp16"]
    bits = (4.5 * counts["nvfp4"] + 8 * counts["int8"] + 16 * counts["fp16"]) / computed
    assert summ["avg_act_bits"] == pytest.approx(bits)
    assert summ["time_s"] == pytest.approx(sum(s["time_s"] for s in d["steps"]))
    assert summ["peak_mem_bytes"] is None  # CPU
    # warm-up step 0 is full precision; later computed steps are quantized
    assert set(d["steps"][0]["routes"]) == {"fp16"}
    assert {r for s in d["steps"][1:] for r in s["routes"]} & {"nvfp4", "int8"}
    wb = summ["weight_bytes"]
    assert 0 < wb["packed_bytes"] < wb["original_bytes"] / 3 and wb["fp_bytes_on_device"] == 0


def test_dmpq_routes_follow_the_policy_rule(pipe):
    # uncalibrated: E = Γ; choose τ between the blocks' Γ values so both routes occur
    handle = sixbit.apply(pipe, SixBitConfig.preset("dmpq_only", policy=None, tau=0.047, warmup_steps=0))
    generate(pipe)
    d = handle.trace.to_dict()
    seen = set()
    for prev, s in zip(d["steps"], d["steps"][1:]):
        for b, blk in enumerate(s["blocks"]):
            assert blk["mode"] == "dmpq"
            g = prev["blocks"][b]["gamma"]
            for j in range(6 * b, 6 * b + 6):
                assert s["pred_err"][j] == pytest.approx(g)
                assert s["routes"][j] == ("int8" if g > 0.047 else "nvfp4")
                seen.add(s["routes"][j])
    assert seen == {"int8", "nvfp4"}


def test_nvfp4_decisions_run_w8a8_where_the_fast_preset_says(pipe):
    # the same decisions as the test above; nvfp4_route="auto" with INT8 weights resident on a device
    # without FP4 tensor cores (the CPU) runs every NVFP4 decision on the W8A8 kernels, and says so
    cfg = SixBitConfig.preset("dmpq_only", policy=None, tau=0.047, int8_route="w8a8", nvfp4_route="auto",
                              warmup_steps=0)
    handle = sixbit.apply(pipe, cfg)
    generate(pipe)
    d = handle.trace.to_dict()
    promoted = 0
    for prev, s in zip(d["steps"], d["steps"][1:]):
        for b, blk in enumerate(s["blocks"]):
            n = 6 if prev["blocks"][b]["gamma"] <= 0.047 else 0  # the block's layers DMPQ put on NVFP4
            assert blk.get("nvfp4_as_int8", 0) == n
            assert all(s["routes"][j] == "int8" for j in range(6 * b, 6 * b + 6))
            promoted += n
    assert promoted > 0 and d["summary"]["nvfp4_as_int8"] == promoted
    assert d["summary"]["route_counts"]["nvfp4"] == 0
    assert {m.last_route for m in handle.modules} == {"w8a8"}
    handle.remove()
    # with W4A8 (no INT8 weights) "auto" keeps NVFP4
    handle = sixbit.apply(pipe, cfg.replace(int8_route="int8"))
    generate(pipe)
    assert handle.trace.summary()["route_counts"]["nvfp4"] > 0 and handle.trace.summary()["nvfp4_as_int8"] == 0
    handle.remove()


def test_int8_decisions_run_requantized_with_only_4bit_weights_resident(pipe):
    """int8_route="w4a8_requant": the INT8 decisions run the re-quantized route, the trace still says int8, the
    layers hold NVFP4 weights only (no 8-bit copy), and the output is that route's numerics, not W4A8's."""
    cfg = SixBitConfig.preset("dmpq_only", policy=None, tau=0.047, warmup_steps=0)
    outs = {}
    for int8_route in ("int8", "w4a8_requant"):
        handle = sixbit.apply(pipe, cfg.replace(int8_route=int8_route))
        assert all(m.packed.formats == ("nvfp4",) for m in handle.modules)
        outs[int8_route] = generate(pipe)
        ran = {m.last_route for m in handle.modules}
        summary = handle.trace.summary()
        handle.remove()
        assert summary["route_counts"]["int8"] > 0 and set(summary["route_counts"]) <= {"nvfp4", "int8", "fp16",
                                                                                           "skipped"}
        assert ran <= {"nvfp4", int8_route} and int8_route in ran
    a, b = (torch.as_tensor(outs[r]).float() for r in ("int8", "w4a8_requant"))
    assert not torch.equal(a, b) and float(formats.relative_error(b, a)) < 0.05


def test_int8_route_auto_resolves_on_the_transformers_device(pipe, monkeypatch):
    """int8_route="auto": W4A8 (``int8``) on the CPU; where sixbit's GPU kernels run (faked here), the
    re-quantized route — and with nvfp4_route="auto" the NVFP4 decisions run it too; backend="torch" keeps int8."""
    from sixbit.linear import ops

    cfg = SixBitConfig.preset("dmpq_only", policy=None, tau=0.047, warmup_steps=0, int8_route="auto",
                              nvfp4_route="auto")
    handle = sixbit.apply(pipe, cfg)
    assert {m.int8_route for m in handle.modules} == {"int8"}
    generate(pipe)
    assert handle.trace.summary()["nvfp4_as_int8"] == 0
    assert handle.trace.config["int8_route"] == "auto" and handle.trace.config["int8_route_resolved"] == "int8"
    handle.remove()
    monkeypatch.setattr(ops(), "int8_tensor_cores", lambda device: True)
    monkeypatch.setattr(hooks, "_NATIVE_FP4", {})
    handle = sixbit.apply(pipe, cfg)
    assert {m.int8_route for m in handle.modules} == {"w4a8_requant"}
    assert all(m.packed.formats == ("nvfp4",) for m in handle.modules)
    generate(pipe)
    assert handle.trace.config["int8_route_resolved"] == "w4a8_requant"
    summary = handle.trace.summary()
    handle.remove()
    assert summary["nvfp4_as_int8"] > 0 and summary["route_counts"]["nvfp4"] == 0
    handle = sixbit.apply(pipe, cfg.replace(backend="torch"))
    assert {m.int8_route for m in handle.modules} == {"int8"}
    handle.remove()


def test_fused_qkv_is_quantized_after_fusing_and_refused_after_apply(pipe):
    pipe.transformer.fuse_qkv_projections()
    ref = generate(pipe)
    handle = sixbit.apply(pipe, "w8a8")
    assert any(n.endswith("attn1.to_qkv") for n in handle.linear_names)
    assert not any(n.endswith(("attn1.to_q", "attn1.to_k", "attn1.to_v")) for n in handle.linear_names)
    out = generate(pipe)
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.05
    handle.remove()
    assert torch.equal(generate(pipe), ref)

    other = tiny_cogvideox_pipeline(seed=0)
    sixbit.apply(other, "w4a4")
    with pytest.raises(AttributeError, match="Fuse QKV projections .* before sixbit.apply"):
        other.transformer.fuse_qkv_projections()


def test_memory_is_honest_by_default(pipe):
    before = sum(p.numel() for p in pipe.transformer.parameters())
    handle = sixbit.apply(pipe, "balanced")
    after = sum(p.numel() for p in pipe.transformer.parameters())
    routed = sum(lin.weight.numel() + (lin.bias.numel() if lin.bias is not None else 0)
                 for lin, _ in handle._originals.values())
    assert after == before - routed  # the routed layers hold no 16/32-bit weights any more
    assert all(not m.has_fp_weights for m in handle.modules)
    with pytest.raises(AttributeError, match="packed weights"):
        handle.modules[0].weight  # noqa: B018
    handle.remove()
    kept = tiny_cogvideox_pipeline(seed=0)
    h2 = sixbit.apply(kept, SixBitConfig.preset("balanced", fp_weights="device"))
    assert all(m.has_fp_weights for m in h2.modules) and h2.memory()["fp_bytes_on_device"] > 0


def test_fp_weights_stream_runs_true_fp16_steps_from_host_copies(pipe):
    ref = generate(pipe)
    outs, routes = {}, {}
    for mode in ("cpu", "stream", "device"):
        p = tiny_cogvideox_pipeline(seed=0)
        before = sum(x.numel() for x in p.transformer.parameters())
        h = sixbit.apply(p, SixBitConfig.preset("balanced", fp_weights=mode, warmup_steps=1))
        outs[mode] = generate(p)
        routes[mode] = {m.resolve("fp16") for m in h.modules}
        if mode == "stream":
            # packed-only residency, like "cpu": no 16-bit weight is a parameter of the model any more
            routed = sum(lin.weight.numel() + lin.bias.numel() for lin, _ in h._originals.values())
            assert sum(x.numel() for x in p.transformer.parameters()) == before - routed
            assert h.memory()["fp_bytes_on_device"] == 0 and all(m.has_fp_weights for m in h.modules)
            assert all(lin.weight.device.type == "cpu" for lin, _ in h._originals.values())
            h.remove()
            assert torch.equal(generate(p), ref)
    assert routes == {"cpu": {"w4a16"}, "stream": {"fp16"}, "device": {"fp16"}}
    # warm-up and PDR steps use the original weights: identical to keeping them on the device
    assert torch.equal(outs["stream"], outs["device"]) and not torch.equal(outs["stream"], outs["cpu"])


def test_modulation_weights_option_quantizes_weights_only(pipe):
    ref = generate(pipe)
    plain = sixbit.apply(pipe, "balanced")
    m_plain = plain.memory()
    plain.remove()
    handle = sixbit.apply(pipe, SixBitConfig.preset("balanced", modulation_weights="nvfp4"))
    mem = handle.memory()
    assert len(handle.weight_only_modules) == 2 * 3 and len(handle.linear_names) == 18
    assert all(m.route == "w4a16" for m in handle.weight_only_modules)
    assert mem["other_transformer_bytes"] < m_plain["other_transformer_bytes"]
    out = generate(pipe)
    d = handle.trace.to_dict()
    assert not any("norm" in n for n in d["linears"])  # not routed, not in the trace's layer list
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.2
    handle.remove()
    assert torch.equal(generate(pipe), ref)


def test_embedder_weights_option_packs_outer_linears_but_not_proj_out(pipe):
    from sixbit.adapters import get_adapter

    ref = generate(pipe)
    outer = [n for n, _ in get_adapter(pipe.transformer).outer_linears(pipe.transformer)]
    assert "patch_embed.text_proj" in outer and "time_embedding.linear_1" in outer and "norm_out.linear" in outer
    assert "proj_out" not in outer and not any(n.startswith("transformer_blocks.") for n in outer)
    before = sixbit.apply(pipe, SixBitConfig.preset("balanced", modulation_weights="nvfp4"))
    m_before = before.memory()
    before.remove()
    handle = sixbit.apply(pipe, SixBitConfig.preset("balanced", modulation_weights="nvfp4", embedder_weights="nvfp4"))
    mem = handle.memory()
    assert len(handle.weight_only_modules) == 2 * 3 + len(outer)
    assert all(m.route == "w4a16" for m in handle.weight_only_modules)
    assert isinstance(pipe.transformer.proj_out, torch.nn.Linear)  # the output projection stays
    assert mem["other_transformer_bytes"] < m_before["other_transformer_bytes"]
    assert mem["packed_bytes"] > m_before["packed_bytes"]
    out = generate(pipe)
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.2
    handle.remove()
    assert torch.equal(generate(pipe), ref)


def test_static_baselines(pipe):
    ref = generate(pipe)
    errs = {}
    for name, route in (("w4a4", "nvfp4"), ("w4a8", "int8"), ("w8a8", "int8")):
        with sixbit.apply(pipe, name) as h:
            out = generate(pipe)
            d = h.trace.to_dict()
        assert {r for s in d["steps"] for r in s["routes"]} == {route}
        errs[name] = float((out - ref).norm() / ref.norm())
    assert errs["w8a8"] < errs["w4a8"] < errs["w4a4"]


def test_cogvideox_15_style_and_apply_refusals():
    pipe = tiny_cogvideox_pipeline(seed=3, v15=True)
    ref = generate(pipe)
    h = sixbit.apply(pipe, SixBitConfig.preset("balanced", policy=None))
    out = generate(pipe)
    assert out.shape == ref.shape and not torch.equal(out, ref)
    with pytest.raises(RuntimeError, match="already applied"):
        sixbit.apply(pipe, "off")
    h.remove()
    from diffusers import FirstBlockCacheConfig

    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.1))
    with pytest.raises(RuntimeError, match="disable_cache"):
        sixbit.apply(pipe, "off")
    with pytest.raises(TypeError, match="no adapter"):
        sixbit.apply(torch.nn.Linear(4, 4), "off")


def test_loading_path_save_pretrained_then_load_pipeline(pipe, tmp_path):
    ref = generate(pipe)
    again = save_and_reload(pipe, tmp_path / "tiny")
    assert torch.equal(generate(again), ref)
    loaded = sixbit.load_pipeline(tmp_path / "tiny", device="cpu")
    assert type(loaded).__name__ == "CogVideoXPipeline" and loaded.transformer.dtype == torch.float32
    assert torch.equal(generate(loaded), ref)
    h = sixbit.apply(loaded, SixBitConfig.preset("balanced", policy=None))
    generate(loaded)
    assert h.trace.to_dict()["model"].endswith("tiny")
    with pytest.raises(FileNotFoundError):
        sixbit.load_pipeline(tmp_path / "missing" / "folder")
    # the text encoder stored in 4 bits at load time: packed layers, a working pipeline, exact remove()
    te4 = sixbit.load_pipeline(tmp_path / "tiny", device="cpu", text_encoder_4bit=True)
    assert loaded.sixbit_text_encoder is None and te4.sixbit_text_encoder.modules
    assert any(type(m).__name__ == "SixBitLinear" for m in te4.text_encoder.modules())
    out4 = generate(te4)
    assert out4.shape == ref.shape and not torch.equal(out4, ref)  # other prompt embeddings, other latents
    te4.sixbit_text_encoder.remove()
    assert torch.equal(generate(te4), ref)


def test_load_pipeline_default_needs_the_embedded_model(monkeypatch):
    import types

    monkeypatch.setitem(__import__("sys").modules, "sixbit.mini", types.ModuleType("sixbit.mini"))
    with pytest.raises(FileNotFoundError, match="sixbit-mini model is not available"):
        sixbit.load_pipeline()
