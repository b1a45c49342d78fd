"""``sixbit_kernels.ops``: packed weights, ``linear`` per route and backend, dispatch, Blackwell emulation."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sixbit_kernels as sk  # noqa: E402
from sixbit import formats as spec  # noqa: E402

blackwell = sk.blackwell
ops = sk.ops

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _layer(n, k, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g) if bias else None
    return w, b


def _x(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[..., 5] *= 25.0  # an outlier channel
    return x.to(dtype)


# ------------------------------------------------------------------------------------ packed weights


@pytest.mark.parametrize("n,k", [(48, 64), (1920, 1920)])
def test_pack_linear_nbytes_exact(n, k):
    w, b = _layer(n, k, seed=1)
    p = ops.pack_linear(w, b.to(torch.bfloat16), formats=("nvfp4", "int8"), hadamard_block=16)
    nv = n * k // 2 + n * k // 16 + 4
    i8 = n * k + n * 4
    assert p.weight_nbytes == nv + i8
    assert p.nbytes == nv + i8 + 2 * n
    assert p.formats == ("nvfp4", "int8") and p.in_features == k and p.out_features == n
    assert p.hadamard_block == 16
    assert 4.5 <= p.bits_per_weight("nvfp4") <= 4.5 + 32 / (n * k)
    held = [p.w4.data, p.w4.scales, p.w4.tensor_scale, p.w8.data, p.w8.scale, p.bias]
    assert p.nbytes == sum(t.numel() * t.element_size() for t in held)
    only4 = ops.pack_linear(w, None)
    assert only4.formats == ("nvfp4",) and only4.nbytes == nv and only4.w8 is None
    # the packed weights are exactly formats.quantize_weight's
    ref = spec.quantize_weight(w, "nvfp4", 16)
    assert torch.equal(p.w4.data, ref.data) and torch.equal(p.w4.scales.view(torch.uint8), ref.scales.view(torch.uint8))


def test_host_grid_helpers_match_triton():
    """The launch wrappers' plain-Python grid math equals triton's helpers (which cost ~6 µs a call)."""
    import triton

    common = sk._common
    assert all(common.next_pow2(n) == triton.next_power_of_2(n) for n in range(0, 4100))
    assert all(common.cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 300) for b in range(1, 40))


def test_pack_linear_to_device_and_errors():
    w, b = _layer(32, 64, seed=2)
    p = ops.pack_linear(w, b).to(DEV)
    assert p.w4.data.device.type == DEV and p.bias.device.type == DEV
    with pytest.raises(ValueError):
        ops.pack_linear(w, b, formats=("fp8",))
    with pytest.raises(ValueError):
        ops.pack_linear(w, b, hadamard_block=24)
    with pytest.raises(ValueError):
        ops.pack_linear(torch.randn(8, 40), None)  # K not a multiple of 16 for NVFP4


# ------------------------------------------------------------------------------------------ linear


ROUTES = ("nvfp4", "int8", "w8a8", "w4a8_requant", "w4a16")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("hb", [None, 32])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_linear_matches_reference_linear(route, hb, backend):
    w, b = _layer(40, 128, seed=3)
    x = _x((2, 9, 128), seed=4)
    p = ops.pack_linear(w, b, formats=("nvfp4", "int8"), hadamard_block=hb).to(DEV)
    y, count = ops.linear(x.to(DEV), p, route, k_sigma=6.0, backend=backend)
    assert y.shape == (2, 9, 40) and y.dtype == x.dtype
    ref = spec.reference_linear(x, w, b, route, hb)
    assert int(count) == int(spec.outlier_count(x.reshape(-1, 128), 6.0)[0]) and count.dtype == torch.int64
    err = float(spec.relative_error(y.cpu(), ref))
    # both are bf16 roundings of (nearly) the same fp32 values; the fused rotation may move a few codes
    assert err <= (1e-3 if hb is None else 5e-3), err


@pytest.mark.parametrize("route", ROUTES)
def test_linear_triton_equals_torch_backend_fp32(route):
    """fp32 activations and outputs: the Triton path equals the torch reference to fp32 accumulation."""
    w, b = _layer(24, 64, seed=5)
    x = _x((7, 64), seed=6, dtype=torch.float32)
    p = ops.pack_linear(w, b, formats=("nvfp4", "int8")).to(DEV)
    yt, ct = ops.linear(x.to(DEV), p, route, backend="triton")
    yr, cr = ops.linear(x, p.to("cpu"), route, backend="torch")
    assert ct is None and cr is None
    assert float(spec.relative_error(yt.cpu(), yr)) <= 1e-3


def test_linear_without_bias_and_empty_input():
    w, _ = _layer(16, 32, seed=7)
    p = ops.pack_linear(w, None).to(DEV)
    y, c = ops.linear(torch.zeros(0, 32, device=DEV), p, "nvfp4", k_sigma=8.0, backend="triton")
    assert y.shape == (0, 16) and int(c) == 0
    x = _x((3, 32), seed=8)
    y, c = ops.linear(x.to(DEV), p, "int8", backend="triton")
    assert c is None
    assert float(spec.relative_error(y.cpu(), spec.reference_linear(x, w, None, "int8"))) <= 2e-3


def test_linear_route_errors():
    w, b = _layer(16, 32, seed=9)
    p = ops.pack_linear(w, b)
    with pytest.raises(ValueError, match="int8"):
        ops.linear(_x((2, 32), 1), p, "w8a8")  # no int8 weights packed
    with pytest.raises(ValueError, match="fp16"):
        ops.linear(_x((2, 32), 1), p, "fp16")
    with pytest.raises(ValueError):
        ops.linear(_x((2, 48), 1), p, "nvfp4")
    with pytest.raises(ValueError):
        ops.linear(_x((2, 32), 1), p, "nvfp4", backend="cuda")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_act_cache_quantizes_a_shared_input_once(backend):
    """Q/K/V-style reuse: layers reading the same tensor share one quantization per operand form; the
    outputs equal uncached calls; an in-place change, another tensor or another route misses; the entry
    goes when the input is freed."""
    import gc

    layers = [ops.pack_linear(*_layer(32, 64, s), formats=("nvfp4", "int8"), hadamard_block=16) for s in (1, 2, 3)]
    layers = [p.to(DEV) for p in layers]
    x = _x((2, 5, 64), 4).to(DEV)
    cache = ops.ActCache()
    for p in layers:
        y, c = ops.linear(x, p, "nvfp4", k_sigma=4.0, backend=backend, cache=cache)
        y0, c0 = ops.linear(x, p, "nvfp4", k_sigma=4.0, backend=backend)
        assert torch.equal(y, y0) and int(c) == int(c0)
    assert cache.hits == 2
    ops.linear(x, layers[0], "int8", backend=backend, cache=cache)  # another form: a miss
    ops.linear(x, layers[1], "w8a8", backend=backend, cache=cache)  # int8 codes: shared with the int8 route
    assert cache.hits == (3 if backend == "torch" else 2)
    x2 = x.clone()
    ops.linear(x2, layers[0], "nvfp4", k_sigma=4.0, backend=backend, cache=cache)  # another tensor: a miss
    assert cache.hits == (3 if backend == "torch" else 2)
    x2.mul_(2.0)  # in place: the version changes, the stale operand must not be used
    y, _ = ops.linear(x2, layers[0], "nvfp4", k_sigma=4.0, backend=backend, cache=cache)
    assert torch.equal(y, ops.linear(x2, layers[0], "nvfp4", k_sigma=4.0, backend=backend)[0])
    assert cache._ops
    del x2
    gc.collect()
    assert not cache._ops  # freed input → the operand is dropped
    with torch.inference_mode():  # no version counter there: identity alone
        xi = x.clone()
        ops.linear(xi, layers[0], "nvfp4", backend=backend, cache=cache)
        ops.linear(xi, layers[1], "nvfp4", backend=backend, cache=cache)
    assert cache.hits == (4 if backend == "torch" else 3)


def test_linear_nan_input_gives_nan_output():
    w, b = _layer(16, 32, seed=10)
    p = ops.pack_linear(w, b, formats=("nvfp4", "int8")).to(DEV)
    x = _x((4, 32), seed=11)
    x[2, 3] = float("nan")
    y4, _ = ops.linear(x.to(DEV), p, "nvfp4", backend="triton")
    assert bool(torch.isnan(y4).all()), "NVFP4: one NaN poisons the per-tensor scale"
    for route in ("w8a8", "w4a8_requant"):  # per-token INT8: the NaN token alone
        y8, _ = ops.linear(x.to(DEV), p, route, backend="triton")
        assert bool(torch.isnan(y8[2]).all()) and bool(torch.isfinite(y8[[0, 1, 3]]).all()), route


def test_quantize_act_both_backends_agree():
    x = _x((11, 256), seed=12)
    for fmt in ("nvfp4", "int8"):
        qt, ct = ops.quantize_act(x.to(DEV), fmt, 16, k_sigma=5.0, backend="triton")
        qr, cr = ops.quantize_act(x, fmt, 16, k_sigma=5.0, backend="torch")
        assert int(ct) == int(cr)
        assert float(spec.relative_error(qt.dequantize(torch.float32).cpu(), qr.dequantize(torch.float32))) < 1e-2


def test_compute_path_and_auto_backend():
    assert ops.compute_path("cpu") == "cpu-reference"
    if torch.cuda.is_available():
        major = torch.cuda.get_device_capability()[0]
        variant = sk.targets.device_target("cuda").variant if major >= 8 else None
        expect = {"hopper": "hopper-triton", "portable": "portable-triton", None: "cuda-reference"}[variant]
        if major >= 10 and blackwell.native_fp4_available("cuda"):
            expect = "blackwell-native (unverified) + " + expect
        assert ops.compute_path("cuda").startswith(expect)
    # auto on CPU is the torch reference: identical to reference_linear
    w, b = _layer(16, 64, seed=13)
    x = _x((5, 64), seed=14)
    p = ops.pack_linear(w, b, hadamard_block=64)
    y, _ = ops.linear(x, p, "nvfp4")
    assert torch.equal(y, spec.reference_linear(x, w, b, "nvfp4", 64))


# ------------------------------------------------------------------------ Blackwell (emulated only)


def test_blackwell_scale_swizzle_roundtrip_and_layout():
    s = torch.arange(200 * 9, dtype=torch.float32).remainder(200).add(1).view(200, 9)
    s8 = (s / 8).to(torch.float8_e4m3fn)
    flat = blackwell.swizzle_scales(s8)
    assert flat.numel() == 256 * 12  # padded to 128 x 4 tiles
    assert torch.equal(blackwell.unswizzle_scales(flat, 200, 9).view(torch.uint8), s8.view(torch.uint8))
    # cuBLAS layout: (row r, col c) of tile (0, 0) sits at (r % 32) * 16 + (r // 32) * 4 + c
    u = flat.view(torch.uint8)
    for r, c in ((0, 0), (5, 3), (37, 1), (127, 2)):
        assert u[(r % 32) * 16 + (r // 32) * 4 + c] == s8.view(torch.uint8)[r, c]
    # second tile along K starts after the first 512 entries
    assert u[512] == s8.view(torch.uint8)[0, 4]


def test_blackwell_emulated_numerics():
    """The arguments handed to torch._scaled_mm (FP4 data, transposed weight view, swizzled scales),
    multiplied by the emulator, reproduce the W4A4 reference."""
    w, b = _layer(72, 128, seed=15)
    x = _x((33, 128), seed=16, dtype=torch.float32)
    wq = spec.quantize_nvfp4(w)
    xq = spec.quantize_nvfp4(x)
    y = blackwell.emulated_linear_nvfp4(xq, wq, b, torch.float32)
    ref = xq.dequantize(torch.float32) @ wq.dequantize(torch.float32).T + b
    assert float(spec.relative_error(y, ref)) <= 1e-5
    assert not blackwell.native_fp4_available("cpu")


def test_dispatch_by_capability_and_shared_memory(monkeypatch):
    t = sk.targets
    monkeypatch.delenv("SIXBIT_KERNEL_VARIANT", raising=False)  # the GPU runs force it for the whole suite
    assert t.target_for((9, 0)).variant == "hopper"
    for cap in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0)):
        assert t.target_for(cap).variant == "portable"
    assert t.target_for((8, 6)).ptx_decode is False and t.target_for((8, 9)).ptx_decode is True
    with pytest.raises(ValueError, match="needs capability >= 9.0"):
        t.target_for((8, 6), variant="hopper")
    monkeypatch.setenv("SIXBIT_KERNEL_VARIANT", "portable")
    assert t.target_for((9, 0)).variant == "portable"
    monkeypatch.setenv("SIXBIT_KERNEL_VARIANT", "fast")
    with pytest.raises(ValueError, match="SIXBIT_KERNEL_VARIANT"):
        t.target_for((9, 0))
    monkeypatch.delenv("SIXBIT_KERNEL_VARIANT")
    g4 = sk.gemm_w4
    big, small = t.target_for((9, 0), variant="portable"), t.target_for((8, 6))
    assert g4.dense_w_config(big) != g4.dense_w_config(small)  # tiers by opt-in shared memory
    assert g4.tile_config(t.target_for((8, 0)), g4.A_DENSE) == g4.TILE_CONFIGS[g4.A_DENSE][-1][1]
    cfg = t.GemmConfig(16, 16, 64, 4, 4, 1)
    tuned = small.with_configs(w8a8=cfg, w4_tile_0=g4.INTERP_CONFIG)
    assert sk.gemm_w8a8.launch_config(tuned) == cfg and g4.tile_config(tuned, g4.A_DENSE) == g4.INTERP_CONFIG
    assert sk.gemm_w8a8.launch_config(small) != cfg
