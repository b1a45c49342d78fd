"""``sixbit_kernels/gated_residual.py`` (CogVideoX's ``x + gate · y`` in one pass) against the reference
``formats.gated_residual`` (diffusers' two ops), bit for bit; interpreter on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

import sixbit_kernels as sk
from sixbit import formats as spec

gr = sk.gated_residual
ops = sk.ops
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _inputs(B, S, C, dtype, seed, *, strided=True, gate_2d=False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, S, C, generator=g) * 3).to(dtype).to(DEV)
    cat = (torch.randn(B, 5 + S, C, generator=g)).to(dtype).to(DEV)
    y = cat[:, 5:] if strided else cat[:, 5:].contiguous()  # the feed-forward's video part of [text; video]
    mod = torch.randn(B, 6 * C, generator=g).to(dtype).to(DEV)
    gate = mod.chunk(6, dim=1)[2]  # a chunk of the modulation, as CogVideoXLayerNormZero makes it
    return x, (gate if gate_2d else gate[:, None, :]), y


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 37, 48), (1, 1, 16), (2, 226, 96), (1, 19, 300), (3, 5, 1920)])
def test_matches_reference_bit_for_bit(dtype, shape):
    x, gate, y = _inputs(*shape, dtype, seed=sum(shape))
    out = gr.gated_residual(x, gate, y)
    assert out.is_contiguous()
    _same(out, spec.gated_residual(x, gate, y))


@pytest.mark.parametrize("dtype", DTYPES)
def test_magnitudes_outliers_zeros_and_non_finite(dtype):
    x, gate, y = _inputs(2, 33, 80, dtype, seed=5, strided=False, gate_2d=True)
    big = torch.finfo(dtype).max / 4
    x[0, :4] = 0.0
    y[0, :4] = 0.0  # a zero block
    y[:, :, 7] *= 1000.0  # an outlier channel
    x[1, 2, :8] = big
    y[1, 2, :8] = big  # overflows to inf in the sum (and in the product where the gate exceeds 4)
    y[1, 3, :8] = torch.finfo(dtype).tiny / 8  # subnormal products
    x[1, 4, 1], y[1, 5, 2], y[0, 6, 3] = math.nan, math.inf, -math.inf
    gate[1, 9] = math.nan
    out = gr.gated_residual(x, gate, y)
    ref = spec.gated_residual(x, gate[:, None, :], y)
    _same(out, ref)
    assert out.isnan().any() and out.isinf().any()


def test_empty_and_tile_choice():
    x, gate, y = _inputs(2, 0, 32, torch.float32, seed=1)
    assert gr.gated_residual(x, gate, y).shape == (2, 0, 32)
    x, gate, y = _inputs(2, 45, 70, torch.bfloat16, seed=2)
    _same(gr.gated_residual(x, gate, y, tile=(8, 32, 4)), spec.gated_residual(x, gate, y))


def test_unsupported_inputs_are_named():
    x, gate, y = _inputs(2, 9, 32, torch.float32, seed=3)
    assert gr.supported(x, gate, y)
    bad = [(x, gate, y.double()), (x, gate.expand(2, 9, 32), y), (x, gate, y.transpose(1, 2).contiguous().transpose(1, 2)),
           (x[0], gate[0], y[0]), (x.int(), gate.int(), y.int())]
    for args in bad:
        assert not gr.supported(*args)
        with pytest.raises(ValueError, match="gated_residual: x and y must be"):
            gr.gated_residual(*args)


def test_ops_uses_the_kernel_where_it_serves_and_torch_elsewhere(monkeypatch):
    x, gate, y = _inputs(2, 11, 64, torch.bfloat16, seed=4)
    calls = []
    real = ops._gated_residual_kernel
    monkeypatch.setattr(ops, "_gated_residual_kernel", lambda *a: calls.append(1) or real(*a))
    _same(ops.gated_residual(x, gate, y, backend="triton"), spec.gated_residual(x, gate, y))
    assert calls == [1]
    _same(ops.gated_residual(x, gate, y, backend="torch"), spec.gated_residual(x, gate, y))
    _same(ops.gated_residual(x, gate.expand(2, 11, 64), y, backend="triton"), spec.gated_residual(x, gate, y))
    assert calls == [1]  # torch for the backend and for a per-token gate the kernel does not take
