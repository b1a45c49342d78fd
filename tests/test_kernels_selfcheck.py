"""The load-time self-check (``sixbit_kernels/selfcheck.py``): a broken kernel is caught before it serves, the
route falls back to the next safe implementation with a warning, and ``compute_path`` says so.

Runs in triton's interpreter: ``selfcheck.interpreter_dispatch`` makes ``backend="auto"`` on CPU tensors
take the checked Triton routes of a Hopper-class target (both GEMM variants run in the interpreter).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import sixbit_kernels as sk  # noqa: E402
from sixbit import formats as spec  # noqa: E402

ops, selfcheck, targets = sk.ops, sk.selfcheck, sk.targets

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter dispatch: CPU hosts")
HOPPER = targets.target_for((9, 0), variant="hopper")


def _layer(n=48, k=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / k**0.5
    return ops.pack_linear(w, torch.randn(n, generator=g), formats=("nvfp4", "int8"), hadamard_block=16)


def _x(m=20, k=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(torch.bfloat16)


def _garbage_for(variants, real):
    """``gemm`` replacement: wrong results (a transposed-sign output) for the given variants."""
    def broken(a, w, bias=None, out_dtype=torch.bfloat16, *, target=None, **kw):
        y = real(a, w, bias, out_dtype, target=target, **kw)
        return -y if target is not None and target.variant in variants else y
    return broken


def test_choose_falls_back_on_exception_and_mismatch_and_remembers():
    ref = torch.ones(4, 4)
    calls = []

    def boom():
        calls.append("boom")
        raise RuntimeError("ptxas: unsupported")

    def wrong():
        calls.append("wrong")
        return ref * 1.1

    def right():
        calls.append("right")
        return ref + 1e-4

    with pytest.warns(RuntimeWarning) as rec:
        impl = selfcheck.choose("cpu", ("unit",), [("a", boom), ("b", wrong), ("c", right)], lambda: ref)
    try:
        assert impl == "c" and calls == ["boom", "wrong", "right"]
        msgs = [str(r.message) for r in rec]
        assert "a failed its self-check (RuntimeError: ptxas: unsupported); falling back to b" in msgs[0]
        assert "b failed its self-check (relative error 1.00e-01 > 1e-02); falling back to c" in msgs[1]
        assert selfcheck.choose("cpu", ("unit",), [("a", boom)], lambda: ref) == "c"  # remembered
        assert calls == ["boom", "wrong", "right"]
        st = selfcheck.status("cpu")["unit"]
        assert st["impl"] == "c" and [f[0] for f in st["failures"]] == ["a", "b"]
    finally:
        selfcheck.reset("cpu")
    assert selfcheck.status("cpu") == {}


def test_self_check_problem_is_built_on_the_first_call_per_key_only():
    """``ops._checked`` builds its probe inputs (random tensors) on a cache miss only: the wrappers that consult it on
    every call (``gated_residual`` four times per block, ``l1_size`` per held piece) do no probe work once checked."""
    ops = sk.ops
    built = []

    def problem():
        built.append(1)
        return (lambda: torch.ones(3)), (lambda: torch.ones(3))

    try:
        assert all(ops._checked(torch.device("cpu"), ("lazy",), problem) for _ in range(3))
        assert built == [1]
    finally:
        selfcheck.reset("cpu")


def test_mismatch_rules():
    y = torch.randn(8, 8)
    assert selfcheck._mismatch((y, torch.tensor(100)), (y, torch.tensor(101))) is None  # count within 2
    assert "count" in selfcheck._mismatch((y, torch.tensor(50)), (y, torch.tensor(100)))
    bad = y.clone()
    bad[0, 0] = float("nan")
    assert selfcheck._mismatch(bad, y) == "non-finite output"
    assert "shape" in selfcheck._mismatch(y[:4], y)


def test_auto_on_cpu_is_the_reference_without_interpreter_dispatch():
    p = _layer()
    assert ops.compute_path("cpu") == "cpu-reference"
    y, _ = ops.linear(_x(), p, "w8a8")
    yr, _ = ops.linear(_x(), p, "w8a8", backend="torch")
    assert torch.equal(y, yr) and selfcheck.status("cpu") == {}


@pytest.mark.parametrize("route", ["w8a8", "int8", "nvfp4", "w4a16"])
def test_every_route_passes_its_check_on_the_healthy_kernels(route):
    p, x = _layer(), _x()
    with selfcheck.interpreter_dispatch(HOPPER):
        y, _ = ops.linear(x, p, route)
        assert selfcheck.status("cpu")[f"{route}/small"]["impl"] == "hopper-triton"
        assert ops.compute_path("cpu") == "hopper-triton"
    yr, _ = ops.linear(x, p, route, backend="torch")
    assert float(spec.relative_error(y.float(), yr.float())) <= selfcheck.BOUND
    assert selfcheck.status("cpu") == {}  # dropped on exit


def test_broken_hopper_gemm_falls_back_to_portable_then_torch(monkeypatch):
    p, x = _layer(), _x()
    yr, _ = ops.linear(x, p, "w8a8", backend="torch")
    real = ops.gemm_w8a8
    monkeypatch.setattr(ops, "gemm_w8a8", _garbage_for({"hopper"}, real))
    with selfcheck.interpreter_dispatch(HOPPER):
        with pytest.warns(RuntimeWarning, match="w8a8/small on cpu: hopper-triton failed its self-check"):
            y, _ = ops.linear(x, p, "w8a8")
        assert ops.compute_path("cpu") == "hopper-triton; self-check fallback: w8a8/small → portable-triton"
        assert float(spec.relative_error(y.float(), yr.float())) <= selfcheck.BOUND
        y2, _ = ops.linear(x, p, "int8")  # other routes keep the Hopper variant
        assert selfcheck.status("cpu")["int8/small"]["impl"] == "hopper-triton"
    monkeypatch.setattr(ops, "gemm_w8a8", _garbage_for({"hopper", "portable"}, real))
    with selfcheck.interpreter_dispatch(HOPPER):
        with pytest.warns(RuntimeWarning, match="portable-triton failed its self-check.*falling back to torch"):
            y, _ = ops.linear(x, p, "w8a8")
        assert torch.equal(y, yr)  # the torch reference served
        assert "w8a8/small → torch" in ops.compute_path("cpu")


def test_kernel_that_raises_falls_back(monkeypatch):
    p, x = _layer(), _x()

    def raises(*a, **k):
        raise RuntimeError("out of resource: shared memory")

    monkeypatch.setattr(ops, "gemm_w4", raises)
    with selfcheck.interpreter_dispatch(targets.target_for((8, 6))):
        with pytest.warns(RuntimeWarning, match="int8/small on cpu: portable-triton failed its self-check "
                                                r"\(RuntimeError: out of resource"):
            y, _ = ops.linear(x, p, "int8")
        assert ops.compute_path("cpu") == "portable-triton; self-check fallback: int8/small → torch"
    assert torch.equal(y, ops.linear(x, p, "int8", backend="torch")[0])


def test_broken_kernel_end_to_end_video_is_correct(monkeypatch, one_thread):
    """A tiny CogVideoX pipeline under the static W8A8 preset with ``backend="auto"``: every W8A8 GEMM
    variant broken on purpose → the self-check sends the route to the torch reference, and the video is
    exactly the torch-backend video; with only the Hopper variant broken the portable kernel serves and
    the video stays within the bound."""
    import sixbit
    from sixbit import SixBitConfig
    from sixbit.testing import generate, tiny_cogvideox_pipeline

    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=2)
    call = dict(num_inference_steps=3)
    with sixbit.apply(pipe, SixBitConfig.preset("w8a8", backend="torch")):
        ref = generate(pipe, **call)
    real = ops.gemm_w8a8
    monkeypatch.setattr(ops, "gemm_w8a8", _garbage_for({"hopper", "portable"}, real))
    with selfcheck.interpreter_dispatch(HOPPER):
        with pytest.warns(RuntimeWarning, match="w8a8/small on cpu: portable-triton failed"):
            with sixbit.apply(pipe, SixBitConfig.preset("w8a8")) as handle:
                out = generate(pipe, **call)
                traced = handle.trace.to_dict()["compute_path"]
        assert ops.compute_path("cpu") == "hopper-triton; self-check fallback: w8a8/small → torch"
        assert traced == ops.compute_path("cpu")  # the trace (and the app's compute-path line) shows it
        from ui.handlers import explain_compute_path
        assert "`w8a8/small → torch`" in explain_compute_path(traced)
        assert selfcheck.status("cpu")["block_stats/torch.float32"]["impl"] == "triton"  # checked, healthy
    assert torch.equal(out, ref)
    monkeypatch.setattr(ops, "gemm_w8a8", _garbage_for({"hopper"}, real))
    with selfcheck.interpreter_dispatch(HOPPER):
        with pytest.warns(RuntimeWarning, match="hopper-triton failed"):
            with sixbit.apply(pipe, SixBitConfig.preset("w8a8")):
                out = generate(pipe, **call)
        assert ops.compute_path("cpu").endswith("w8a8/small → portable-triton")
    assert torch.isfinite(out).all() and float(spec.relative_error(out, ref)) <= selfcheck.BOUND


def test_blackwell_native_route_is_checked_and_falls_back(monkeypatch):
    """On capability >= 10 the nvfp4 route tries native FP4 ``torch._scaled_mm`` first. Here its cuBLAS call
    is replaced by the emulator (same arguments, swizzled scales): the check passes and native serves; the
    real call (which refuses without a Blackwell GPU) fails the check and the portable kernel serves."""
    p, x = _layer(), _x()
    sm120 = targets.target_for((12, 0))
    monkeypatch.setattr(ops, "_native_fp4", lambda dev: True)
    monkeypatch.setattr(sk.blackwell, "scaled_mm_nvfp4", sk.blackwell.emulated_linear_nvfp4)
    with selfcheck.interpreter_dispatch(sm120):
        y, _ = ops.linear(x, p, "nvfp4")
        assert selfcheck.status("cpu")["nvfp4/small"]["impl"] == "blackwell-native"
        assert ops.compute_path("cpu") == "blackwell-native (unverified) + portable-triton"
    yr, _ = ops.linear(x, p, "nvfp4", backend="torch")
    assert float(spec.relative_error(y.float(), yr.float())) <= selfcheck.BOUND
    monkeypatch.undo()
    monkeypatch.setattr(ops, "_native_fp4", lambda dev: True)
    with selfcheck.interpreter_dispatch(sm120):
        with pytest.warns(RuntimeWarning, match="nvfp4/small on cpu: blackwell-native failed its self-check "
                                                r"\(RuntimeError: native NVFP4 GEMM needs"):
            y, _ = ops.linear(x, p, "nvfp4")
        assert ops.compute_path("cpu").endswith("self-check fallback: nvfp4/small → portable-triton")
    assert float(spec.relative_error(y.float(), yr.float())) <= selfcheck.BOUND
