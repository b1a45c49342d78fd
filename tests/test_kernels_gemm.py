"""GEMM kernels against the dequantized reference: ‖out − ref‖ / ‖ref‖ ≤ 1e-3 (fp32 outputs compared).

CPU-only hosts run them in triton's interpreter (``TRITON_INTERPRET=1``, tests/conftest.py); CUDA hosts run
the compiled kernels, including the tile configs the benchmark picked for the H200.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sixbit_kernels as sk  # noqa: E402
from sixbit import formats as spec  # noqa: E402

g4 = sk.gemm_w4
g8 = sk.gemm_w8a8
hq = sk.hadamard_quant
targets = sk.targets

#: both GEMM variants on a Hopper-class target (the interpreter runs the TMA forms too)
VARIANT_TARGETS = {v: targets.target_for((9, 0), variant=v) for v in targets.VARIANTS}

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-3


def _rel(y, ref):
    y = y.float().cpu()
    assert bool(torch.isfinite(y).all()), "non-finite output"
    return float(spec.relative_error(y, ref))


def _data(m, n, k, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g).add(0.2)).to(dtype)
    w = torch.randn(n, k, generator=g) / k**0.5
    w[:, 3] *= 20  # a weight outlier column
    b = torch.randn(n, generator=g)
    return x, w, b


SHAPES = [(1, 32, 64), (17, 48, 96), (40, 80, 160), (3, 16, 16)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("decode", ["tile", "once-hopper", "once-portable"])
def test_gemm_w4a4_packed_and_dense(m, n, k, bias, decode):
    x, w, b = _data(m, n, k, seed=m + n + k)
    b = b if bias else None
    w4 = spec.quantize_nvfp4(w)
    qa, _ = hq.quantize_nvfp4_act(x.to(DEV))
    ref = qa.dequantize(torch.float32).cpu() @ w4.dequantize(torch.float32).T + (0 if b is None else b)
    wd = w4.to(DEV)
    bd = None if b is None else b.to(DEV)
    assert _rel(g4.gemm_w4(qa, wd, bd, torch.float32), ref) <= TOL
    (vals, bs, ts), _ = hq.quantize_nvfp4_act(x.to(DEV), dense=True)
    da = g4.DenseAct(vals, "nvfp4", tensor_scale=ts)
    assert _rel(g4.gemm_w4(da, wd, bd, torch.float32, **_decode(decode)), ref) <= TOL


def _decode(decode: str) -> dict:
    """``"tile"`` or ``"once-<variant>"`` → gemm_w4 keyword arguments."""
    if decode == "tile":
        return {"decode": "tile"}
    return {"decode": "once", "target": VARIANT_TARGETS[decode.split("-")[1]]}


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("decode", ["tile", "once-hopper", "once-portable"])
def test_gemm_w4a8_packed_and_dense(m, n, k, decode):
    x, w, b = _data(m, n, k, seed=2 * m + n)
    w4 = spec.quantize_nvfp4(w)
    q8, _ = hq.quantize_int8_act(x.to(DEV))
    ref = q8.dequantize(torch.float32).cpu() @ w4.dequantize(torch.float32).T + b
    assert _rel(g4.gemm_w4(q8, w4.to(DEV), b.to(DEV), torch.float32), ref) <= TOL
    d8, _ = hq.quantize_int8_act(x.to(DEV), dense=True)
    da = g4.DenseAct(d8.data, "int8", row_scale=d8.scale)
    assert _rel(g4.gemm_w4(da, w4.to(DEV), b.to(DEV), torch.float32, **_decode(decode)), ref) <= TOL


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decode", ["tile", "once-hopper", "once-portable"])
def test_gemm_w4a16(m, n, k, dtype, decode):
    x, w, b = _data(m, n, k, seed=3 * m + k, dtype=dtype)
    w4 = spec.quantize_nvfp4(w)
    ref = x.float() @ w4.dequantize(torch.float32).T + b
    assert _rel(g4.gemm_w4(x.to(DEV), w4.to(DEV), b.to(DEV), torch.float32, **_decode(decode)), ref) <= TOL
    # fp32-precision activations (here: Hadamard-rotated) through the bf16 [hi | lo] split
    hb = 16
    xr = spec.block_hadamard(x, hb)
    wr = spec.quantize_weight(w, "nvfp4", hb)
    ref = xr @ wr.dequantize(torch.float32).T + b
    pair, _ = hq.rotate_split(x.to(DEV), hb)
    assert _rel(g4.gemm_w4(pair, wr.to(DEV), b.to(DEV), torch.float32, **_decode(decode)), ref) <= TOL


@pytest.mark.parametrize("m,n,k", SHAPES + [(5, 24, 48)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("variant", targets.VARIANTS)
def test_gemm_w8a8(m, n, k, bias, variant):
    x, w, b = _data(m, n, k, seed=5 * m + n)
    b = b if bias else None
    w8 = spec.quantize_int8(w)
    q8, _ = hq.quantize_int8_act(x.to(DEV))
    ref = q8.dequantize(torch.float32).cpu() @ w8.dequantize(torch.float32).T + (0 if b is None else b)
    y = g8.gemm_w8a8(q8, w8.to(DEV), None if b is None else b.to(DEV), torch.float32, target=VARIANT_TARGETS[variant])
    assert _rel(y, ref) <= TOL


def test_k_tail_and_output_dtypes():
    """K not a multiple of the K-tile (masked tail), bf16/fp16 outputs."""
    x, w, b = _data(9, 40, 80, seed=99)
    w4, w8 = spec.quantize_nvfp4(w), spec.quantize_int8(w)
    q8, _ = hq.quantize_int8_act(x.to(DEV))
    cfg4 = (16, 16, 64, 4, 4, 1, False)  # K=80 = 64 + a masked tail of 16
    ref = q8.dequantize(torch.float32).cpu() @ w4.dequantize(torch.float32).T + b
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        y = g4.gemm_w4(q8, w4.to(DEV), b.to(DEV), dt, config=cfg4)
        assert y.dtype == dt
        assert _rel(y, ref) <= (TOL if dt == torch.float32 else 4e-3)
    ref8 = q8.dequantize(torch.float32).cpu() @ w8.dequantize(torch.float32).T + b
    y = g8.gemm_w8a8(q8, w8.to(DEV), b.to(DEV), torch.float32, config=(16, 16, 64, 4, 4, 1))
    assert _rel(y, ref8) <= TOL


@pytest.mark.parametrize("swap", [False, True])
def test_gemm_w4_production_tiles(swap):
    """The CUDA tile configs (large tiles, weight-as-A swap), on a shape with ragged M and N."""
    x, w, b = _data(70, 136, 256, seed=7)
    w4 = spec.quantize_nvfp4(w)
    (vals, bs, ts), _ = hq.quantize_nvfp4_act(x.to(DEV), dense=True)
    qa, _ = hq.quantize_nvfp4_act(x.to(DEV))
    ref = qa.dequantize(torch.float32).cpu() @ w4.dequantize(torch.float32).T + b
    for mode, a in ((g4.A_DENSE, g4.DenseAct(vals, "nvfp4", tensor_scale=ts)), (g4.A_NVFP4, qa)):
        for _, cfg in g4.TILE_CONFIGS[mode]:  # every shared-memory tier
            cfg = cfg._replace(swap=swap)
            assert _rel(g4.gemm_w4(a, w4.to(DEV), b.to(DEV), torch.float32, config=cfg), ref) <= TOL


def test_gemm_decoded_once_production_tiles_and_dispatch(monkeypatch):
    """The decode-once GEMM at its CUDA tiles (both variants, every tier) on ragged M/N and a K with a
    partial last tile (TMA zero fill / masked pointer loads), bf16 out; and ``decode="auto"`` switching to
    it at ``decode_once_min_m`` rows."""
    x, w, b = _data(70, 136, 288, seed=9)
    w4 = spec.quantize_nvfp4(w)
    (vals, bs, ts), _ = hq.quantize_nvfp4_act(x.to(DEV), dense=True)
    da = g4.DenseAct(vals, "nvfp4", tensor_scale=ts)
    ref = da.dequantize(torch.float32).cpu() @ w4.dequantize(torch.float32).T + b
    for variant, tgt in VARIANT_TARGETS.items():
        for _, cfg in g4.DENSE_W_CONFIGS[variant]:
            y = g4.gemm_w4(da, w4.to(DEV), b.to(DEV), torch.float32, decode="once", config=cfg, target=tgt)
            assert _rel(y, ref) <= TOL, (variant, cfg)
    yb = g4.gemm_w4(da, w4.to(DEV), b.to(DEV), torch.bfloat16, decode="once")
    assert yb.dtype == torch.bfloat16 and _rel(yb, ref) <= 4e-3
    calls = []
    real = g4._gemm_decoded_once
    monkeypatch.setattr(g4, "_gemm_decoded_once", lambda *a: calls.append(1) or real(*a))
    g4.gemm_w4(da, w4.to(DEV), b.to(DEV), torch.float32, decode_once_min_m=71)
    assert not calls
    assert _rel(g4.gemm_w4(da, w4.to(DEV), b.to(DEV), torch.float32, decode_once_min_m=70), ref) <= TOL
    assert calls
    qa, _ = hq.quantize_nvfp4_act(x.to(DEV))
    with pytest.raises(ValueError, match="16-bit activations"):
        g4.gemm_w4(qa, w4.to(DEV), decode="once")
    with pytest.raises(ValueError, match="decode must be"):
        g4.gemm_w4(da, w4.to(DEV), decode="sometimes")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_weight_exact(dtype):
    """decode_weight writes E2M1 × bs × 2**-7 bit-exactly (ragged N, K not a multiple of its K tile)."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(37, 80, generator=g) * torch.logspace(-3, 3, 37).unsqueeze(1)
    w[5] = 0.0
    w4 = spec.quantize_nvfp4(w)
    y = g4.decode_weight(w4.to(DEV), dtype).cpu()
    exact = spec.e2m1_decode(spec.unpack_fp4(w4.data)).view(37, -1, 16) * w4.scales.float().unsqueeze(-1) / 128
    assert y.dtype == dtype
    assert torch.equal(y.float(), exact.view(37, 80))


def test_gemm_w8a8_production_tiles():
    x, w, b = _data(70, 136, 256, seed=8)
    w8 = spec.quantize_int8(w)
    q8, _ = hq.quantize_int8_act(x.to(DEV))
    ref = q8.dequantize(torch.float32).cpu() @ w8.dequantize(torch.float32).T + b
    for variant, tgt in VARIANT_TARGETS.items():
        for _, cfg in g8.CONFIGS[variant]:
            assert _rel(g8.gemm_w8a8(q8, w8.to(DEV), b.to(DEV), torch.float32, config=cfg, target=tgt), ref) <= TOL
    # K not a multiple of 16: the hopper variant falls back to pointer loads
    q = spec.Int8Tensor(q8.data[:, :250].contiguous(), q8.scale, q8.orig_dtype)
    w250 = spec.Int8Tensor(w8.data[:, :250].contiguous(), w8.scale, w8.orig_dtype)
    ref = q.dequantize(torch.float32).cpu() @ w250.dequantize(torch.float32).T
    assert _rel(g8.gemm_w8a8(q, w250.to(DEV), None, torch.float32, target=VARIANT_TARGETS["hopper"]), ref) <= TOL


@pytest.mark.parametrize("n", [136, 36])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemm_w8a8_tma_store_equals_pointer_store(n, dtype):
    """The descriptor-store epilogue (rows past M clipped by the copy engine) writes exactly what the masked
    pointer store writes, for every output dtype; a row pitch that is not 16-byte aligned (36 bf16/fp16
    columns) falls back to the pointer store."""
    x, w, b = _data(70, n, 256, seed=n)
    w8 = spec.quantize_int8(w).to(DEV)
    q8, _ = hq.quantize_int8_act(x.to(DEV))
    cfg = (32, 32, 64, 4, 4, 1)
    hopper = VARIANT_TARGETS["hopper"]
    y_desc = g8.gemm_w8a8(q8, w8, b.to(DEV), dtype, config=cfg, target=hopper, tma_store=True)
    y_ptr = g8.gemm_w8a8(q8, w8, b.to(DEV), dtype, config=cfg, target=hopper, tma_store=False)
    assert y_desc.dtype == dtype and torch.equal(y_desc, y_ptr)
    ref = q8.dequantize(torch.float32).cpu() @ w8.dequantize(torch.float32).cpu().T + b
    assert _rel(y_desc, ref) <= (TOL if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("ptx", [True, False])
def test_decoded_weights_are_exact_halves(ptx):
    """The in-kernel decode (bit placement × scale·2**7) reproduces E2M1 × bs exactly: an identity GEMM.
    On CUDA both decoders run (inline PTX and the element-wise one); the interpreter always uses the latter."""
    from dataclasses import replace

    tgt = replace(VARIANT_TARGETS["portable"], ptx_decode=ptx)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 64, generator=g) * torch.logspace(-3, 3, 32).unsqueeze(1)
    w4 = spec.quantize_nvfp4(w)
    eye = torch.eye(64, dtype=torch.float16)
    y = g4.gemm_w4(eye.to(DEV), w4.to(DEV), None, torch.float32, target=tgt).cpu()  # = dequant(W)^T
    exact = spec.e2m1_decode(spec.unpack_fp4(w4.data)).view(32, -1, 16) * w4.scales.float().unsqueeze(-1)
    assert torch.equal(y.T, (exact.view(32, 64) * w4.tensor_scale).float())


def test_rejects_mismatched_k():
    x, w, _ = _data(4, 16, 64, seed=1)
    w4 = spec.quantize_nvfp4(w[:, :32])
    with pytest.raises(ValueError):
        g4.gemm_w4(x.to(DEV), w4.to(DEV))
    with pytest.raises(TypeError):
        g4.gemm_w4(x.float().to(DEV), spec.quantize_nvfp4(w).to(DEV))


def _assert_is_gelu_of(y_act: torch.Tensor, y: torch.Tensor, max_rate: float = 0.01) -> None:
    """``y_act`` is ``F.gelu(y, approximate="tanh")`` of the same kernel's own output ``y``, with the same
    non-finite entries; finite ones equal up to one ulp of the output dtype on at most ``max_rate`` of the
    entries, or within ``|y|·2⁻²¹`` (the kernel's ``tanh`` is ``1 − 2/(1+e^{2u})``, ``_common.gelu_tanh``: in the
    negative tail ``1 + tanh`` keeps fp32's absolute precision only, PyTorch's as well)."""
    ref = spec.activate(y.cpu(), "gelu_tanh")
    got = y_act.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    fin = torch.isfinite(ref)
    assert torch.equal(torch.isnan(got), torch.isnan(ref)) and torch.equal(got[torch.isinf(ref)], ref[torch.isinf(ref)])
    diff = (got[fin].float() - ref[fin].float()).abs()
    tail = y.cpu()[fin].float().abs() * 2.0**-21
    ulp = torch.finfo(ref.dtype).eps * ref[fin].float().abs() if ref.dtype != torch.float32 else 0 * diff
    assert bool((diff <= torch.maximum(ulp * 1.01, tail)).all())
    assert float((diff > tail).float().mean()) <= max_rate


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kernel", ["w8a8-hopper", "w8a8-hopper-ptr", "w8a8-portable", "w4a8-tile", "w4a8-once-hopper",
                                    "w4a8-once-portable", "w4a4-tile", "w4a16-once-hopper"])
def test_gelu_epilogue_is_gelu_of_the_output(kernel, dtype):
    """``activation="gelu_tanh"``: the epilogue's GELU of the rounded output, for each GEMM path and output
    dtype — on an awkward shape (M, N not tile multiples), magnitudes from −40 to 40 (GELU's tails: 0 and the
    identity), and ±inf / NaN bias columns (GELU(+inf) = +inf, GELU(−inf) = NaN as in PyTorch)."""
    x, w, b = _data(37, 72, 96, seed=11)
    x = x * 8
    b = b * 4
    b[5], b[6], b[7] = float("inf"), float("-inf"), float("nan")
    bd = b.to(DEV)
    if kernel.startswith("w8a8"):
        q8, _ = hq.quantize_int8_act(x.to(DEV))
        kw = {"target": VARIANT_TARGETS[kernel.split("-")[1]], "tma_store": not kernel.endswith("ptr"),
              "config": (32, 32, 32, 4, 4, 1)}
        run = lambda act: g8.gemm_w8a8(q8, spec.quantize_int8(w).to(DEV), bd, dtype, activation=act, **kw)  # noqa: E731
    else:
        w4 = spec.quantize_nvfp4(w).to(DEV)
        mode, decode = kernel.split("-", 1)
        if mode == "w4a8":
            a = hq.quantize_int8_act(x.to(DEV), dense=decode != "tile")[0]
            a = g4.DenseAct(a.data, "int8", row_scale=a.scale) if decode != "tile" else a
        elif mode == "w4a4":
            a = hq.quantize_nvfp4_act(x.to(DEV))[0]
        else:
            a = x.to(DEV)
        run = lambda act: g4.gemm_w4(a, w4, bd, dtype, activation=act, **_decode(decode))  # noqa: E731
    y = run(None)
    assert float(y.float().abs().nan_to_num(posinf=0).max()) > 20  # both tails of the GELU are exercised
    _assert_is_gelu_of(run("gelu_tanh"), y)


def test_activation_is_checked_by_name():
    x, w, b = _data(4, 16, 32, seed=1)
    q8, _ = hq.quantize_int8_act(x.to(DEV))
    for call in (lambda: g8.gemm_w8a8(q8, spec.quantize_int8(w).to(DEV), activation="relu"),
                 lambda: g4.gemm_w4(q8, spec.quantize_nvfp4(w).to(DEV), activation="gelu")):
        with pytest.raises(ValueError, match="activation must be one of"):
            call()


@pytest.mark.parametrize("n", [40, 36])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_persistent_decode_once_equals_the_portable_kernel(n, dtype, monkeypatch):
    """The Hopper decode-once GEMM (persistent: several tiles per program in the interpreter's 4 "SMs"; a TMA
    store, or the masked pointer store where the row pitch is not 16-byte aligned — 36 bf16 columns) computes
    what the one-tile-per-program portable kernel computes, on plain, INT8-dense and ``[hi | lo]`` operands."""
    x, w, b = _data(70, n, 96, seed=n)
    w4 = spec.quantize_weight(w, "nvfp4", 32).to(DEV)
    d8, _ = hq.quantize_int8_act(x.to(DEV), dense=True)
    pair, _ = hq.rotate_split(x.to(DEV), 32)
    for a in (x.to(DEV), g4.DenseAct(d8.data, "int8", row_scale=d8.scale), pair):
        ys = [g4.gemm_w4(a, w4, b.to(DEV), dtype, decode="once", target=VARIANT_TARGETS[v], activation=act)
              for act in (None, "gelu_tanh") for v in ("hopper", "portable")]
        assert torch.equal(ys[0], ys[1]) and torch.equal(ys[2], ys[3])
    # 16-bit outputs run the persistent kernel on Hopper; fp32 outputs the one-tile-per-program kernel (shared memory)
    launched = []
    for name in ("_gemm_dense_w_kernel", "_gemm_dense_w_persistent_kernel"):
        kern = getattr(g4, name)
        monkeypatch.setattr(g4, name, type("K", (), {"__getitem__": lambda self, grid, k=kern, n=name:
                                                     launched.append(n) or k[grid]})())
    for out in (dtype, torch.float32):
        g4.gemm_w4(x.to(DEV), w4, None, out, decode="once", target=VARIANT_TARGETS["hopper"])
    assert launched == ["_gemm_dense_w_persistent_kernel", "_gemm_dense_w_kernel"]
