"""``sixbit_kernels/block_stats.py`` (the engine's per-block Δ / Γ / delta-change pass) and ``ops.outlier_count``
against the torch reference (``sixbit.dmpq.gamma_sums``, ``sixbit.tdc.delta_change_sums``,
``sixbit.formats.outlier_count``); interpreter on the CPU."""

from __future__ import annotations

import math

import pytest
import torch

import sixbit
import sixbit_kernels as sk
from sixbit import SixBitConfig
from sixbit import formats as spec
from sixbit.dmpq import gamma_sums
from sixbit.tdc import delta_change_sums
from sixbit.testing import generate, tiny_cogvideox_pipeline

bs = sk.block_stats
ops = sk.ops
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _streams(shapes, dtype, g, scale=1.0):
    return [(torch.randn(*s, generator=g) * scale).to(dtype).to(DEV) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shapes", [[(2, 37, 48)], [(2, 129, 64), (2, 7, 64)], [(1, 1, 16)]])
@pytest.mark.parametrize("with_old", [True, False])
def test_block_stats_matches_reference(dtype, shapes, with_old):
    g = torch.Generator().manual_seed(len(shapes) * 10 + shapes[0][1])
    ins = _streams(shapes, dtype, g, 3.0)
    outs = [i + t for i, t in zip(ins, _streams(shapes, dtype, g, 0.5))]
    olds = _streams(shapes, dtype, g, 0.5) if with_old else None
    if with_old:
        olds[0].view(-1)[:5] = 0.0
    ins[0].view(-1)[-3:] = 1e4 if dtype != torch.float16 else 6e3  # huge and tiny magnitudes
    outs[0].view(-1)[-2:] = 1e-6
    assert ops.block_stats_supported(outs, ins, olds, "triton")
    deltas, sums = ops.block_stats(outs, ins, olds)
    ref_d = [o - i for o, i in zip(outs, ins)]
    for d, r in zip(deltas, ref_d):
        assert d.dtype == dtype and torch.equal(d, r)  # Δ bit-exact: one rounding of out − in
    ref = [*gamma_sums(ref_d[0], ins[0])]
    ref += [*delta_change_sums(ref_d, olds)] if with_old else [torch.zeros(()), torch.zeros(())]
    ref = torch.stack([r.double().cpu() for r in ref])
    assert sums.dtype == torch.float64 and sums.shape == (4,)
    torch.testing.assert_close(sums.cpu(), ref, rtol=1e-5, atol=0.0)  # fp32 sums, another order
    _, sums2 = ops.block_stats(outs, ins, olds, write=False)
    assert torch.equal(sums2, sums)  # deterministic (no atomics)


def test_block_stats_non_finite_and_empty():
    x = torch.ones(4, 32).to(DEV)
    y = x.clone()
    y[1, 3] = math.nan
    _, s = ops.block_stats([y], [x])
    assert math.isnan(float(s[0])) and float(s[1]) == 128.0
    y[1, 3] = math.inf
    _, s = ops.block_stats([y], [x], [x])
    assert math.isinf(float(s[0])) and math.isinf(float(s[2])) and float(s[3]) == 128.0
    e = torch.zeros(0, 16).to(DEV)
    d, s = ops.block_stats([e], [e], [e])
    assert d[0].shape == (0, 16) and float(s.abs().sum()) == 0.0


def test_block_stats_rejects_mismatched_streams():
    a = torch.zeros(4, 32).to(DEV)
    assert not ops.block_stats_supported([a], [a.t().contiguous().t()], None, "triton") or a.is_contiguous()
    assert not bs.supported(a, a.half())
    assert not bs.supported(a, torch.zeros(4, 16).to(DEV))
    assert not ops.block_stats_supported([a], [a], None, "torch")
    with pytest.raises(ValueError, match="delta_stats"):
        bs.delta_stats(a, a[:, ::2])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_outlier_count_matches_reference(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 45, 256, generator=g).to(dtype)
    x[0, 3, 7] = 500.0
    x[2, 10] = 0.0
    x[1, 4, :2] = -200.0
    c, n = ops.outlier_count(x.to(DEV), 8.0, "triton")
    rc, rn = spec.outlier_count(x, 8.0)
    assert n == rn and c.dtype == torch.int64 and int(c) == int(rc) and int(rc) >= 2
    c, n = ops.outlier_count(torch.randn(3, 10).to(DEV), 8.0, "triton")  # width not a multiple of 16: reference
    assert n == 30


@pytest.mark.skipif(torch.cuda.is_available(), reason="the tiny pipeline runs on the CPU (interpreter)")
def test_engine_triton_bookkeeping_takes_the_reference_decisions():
    """The whole engine with backend="triton" (kernels in the interpreter) against backend="torch" on a tiny
    pipeline with TDC: the same skip pattern, routes and modes; Γ and delta changes equal to fp32 rounding."""
    traces = {}
    for backend in ("torch", "triton"):
        pipe = tiny_cogvideox_pipeline(seed=0)
        with sixbit.apply(pipe, SixBitConfig.preset("tdc_only", backend=backend, tdc_mode="block", tdc_threshold=0.5,
                                                     tdc_budget=1.0, tdc_first=1, tdc_last=0)) as h:
            generate(pipe, num_inference_steps=6)
            traces[backend] = h.trace.to_dict()["steps"]
    for st, sk_ in zip(traces["torch"], traces["triton"]):
        for a, b in zip(st["blocks"], sk_["blocks"]):
            assert a["mode"] == b["mode"] and a["skipped"] == b["skipped"]
            for key in ("gamma", "delta_sim"):
                if a[key] is None:
                    assert b[key] is None
                else:
                    assert b[key] == pytest.approx(a[key], rel=1e-5)
    assert any(b["skipped"] for s in traces["torch"] for b in s["blocks"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape,view", [((2, 40, 48), "slice"), ((1, 1, 16), "contiguous"), ((3, 7, 100), "slice"),
                                        ((517,), "contiguous"), ((2, 9, 1920), "slice"), ((4, 5, 6, 8), "contiguous")])
def test_finite_l1_mean_matches_tdc_l1_size(dtype, shape, view):
    """TDC's ``"magnitude"`` size of a held tensor in one pass (``block_stats.finite_l1_mean``) against
    ``sixbit.tdc.l1_size``: contiguous tensors and the regated pieces' strided views, huge and tiny magnitudes, an
    outlier channel, zeros and non-finite elements (counted as 0)."""
    from sixbit.tdc import l1_size

    g = torch.Generator().manual_seed(sum(shape))
    t = (torch.randn(*shape, generator=g) * 2).to(dtype).to(DEV)
    if view == "slice":
        t = torch.cat([t[:, :3], t], dim=1)[:, 3:]  # the video part of [text; video]
        assert not t.is_contiguous()
    flat = t.reshape(-1) if t.is_contiguous() else None
    t[..., 0] = 0.0
    if t.shape[-1] > 5:
        t[..., 5] *= 300.0 if dtype != torch.float16 else 30.0  # an outlier channel
    if flat is not None and flat.numel() > 8:
        flat[:2] = torch.finfo(dtype).tiny / 4
        flat[2] = float("nan")
        flat[3], flat[4] = float("inf"), -float("inf")
    else:
        t[0, 0, 1], t[0, -1, 2] = float("nan"), float("inf")
    assert bs.finite_l1_supported(t)
    got, ref = bs.finite_l1_mean(t), l1_size(t)
    assert got.dtype == torch.float32 and got.dim() == 0 and math.isfinite(float(got))
    torch.testing.assert_close(got.cpu(), ref.cpu(), rtol=2e-6, atol=0.0)
    assert torch.equal(bs.finite_l1_mean(t), got)  # deterministic


def test_finite_l1_mean_all_zero_and_unsupported_inputs():
    assert float(bs.finite_l1_mean(torch.zeros(2, 5, 32).to(DEV))) == 0.0
    t = torch.randn(2, 5, 32).to(DEV)
    for bad in (torch.tensor(1.0), torch.zeros(2, 0, 32), t.transpose(1, 2), t.double(), t.transpose(0, 1)[None]):
        assert not bs.finite_l1_supported(bad)
        with pytest.raises(ValueError, match="finite_l1_mean: a non-empty"):
            bs.finite_l1_mean(bad)
    assert not ops.l1_size_supported(t, "torch") and ops.l1_size_supported(t, "triton")


def test_sizer_takes_the_kernel_where_it_serves_and_tdc_l1_size_elsewhere(monkeypatch):
    from sixbit import hooks, tdc

    seen = []
    monkeypatch.setattr(tdc, "l1_size", lambda t: seen.append("torch") or torch.zeros(()))
    t = torch.randn(2, 7, 64).to(DEV)[:, 2:]
    kernel = hooks.sizer("triton")(t)
    assert seen == [] and float(kernel) > 0
    hooks.sizer("torch")(t)
    hooks.sizer("triton")(torch.tensor(2.0))  # a 0-d size: the reference (the size itself)
    assert seen == ["torch", "torch"]
