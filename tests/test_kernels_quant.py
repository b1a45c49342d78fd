"""Fused Hadamard + quantize kernels against ``sixbit.formats`` (bit-exact where the spec allows).

On a CPU-only host these run in triton's interpreter (``TRITON_INTERPRET=1``, set by tests/conftest.py
before any kernel module is imported; set here too for a standalone run); on a CUDA host the compiled
kernels run on the GPU and the reference is computed on the CPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sixbit_kernels as sk  # noqa: E402
from sixbit import formats as spec  # noqa: E402

hq = sk.hadamard_quant
_e2m1_encode = sk._common.e2m1_encode

DEV = "cuda" if torch.cuda.is_available() else "cpu"
E2M1_MAG = torch.tensor(spec.E2M1_VALUES)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(m, k, seed, dtype=torch.bfloat16, scale=1.0):
    g = _gen(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).add(0.1) * scale
    return x.to(dtype)


def _codes(t: spec.NVFP4Tensor):
    return spec.unpack_fp4(t.data.cpu())


def _assert_int8_equal(q, ref):
    assert q.data.dtype == torch.int8
    d = q.data.cpu() != ref.data
    assert not bool(d.any()), f"{int(d.sum())} int8 codes differ"
    assert torch.equal(q.scale.cpu(), ref.scale), "int8 scales differ"


def _assert_nvfp4_equal(q, ref):
    assert torch.equal(q.tensor_scale.cpu().reshape(()), ref.tensor_scale.reshape(())), "tensor scale differs"
    assert torch.equal(q.scales.cpu().view(torch.uint8), ref.scales.view(torch.uint8)), "block scales differ"
    d = spec.unpack_fp4(q.data.cpu()) != spec.unpack_fp4(ref.data)
    assert not bool(d.any()), f"{int(d.sum())} NVFP4 codes differ"


# ----------------------------------------------------------- bit-exact on the same (rotated) input


@pytest.mark.parametrize("m,k", [(1, 16), (17, 256), (255, 48), (4, 1920), (3, 3072)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_bit_exact_without_rotation(m, k, dtype):
    x = _rand(m, k, seed=m * 7 + k, dtype=dtype, scale=5.0)
    x[m // 2] = 0  # an all-zero row
    x[0, k // 3] = 300.0  # a large outlier
    xd = x.to(DEV)
    q8, c8 = hq.quantize_int8_act(xd, None, k_sigma=4.0)
    _assert_int8_equal(q8, spec.quantize_int8(x.float()))
    q4, c4 = hq.quantize_nvfp4_act(xd, None, k_sigma=4.0)
    _assert_nvfp4_equal(q4, spec.quantize_nvfp4(x.float()))
    ref_count = int(spec.outlier_count(x, 4.0)[0])
    assert int(c8) == ref_count and int(c4) == ref_count


@pytest.mark.parametrize("hb", [16, 32, 64, 128])
def test_quantize_bit_exact_on_rotated_input(hb):
    """The spec's rotation computed by formats, handed to the kernels un-fused: bit-exact."""
    x = _rand(33, 384, seed=hb)
    xr = spec.block_hadamard(x, hb)
    _assert_int8_equal(hq.quantize_int8_act(xr.to(DEV), None)[0], spec.quantize_int8(xr))
    _assert_nvfp4_equal(hq.quantize_nvfp4_act(xr.to(DEV), None)[0], spec.quantize_nvfp4(xr))


@pytest.mark.parametrize("hb", [16, 64])
@pytest.mark.parametrize("m,k", [(1, 64), (19, 256), (5, 1920)])
def test_fused_rotation_bit_exact_when_sums_are_exact(hb, m, k):
    """Integer-valued bf16 inputs (|x| ≤ 64, one power-of-two scale): every partial sum of the rotation is
    exact and 1/sqrt(hb) is a power of two, so fused and reference rotations agree in every bit."""
    g = _gen(hb + m + k)
    x = (torch.randint(-64, 65, (m, k), generator=g).float() * 2.0**-3).to(torch.bfloat16)
    xr = spec.block_hadamard(x, hb)
    xd = x.to(DEV)
    _assert_int8_equal(hq.quantize_int8_act(xd, hb)[0], spec.quantize_int8(xr))
    _assert_nvfp4_equal(hq.quantize_nvfp4_act(xd, hb)[0], spec.quantize_nvfp4(xr))


# ------------------------------------------------------- fused rotation on random data: rare ±1 steps


def _mag_index(codes):
    return (codes & 7).long()


@pytest.mark.parametrize("hb", [16, 32, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_rotation_random_inputs(hb, dtype):
    """Documented behaviour: with the rotation fused, a code may differ from the reference by one step
    where a rotated value sits on a rounding tie (the fused sum is ordered differently). Bound the rate."""
    m, k = 67, 512
    x = _rand(m, k, seed=3 * hb, dtype=dtype, scale=3.0)
    xr = spec.block_hadamard(x, hb)
    q8, _ = hq.quantize_int8_act(x.to(DEV), hb)
    r8 = spec.quantize_int8(xr)
    d = (q8.data.cpu().int() - r8.data.int()).abs()
    assert int(d.max()) <= 1 and float((d > 0).float().mean()) < 1e-3
    torch.testing.assert_close(q8.scale.cpu(), r8.scale, rtol=1e-5, atol=0)

    q4, _ = hq.quantize_nvfp4_act(x.to(DEV), hb)
    r4 = spec.quantize_nvfp4(xr)
    torch.testing.assert_close(q4.tensor_scale.cpu().reshape(()), r4.tensor_scale, rtol=1e-5, atol=0)
    sb = (q4.scales.cpu().view(torch.uint8).int() - r4.scales.view(torch.uint8).int()).abs()
    assert int(sb.max()) <= 1 and float((sb > 0).float().mean()) < 1e-2
    c, rc = _codes(q4), _codes(r4)
    dm = (_mag_index(c) - _mag_index(rc)).abs()
    assert int(dm.max()) <= 1 and float((dm > 0).float().mean()) < 1e-2
    # every rotated value dequantizes to (nearly) the same number
    err = spec.relative_error(q4.dequantize(torch.float32).cpu(), r4.dequantize(torch.float32))
    assert float(err) < 2e-2


# ---------------------------------------------------------------------------- magnitudes, edge cases


@pytest.mark.parametrize("scale", [1e-30, 1e-6, 1.0, 1e4, 3e30])
def test_huge_and_tiny_magnitudes(scale):
    x = _rand(9, 128, seed=11, dtype=torch.float32, scale=scale)
    x[2, 5] = 40 * scale
    _assert_int8_equal(hq.quantize_int8_act(x.to(DEV), None)[0], spec.quantize_int8(x))
    _assert_nvfp4_equal(hq.quantize_nvfp4_act(x.to(DEV), None)[0], spec.quantize_nvfp4(x))


def test_all_zero_tensor():
    x = torch.zeros(5, 64, dtype=torch.bfloat16)
    q8, c8 = hq.quantize_int8_act(x.to(DEV), 16, k_sigma=8.0)
    _assert_int8_equal(q8, spec.quantize_int8(x.float()))
    q4, c4 = hq.quantize_nvfp4_act(x.to(DEV), 16, k_sigma=8.0)
    _assert_nvfp4_equal(q4, spec.quantize_nvfp4(x.float()))
    assert int(c8) == 0 and int(c4) == 0
    assert not bool(q4.dequantize(torch.float32).cpu().any())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_inputs_give_documented_nan(bad):
    x = _rand(6, 64, seed=5, dtype=torch.float32)
    x[3, 17] = bad
    q8, _ = hq.quantize_int8_act(x.to(DEV), 16)
    s = q8.scale.cpu().reshape(-1)
    assert bool(torch.isnan(s[3])) and bool(torch.isfinite(torch.cat([s[:3], s[4:]])).all())
    deq = q8.dequantize(torch.float32).cpu()
    assert bool(torch.isnan(deq[3]).all()) and bool(torch.isfinite(deq[[0, 1, 2, 4, 5]]).all())
    ref8 = spec.quantize_int8(spec.block_hadamard(x, 16), check_finite=False)
    assert torch.equal(q8.data.cpu()[[0, 1, 2, 4, 5]], ref8.data[[0, 1, 2, 4, 5]])
    q4, _ = hq.quantize_nvfp4_act(x.to(DEV), 16)
    assert bool(torch.isnan(q4.dequantize(torch.float32).cpu()).all()), "one non-finite value: whole tensor NaN"


def test_outlier_count_matches_spec():
    x = _rand(40, 256, seed=21, scale=1.0).float()
    x[:, 7] *= 30.0  # an outlier channel
    x[5] = 0
    for ks in (2.0, 4.0, 8.0):
        ref = int(spec.outlier_count(x, ks)[0])
        assert int(hq.outlier_count(x.to(DEV), ks)) == ref
        assert int(hq.quantize_int8_act(x.to(DEV), 32, k_sigma=ks)[1]) == ref
        assert int(hq.nvfp4_amax(x.to(DEV), 32, k_sigma=ks)[1]) == ref
        assert int(hq.rotate_split(x.to(DEV), 32, k_sigma=ks)[1]) == ref


# ------------------------------------------------------------------ dense (Hopper operand) variants


def test_dense_outputs_are_the_packed_values():
    x = _rand(21, 256, seed=8, scale=2.0)
    q4, _ = hq.quantize_nvfp4_act(x.to(DEV), 32)
    (vals, bs, ts), _ = hq.quantize_nvfp4_act(x.to(DEV), 32, dense=True)
    codes = _codes(q4)
    mag = E2M1_MAG[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    exact = (mag.view(21, -1, 16) * q4.scales.cpu().float().unsqueeze(-1) * 2.0**-7).view(21, 256)
    assert vals.dtype == torch.float16
    assert torch.equal(vals.cpu().float(), exact), "dense values must be E2M1 * bs * 2**-7 exactly"
    assert torch.equal(bs.cpu().view(torch.uint8), q4.scales.cpu().view(torch.uint8))
    assert torch.equal(ts.cpu(), q4.tensor_scale.cpu())
    q8, _ = hq.quantize_int8_act(x.to(DEV), 32)
    d8, _ = hq.quantize_int8_act(x.to(DEV), 32, dense=True)
    assert d8.data.dtype == torch.float16
    assert torch.equal(d8.data.cpu().float(), q8.data.cpu().float())
    assert torch.equal(d8.scale.cpu(), q8.scale.cpu())


def test_rotate_split_precision():
    x = _rand(13, 640, seed=4, dtype=torch.float32, scale=7.0)
    sp, _ = hq.rotate_split(x.to(DEV), 128)
    assert sp.hilo.shape == (13, 1280) and sp.hilo.dtype == torch.bfloat16
    xr = spec.block_hadamard(x, 128)
    rec = sp.value().cpu()
    # hi + lo carries ≥ 16 significant bits (the interpreter truncates fp32 → bf16; the GPU rounds)
    err = (rec - xr).abs() / xr.abs().amax(dim=1, keepdim=True)
    assert float(err.max()) < 2.0**-15


@pytest.mark.parametrize("k,hb", [(640, 128), (3072, 64), (48, None)])
def test_scale16_act_precision(k, hb):
    """fp16 values scaled per token: values × row scale = block_hadamard(x) to fp16 precision, whatever the
    magnitude (rows from 1e-6 to 1e6 and an all-zero row), the row scale is the INT8 pass's, one count."""
    x = _rand(11, k, seed=k, dtype=torch.float32, scale=3.0) * torch.logspace(-6, 6, 11).unsqueeze(1)
    x[3] = 0.0
    d, c = hq.scale16_act(x.to(DEV), hb, k_sigma=4.0)
    assert d.fmt == "fp16" and d.values.dtype == torch.float16 and d.row_scale.shape == (11, 1)
    xr = spec.block_hadamard(x, hb) if hb else x
    err = (d.dequantize().cpu() - xr).abs() / xr.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    assert float(err.max()) <= 2.0**-11
    assert float(d.values.abs().max()) <= 127.0 and bool((d.values[3] == 0).all())
    q8, c8 = hq.quantize_int8_act(x.to(DEV), hb, k_sigma=4.0)
    assert torch.equal(d.row_scale.cpu(), q8.scale.cpu()) and int(c) == int(c8)


def test_rejects_bad_shapes():
    with pytest.raises(ValueError):
        hq.quantize_int8_act(torch.zeros(4, 40, device=DEV), None)  # K not a multiple of 16
    with pytest.raises(ValueError):
        hq.quantize_int8_act(torch.zeros(4, 96, device=DEV), 64)  # block does not divide K
    with pytest.raises(ValueError):
        hq.quantize_int8_act(torch.zeros(4, 64, device=DEV), 24)  # not a power of two


@pytest.mark.parametrize("hb", [None, 64])
def test_multi_step_rows_equal_single_step(hb):
    """A small register tile forces several steps per token (second pass re-reads the rows): results must
    be bit-identical to the one-step kernel for every mode."""
    x = _rand(9, 3072, seed=31, scale=2.0)  # 24 or 48 chunks: tile 16 → 2-3 steps; tile 256 → 1 step
    x[4, 100] = 90.0
    xd = x.to(DEV)
    one, many = (256, 8, 2), (16, 4, 3)  # `one` splits its row into two tiles (second tile: 64 rows)
    assert hq.rows_geometry(3072 // (64 if hb else 128), 256)[2] > 0
    a8, ac = hq.quantize_int8_act(xd, hb, k_sigma=4.0, config=one)
    b8, bc = hq.quantize_int8_act(xd, hb, k_sigma=4.0, config=many)
    assert torch.equal(a8.data, b8.data) and torch.equal(a8.scale, b8.scale) and int(ac) == int(bc)
    am, amc = hq.nvfp4_amax(xd, hb, k_sigma=4.0, config=one)
    bm, bmc = hq.nvfp4_amax(xd, hb, k_sigma=4.0, config=many)
    assert torch.equal(am, bm) and int(amc) == int(bmc) == int(spec.outlier_count(x, 4.0)[0])
    sa, _ = hq.rotate_split(xd, hb, config=one)
    sb, _ = hq.rotate_split(xd, hb, config=many)
    assert torch.equal(sa.hilo, sb.hilo)
    assert int(hq.outlier_count(xd, 4.0, config=many)) == int(ac)
    c8, cc = hq.quantize_int8_act(xd, hb, k_sigma=4.0, config=one, split=False)  # pads instead: same bits
    assert torch.equal(a8.data, c8.data) and torch.equal(a8.scale, c8.scale) and int(ac) == int(cc)
    ref = spec.quantize_int8(spec.block_hadamard(x, hb) if hb else x.float())
    if hb is None:
        _assert_int8_equal(b8, ref)


def test_rows_geometry_splits_padded_rows():
    """One-step rows that would pad the register tile by more than 1/8 become two power-of-two tiles per
    token (no idle lanes) when the second tile keeps SPLIT_MIN_ROWS rows; rows that pad little, take
    several steps, or would leave a small second tile keep one padded tile."""
    assert hq.SPLIT_MIN_ROWS == 64
    assert hq.rows_geometry(30, 64) == (2, 32, 0, 1)  # K 1920 / 64: 32 rows, 2 idle
    assert hq.rows_geometry(48, 256) == (4, 32, 16, 1)  # K 3072 / 64 on the long config: 128 + 64 rows
    assert hq.rows_geometry(48, 64) == (1, 64, 0, 1)  # on the short config the split tile would be 16 rows
    assert hq.rows_geometry(48, 64, min_rows=16) == (1, 32, 16, 1)
    assert hq.rows_geometry(120, 256) == (2, 128, 0, 1)  # K 7680
    assert hq.rows_geometry(192, 256) == (1, 128, 64, 1)  # K 12288: 128 + 64, was 256 with 64 idle
    assert hq.rows_geometry(24, 64) == (2, 32, 0, 1)  # Wan's 1536: a 16-row split tile would be slower
    assert hq.rows_geometry(48, 16) == (1, 16, 0, 3)  # several steps: no split
    assert hq.rows_geometry(33, 64, min_rows=16) == (1, 64, 0, 1)  # the rest would be a 1-row tile
    assert hq.rows_geometry(48, 256, split=False) == (4, 64, 0, 1)
    for nchr in range(1, 300):
        for mr in (16, 64):
            tok, g, g2, nstep = hq.rows_geometry(nchr, 128, min_rows=mr)
            assert tok * (g + g2) <= 128 and (g + g2) * nstep >= nchr and (g2 == 0 or tok * g2 >= mr)


def test_e2m1_encode_matches_spec_on_ties_and_neighbours():
    """The kernels' branch-light E2M1 rounding equals formats.e2m1_encode on every tie, both fp32
    neighbours of every tie, signed zeros, saturation and a dense grid."""
    import triton
    import triton.language as tl

    @triton.jit
    def _enc(v_ptr, c_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(v_ptr + i, mask=i < n, other=0.0)
        tl.store(c_ptr + i, _e2m1_encode(v).to(tl.uint8), mask=i < n)

    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    near = torch.cat([ties, torch.nextafter(ties, torch.zeros_like(ties)), torch.nextafter(ties, ties * 2)])
    v = torch.cat([near, -near, torch.linspace(-7.5, 7.5, 3001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 6.5, 7.0, 1e6, -1e6])])
    c = torch.empty(v.numel(), dtype=torch.uint8)
    vd, cd = v.to(DEV), c.to(DEV)
    _enc[(triton.cdiv(v.numel(), 1024),)](vd, cd, v.numel(), BLOCK=1024, enable_fp_fusion=False)
    ref = spec.e2m1_encode(v.clamp(-6, 6))
    bad = cd.cpu() != ref
    assert not bool(bad.any()), list(zip(v[bad].tolist()[:5], cd.cpu()[bad].tolist()[:5], ref[bad].tolist()[:5]))
