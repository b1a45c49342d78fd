"""8-bit attention under the method's policy, in a real (tiny, random-weight) CogVideoX pipeline: the block
hook routes each block's attention per step (``dmpq.attention_route``), the trace records what ran, a
schedule replays it; and ``sixbit.warmup`` visits every kernel configuration the config can reach.

On the CPU the 8-bit route is the torch emulation of the kernel (``formats.attention_fp8_reference``).
"""

from __future__ import annotations

import pytest
import torch

import sixbit
from sixbit import warmup
from sixbit.config import SixBitConfig
from sixbit.policy import LinearFit, Policy
from sixbit.testing import generate, tiny_cogvideox_pipeline, tiny_wan_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = 5


@pytest.fixture(scope="module")
def pipe():
    return tiny_cogvideox_pipeline(seed=0, num_layers=3, head_dim=32)


def _policy(pipe, alpha=0.0, beta=0.01, tau_attn=0.05) -> Policy:
    h = sixbit.apply(pipe, SixBitConfig(policy=None))
    names, blocks = h.linear_names, h.block_names
    h.remove()
    return Policy(linears={n: LinearFit(1.0, 0.0) for n in names}, tau=0.5, model="tiny",
                  attention={b: LinearFit(alpha, beta) for b in blocks}, attention_tau=tau_attn)


def _attention_rows(trace: dict) -> list[list[dict]]:
    return [st["attention"] for st in trace["steps"]]


def test_policy_routes_attention_per_block_and_step_and_the_trace_records_it(pipe):
    pol = _policy(pipe)
    # the probe routed by the policy too (its default 16-bit route is tested in test_probe_route_…)
    cfg = SixBitConfig(warmup_steps=1, tdc_first=1, tdc_threshold=10.0, tdc_probe_threshold=10.0, pdr=False,
                       tdc_probe_route="policy")
    ref = generate(pipe, num_inference_steps=STEPS)
    with sixbit.apply(pipe, cfg, policy=pol) as h:
        out = generate(pipe, num_inference_steps=STEPS)
        tr = h.trace.to_dict()
        sched = h.trace.skip_schedule()
    rows = _attention_rows(tr)
    assert all(a["route"] == "bf16" and a["why"] == "full_precision" for a in rows[0])  # warm-up step
    computed = [(t, b, a) for t, row in enumerate(rows) for b, a in enumerate(row) if a["route"] != "skipped"]
    fp8 = [a for _, _, a in computed if a["route"] == "fp8"]
    assert fp8 and all(a["pred_err"] == pytest.approx(0.01) and a["emulated"] for a in fp8)
    for t, b, a in computed:  # after a skip (no fresh Γ) bf16; else the prediction 0.01 ≤ τ_attn → fp8
        blk = tr["steps"][t]["blocks"][b]
        prev = tr["steps"][t - 1]["blocks"][b] if t else None
        if t >= 1 and prev["computed"]:
            assert a["route"] == "fp8", (t, b)
        elif t >= 1:
            assert (a["route"], a["why"]) == ("bf16", "after_skip")
        assert blk["computed"]
    assert any(a["route"] == "skipped" for row in rows for a in row)
    summ = tr["summary"]
    assert summ["attention_counts"]["fp8"] == len(fp8) and 0 < summ["attention_fp8_fraction"] < 1
    assert tr["compute_path"] == "cpu-reference"  # on the CPU every low-bit route is the emulation
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.5
    # the schedule records each computed cell's attention route, and a replay takes it (not the prediction)
    letters = sched.to_dict()["attention"]["cond_uncond"]
    assert sched.to_dict()["version"] == 3
    assert letters == ["".join({"fp8": "8", "bf16": "b", "skipped": "-"}[a["route"]] for a in row) for row in rows]
    with sixbit.apply(pipe, cfg, policy=_policy(pipe, tau_attn=0.0), schedule=sched) as h:
        generate(pipe, num_inference_steps=STEPS)
        again = h.trace.to_dict()
    assert [[a["route"] for a in row] for row in _attention_rows(again)] == [[a["route"] for a in row] for row in rows]


def test_probe_route_runs_the_probe_16bit_with_bf16_attention(pipe):
    """tdc_probe_route="fp16" (default): step mode's probe block runs 16-bit activations and bf16 attention after
    the warm-up, traced mode "probe"; with TDC off (dmpq_only) block 0 is an ordinary DMPQ block."""
    cfg = SixBitConfig(warmup_steps=1, tdc_first=1, tdc_threshold=10.0, tdc_probe_threshold=10.0, pdr=False)
    with sixbit.apply(pipe, cfg, policy=_policy(pipe)) as h:
        generate(pipe, num_inference_steps=STEPS)
        tr = h.trace.to_dict()
    rows = _attention_rows(tr)
    for t in range(1, STEPS):
        assert tr["steps"][t]["blocks"][0]["mode"] == "probe"
        assert (rows[t][0]["route"], rows[t][0]["why"]) == ("bf16", "probe")
    with sixbit.apply(pipe, SixBitConfig.preset("dmpq_only"), policy=_policy(pipe)) as h:
        generate(pipe, num_inference_steps=STEPS)
        modes = {s["blocks"][0]["mode"] for s in h.trace.to_dict()["steps"][1:]}
    assert "probe" not in modes


@pytest.mark.parametrize("after,why", [("fp8", "after_skip_fp8"), ("policy", "stale_policy")])
def test_attention_after_skip_puts_the_step_after_a_skip_on_8bit(pipe, after, why):
    cfg = SixBitConfig(warmup_steps=1, tdc_first=1, tdc_threshold=10.0, tdc_probe_threshold=10.0, pdr=False,
                       attention_after_skip=after)
    with sixbit.apply(pipe, cfg, policy=_policy(pipe)) as h:
        generate(pipe, num_inference_steps=STEPS)
        tr = h.trace.to_dict()
        letters = h.trace.skip_schedule().to_dict()["attention"]["cond_uncond"]
    rows, n = _attention_rows(tr), 0
    for t in range(2, STEPS):
        for b, a in enumerate(rows[t]):
            if tr["steps"][t]["blocks"][b]["computed"] and not tr["steps"][t - 1]["blocks"][b]["computed"]:
                n += 1
                assert (a["route"], a["why"], a["emulated"]) == ("fp8", why, True), (t, b)
                assert letters[t][b] == "8"
                assert a["pred_err"] == (pytest.approx(0.01) if after == "policy" else None)
    assert n > 0


def test_threshold_target_and_policy_without_fits_choose_bf16(pipe):
    cfg = SixBitConfig(tdc=False, pdr=False, warmup_steps=0)
    with sixbit.apply(pipe, cfg, policy=_policy(pipe, tau_attn=0.001)) as h:  # E 0.01 > τ 0.001
        generate(pipe, num_inference_steps=3)
        assert h.trace.summary()["attention_counts"]["fp8"] == 0
    with sixbit.apply(pipe, cfg.replace(tau_attn=0.5), policy=_policy(pipe, tau_attn=0.001)) as h:
        assert h.tau_attn == 0.5
        generate(pipe, num_inference_steps=3)
        assert h.trace.summary()["attention_fp8_fraction"] == pytest.approx(2 / 3)  # step 0 has no Γ
    old = _policy(pipe)
    old.attention, old.attention_tau = {}, None  # an older policy file: no attention fits
    with sixbit.apply(pipe, cfg, policy=old) as h:
        generate(pipe, num_inference_steps=3)
        assert h.trace.summary()["attention_counts"]["fp8"] == 0
        assert "no attention fit: bf16 attention" in h.trace.to_dict()["config"]["policy_resolved"]
    with sixbit.apply(pipe, cfg.replace(attention="fp8"), policy=old) as h:  # "fp8": every computed block
        generate(pipe, num_inference_steps=3)
        assert h.trace.summary()["attention_fp8_fraction"] == 1.0


def test_wan_keeps_bf16_attention():
    wan = tiny_wan_pipeline(seed=0)
    with sixbit.apply(wan, SixBitConfig(tdc=False, pdr=False, attention="fp8", policy=None)) as h:
        generate(wan, num_inference_steps=2)
        summ = h.trace.summary()
    assert summ["attention_counts"]["fp8"] == 0 and summ["attention_counts"]["bf16"] > 0


# ------------------------------------------------------------------------------------------ warm-up


def test_warmup_plans_every_route_and_visits_each_once(pipe, monkeypatch):
    """Every (layer shape, route) the config can decide, the statistics kernels and every attention route;
    on the CPU apply() compiles nothing, and warm(force=True) runs the plan (the torch reference)."""
    from sixbit.linear import ops

    pol = _policy(pipe)
    with sixbit.apply(pipe, SixBitConfig(), policy=pol) as h:
        assert h.kernels_compiled_s is None and h.kernels_compiled == []
        names = [n for n, _ in warmup.plan(h)]
        shapes = {(m.in_features, m.out_features) for m in h.modules}
        for k, n in shapes:
            for r in ("nvfp4", "int8", "w4a16"):  # fp16 resolves to w4a16 (fp_weights="cpu")
                assert f"linear {k}→{n} {r}" in names
        assert {"attention 2×32 bf16", "attention 2×32 fp8"} <= set(names)
        assert any(n.startswith("block_stats") and "delta change" in n for n in names)
        # the span's blocks keep no delta (tdc_store): the variant without the write too (a timed compile at 5B)
        stats = {n.split(" + ")[-1] if " + " in n else "" for n in names if n.startswith("block_stats")}
        assert stats == {"", "delta", "delta change"}
        assert any(n.startswith("outlier_count") for n in names)
        dim = pipe.transformer.config.num_attention_heads * pipe.transformer.config.attention_head_dim
        assert {n for n in names if n.startswith("norm_modulate_int8")} == {  # the fused producer, both forms
            f"norm_modulate_int8 {dim}", f"norm_modulate_int8 {dim} dense"}
        assert f"norm_modulate {dim}" in names  # its 16-bit output, for NVFP4 / W4A16 consumers
        assert f"gated_residual {dim}" in names  # the fused block forward's x + gate · y
        ff = {(m.in_features, m.out_features) for m, _ in h.gelu_epilogue}  # ff.net.0.proj: GELU in the GEMM
        assert len(h.gelu_epilogue) == len(h.block_hooks) and len(ff) == 1
        assert {f"linear {k}→{n} (GELU epilogue) {r}" for k, n in ff for r in ("nvfp4", "int8", "w4a16")} <= set(names)
        assert len(names) == len(set(names))
        seen = []
        real = ops().linear
        monkeypatch.setattr(ops(), "linear", lambda x, p, route, **kw: (seen.append((p.in_features, route)),
                                                                           real(x, p, route, **kw))[1])
        w = warmup.warm(h, force=True)
        assert w.items == names and w.seconds > 0 and "kernels compiled in" in w.line()
        assert {(k, r) for k, _ in shapes for r in ("nvfp4", "int8", "w4a16")} <= set(seen)
    with sixbit.apply(pipe, SixBitConfig.preset("w8a8"), policy=pol) as h:
        names = [n for n, _ in warmup.plan(h)]
        assert all(n.endswith("w8a8") for n in names if n.startswith("linear"))
        assert not any(n.endswith("fp8") for n in names)  # static baselines keep bf16 attention
        assert any(n.startswith("norm_modulate_int8") for n in names)
        assert f"norm_modulate {dim}" not in names  # every consumer reads the INT8 operand
        warmup.warm(h, force=True)  # the attention alone on layers that hold only W8A8 weights (a bug on the H200)
    with sixbit.apply(pipe, SixBitConfig.preset("tdc_only"), policy=pol) as h:
        assert not any(n.startswith(("linear", "norm_modulate", "gated_residual")) for n, _ in warmup.plan(h))
    with sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_store="blocks", tdc_regate="off"), policy=pol) as h:
        assert all(" + " in n for n, _ in warmup.plan(h) if n.startswith("block_stats"))
    with sixbit.apply(pipe, SixBitConfig.preset("tdc_only", tdc_store="blocks"), policy=pol) as h:  # regated: no Δ
        stats = [" + " in n for n, _ in warmup.plan(h) if n.startswith("block_stats")]
        assert True in stats and False in stats


@pytest.mark.skipif(not torch.cuda.is_available(), reason="apply() compiles on a GPU only")
def test_apply_compiles_on_the_gpu(pipe):
    gpu = pipe.to("cuda", torch.bfloat16)
    with sixbit.apply(gpu, SixBitConfig(policy=None)) as h:
        assert h.kernels_compiled_s > 0 and h.kernels_compiled
        assert h.trace.summary()["kernels_compiled_s"] == h.kernels_compiled_s
    pipe.to("cpu", torch.float32)
