"""The route table (``sixbit.routes``): one vocabulary, and the modules that read it agree with it."""

from __future__ import annotations

import pytest

from sixbit import routes
from sixbit.linear import ops


def test_table_names_letters_bits_and_display():
    assert routes.ROUTES == ("nvfp4", "int8", "w8a8", "w4a8_requant", "w4a16", "fp16")
    assert routes.INT8_ROUTES == ("int8", "w8a8", "w4a8_requant")
    assert routes.DISPLAY_ROUTES == ("nvfp4", "int8", "fp16")
    assert routes.TRACE_ROUTES == ("nvfp4", "int8", "fp16", "skipped")
    assert routes.BITS == {"nvfp4": 4.5, "int8": 8.0, "fp16": 16.0}
    assert routes.LETTERS == {"nvfp4": "n", "int8": "i", "fp16": "f"}
    assert {routes.FROM_LETTER[c] for c in "nif"} == set(routes.DISPLAY_ROUTES)
    assert [routes.display(r) for r in (*routes.ROUTES, "skipped")] == ["nvfp4", "int8", "int8", "int8", "fp16",
                                                                         "fp16", "skipped"]
    # a route and the one it shares a display name with spend the same activation bits
    assert all(routes.TABLE[r].act_bits == routes.BITS[routes.display(r)] for r in routes.ROUTES)
    assert set(routes.STATIC.values()) <= set(routes.KERNEL_ROUTES)


@pytest.mark.parametrize("fp_weights", [True, False])
@pytest.mark.parametrize("int8_route", ["int8", "w8a8", "w4a8_requant"])
def test_resolve_fp16_runs_as_w4a16_without_the_original_weights(fp_weights, int8_route):
    got = {r: routes.resolve(r, has_fp_weights=fp_weights, int8_route=int8_route) for r in routes.DISPLAY_ROUTES}
    assert got == {"nvfp4": "nvfp4", "int8": int8_route, "fp16": "fp16" if fp_weights else "w4a16"}
    assert all(routes.display(v) == k for k, v in got.items())  # the trace shows what was decided


def test_kernels_read_the_table():
    k = ops()
    assert k.LINEAR_ROUTES == routes.KERNEL_ROUTES == ("nvfp4", "int8", "w8a8", "w4a8_requant", "w4a16")
    assert k.WEIGHT_FORMAT == {"nvfp4": "nvfp4", "int8": "nvfp4", "w8a8": "int8", "w4a8_requant": "nvfp4",
                               "w4a16": "nvfp4"}
