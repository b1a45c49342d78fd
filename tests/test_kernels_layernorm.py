"""``sixbit_kernels/layernorm.py``: LayerNorm over short strided rows against ``F.layer_norm`` (interpreter on CPU)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import sixbit_kernels as sk  # noqa: E402

ln = sk.layernorm
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _ulp_close(y, ref):
    """Within one ulp of the output dtype (fp32: a few fp32 ulps) of the fp32 reference."""
    ref = ref.float()
    tol = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-20}[y.dtype]
    err = (y.float().cpu() - ref).abs()
    assert bool((err <= tol * ref.abs() + 1e-6).all()), float(err.max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", [True, False])
def test_strided_heads_view(dtype, affine):
    """The CogVideoX call: [B, S, H*D] projection output viewed as [B, H, S, D] (transposed, strided)."""
    g = torch.Generator().manual_seed(1)
    B, S, H, D = 2, 37, 3, 64
    x = (torch.randn(B, S, H * D, generator=g) * 4 + 1).to(dtype)
    x[0, 5] *= 300.0  # a huge token
    x[1, 7] = 0.0  # an all-zero token: rstd = 1/sqrt(eps), output = bias
    xv = x.to(DEV).view(B, S, H, D).transpose(1, 2)
    w = (torch.randn(D, generator=g) if affine else torch.ones(D)).to(dtype)
    b = (torch.randn(D, generator=g) if affine else torch.zeros(D)).to(dtype)
    y = ln.layer_norm_rows(xv, w.to(DEV) if affine else None, b.to(DEV) if affine else None, 1e-6)
    assert y.shape == xv.shape and y.dtype == dtype and y.is_contiguous()
    ref = F.layer_norm(x.float().view(B, S, H, D).transpose(1, 2), (D,), w.float(), b.float(), 1e-6)
    _ulp_close(y, ref)
    if dtype == torch.bfloat16:  # and PyTorch's own bf16 LayerNorm agrees to one bf16 step
        mine = F.layer_norm(xv.cpu(), (D,), w if affine else None, b if affine else None, 1e-6)
        assert float((mine.float() - y.float().cpu()).abs().max()) <= 2.0**-6 * float(ref.abs().max())


@pytest.mark.parametrize("shape", [(5, 16), (1, 3, 128), (2, 3, 4, 256), (0, 32)])
def test_shapes_and_rejections(shape):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=g).to(DEV)
    y = ln.layer_norm_rows(x, None, None, 1e-5)
    _ulp_close(y, F.layer_norm(x.cpu(), (shape[-1],), eps=1e-5))


def test_unsupported_inputs():
    assert not ln.supported(torch.zeros(4, 48), (48,))  # not a power of two
    assert not ln.supported(torch.zeros(4, 512), (512,))  # too wide for one register tile
    assert not ln.supported(torch.zeros(8, 4).t(), (2,))
    assert not ln.supported(torch.zeros(4, 64), (4, 64))
    with pytest.raises(ValueError, match="unsupported"):
        ln.layer_norm_rows(torch.zeros(4, 64).t().to(DEV), None, None, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("start", [0, 5, 36])
def test_rope_fused_matches_diffusers(dtype, start):
    """``rope=(cos, sin, start)``: CogVideoX's ``q[:, :, start:] = apply_rotary_emb(q[:, :, start:], ...)``
    after the norm — bit-exact against diffusers on the kernel's own normalized values, and within the
    norm's one-ulp tolerance of the whole PyTorch chain."""
    from diffusers.models.embeddings import apply_rotary_emb

    g = torch.Generator().manual_seed(3)
    B, S, H, D = 2, 37, 3, 64
    x = (torch.randn(B, S, H * D, generator=g) * 3).to(dtype)
    x[1, 36] *= 1e3  # a huge token inside the rotated part
    x[0, S - 1] = 0.0
    xv = x.to(DEV).view(B, S, H, D).transpose(1, 2)
    w, b = torch.randn(D, generator=g).to(dtype), torch.randn(D, generator=g).to(dtype)
    ang = torch.randn(S - start, D // 2, generator=g) * 3
    cos = ang.cos().repeat_interleave(2, dim=-1)
    sin = ang.sin().repeat_interleave(2, dim=-1)
    y = ln.layer_norm_rows(xv, w.to(DEV), b.to(DEV), 1e-6, rope=(cos.to(DEV), sin.to(DEV), start)).cpu()
    plain = ln.layer_norm_rows(xv, w.to(DEV), b.to(DEV), 1e-6).cpu()
    ref = plain.clone()
    ref[:, :, start:] = apply_rotary_emb(plain[:, :, start:], (cos, sin))
    assert torch.equal(y, ref)
    # against PyTorch's whole chain (its own LayerNorm, then diffusers' rotary): one output ulp, ~2 for bf16
    full = F.layer_norm(x.float().view(B, S, H, D).transpose(1, 2), (D,), w.float(), b.float(), 1e-6)
    full[:, :, start:] = apply_rotary_emb(full[:, :, start:], (cos, sin))
    tol = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-18
    assert float((y.float() - full).abs().max()) <= tol * float(full.abs().max())


def test_rope_rejects_mismatched_tables():
    x = torch.zeros(1, 2, 10, 16).to(DEV)
    with pytest.raises(ValueError, match="rotary tables"):
        ln.layer_norm_rows(x, None, None, 1e-5, rope=(torch.ones(9, 16).to(DEV), torch.ones(9, 16).to(DEV), 2))
