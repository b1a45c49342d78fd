"""Fused producers (sixbit_kernels/norm_quant.py, sixbit_kernels/gelu_quant.py) against ``sixbit.formats``.

Two comparisons for each: with today's unfused path — the model's 16-bit output computed by PyTorch, then
``hadamard_quant.quantize_int8_act`` (what ``ops.linear`` would do) — and with the plain-torch reference
(``formats.norm_modulate_int8`` / ``formats.gelu_int8``). Documented bound: a 16-bit value may differ by
one ulp (LayerNorm statistics' summation order, the GELU's tanh), and then a code by one step; the rate is
bounded. Interpreter on CPU hosts; compiled kernels on a CUDA host (reference on the CPU).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sixbit_kernels as sk  # noqa: E402
from sixbit import formats as spec  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
nq, gq, hq = sk.norm_quant, sk.gelu_quant, sk.hadamard_quant
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # interpreter's exp


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _act(shape, seed, dtype, scale=1.0):
    g = _gen(seed)
    x = torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g).add(0.1) * scale
    x[..., 3] *= 25.0  # an outlier channel
    return x.to(dtype)


def _close_codes(q, ref, rate=2e-3, what="codes"):
    """Codes within one step, differing at a rate below ``rate``, on the rows with a finite scale (a
    non-finite row's codes are meaningless, formats' ``check_finite=False`` contract); scales close."""
    rows = torch.isfinite(ref.scale[:, 0])
    d = (q.data.cpu().float() - ref.data.float()).abs()[rows]
    assert float(d.max()) <= 1, f"{what}: a code is {float(d.max())} steps off"
    assert float((d > 0).float().mean()) < rate, f"{what}: {int((d > 0).sum())} codes differ"
    s, r = q.scale.cpu(), ref.scale
    fin = torch.isfinite(r)
    assert torch.equal(torch.isnan(s), torch.isnan(r)), f"{what}: NaN scales differ"
    torch.testing.assert_close(s[fin], r[fin], rtol=2e-2, atol=0)


def _parts(b, s_text, s_video, k, seed, dtype, scale=1.0):
    g = _gen(seed + 1)
    enc = _act((b, s_text, k), seed, dtype, scale)
    hs = _act((b, s_video, k), seed + 2, dtype, scale)
    mod = (torch.randn(b, 6 * k, generator=g) * 0.5).to(dtype)
    sh, sc, _, esh, esc, _ = mod.chunk(6, dim=1)  # views with row stride 6K, as diffusers' chunk gives
    return [(enc, 1 + esc, esh), (hs, 1 + sc, sh)]


def _to(parts, dev):
    return [(x.to(dev), op.to(dev), sh.to(dev)) for x, op, sh in parts]


def _ln_params(k, seed, dtype, affine=True):
    if not affine:
        return None, None
    g = _gen(seed + 3)
    return (1 + 0.3 * torch.randn(k, generator=g)).to(dtype), (0.2 * torch.randn(k, generator=g)).to(dtype)


# ------------------------------------------------------------------------------------- norm + modulate


@pytest.mark.parametrize("b,s_text,s_video,k,hb", [(2, 5, 17, 256, 64), (1, 3, 1, 64, 16), (2, 0, 9, 128, 128),
                                                   (2, 7, 41, 1920, 64), (1, 2, 3, 512, None),
                                                   (2, 3, 29, 3072, 64), (1, 1, 2, 3072, 128), (1, 2, 7, 3072, None),
                                                   (2, 0, 5, 4096, 64), (1, 2, 3, 3584, 32)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm_modulate_int8_matches_unfused(b, s_text, s_video, k, hb, dtype):
    parts = _parts(b, s_text, s_video, k, seed=k + s_video, dtype=dtype, scale=3.0)
    w, bias = _ln_params(k, k, dtype)
    eps = 1e-5
    q, y = nq.norm_modulate(_to(parts, DEV), _dev(w), _dev(bias), eps, hb, norm=True)
    y_ref = spec.norm_modulate(parts, w, bias, eps)
    assert y.shape == y_ref.shape and y.dtype == dtype
    dy = (y.cpu().float() - y_ref.float()).abs()
    # one ulp of the LayerNorm output carried through "· one_plus" (≤ u·|prod|), that product rounded on
    # each side (half an ulp each, ≤ u·|prod| together) and "+ shift" (the sum's own rounding; with
    # cancellation the difference is large relative to the sum itself)
    u = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    prod = torch.cat([torch.nn.functional.layer_norm(x, (k,), w, bias, eps) * op[:, None] for x, op, _ in parts], 1)
    bound = u * (2 * prod.float().abs() + y_ref.float().abs()) + 1e-30
    assert bool((dy <= bound).all()), "beyond one ulp of the norm"
    assert float((dy > 0).float().mean()) < 2e-3
    today = hq.quantize_int8_act(y_ref.reshape(-1, k).to(DEV), hb)[0]  # the unfused path's codes
    _close_codes(q, _cpu(today), what="vs quantize kernel")
    _close_codes(q, spec.norm_modulate_int8(parts, w, bias, eps, hb), what="vs reference")
    assert q.data.shape == (b * (s_text + s_video), k) and q.scale.shape == (b * (s_text + s_video), 1)


def _dev(t):
    return None if t is None else t.to(DEV)


def _cpu(q):
    return spec.Int8Tensor(q.data.cpu(), q.scale.cpu(), q.orig_dtype)


@pytest.mark.parametrize("k", [384, 3072])
def test_norm_modulate_dense_codes_and_no_affine(k):
    """fp16 codes (the W4A8 operand) are the same integers; LayerNorm without weight / bias; fp32 input
    (interpreter only: on CUDA the wrapper refuses fp32, whose rotation tile exceeded shared memory)."""
    for dtype in (torch.bfloat16,) + ((torch.float32,) if DEV == "cpu" else ()):
        parts = _parts(2, 4, 19, k, seed=5, dtype=dtype)
        q8, _ = nq.norm_modulate(_to(parts, DEV), None, None, 1e-6, 128)
        q16, y = nq.norm_modulate(_to(parts, DEV), None, None, 1e-6, 128, dense=True)
        assert y is None and q16.data.dtype == torch.float16 and torch.equal(q16.scale, q8.scale)
        if DEV == "cpu":
            assert torch.equal(q16.data.float(), q8.data.float())
        else:
            # two compiled variants: the rotation is an MMA whose layout the compiler picks per variant, so a
            # rotated value can round differently in its last bit and land one code away at a tie (H200,
            # K = 3072: 3 of 141,312 codes, session 12) — both within the spec's tolerance below
            d = (q16.data.float() - q8.data.float()).abs()
            assert float(d.max()) <= 1 and float((d > 0).float().mean()) < 1e-3
            _close_codes(q16, spec.norm_modulate_int8(parts, None, None, 1e-6, 128), what=f"{dtype} fp16 codes")
        _close_codes(q8, spec.norm_modulate_int8(parts, None, None, 1e-6, 128), what=str(dtype))


@pytest.mark.parametrize("k", [256, 1920, 3072])
def test_norm_modulate_norm_only_and_magnitudes(k):
    """``codes=False`` writes only the modulated output; huge, tiny and all-constant (zero-variance) rows. It
    runs one token per step (``NORM_ONLY_PROGRAMS_PER_SM``): the same values as the codes launch's 16-bit
    output, whose tile holds several tokens at 256 and 1920."""
    parts = _parts(1, 2, 17, k, seed=9, dtype=torch.bfloat16)
    hs = parts[1][0].clone()
    hs[0, 0] *= 1e15
    hs[0, 1] *= 1e-20
    hs[0, 2] = 0.0
    hs[0, 3] = 7.0  # constant row: variance 0, the output is the bias
    parts[1] = (hs, *parts[1][1:])
    w, bias = _ln_params(k, 1, torch.bfloat16)
    q, y = nq.norm_modulate(_to(parts, DEV), _dev(w), _dev(bias), 1e-5, 64, codes=False, norm=True)
    assert q is None
    y_ref = spec.norm_modulate(parts, w, bias, 1e-5)
    torch.testing.assert_close(y.cpu().float(), y_ref.float(), rtol=2**-7, atol=1e-6)
    q, y_codes = nq.norm_modulate(_to(parts, DEV), _dev(w), _dev(bias), 1e-5, 64, norm=True)
    assert torch.equal(y, y_codes)
    _close_codes(q, spec.norm_modulate_int8(parts, w, bias, 1e-5, 64), rate=1e-2)


@pytest.mark.parametrize("k", [128, 3072])
def test_norm_modulate_non_finite_rows(k):
    """A NaN or Inf in a token makes that token's scale NaN; the other tokens are unaffected."""
    parts = _parts(2, 3, 17, k, seed=11, dtype=torch.bfloat16)
    hs = parts[1][0].clone()
    hs[0, 4, 7] = float("nan")
    hs[1, 0, 0] = float("inf")
    parts[1] = (hs, *parts[1][1:])
    q, _ = nq.norm_modulate(_to(parts, DEV), None, None, 1e-5, 64)
    ref = spec.norm_modulate_int8(parts, None, None, 1e-5, 64)
    bad = torch.isnan(ref.scale[:, 0])
    assert int(bad.sum()) == 2 and torch.equal(torch.isnan(q.scale.cpu()[:, 0]), bad)
    _close_codes(q, ref)


@pytest.mark.skipif(DEV == "cuda", reason="the interpreter's tile height is what is changed here")
@pytest.mark.parametrize("k,hb", [(3072, 64), (1920, 64), (4096, 64)])
def test_norm_modulate_cuda_geometry_in_the_interpreter(monkeypatch, k, hb):
    """The CUDA tiles (64 rows: one token of 3072 / 4096 per step, two of 1920) give the same bits as the
    interpreter's 128-row tile, on awkward token counts with zero, huge and constant rows, and match the
    reference."""
    parts = _parts(2, 3, 13, k, seed=k, dtype=torch.bfloat16, scale=5.0)
    hs = parts[1][0].clone()
    hs[0, 0] = 0.0
    hs[0, 1] *= 1e20
    hs[1, 2] = -3.0
    parts[1] = (hs, *parts[1][1:])
    w, bias = _ln_params(k, 2, torch.bfloat16)
    ref = nq.norm_modulate(parts, w, bias, 1e-5, hb, norm=True)
    monkeypatch.setattr(sk.rows_int8, "INTERP_ROWS", sk.rows_int8.CUDA_ROWS)
    assert nq.geometry(k, hb, True)[1] == (1 if k > 2048 else 2)  # tokens per step, as on CUDA
    q, y = nq.norm_modulate(parts, w, bias, 1e-5, hb, norm=True)
    assert torch.equal(y, ref[1]) and torch.equal(q.data, ref[0].data) and torch.equal(q.scale, ref[0].scale)
    _close_codes(q, spec.norm_modulate_int8(parts, w, bias, 1e-5, hb), rate=1e-2)


@pytest.mark.parametrize("k,warps", [(1920, 8), (3072, 8)])
def test_norm_modulate_warps_override_gives_the_same_bits(k, warps):
    """The default warps (4 at every width since session 31; 3072's one-token tile had 8 before) and the other
    count the benchmark compares give the same bits, both codes forms, on a small problem."""
    assert nq.default_warps(k, 64) == 4 and nq.default_warps(k, 64, interp=True) == 4
    parts = _to(_parts(2, 3, 21, k, seed=4, dtype=torch.bfloat16, scale=2.0), DEV)
    w, bias = _ln_params(k, 4, torch.bfloat16)
    for dense in (False, True):
        a, ya = nq.norm_modulate(parts, _dev(w), _dev(bias), 1e-5, 64, norm=True, dense=dense)
        b, yb = nq.norm_modulate(parts, _dev(w), _dev(bias), 1e-5, 64, norm=True, dense=dense, num_warps=warps)
        assert torch.equal(ya, yb) and torch.equal(a.data, b.data) and torch.equal(a.scale, b.scale)


def test_norm_modulate_errors():
    if DEV == "cuda":
        with pytest.raises(TypeError, match="fp32"):
            nq.norm_modulate(_to(_parts(1, 1, 3, 128, seed=1, dtype=torch.float32), DEV), None, None, 1e-5, 64)
    parts = _parts(2, 2, 5, 128, seed=1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one_plus"):
        nq.norm_modulate([(parts[0][0], parts[0][1][:1], parts[0][2])], None, None, 1e-5, 64)
    with pytest.raises(ValueError, match="nothing to emit"):
        nq.norm_modulate(parts, None, None, 1e-5, 64, codes=False)
    with pytest.raises(ValueError, match="expected"):
        nq.norm_modulate([parts[0], (parts[1][0][:1], *parts[1][1:])], None, None, 1e-5, 64)


# ------------------------------------------------------------------------------------------------ GELU


@pytest.mark.parametrize("m,k,hb", [(1, 64, 16), (17, 256, 64), (0, 128, 64), (33, 7680, 64), (5, 512, None),
                                    (9, 384, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gelu_int8_matches_unfused(m, k, hb, dtype):
    x = _act((m, k), seed=m + k, dtype=dtype, scale=3.0)
    q = gq.gelu_int8(x.to(DEV), hb)
    y_ref = torch.nn.functional.gelu(x, approximate="tanh")
    assert q.data.shape == (m, k) and q.scale.shape == (m, 1)
    if m:
        _close_codes(q, _cpu(hq.quantize_int8_act(y_ref.to(DEV), hb)[0]), what="vs quantize kernel")
        _close_codes(q, spec.gelu_int8(x, hb), what="vs reference")


def test_gelu_int8_magnitudes_dense_and_non_finite():
    x = _act((6, 256), seed=2, dtype=torch.bfloat16)
    x[0] *= 1e30  # x³ overflows: GELU(x) = x (or 0 for the negatives), as PyTorch
    x[1] *= 1e-30
    x[2] = 0.0
    x[3, 5] = float("nan")
    x[4, 9] = float("-inf")  # GELU(-inf) = -inf · 0 = NaN in PyTorch too
    x[5, 1] = float("inf")
    q = gq.gelu_int8(x.to(DEV), 64)
    ref = spec.gelu_int8(x, 64)
    _close_codes(q, ref, rate=1e-2)
    assert torch.isnan(q.scale.cpu()[3:, 0]).all() and torch.isfinite(q.scale.cpu()[:3, 0]).all()
    q16 = gq.gelu_int8(x.to(DEV), 64, dense=True)
    assert q16.data.dtype == torch.float16 and torch.equal(q16.data.float(), q.data.float())


def test_gelu_int8_rejects_long_rows_and_bad_dtype():
    with pytest.raises(ValueError, match="one step"):
        gq.gelu_int8(torch.zeros(2, 129 * 128, dtype=torch.bfloat16, device=DEV), 128)
    with pytest.raises(TypeError, match="bf16"):
        gq.gelu_int8(torch.zeros(2, 64, dtype=torch.int32, device=DEV), 64)


_SPEC_SCRIPT = """
import sys, torch
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
import sixbit_kernels as sk
from sixbit_kernels import aot

def keys(b, s_video, s_text, d):
    def drive(sk_, target):
        mod = torch.empty(b, 6 * d, dtype=torch.bfloat16)[:, :d]  # diffusers' chunk: row stride 6d
        parts = [(torch.empty(b, n, d, dtype=torch.bfloat16), mod, mod) for n in (s_text, s_video)]
        sk_.norm_quant.norm_modulate(parts, mod[0], mod[0], 1e-5, 64)
    saved, aot.drive = aot.drive, drive
    try:
        launches = aot.record(sk, None)
    finally:
        aot.drive = saved
    backend = make_backend(GPUTarget("cuda", 90, 32))
    return {repr(create_function_from_signature(f.signature, f.params, backend)(*a, **dict(kw, debug=False))[1])
            for f, a, kw in launches}

for d in (1920, 3072):
    warm, real = keys(1, 112, 16, d), keys(2, 17550, 226, d)  # sixbit.warmup's problem; a 49-frame 480x720 video
    assert warm == real and len(real) == 1, (d, warm, real)
print("ok")
"""


@pytest.mark.skipif(DEV == "cuda", reason="CPU check of triton's specialisation keys")
def test_norm_modulate_warmup_problem_compiles_what_a_video_runs():
    """Triton specialises integer arguments on divisibility by 16: the kernel's token counts and offsets
    are not specialised, so ``sixbit.warmup``'s small problem (1 × (16 + 112) tokens) and a real video's
    (2 × (226 + 17,550)) — both streams — launch one and the same compiled kernel."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _SPEC_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-2000:] + proc.stderr[-2000:]
