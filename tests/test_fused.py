"""Quantize fused into the norm producers (sixbit/fused.py) and the pre-quantized input of ``ops.linear``.

The fused block must compute what the block's own forward computes (documented bound: the producer's
codes equal the unfused quantize's up to rare one-step flips, so outputs agree to ~1e-4 relative), fuse
exactly where every consumer reads an INT8 operand this step, and leave every other case untouched.
Triton's interpreter on CPU tensors (``backend="triton"``, processors with ``allow_cpu``); on a CUDA host
the compiled kernels on the GPU, in bf16 (the producers' GPU dtypes).
"""

from __future__ import annotations

import pytest
import torch
from diffusers.hooks.hooks import HookRegistry

import sixbit
from sixbit import SixBitConfig, attention, fused
from sixbit import formats as spec
from sixbit.adapters import COGVIDEOX
from sixbit.linear import ops, swap_linears
from sixbit.testing import generate, tiny_cogvideox_pipeline, tiny_wan_pipeline

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: the dtypes the block tests run: fp32 too in the interpreter; on CUDA the producers take bf16/fp16 only
DTYPES = [torch.float32, torch.bfloat16] if DEV == "cpu" else [torch.bfloat16]
BOUND = 1e-4  # measured: 0 (bf16) and ~2e-8 (fp32) on these blocks


def _block(int8_route="w8a8", backend="triton", dtype=DTYPES[0], seed=0, hadamard_block=32):
    """One CogVideoX block (width 32) with swapped linears, the fused processor and the fused hook."""
    block = tiny_cogvideox_pipeline(seed=seed, num_layers=1, dtype=dtype).transformer.transformer_blocks[0].to(DEV)
    names = [n for n, _ in COGVIDEOX.block_linears(block)]
    new, _ = swap_linears(block, names, formats_=("nvfp4", "int8"), hadamard_block=hadamard_block, fp_weights="device",
                          int8_route=int8_route, backend=backend, k_sigma=None)
    for attn, _ in attention.install([("b", block)], ops(), backend):
        attn.processor.allow_cpu = True
    hook = fused.FusedProducersHook(backend)
    HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, fused.FUSED_HOOK)
    g = torch.Generator().manual_seed(seed + 7)
    args = tuple(torch.randn(*shape, generator=g).to(DEV, dtype) for shape in ((2, 24, 32), (2, 5, 32), (2, 32)))
    return block, new, hook, args


def _run(block, hook, args, routes):
    for m, r in routes.items():
        m.route = r
    with torch.no_grad():
        got = block(*args)
        ref = hook.fn_ref.original_forward(*args)
    return got, ref


def _close(got, ref):
    for g, r in zip(got, ref):
        assert float(spec.relative_error(g, r)) < BOUND


@pytest.mark.parametrize("int8_route,dtype", [("w8a8", d) for d in DTYPES] + [("int8", DTYPES[0])])
def test_fused_block_matches_unfused(int8_route, dtype, one_thread):
    """Every linear on an INT8 route (W8A8; W4A8 reads fp16 codes): both norms fused."""
    block, new, hook, args = _block(int8_route, dtype=dtype)
    got, ref = _run(block, hook, args, {m: "int8" for m in new.values()})
    assert (hook.fused, hook.unfused) == (2, 0)
    _close(got, ref)


@pytest.mark.parametrize("int8_route", ["w8a8", "int8"])
def test_unrotated_layers_read_the_int8_codes_too(int8_route, one_thread):
    """``hadamard_block=0`` (no rotation: the layers' Hadamard block is None): the producer still writes the INT8
    codes their INT8 routes read, not the 16-bit output."""
    block, new, hook, args = _block(int8_route, hadamard_block=0)
    assert new["attn1.to_q"].packed.hadamard_block is None
    got, ref = _run(block, hook, args, {m: "int8" for m in new.values()})
    assert (hook.fused, hook.sixteen, hook.unfused) == (2, 0, 0)
    _close(got, ref)


def test_fuses_only_where_every_consumer_reads_int8(one_thread):
    """INT8 codes where every consumer reads them; the 16-bit output (one pass) where a consumer on a quantized
    route needs the 16-bit input; diffusers' own ops where a consumer is on the 16-bit route."""
    block, new, hook, args = _block()
    routes = {m: "int8" for m in new.values()}
    routes[new["attn1.to_k"]] = "nvfp4"  # one qkv consumer needs the 16-bit input: norm1 writes it
    got, ref = _run(block, hook, args, routes)
    assert (hook.fused, hook.sixteen, hook.unfused) == (1, 1, 0)
    _close(got, ref)
    routes[new["ff.net.0.proj"]] = "w4a16"  # norm2 writes the 16-bit output too
    got, ref = _run(block, hook, args, routes)
    assert (hook.fused, hook.sixteen, hook.unfused) == (1, 3, 0)
    _close(got, ref)
    routes[new["attn1.to_k"]] = routes[new["ff.net.0.proj"]] = "fp16"  # a full-precision consumer: diffusers' ops
    got, ref = _run(block, hook, args, routes)
    assert (hook.fused, hook.sixteen, hook.unfused) == (1, 3, 2)
    assert all(torch.equal(g, r) for g, r in zip(got, ref))  # nothing fused: the block's own forward


def test_the_fused_path_reports_the_attention_output_it_computes_without_the_module_call(one_thread):
    """``tdc_regate`` keeps the self-attention's output of a computed block: the fused forward computes it through
    the processor, not the attention module (whose ``PartHook`` never sees that call), so it reports it itself."""
    block, new, hook, args = _block()
    seen, module_out = {}, []
    hook.capture = lambda name, out: seen.setdefault(name, out)
    block.attn1.register_forward_hook(lambda m, a, o: module_out.append(o))
    _run(block, hook, args, {m: "int8" for m in new.values()})
    assert (hook.fused, hook.unfused) == (2, 0) and set(seen) == {"attn1"}
    assert len(module_out) == 1  # the unfused reference's call only
    _close(seen["attn1"], module_out[0])


def test_torch_backend_and_outlier_counts_run_todays_path(one_thread):
    block, new, hook, args = _block(backend="torch")
    got, ref = _run(block, hook, args, {m: "int8" for m in new.values()})
    assert hook.fused == 0 and all(torch.equal(g, r) for g, r in zip(got, ref))
    block, new, hook, args = _block()
    new["attn1.to_q"].k_sigma = 8.0  # a per-linear outlier count needs the 16-bit input: written in one pass
    got, ref = _run(block, hook, args, {m: "int8" for m in new.values()})
    assert (hook.fused, hook.sixteen, hook.unfused) == (1, 1, 0)
    _close(got, ref)
    new["attn1.to_q"].k_sigma = None
    new["attn1.to_q"].observer = lambda *a: None  # calibration sees diffusers' own values
    _run(block, hook, args, {m: "int8" for m in new.values()})
    assert (hook.fused, hook.sixteen, hook.unfused) == (2, 1, 1)


def test_wider_than_max_dim_runs_the_blocks_own_forward(monkeypatch, one_thread):
    block, new, hook, args = _block()
    monkeypatch.setattr(fused, "MAX_DIM", 16)  # the block is 32 wide
    got, ref = _run(block, hook, args, {m: "int8" for m in new.values()})
    assert (hook.fused, hook.unfused) == (0, 2) and all(torch.equal(g, r) for g, r in zip(got, ref))


def _norm_5b(dtype, seed):
    """diffusers' ``CogVideoXLayerNormZero`` at CogVideoX-5B's dim 3072 (non-trivial LayerNorm weight and bias) and a
    video (37 tokens), text (3 tokens) and time-embedding input, batch 2."""
    from diffusers.models.normalization import CogVideoXLayerNormZero

    dim = 3072
    torch.manual_seed(0)
    norm = CogVideoXLayerNormZero(64, dim, True, 1e-5, bias=True).to(DEV, dtype).eval()
    with torch.no_grad():
        norm.norm.weight.normal_(1.0, 0.2)
        norm.norm.bias.normal_(0.0, 0.2)
    g = torch.Generator().manual_seed(seed)
    return (norm, *(torch.randn(*s, generator=g).to(DEV, dtype) for s in ((2, 37, dim), (2, 3, dim), (2, 64))))


def test_sixteen_bit_producer_at_cogvideox_5b_width(one_thread):
    """The hook's 16-bit producer (consumers on NVFP4 / W4A16 routes) at dim 3072, awkward token counts: diffusers'
    ``CogVideoXLayerNormZero`` output concatenated ``[text; video]``, up to one ulp of the model dtype on a few
    values (the LayerNorm statistics' summation order), the same gates."""
    dim, dtype = 3072, DTYPES[-1]
    norm, hs, enc, temb = _norm_5b(dtype, seed=2)
    with torch.no_grad():
        hs[0, 5] *= 1e3  # a huge token and a constant one (zero variance)
        hs[1, 7] = 0.25
        y, gate, enc_gate = fused.FusedProducersHook("triton")._operand(norm, temb, hs, enc, fused.SIXTEEN_BIT)
        n_hs, n_enc, ref_gate, ref_enc_gate = norm(hs, enc, temb)
        shift, _, _, enc_shift, _, _ = norm.linear(norm.silu(temb)).chunk(6, dim=1)
    ref = torch.cat([n_enc, n_hs], 1).float()
    assert y.dtype == dtype and y.shape == (2, 40, dim)
    assert torch.equal(gate[:, 0], ref_gate[:, 0]) and torch.equal(enc_gate[:, 0], ref_enc_gate[:, 0])
    # one ulp of the normalized value, carried through ``· (1 + scale)`` (≈ ref − shift) and the rounding of the sum
    sh = torch.cat([enc_shift[:, None].expand(2, 3, dim), shift[:, None].expand(2, 37, dim)], 1).float()
    bound = ((ref - sh).abs() + ref.abs()) * 2.0 ** -7 + 1e-30
    d = (y.float() - ref).abs()
    assert bool((d <= bound).all()) and float((d > 0).float().mean()) < 0.02


@pytest.mark.parametrize("form", ["int8", "int8-dense"])
def test_producer_at_cogvideox_5b_width(form, one_thread):
    """The hook's producer call at CogVideoX-5B's dim 3072 (diffusers' own CogVideoXLayerNormZero: its
    modulation linear, the ``chunk`` views) against the reference on diffusers' output, awkward token
    counts; every consumer route of that width fuses (dims up to ``fused.MAX_DIM``)."""
    dim = 3072
    assert dim <= fused.MAX_DIM
    norm, hs, enc, temb = _norm_5b(torch.bfloat16, seed=1)
    with torch.no_grad():
        q, gate, enc_gate = fused.FusedProducersHook("triton")._operand(norm, temb, hs, enc, (form, 64))
        n_hs, n_enc, ref_gate, ref_enc_gate = norm(hs, enc, temb)
    assert q.form == form and q.shape == (2, 40, dim) and q.hadamard_block == 64
    assert torch.equal(gate[:, 0], ref_gate[:, 0]) and torch.equal(enc_gate[:, 0], ref_enc_gate[:, 0])
    ref = spec.quantize_int8(spec.block_hadamard(torch.cat([n_enc, n_hs], 1).reshape(-1, dim).cpu(), 64),
                             check_finite=False)
    d = (q.act.data.cpu().float() - ref.data.float()).abs()
    assert float(d.max()) <= 1 and float((d > 0).float().mean()) < 2e-3
    torch.testing.assert_close(q.act.scale.cpu(), ref.scale, rtol=2e-2, atol=0)


def test_pipeline_fused_matches_unfused_and_removes_cleanly(one_thread):
    """The engine wires the hook inside its block hook (routes set first): a W8A8 video with the fused
    producers equals the unfused one to the bound; ``remove()`` leaves the blocks as they were."""
    pipe = tiny_cogvideox_pipeline(seed=0, num_layers=2, dtype=DTYPES[0]).to(DEV)
    out = {}
    for fp in (False, True):
        with sixbit.apply(pipe, SixBitConfig.preset("w8a8", backend="triton", fused_producers=fp,
                                                    gelu_epilogue=fp)) as h:
            blocks = [b for _, b in h.adapter.blocks(pipe.transformer)]
            for b in blocks:
                b.attn1.processor.allow_cpu = True
            out[fp] = generate(pipe, num_inference_steps=2)
            hooks = [b._diffusers_hook.hooks.get(fused.FUSED_HOOK) for b in blocks]
            assert all(k is None for k in hooks) if not fp else all((k.fused, k.unfused) == (4, 0) for k in hooks)
            # ff.net.0's GELU in its GEMM's epilogue: once per block and step (CFG batched)
            assert [k.calls for _, k in h.gelu_epilogue] == ([2, 2] if fp else [])
    # measured 7e-7 (fp32, interpreter). On CUDA the test runs bf16, where the fused and unfused paths round
    # differently (one real 2B block on the H200: 1.6e-3, fused_quant_h200.md); the H200 run failed this test
    # under the CPU bound, and this looser GPU bound is not yet re-checked there
    bound = 10 * BOUND if DEV == "cpu" else 1e-2
    assert float(spec.relative_error(out[True], out[False])) < bound
    for b in pipe.transformer.transformer_blocks:
        for m in (b, b.ff.net[0]):
            assert "forward" not in m.__dict__ and not getattr(m, "_diffusers_hook", None)


# ------------------------------------------------------------------------- ops.linear on QuantizedInput


def _layer(k=64, n=48):
    g = torch.Generator().manual_seed(3)
    return ops().pack_linear(torch.randn(n, k, generator=g) / 8, torch.randn(n, generator=g),
                             formats=("nvfp4", "int8"), hadamard_block=32)


@pytest.mark.parametrize("route", ["w8a8", "int8", "w4a8_requant"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_linear_on_quantized_input_equals_linear_on_x(route, backend):
    """A producer's operand built with today's quantize of ``x`` gives ``linear(x)``'s output."""
    p = _layer().to(DEV)
    x = torch.randn(3, 17, 64, generator=torch.Generator().manual_seed(4)).to(DEV)
    form = ops().operand_form(p, route)
    act = ops().quantize_act(x.reshape(-1, 64), "int8", 32, backend=backend)[0]
    if form == "int8-dense":
        act = spec.Int8Tensor(act.data.to(torch.float16), act.scale, act.orig_dtype)
    y = ops().linear(ops().QuantizedInput(act, 32, (3, 17), x.dtype), p, route, backend=backend)[0]
    y_ref = ops().linear(x, p, route, backend=backend)[0]
    assert y.shape == (3, 17, 48)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)


def test_quantized_input_errors_name_the_mismatch():
    p = _layer()
    act = spec.quantize_int8(torch.randn(4, 64))
    q = ops().QuantizedInput(act, 32, (4,), torch.float32)
    assert ops().operand_form(p, "nvfp4") is None and ops().operand_form(p, "w8a8") == "int8"
    assert ops().operand_form(p, "w4a8_requant") == "int8"  # the codes W8A8 reads: no 8-bit weight needed
    assert ops().operand_form(ops().pack_linear(torch.randn(8, 64), None), "w4a8_requant") == "int8"
    with pytest.raises(ValueError, match="reads no pre-quantized operand"):
        ops().linear(q, p, "nvfp4")
    with pytest.raises(ValueError, match="reads int8-dense"):
        ops().linear(q, p, "int8")
    with pytest.raises(ValueError, match="Hadamard block 16"):
        ops().linear(ops().QuantizedInput(act, 16, (4,), torch.float32), p, "w8a8")
    with pytest.raises(ValueError, match="k_sigma"):
        ops().linear(q, p, "w8a8", k_sigma=8.0)


@pytest.mark.skipif(DEV == "cuda", reason="interpreter dispatch of CPU tensors (the GPU's check runs in the app)")
def test_producers_are_self_checked_under_auto(monkeypatch, one_thread):
    """``backend="auto"``: the producer kernels are checked once per device against formats' reference; a
    broken one falls back (a warning) and the block runs its own forward."""
    from sixbit_kernels import selfcheck, targets

    k = ops()
    x = torch.randn(2, 9, 64)
    parts = [(x, torch.ones(2, 64), torch.zeros(2, 64))]
    with selfcheck.interpreter_dispatch(targets.INTERPRETER):
        assert k.producers_supported(x, "auto")
        q = k.norm_modulate_int8(parts, None, None, 1e-5, 32)
        assert q.form == "int8" and q.shape == (2, 9, 64)
        assert selfcheck.status("cpu")["norm_modulate_int8/64/torch.float32/32"]["impl"] == "triton"
        g = k.gelu_int8(x, 32, dense=True)
        assert g.form == "int8-dense" and g.lead == (2, 9)
        y = k.norm_modulate(parts, None, None, 1e-5)  # the 16-bit output, its own self-check
        assert y.shape == (2, 9, 64) and selfcheck.status("cpu")["norm_modulate/64/torch.float32"]["impl"] == "triton"
        torch.testing.assert_close(y, spec.norm_modulate(parts, None, None, 1e-5), rtol=1e-5, atol=1e-5)
    real = k._norm_modulate_kernel

    def broken(parts, *a, **kw):
        q, y = real(parts, *a, **kw)
        return spec.Int8Tensor(q.data, q.scale * 2, q.orig_dtype), y

    monkeypatch.setattr(k, "_norm_modulate_kernel", broken)
    with selfcheck.interpreter_dispatch(targets.INTERPRETER):
        with pytest.warns(RuntimeWarning, match="norm_modulate_int8/64.*failed its self-check"):
            assert k.norm_modulate_int8(parts, None, None, 1e-5, 32) is None
    monkeypatch.setattr(k, "_norm_modulate_kernel", lambda parts, *a, **kw: (None, 2 * real(parts, *a, **kw)[1]))
    with selfcheck.interpreter_dispatch(targets.INTERPRETER):
        with pytest.warns(RuntimeWarning, match="norm_modulate/64.*failed its self-check"):
            assert k.norm_modulate(parts, None, None, 1e-5) is None
    assert not k.producers_supported(x, "auto")  # CPU without interpreter dispatch: today's path


# ------------------------------------------------------------------------- the GELU in ff.net.0's epilogue


@pytest.mark.parametrize("route", ["nvfp4", "int8", "w8a8", "fp16"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_linear_activation_is_gelu_of_the_output(route, backend):
    """``SixBitLinear(x, activation="gelu_tanh")`` is ``F.gelu`` of the layer's own output on every route and
    backend (the kernels' epilogue tanh: within a few fp32 ulps); an observer sees the linear's output."""
    block = tiny_cogvideox_pipeline(seed=1, num_layers=1).transformer.transformer_blocks[0].to(DEV)
    new, _ = swap_linears(block, ["ff.net.0.proj"], formats_=("nvfp4", "int8"), hadamard_block=32,
                          fp_weights="device", int8_route="w8a8" if route == "w8a8" else "int8", backend=backend,
                          k_sigma=None)
    lin = new["ff.net.0.proj"]
    lin.route = "int8" if route == "w8a8" else route
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(5)).to(DEV) * 4
    with torch.no_grad():
        y = lin(x)
        ref = torch.nn.functional.gelu(y, approximate="tanh")
        got = lin(x, activation="gelu_tanh")
        assert lin.last_route == lin.resolve(lin.route)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
        seen = []
        lin.observer = lambda m, xi, yi: seen.append(yi)
        torch.testing.assert_close(lin(x, activation="gelu_tanh"), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(seen[0], y)  # the pre-activation output, as without the activation
        with pytest.raises(ValueError, match="activation must be one of"):
            lin(x, activation="relu")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_quantized_input_with_gelu_equals_gelu_of_linear(backend):
    p = _layer().to(DEV)
    x = torch.randn(2, 11, 64, generator=torch.Generator().manual_seed(6)).to(DEV)
    act = ops().quantize_act(x.reshape(-1, 64), "int8", 32, backend=backend)[0]
    q = ops().QuantizedInput(act, 32, (2, 11), x.dtype)
    y = ops().linear(q, p, "w8a8", backend=backend, activation="gelu_tanh")[0]
    ref = torch.nn.functional.gelu(ops().linear(x, p, "w8a8", backend=backend)[0], approximate="tanh")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_wan_feed_forward_gelu_runs_in_the_epilogue(one_thread):
    """Wan's ``ffn.net.0`` is a tanh GELU too: hooked once per block, and the video equals the one without the
    hook (torch reference: PyTorch's GELU after the linear either way, so bit for bit)."""
    pipe = tiny_wan_pipeline()
    out = {}
    for on in (False, True):
        with sixbit.apply(pipe, SixBitConfig.preset("w8a8", backend="torch", gelu_epilogue=on)) as h:
            out[on] = generate(pipe, num_inference_steps=2)
            assert [k.calls > 0 for _, k in h.gelu_epilogue] == ([True] * 2 if on else [])
    assert torch.equal(out[True], out[False])
