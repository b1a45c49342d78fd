"""The CPU reference path the demo runs on a CPU (issue 16, item 14): cheaper, with the same numbers.

Profiling the 6Bit CPU run (benchmarks/app_cpu.py) showed the simulated quantization, not the method, made it
slower than the baseline: every call dequantized its packed weight again, and the activations' fake-quant
encoded E2M1 codes, packed them into bytes, unpacked and decoded them. The weight is now dequantized once per
layer on the CPU, and the activations are rounded straight to E2M1 values — identical to the spec bit for bit.
"""

import pytest
import torch

import sixbit_kernels as sk
from sixbit import formats as spec


def _awkward(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 96, generator=g) * torch.logspace(-30, 30, 96).pow(1 / 3)  # huge and tiny channels
    x[3] = 0.0  # an all-zero row
    x[5, :16] = -0.0
    x[7, 32:48] = x[7, 32:48].abs() * -1e-39  # subnormal negatives: rounded to a negative zero
    return x


def test_e2m1_round_is_decode_of_encode_on_every_tie_and_sign():
    grid = torch.arange(-7, 7.0001, 0.03125)  # every tie of the E2M1 grid, beyond ±6 (saturation), both zeros
    grid = torch.cat([grid, torch.tensor([0.0, -0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 1e-40, -1e-40])])
    want = spec.e2m1_decode(spec.e2m1_encode(grid))
    got = spec.e2m1_round(grid)
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tensor_scale", [None, "given"])
def test_fake_quantize_nvfp4_equals_quantize_then_dequantize(seed, tensor_scale):
    x = _awkward(seed)
    ts = None if tensor_scale is None else torch.tensor(0.37)
    want = spec.quantize_nvfp4(x, ts).dequantize(torch.float32)
    got = spec.fake_quantize_nvfp4(x, ts)
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


def test_fake_quantize_nvfp4_non_finite_blocks_are_nan_like_the_spec():
    x = _awkward(9)
    x[2, 20] = float("inf")
    x[4, 70] = float("nan")
    with pytest.raises(spec.NonFiniteError, match="fake_quantize_nvfp4"):
        spec.fake_quantize_nvfp4(x)
    want = spec.quantize_nvfp4(x, torch.tensor(0.5), check_finite=False).dequantize(torch.float32)
    got = spec.fake_quantize_nvfp4(x, torch.tensor(0.5), check_finite=False)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(got[2, 16:32]).all()
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_cpu_reference_linear_dequantizes_each_weight_once(monkeypatch):
    ops = sk.ops
    w, b, x = torch.randn(48, 64), torch.randn(48), torch.randn(2, 5, 64)
    p = ops.pack_linear(w, b, formats=("nvfp4", "int8"), hadamard_block=32)
    calls = []
    real = spec.dequantize_nvfp4
    monkeypatch.setattr(spec, "dequantize_nvfp4", lambda t, dtype=torch.float32: calls.append(t) or real(t, dtype))
    ys = [ops.linear(x, p, route, backend="torch")[0] for route in ("nvfp4", "int8", "nvfp4", "w4a16", "int8")]
    assert len(calls) == 1  # one dequantized NVFP4 weight, reused by every route that reads it
    for route, y in zip(("nvfp4", "int8", "nvfp4", "w4a16", "int8"), ys):
        assert torch.equal(y, spec.reference_linear(x, w, b, route, 32)), route
