"""The numerics spec: NVFP4 bit-exact against torchao, INT8 bounds, Hadamard algebra, outliers, errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sixbit import formats as fmt
from sixbit.routes import ROUTES

torchao_nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")


def _torchao_quantize(x: torch.Tensor):
    s = torchao_nvfp4.per_tensor_amax_to_scale(x.abs().amax())
    scales, data = torchao_nvfp4.nvfp4_quantize(x.contiguous(), 16, s)
    return data, scales, s


def _assert_same_as_torchao(x: torch.Tensor):
    ours = fmt.quantize_nvfp4(x)
    if not bool(x.any()):
        # documented deviation: torchao divides by a zero tensor scale (NaN-derived codes); sixbit keeps
        # scale 1 and all-zero codes, so the tensor dequantizes to exact zeros
        assert not bool(ours.data.any()) and ours.tensor_scale == 1
        return
    data, scales, s = _torchao_quantize(x)
    assert torch.equal(ours.data, data), "packed codes differ from torchao"
    assert torch.equal(ours.scales.view(torch.uint8), scales.view(torch.uint8)), "block scales differ"
    assert torch.equal(ours.tensor_scale, s.reshape(()))


# ------------------------------------------------------------------------- NVFP4 vs torchao (bit-exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 16), (3, 48), (17, 64), (64, 1920), (5, 7, 3072)])
def test_nvfp4_bit_exact_vs_torchao(dtype, shape):
    g = torch.Generator().manual_seed(hash((str(dtype), shape)) % 2**31)
    x = torch.randn(shape, generator=g) * torch.rand(shape[:-1] + (1,), generator=g) * 10
    x = x.to(dtype)
    x.view(-1, shape[-1])[0, :16] = 0  # an all-zero block
    x2 = x.reshape(-1, shape[-1])
    _assert_same_as_torchao(x2)
    # the N-d call equals the 2-d one
    assert torch.equal(fmt.quantize_nvfp4(x).data.reshape(x2.shape[0], -1), fmt.quantize_nvfp4(x2).data)


@pytest.mark.parametrize("scale", [1e-30, 1e-6, 1.0, 1e6, 3e36])
def test_nvfp4_bit_exact_vs_torchao_magnitudes(scale):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(32, 256, generator=g) * scale
    x[3, 100] = 50 * scale  # an outlier stretching the tensor scale
    _assert_same_as_torchao(x)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    blocks=st.integers(1, 6),
    log_scale=st.floats(-20, 20),
    seed=st.integers(0, 2**31 - 1),
    heavy=st.booleans(),
)
def test_nvfp4_property_vs_torchao_and_roundtrip(rows, blocks, log_scale, seed, heavy):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, blocks * 16, generator=g) * (2.0**log_scale)
    if heavy:
        x = x * torch.rand(rows, blocks * 16, generator=g).pow(8) * 100
    _assert_same_as_torchao(x)
    q = fmt.quantize_nvfp4(x)
    y = q.dequantize()
    assert y.shape == x.shape and torch.isfinite(y).all()
    # round-trip error bound: half the widest E2M1 step (1.0 between 4 and 6) relative to the block amax,
    # plus the e4m3 rounding of the block scale (relative 2**-4)
    xb, yb = x.reshape(rows, -1, 16), y.reshape(rows, -1, 16)
    amax = xb.abs().amax(-1, keepdim=True)
    assert bool(((yb - xb).abs() <= amax * (1.0 / 6.0) * (1 + 2**-3) + 1e-45).all())
    # signs never flip
    assert bool((torch.sign(yb) * torch.sign(xb) >= 0).all())


def test_e2m1_ties_round_to_even_and_saturate():
    vals = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 6.5, 1e9, -0.25, -5.0, -1e9, 0.0, -0.0])
    codes = fmt.e2m1_encode(vals)
    # ties go to the even code: 0.25→0 (code 0), 0.75→1.0 (2), 1.25→1.0 (2), 1.75→2.0 (4), 2.5→2 (4),
    # 3.5→4 (6), 5→4 (6); beyond 6 saturates at code 7
    assert codes.tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 14, 15, 0, 8]
    assert fmt.e2m1_decode(codes).tolist() == [0, 1, 1, 2, 2, 4, 4, 6, 6, 6, -0.0, -4, -6, 0, -0.0]
    # just off the ties, rounding is to nearest
    eps = 1e-4
    off = torch.tensor([0.25 + eps, 0.75 - eps, 1.25 + eps, 2.5 + eps, 5.0 + eps])
    assert fmt.e2m1_decode(fmt.e2m1_encode(off)).tolist() == [0.5, 0.5, 1.5, 3.0, 6.0]


def test_pack_unpack_nibble_order():
    codes = torch.tensor([[1, 2, 3, 4, 15, 0]], dtype=torch.uint8)
    packed = fmt.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x0F]]
    assert torch.equal(fmt.unpack_fp4(packed), codes)
    with pytest.raises(ValueError):
        fmt.pack_fp4(torch.zeros(1, 3, dtype=torch.uint8))


def test_nvfp4_all_zero_and_sizes():
    z = torch.zeros(4, 64)
    q = fmt.quantize_nvfp4(z)
    assert torch.equal(q.dequantize(), z)
    assert q.data.dtype == torch.uint8 and q.data.shape == (4, 32)
    assert q.scales.dtype == torch.float8_e4m3fn and q.scales.shape == (4, 4)
    # byte-accurate size: K/2 codes + K/16 scales per row + one fp32
    assert q.nbytes == 4 * 32 + 4 * 4 + 4
    w = fmt.quantize_nvfp4(torch.randn(1920, 1920))
    assert w.nbytes == 1920 * 960 + 1920 * 120 + 4
    assert 4.5 <= w.bits_per_element < 4.501


def test_nvfp4_saturation_to_six_times_scale():
    x = torch.zeros(1, 16)
    x[0, 0] = 6.0
    x[0, 1] = -3.0
    q = fmt.quantize_nvfp4(x)
    y = q.dequantize()
    assert y[0, 0] == pytest.approx(6.0, rel=2**-3) and y[0, 1] == pytest.approx(-3.0, rel=2**-3)
    assert fmt.unpack_fp4(q.data)[0, 0] == 7  # the block max maps to the top code


def test_nvfp4_rejects_bad_shape_and_nonfinite():
    with pytest.raises(ValueError, match="multiple of 16"):
        fmt.quantize_nvfp4(torch.randn(2, 20))
    x = torch.randn(2, 32)
    x[1, 5] = float("nan")
    with pytest.raises(fmt.NonFiniteError, match="non-finite"):
        fmt.quantize_nvfp4(x)
    x[1, 5] = float("inf")
    with pytest.raises(fmt.NonFiniteError):
        fmt.quantize_nvfp4(x)


def test_nvfp4_nonfinite_documented_result():
    # with a given finite tensor scale, only the blocks holding non-finite values become NaN
    x = torch.randn(2, 48)
    x[1, 20] = float("inf")
    s = fmt.nvfp4_tensor_scale(torch.randn(2, 48))
    y = fmt.quantize_nvfp4(x, s, check_finite=False).dequantize()
    assert torch.isnan(y[1, 16:32]).all()
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[1, :16]).all() and torch.isfinite(y[1, 32:]).all()
    # with the tensor scale taken from the tensor, the whole tensor is NaN — never a finite value
    x[1, 20] = float("nan")
    y = fmt.quantize_nvfp4(x, check_finite=False).dequantize()
    assert not torch.isfinite(y).any()


# ---------------------------------------------------------------------------------------------- INT8


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 8), k=st.integers(1, 300), log_scale=st.floats(-30, 30), seed=st.integers(0, 2**31 - 1))
def test_int8_error_bound_and_codes(rows, k, log_scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * (2.0**log_scale)
    q = fmt.quantize_int8(x)
    assert q.data.dtype == torch.int8 and q.scale.shape == (rows, 1)
    assert int(q.data.min()) >= -127 and int(q.data.max()) <= 127
    amax = x.abs().amax(-1, keepdim=True)
    err = (q.dequantize() - x).abs()
    # half a step, with a little slack for fp32 rounding of the scale
    assert bool((err <= amax / 127 * 0.5 * (1 + 1e-5) + 1e-45).all())
    # the row max maps to ±127 exactly
    assert bool((q.data.abs().amax(-1) == 127).all())


def test_int8_zero_rows_rounding_and_nonfinite():
    x = torch.tensor([[0.0, 0.0, 0.0], [127.0, 0.5, 1.5], [127.0, -2.5, 63.5]])
    q = fmt.quantize_int8(x)
    assert q.scale[0, 0] == 1.0 and torch.equal(q.dequantize()[0], x[0])
    assert q.data[1].tolist() == [127, 0, 2] and q.data[2].tolist() == [127, -2, 64]  # half to even
    bad = torch.randn(3, 8)
    bad[2, 2] = float("-inf")
    with pytest.raises(fmt.NonFiniteError):
        fmt.quantize_int8(bad)
    y = fmt.quantize_int8(bad, check_finite=False).dequantize()
    assert torch.isnan(y[2]).all() and torch.isfinite(y[:2]).all()


# ------------------------------------------------------------------------------------------ Hadamard


@pytest.mark.parametrize("n", [2, 16, 32, 64, 128])
def test_hadamard_orthonormal_and_symmetric(n):
    h = fmt.hadamard_matrix(n, torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    assert torch.equal(h, h.T)
    assert torch.allclose(h.abs(), torch.full_like(h, 1 / math.sqrt(n)))


@pytest.mark.parametrize("block", [16, 32, 64, 128])
@pytest.mark.parametrize("k", [1920, 3072, 384])
def test_hadamard_folding_preserves_linear(block, k):
    g = torch.Generator().manual_seed(block + k)
    x = torch.randn(5, k, generator=g, dtype=torch.float64)
    w = torch.randn(24, k, generator=g, dtype=torch.float64)
    xr = fmt.block_hadamard(x.float(), block).double()
    wr = fmt.fold_hadamard(w.float(), block).double()
    ref = x @ w.T
    assert torch.allclose(xr @ wr.T, ref, rtol=1e-4, atol=1e-3 * ref.abs().max().item())
    # applying it twice is the identity
    assert torch.allclose(fmt.block_hadamard(fmt.block_hadamard(x.float(), block), block).double(), x, atol=1e-5)


def test_hadamard_bad_blocks():
    with pytest.raises(ValueError, match="power of two"):
        fmt.block_hadamard(torch.randn(2, 48), 24)
    with pytest.raises(ValueError, match="does not divide"):
        fmt.block_hadamard(torch.randn(2, 48), 32)


def test_hadamard_spreads_an_outlier():
    x = torch.zeros(1, 256)
    x[0, 3] = 64.0
    r = fmt.block_hadamard(x, 64)
    assert torch.allclose(r[0, :64].abs(), torch.full((64,), 8.0)) and not r[0, 64:].any()
    assert fmt.outlier_ratio(x) > 0 and fmt.outlier_ratio(r) == 0


# ------------------------------------------------------------------------------ outliers, errors, linear


def test_outlier_ratio_definition():
    x = torch.ones(4, 100)
    assert fmt.outlier_ratio(x) == 0
    x[1, 7] = 1000.0  # rms of row 1 ≈ 100 → 1000 > 8·100
    count, n = fmt.outlier_count(x)
    assert int(count) == 1 and n == 400
    assert fmt.outlier_ratio(x).item() == pytest.approx(1 / 400)
    assert fmt.outlier_ratio(torch.zeros(3, 16)) == 0
    # with k=0.5 every 1 of the three flat rows counts, but not the 1s beside row 1's spike
    assert fmt.outlier_ratio(x, k_sigma=0.5).item() == pytest.approx(301 / 400)


@pytest.mark.parametrize("chunk", [1, 7, 100, 10_000])
def test_outlier_count_in_row_chunks_equals_the_whole(monkeypatch, chunk):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 37, 64, generator=g, dtype=torch.float32).to(torch.bfloat16)
    x[0, ::5, 3] = 40.0
    xf = x.float().reshape(-1, 64)
    whole = int((xf.abs() > 4.0 * xf.pow(2).mean(-1, keepdim=True).sqrt()).sum())
    monkeypatch.setattr(fmt, "OUTLIER_CHUNK_ELEMS", chunk)  # rows per chunk: max(1, chunk // 64)
    count, n = fmt.outlier_count(x, 4.0)
    assert int(count) == whole > 0 and n == x.numel() and count.dtype == torch.int64
    assert int(fmt.outlier_count(x[:0], 4.0)[0]) == 0


def test_relative_error():
    y = torch.tensor([3.0, 4.0])
    assert fmt.relative_error(y, y) == 0
    assert fmt.relative_error(y + torch.tensor([0.0, 0.5]), y).item() == pytest.approx(0.1)
    assert fmt.relative_error(torch.zeros(2), torch.zeros(2)) == 0
    assert torch.isinf(fmt.relative_error(torch.ones(2), torch.zeros(2)))


@pytest.mark.parametrize("block", [None, 32])
def test_reference_linear_routes_order_of_error(block):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    x[:, 5] *= 30  # an outlier channel, as in DiT activations
    w = torch.randn(96, 256, generator=g) / 16
    b = torch.randn(96, generator=g)
    y = torch.nn.functional.linear(x, w, b)
    errs = {r: fmt.relative_error(fmt.reference_linear(x, w, b, r, block), y).item() for r in ROUTES}
    assert errs["fp16"] == 0
    assert errs["w4a16"] < errs["int8"] <= errs["nvfp4"] + 1e-6
    assert errs["w8a8"] < errs["int8"]
    assert errs["nvfp4"] < 0.25
    with pytest.raises(ValueError, match="unknown route"):
        fmt.reference_linear(x, w, b, "fp8")


def test_hadamard_reduces_int8_error_with_an_outlier_channel():
    # per-token INT8 spends its whole range on one outlier channel; the rotation spreads it over a block
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 512, generator=g)
    x[:, 7] *= 200
    w = torch.randn(64, 512, generator=g) / 20
    y = x @ w.T
    # (w8a8, so that the 4-bit weight error does not mask the activation error)
    plain = fmt.relative_error(fmt.reference_linear(x, w, None, "w8a8"), y)
    rotated = fmt.relative_error(fmt.reference_linear(x, w, None, "w8a8", 128), y)
    assert rotated < 0.5 * plain


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_linear_keeps_dtype(dtype):
    x = torch.randn(3, 7, 64).to(dtype)
    w = torch.randn(32, 64)
    for route in ROUTES:
        y = fmt.reference_linear(x, w, None, route, 16)
        assert y.dtype == dtype and y.shape == (3, 7, 32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_attention_kv_stats_v_amax_is_max_abs_exactly_without_a_copy(dtype):
    """The K/V statistics' V amax (an ∞-norm reduction since session 21, no |V| copy) is max |v| bit for bit on a
    strided [B, H, S, D] view — ±0, ±inf — and a head with a NaN (or an inf) anywhere gets NaN for every channel."""
    g = torch.Generator().manual_seed(3)
    v = torch.randn(2, 40, 3, 8, generator=g).to(dtype).transpose(1, 2)  # the processor's [B, S, H, D] layout
    k = torch.randn(2, 40, 3, 8, generator=g).to(dtype).transpose(1, 2)
    v[1, 1, :, 3] = -0.0
    v[0, 2, 7, 5] = -100.0
    _, amax = fmt.attention_kv_stats(k, v)
    assert torch.equal(amax, v.abs().amax(dim=2).float()) and amax[0, 2, 5] == 100.0 and amax[1, 1, 3] == 0.0
    v[0, 0, 3, 2] = float("nan")
    v[1, 2, 5, 1] = -float("inf")
    _, amax = fmt.attention_kv_stats(k, v)
    assert bool(amax[0, 0].isnan().all()) and bool(amax[1, 2].isnan().all())
    assert torch.equal(amax[0, 1], v[0, 1].abs().amax(dim=0).float())
