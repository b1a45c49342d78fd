"""``sixbit/attention.py``: the fused q/k-norm + rotary CogVideoX processor against diffusers' own, with the
Triton kernel running in the interpreter on the CPU (``allow_cpu``), natively on a GPU."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import Attention, CogVideoXAttnProcessor2_0

from sixbit._kernels import kernels as sk
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
    calls = []
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
