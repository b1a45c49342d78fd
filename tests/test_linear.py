"""SixBitLinear: the kernel contract per route, route resolution, device moves, swap/restore."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from sixbit import formats
from sixbit.linear import SixBitLinear, effective_hadamard_block, ops, restore_linears, swap_linears

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32, bias=False))


@pytest.mark.parametrize("route", ["nvfp4", "int8", "w8a8", "w4a8_requant", "w4a16"])
def test_routes_match_the_numerics_spec(route):
    model = _model()
    lin = model[0]
    w, b = lin.weight.detach().clone(), lin.bias.detach().clone()
    new, _ = swap_linears(model, ["0"], formats_=("nvfp4", "int8"), hadamard_block=64, fp_weights="cpu",
                          int8_route="int8", backend="auto", k_sigma=None)
    x = torch.randn(2, 5, 64)
    m = new["0"]
    m.route = route
    y = m(x)
    ref = formats.reference_linear(x, w, b, route, 64)
    assert y.shape == (2, 5, 96) and m.last_route == route
    assert float(formats.relative_error(y, ref)) < 1e-5


def test_route_resolution_and_outlier_counts():
    model = _model()
    w = model[0].weight.detach().clone()
    new, orig = swap_linears(model, ["0"], formats_=("nvfp4", "int8"), hadamard_block=64, fp_weights="device",
                             int8_route="w8a8", backend="auto", k_sigma=4.0)
    m = new["0"]
    assert m.has_fp_weights and orig["0"][0] is m._fp
    assert m.resolve("int8") == "w8a8" and m.resolve("fp16") == "fp16" and m.resolve("nvfp4") == "nvfp4"
    x = torch.randn(3, 64)
    x[0, 7] = 50.0
    m.route = "fp16"
    assert torch.equal(m(x), torch.nn.functional.linear(x, w, orig["0"][0].bias))
    assert m.last_outliers[0] == 1 and m.last_outliers[1] == x.numel()
    m.route = "int8"
    m(x)
    assert m.last_route == "w8a8" and m.last_outliers[0] == 1
    # without device-resident originals "fp16" means 16-bit activations × 4-bit weights
    cpu = SixBitLinear("x", m.packed, 64, 96)
    assert cpu.resolve("fp16") == "w4a16" and not hasattr(cpu, "weight")
    with pytest.raises(AttributeError, match="holds only packed weights"):
        cpu.weight  # noqa: B018


@torch.no_grad()
def test_swap_restore_is_exact_and_dtype_moves_do_not_touch_packed_weights():
    model = _model()
    x = torch.randn(4, 64)
    ref = model(x)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    new, orig = swap_linears(model, ["0", "2"], formats_=("nvfp4",), hadamard_block=128, fp_weights="cpu",
                             int8_route="int8", backend="auto", k_sigma=None)
    assert all(isinstance(model[i], SixBitLinear) for i in (0, 2)) and list(model.state_dict()) == []
    assert new["0"].packed.hadamard_block == 64 and new["2"].packed.hadamard_block == 32  # reduced per width
    packed = new["0"].packed
    codes = packed.w4.data.clone()
    model.to(torch.float64)  # a dtype cast must not cast codes or e4m3 scales
    assert new["0"].packed.w4.data.dtype == torch.uint8 and torch.equal(new["0"].packed.w4.data, codes)
    assert new["0"].packed.w4.scales.dtype == torch.float8_e4m3fn
    model.to(torch.float32)
    y = model(x)
    assert 0 < float(formats.relative_error(y, ref)) < 0.35  # two W4A4 layers in a row
    assert new["0"].packed.nbytes < 64 * 96 * 4 / 6
    restore_linears(model, orig)
    assert all(isinstance(model[i], nn.Linear) for i in (0, 2))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert torch.equal(model(x), ref)


def test_effective_hadamard_block():
    assert effective_hadamard_block(1920, 64) == 64
    assert effective_hadamard_block(1920, 256) == 128
    assert effective_hadamard_block(48, 64) == 16
    assert effective_hadamard_block(40, 64) is None
    assert effective_hadamard_block(1920, 0) is None
    assert ops().compute_path("cpu") == "cpu-reference"
