"""``sixbit_kernels.requant``: the NVFP4 weight re-quantized to per-channel INT8 (the ``w4a8_requant`` route's
weight operand) equals ``formats.requantize_int8`` bit for bit — codes and scales — in the interpreter and on a GPU."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sixbit_kernels as sk  # noqa: E402
from sixbit import formats as spec  # noqa: E402

rq = sk.requant
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _weight(n, k, seed, spread=3.0):
    """Rows whose blocks span ``10**±spread`` (awkward block-scale ratios), an outlier column."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-spread, spread, k)[torch.randperm(k, generator=g)]
    w[:, k // 3] *= 40.0
    return w


def _same(t: spec.NVFP4Tensor, **kw):
    ref = spec.requantize_int8(t)
    got = rq.requantize_int8(t.to(DEV), **kw)
    assert got.data.dtype == torch.int8 and got.data.shape == ref.data.shape
    assert got.scale.dtype == torch.float32 and got.scale.shape == (ref.data.shape[0], 1)
    assert torch.equal(got.data.cpu(), ref.data)
    torch.testing.assert_close(got.scale.cpu(), ref.scale, rtol=0, atol=0, equal_nan=True)  # bit for bit, NaN where NaN
    return ref


@pytest.mark.parametrize("n,k", [(1, 16), (5, 48), (9, 272), (16, 256), (33, 1920)])
def test_requant_equals_the_spec(n, k):
    """Awkward shapes: rows not a multiple of the program's, K not a multiple of the K tile, one block."""
    ref = _same(spec.quantize_nvfp4(_weight(n, k, seed=n + k)))
    assert int(ref.data.abs().max()) == 127  # every row reaches ±127 at its largest weight


@pytest.mark.parametrize("config", [(1, 16, 1), (2, 64, 2), (8, 128, 4)])
def test_requant_launch_geometries_agree(config):
    _same(spec.quantize_nvfp4(_weight(11, 208, seed=1)), config=config)


def test_requant_zero_rows_tiny_and_huge_magnitudes():
    w = _weight(6, 64, seed=2)
    w[1] = 0.0  # an all-zero row: scale = tensor scale, codes 0
    w[2] *= 1e-30  # tiny (e4m3's subnormal block scales)
    w[3, :16] = 0.0  # a zero block inside a row
    t = spec.quantize_nvfp4(w * 1e30)  # huge: the tensor scale carries the magnitude
    ref = _same(t)
    assert not ref.data[1].any() and float(ref.scale[1]) == float(t.tensor_scale)
    t2 = spec.quantize_nvfp4(torch.zeros(3, 32))  # an all-zero tensor (tensor scale 1)
    ref2 = _same(t2)
    assert not ref2.data.any() and torch.equal(ref2.scale, torch.ones(3, 1))


def test_requant_nan_block_scale_gives_a_nan_row():
    t = spec.quantize_nvfp4(_weight(4, 64, seed=3))
    sc = t.scales.view(torch.uint8).clone()
    sc[2, 1] = 0x7F  # e4m3's NaN
    bad = spec.NVFP4Tensor(t.data, sc.view(torch.float8_e4m3fn), t.tensor_scale, t.orig_dtype)
    ref = _same(bad)
    assert ref.scale[2].isnan().all() and not ref.data[2].any()
    assert torch.isfinite(ref.scale[[0, 1, 3]]).all()


def test_requant_error_is_small_beside_nvfp4s():
    """The extra rounding costs little: the re-quantized weight is within ~1.5 % (relative L2) of the NVFP4
    weight, against NVFP4's own ~10 % from the original, and the route's output error barely moves."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(96, 256, generator=g) / 16
    t = spec.quantize_nvfp4(w)
    w4 = t.dequantize(torch.float32)
    w8 = spec.requantize_int8(t).dequantize(torch.float32)
    assert float(spec.relative_error(w8, w4)) < 0.015 < 0.08 < float(spec.relative_error(w4, w))
    x = torch.randn(64, 256, generator=g)
    y = x @ w.T
    e_int8 = float(spec.relative_error(spec.reference_linear(x, w, None, "int8"), y))
    e_req = float(spec.relative_error(spec.reference_linear(x, w, None, "w4a8_requant"), y))
    assert e_int8 < e_req < e_int8 * 1.02


def test_requant_rejects_what_is_not_a_packed_weight():
    t = spec.quantize_nvfp4(_weight(4, 32, seed=5))
    with pytest.raises(TypeError, match="NVFP4"):
        rq.requantize_int8(spec.NVFP4Tensor(t.data.float(), t.scales, t.tensor_scale))
    with pytest.raises(ValueError, match="scales"):
        rq.requantize_int8(spec.NVFP4Tensor(t.data, t.scales[:, :1], t.tensor_scale))
