"""``sixbit/attention.py``: the fused q/k-norm + rotary CogVideoX processor against diffusers' own, with the
Triton kernel running in the interpreter on the CPU (``allow_cpu``), natively on a GPU."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention, CogVideoXAttnProcessor2_0

import sixbit_kernels as sk
from sixbit.attention import FusedQKNormRopeProcessor

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _attn(heads=2, dim_head=16, qk_norm="layer_norm"):
    torch.manual_seed(0)
    a = Attention(query_dim=heads * dim_head, dim_head=dim_head, heads=heads, qk_norm=qk_norm, eps=1e-6,
                  bias=True, out_bias=True, processor=CogVideoXAttnProcessor2_0())
    with torch.no_grad():  # non-trivial affine norms
        for n in (a.norm_q, a.norm_k) if qk_norm else ():
            n.weight.normal_(1.0, 0.3)
            n.bias.normal_(0.0, 0.3)
    return a.eval().to(DEV)


def _inputs(text=3, video=10, dim=32, head_dim=16):
    g = torch.Generator().manual_seed(1)
    hs = torch.randn(2, video, dim, generator=g)
    enc = torch.randn(2, text, dim, generator=g)
    ang = torch.randn(video, head_dim // 2, generator=g)
    rope = (ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1))
    return hs.to(DEV), enc.to(DEV), tuple(r.to(DEV) for r in rope)


@pytest.mark.parametrize("with_rope", [True, False])
def test_fast_path_matches_diffusers(with_rope):
    attn = _attn()
    hs, enc, rope = _inputs()
    rope = rope if with_rope else None
    orig = attn.processor
    ref = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    attn.set_processor(FusedQKNormRopeProcessor(orig, sk.ops, allow_cpu=True))
    attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)  # on a GPU the first use runs the self-check,
    calls = []  # which calls ops.layer_norm_rows itself: count the calls of a warm processor only
    real = sk.ops.layer_norm_rows
    try:
        sk.ops.layer_norm_rows = lambda *a, **k: calls.append(k.get("rope")) or real(*a, **k)
        out = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    finally:
        sk.ops.layer_norm_rows = real
    assert len(calls) == 2 and (calls[0] is not None) == with_rope  # the kernel ran, for q and k
    for o, r in zip(out, ref):
        assert o.shape == r.shape
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback (on a GPU the fast path runs)")
def test_falls_back_to_the_original_processor():
    """CPU without allow_cpu, an attention mask, or no q/k LayerNorm: the original processor runs."""
    hs, enc, rope = _inputs()
    attn = _attn()
    seen = []

    class Spy(CogVideoXAttnProcessor2_0):
        def __call__(self, *a, **k):
            seen.append(1)
            return super().__call__(*a, **k)

    attn.set_processor(FusedQKNormRopeProcessor(Spy(), sk.ops))
    attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    assert seen == [1]
    plain = _attn(qk_norm=None)
    plain.set_processor(FusedQKNormRopeProcessor(Spy(), sk.ops, allow_cpu=True))
    plain(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    assert seen == [1, 1]


def test_mismatched_rotary_tables_are_a_clear_error():
    attn = _attn()
    hs, enc, rope = _inputs()
    attn.set_processor(FusedQKNormRopeProcessor(attn.processor, sk.ops, allow_cpu=True))
    with pytest.raises(ValueError, match="rotary tables"):
        attn(hs, encoder_hidden_states=enc, image_rotary_emb=(rope[0][:-1], rope[1][:-1]))


def _fp8_ready_attn(dim_head=32):
    attn = _attn(dim_head=dim_head)
    hs, enc, rope = _inputs(text=5, video=27, dim=2 * dim_head, head_dim=dim_head)
    return attn, hs, enc, rope


def test_fp8_route_matches_the_spec_and_sdpa():
    """``attention_route="fp8"``: the 8-bit kernel (interpreter on CPU) replaces SDPA; the output equals the
    same processor with SDPA to within the 8-bit error, and the kernel saw the normalized q/k."""
    from sixbit.attention import ATTENTION_ROUTES, attend

    attn, hs, enc, rope = _fp8_ready_attn()
    orig = attn.processor
    attn.set_processor(FusedQKNormRopeProcessor(orig, sk.ops, allow_cpu=True))
    with torch.no_grad():
        ref = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    assert attn.processor.last_attention_route == "bf16"
    attn.processor.attention_route = "fp8"
    with torch.no_grad():
        out = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    assert attn.processor.last_attention_route == "fp8"
    for o, r in zip(out, ref):
        assert o.shape == r.shape
        assert 0 < float((o - r).norm() / r.norm()) < 0.1
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 19, 32, generator=g).to(DEV) for _ in range(3))
    o, ran, emulated = attend(q, k, v, "fp8", allow_cpu=True)
    assert not emulated
    from sixbit import formats as spec
    exp = spec.attention_fp8_reference(q.cpu(), k.cpu(), v.cpu(), block_n=sk.attention_fp8.CONFIGS[32][1])
    exp = exp.transpose(1, 2).reshape(2, 19, 64)
    tol = 1e-5 if DEV == "cpu" else 2e-2 * float(exp.abs().max())  # GPU: fp8 MMA sums, P8 rounding flips
    torch.testing.assert_close(o.cpu(), exp, rtol=0, atol=tol)
    assert ran == "fp8" and ATTENTION_ROUTES == ("bf16", "fp8")


@pytest.mark.parametrize("with_rope", [True, False])
def test_fp8_route_normalizes_q_and_k_on_load(with_rope, monkeypatch):
    """On the 8-bit route the processor hands the raw q/k projections and their norms (+ rotary) to the
    attention kernels (``_norms_on_load``): ``layer_norm_rows`` does not run, and the output is the one of
    normalizing first — bit for bit in the interpreter, within the 8-bit kernel's rounding on a GPU. An
    observer (calibration) still sees normalized q/k: then the norm runs first. With rotary tables only
    where ``NORM_ON_LOAD_ROTARY`` says so (off by default: slower on an H100; tested here switched on)."""
    import sixbit.attention as sa

    monkeypatch.setattr(sa, "NORM_ON_LOAD_ROTARY", True)
    attn, hs, enc, rope = _fp8_ready_attn()
    rope = rope if with_rope else None
    proc = FusedQKNormRopeProcessor(attn.processor, sk.ops, allow_cpu=True, attention_route="fp8")
    attn.set_processor(proc)
    with torch.no_grad():
        attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)  # GPU: the self-checks run on first use
        calls = []
        real = sk.ops.layer_norm_rows
        try:
            sk.ops.layer_norm_rows = lambda *a, **k: calls.append(1) or real(*a, **k)
            before = proc.norm_on_load_calls
            out = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
            assert proc.norm_on_load_calls == before + 1 and calls == [] and proc.last_attention_route == "fp8"
            seen = []
            proc.observer = lambda q, k, v: seen.append(q)
            first = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
            assert proc.norm_on_load_calls == before + 1 and len(calls) == 2 and len(seen) == 1
        finally:
            sk.ops.layer_norm_rows = real
    for o, r in zip(out, first):
        if DEV == "cpu":
            assert torch.equal(o, r)
        else:
            assert float((o - r).norm() / r.norm()) < 0.02


def test_fp8_route_with_rotary_normalizes_first_by_default():
    """``NORM_ON_LOAD_ROTARY`` off (the default): with rotary tables the processor runs ``layer_norm_rows`` (+ the
    rotary) first and the 8-bit kernels read the normalized q/k; without them the norm still rides on load."""
    import sixbit.attention as sa

    assert sa.NORM_ON_LOAD_ROTARY is False
    attn, hs, enc, rope = _fp8_ready_attn()
    proc = FusedQKNormRopeProcessor(attn.processor, sk.ops, allow_cpu=True, attention_route="fp8")
    attn.set_processor(proc)
    calls, real = [], sk.ops.layer_norm_rows
    with torch.no_grad():
        attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)  # GPU: the self-checks run on first use
        try:
            sk.ops.layer_norm_rows = lambda *a, **k: calls.append(1) or real(*a, **k)
            attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
            assert proc.norm_on_load_calls == 0 and len(calls) == 2 and proc.last_attention_route == "fp8"
            attn(hs, encoder_hidden_states=enc, image_rotary_emb=None)
            assert proc.norm_on_load_calls == 1 and len(calls) == 2
        finally:
            sk.ops.layer_norm_rows = real


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback (on a GPU the kernel runs)")
def test_fp8_route_falls_back_to_sdpa():
    """No interpreter permission (CPU), an unsupported head dim, or backend="torch": SDPA runs."""
    from sixbit.attention import attend, set_attention_route

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 9, 32, generator=g) for _ in range(3))
    out, ran, _ = attend(q, k, v, "fp8")
    assert ran == "bf16"
    exp = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 9, 64)
    assert torch.equal(out, exp)
    assert attend(q[..., :16], k[..., :16], v[..., :16], "fp8", allow_cpu=True)[1] == "bf16"
    with pytest.raises(ValueError, match="attention_route"):
        attend(q, k, v, "int4")
    attn, hs, enc, rope = _fp8_ready_attn()
    proc = FusedQKNormRopeProcessor(attn.processor, sk.ops, backend="torch", allow_cpu=True, attention_route="fp8")
    attn.set_processor(proc)
    proc.attention_route = "bf16"
    attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    assert proc.last_attention_route is None  # backend="torch", bf16: the original processor ran
    installed = [(attn, proc)]
    set_attention_route(installed, "bf16")
    assert proc.attention_route == "bf16"
    with pytest.raises(ValueError, match="attention_route"):
        set_attention_route(installed, "fp4")


def test_fp8_route_emulated_with_the_torch_backend_and_on_the_cpu():
    """backend="torch" (and the CPU without interpreter permission): the "fp8" route runs the spec
    (formats.attention_fp8_reference) on q/k/v built exactly as diffusers builds them, flagged emulated; the
    observer sees those q/k/v; bf16 stays the original processor, bit for bit."""
    from sixbit import formats as spec

    attn, hs, enc, rope = _fp8_ready_attn()
    orig = attn.processor
    with torch.no_grad():
        ref = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
    seen = []
    for backend, allow in (("torch", True), *((("auto", False),) if DEV == "cpu" else ())):
        proc = FusedQKNormRopeProcessor(orig, sk.ops, backend=backend, allow_cpu=allow, attention_route="fp8")
        proc.observer = lambda q, k, v: seen.append((q.clone(), k.clone(), v.clone()))
        attn.set_processor(proc)
        with torch.no_grad():
            out = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
        assert (proc.last_attention_route, proc.last_attention_emulated) == ("fp8", True)
        q, k, v = seen[-1]
        exp = spec.attention_fp8_reference(q, k, v, block_n=sk.attention_fp8.CONFIGS[32][1])
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        assert 0 < float((exp - sdpa).norm() / sdpa.norm()) < 0.1
        exp = attn.to_out[0](exp.transpose(1, 2).reshape(*q.shape[:1], q.shape[2], -1))
        torch.testing.assert_close(out[0], exp[:, 5:], rtol=0, atol=1e-6)
        for o, r in zip(out, ref):
            assert 0 < float((o - r).norm() / r.norm()) < 0.1
        proc.attention_route, proc.observer = "bf16", None
        with torch.no_grad():
            same = attn(hs, encoder_hidden_states=enc, image_rotary_emb=rope)
        assert proc.last_attention_route is None and all(torch.equal(a, b) for a, b in zip(same, ref))


@pytest.mark.usefixtures("one_thread")
def test_fp8_route_in_a_tiny_pipeline():
    """A whole (tiny, random-weight) CogVideoX generation with every joint attention on the 8-bit route."""
    from sixbit import attention
    from sixbit.testing import generate, tiny_cogvideox_pipeline

    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=2, head_dim=32).to(DEV)
    ref = generate(pipe, num_inference_steps=2)
    blocks = list(enumerate(pipe.transformer.transformer_blocks))
    installed = attention.install(blocks, sk.ops, attention_route="fp8")
    assert len(installed) == 2
    for m, _ in installed:
        m.processor.allow_cpu = True
    out = generate(pipe, num_inference_steps=2)
    assert all(m.processor.last_attention_route == "fp8" for m, _ in installed)
    assert bool(torch.isfinite(out).all())
    assert 0 < float((out - ref).norm() / ref.norm()) < 0.1
    attention.set_attention_route(installed, "bf16")
    bf16 = generate(pipe, num_inference_steps=2)
    assert all(m.processor.last_attention_route == "bf16" for m, _ in installed)
    assert float((bf16 - ref).norm() / ref.norm()) < 1e-4  # the fused q/k norm alone: fp32 rounding
    attention.uninstall(installed)
