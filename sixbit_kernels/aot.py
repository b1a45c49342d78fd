"""Ahead-of-time compile of every kernel launch sixbit dispatches, for GPUs that are not present.

``python -m sixbit_kernels.aot [--caps 80,86,89,90,100,120] [--jobs 2]`` (run *without*
``TRITON_INTERPRET``; no GPU needed). For each target capability it drives the real wrappers —
``ops.linear`` on every route at the CogVideoX-2B/5B and Wan-1.3B linear shapes (large M: decode-once
GEMMs, ``w4a8_requant``'s re-quantize + W8A8; small M: modulation / text-encoder rows, per-tile decode), PDR's outlier count, the block
bookkeeping, the q/k norm (+ rotary), the fused producers (norm → INT8, GELU → INT8), the self-check's
problems and, from sm_89, the 8-bit attention (K/V pass and attention at head dims 64 and 128, the tile
``attention_fp8.default_config`` picks for the target's shared memory; also with the residual terms, an accuracy
option the processor does not dispatch) — with CPU tensors and that target's
dispatch (``targets.target_for``), records each ``kernel[grid](...)`` instead of launching it, and
compiles every distinct launch (signature, constexprs, alignment attributes, num_warps/num_stages) with
``triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))``. On capability 9.0 both variants
are compiled (the portable one is what ``SIXBIT_KERNEL_VARIANT=portable`` runs); Hopper-only launches
nowhere else. Each result: compile error or not, ``metadata.shared`` against the target's opt-in budget
(``targets.SMEM_OPTIN``), seconds. The alignment attributes come from triton's own binder (the JIT's
specialisation of the same arguments), so what is compiled is what a launch on that GPU would compile.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from sixbit.formats import Int8Tensor, NVFP4Tensor

#: (K, N) of the block linears driven at large M, and the widths of their inputs
BLOCK_SHAPES = [(1920, 5760), (1920, 1920), (1920, 7680), (7680, 1920),  # CogVideoX-2B
                (3072, 9216), (3072, 3072), (3072, 12288), (12288, 3072),  # CogVideoX-5B
                (1536, 1536), (1536, 8960), (8960, 1536)]  # Wan 1.3B
M_LARGE = 35552  # CogVideoX 49 frames 480x720, CFG batched
#: weight-only 4-bit (w4a16, no rotation) at small M: modulation linears (M = batch) and a T5 text encoder
SMALL = [(2, 512, 11520), (2, 512, 18432), (452, 4096, 4096), (452, 4096, 10240)]
HB = 64


def _packed(ops, k, n, formats):
    w4 = w8 = None
    if "nvfp4" in formats:
        w4 = NVFP4Tensor(torch.empty(n, k // 2, dtype=torch.uint8), torch.empty(n, k // 16, dtype=torch.float8_e4m3fn),
                         torch.ones((), dtype=torch.float32), torch.bfloat16)
    if "int8" in formats:
        w8 = Int8Tensor(torch.empty(n, k, dtype=torch.int8), torch.ones(n, 1), torch.bfloat16)
    return ops.PackedLinear(w4, w8, torch.empty(n, dtype=torch.bfloat16), HB if "int8" in formats else None, k, n)


def drive(sk, target) -> None:
    """Every launch the dispatch makes for ``target`` (kernels recorded, not run)."""
    ops = sk.ops
    opts = ops.KernelOptions(target=target)
    for k, n in BLOCK_SHAPES:
        p = _packed(ops, k, n, ("nvfp4", "int8"))
        x = torch.empty(M_LARGE, k, dtype=torch.bfloat16)
        for route in ops.LINEAR_ROUTES:
            ops.linear(x, p, route, backend="triton", options=opts)
            if n == 4 * k or (k, n) == (1536, 8960):  # a feed-forward's first projection: the GELU epilogue
                ops.linear(x, p, route, backend="triton", options=opts, activation="gelu_tanh")
        ops.linear(x[:1024], p, "int8", backend="triton", options=opts)  # the self-check's problem
        if (k, n) == (1920, 7680):  # an fp32 output of the decode-once GEMM (Hopper: not the persistent kernel)
            sk.gemm_w4.gemm_w4(x[:1024], p.weight("nvfp4"), None, torch.float32, decode="once", target=target)
        sk.hadamard_quant.outlier_count(x, 8.0)  # PDR's block-input count
    for m, k, n in SMALL:
        p = _packed(ops, k, n, ("nvfp4",))
        ops.linear(torch.empty(m, k, dtype=torch.bfloat16), p, "w4a16", backend="triton", options=opts)
    for d, s in ((1920, 17776), (3072, 17776)):  # block bookkeeping: video and text streams
        t = torch.empty(2, s, d, dtype=torch.bfloat16)
        sk.block_stats.delta_stats(t, t, t)
        sk.block_stats.delta_stats(t, t, None, write=False)
        sk.gated_residual.gated_residual(t, t[:, :1], t)  # the fused block forward's x + gate · y
        sk.block_stats.finite_l1_mean(t[:, 226:])  # TDC's "magnitude" size of a held piece
    q = torch.empty(2, 17776, 30, 64, dtype=torch.bfloat16).transpose(1, 2)
    w = torch.empty(64, dtype=torch.bfloat16)
    cs = torch.empty(17550, 64)
    sk.layernorm.layer_norm_rows(q, w, w, 1e-6)
    sk.layernorm.layer_norm_rows(q, w, w, 1e-6, rope=(cs, cs, 226))
    for d in (1920, 3072):  # fused producers: norm + modulate → the [text; video] INT8 operand (and fp16 codes)
        mod = torch.empty(2, d, dtype=torch.bfloat16)
        parts = [(torch.empty(2, 226, d, dtype=torch.bfloat16), mod, mod),
                 (torch.empty(2, 17550, d, dtype=torch.bfloat16), mod, mod)]
        wd = torch.empty(d, dtype=torch.bfloat16)
        for dense in (False, True):
            sk.norm_quant.norm_modulate(parts, wd, wd, 1e-5, HB, dense=dense)
        sk.norm_quant.norm_modulate(parts, wd, wd, 1e-5, HB, codes=False, norm=True)
    sk.gelu_quant.gelu_int8(torch.empty(M_LARGE, 7680, dtype=torch.bfloat16), HB)  # GELU → INT8 (2B ff-out)
    if target.capability >= (8, 9):  # 8-bit attention (e4m3 MMAs): CogVideoX's head dim 64 and Wan's 128
        fa = sk.attention_fp8
        # each also with the accuracy option of session 39 (second e4m3 terms on K's 32 largest channels and V; not
        # dispatched by the processor) — in the processor's form only with the rotary
        terms = {"residual_channels": 32, "v_residual": True}
        picked = {**terms, "residual_ratio": 3.0}  # session 40: per head, two launches that each skip the other heads
        for d, h, s in ((64, 30, 17776), (128, 12, 32760)):
            q = torch.empty(2, h, s, d, dtype=torch.bfloat16)
            for opts in ({}, terms, picked) if d == 64 else ({}, terms):
                kv = fa.quantize_kv(q, q, **opts)
                fa.attention_fp8(q, kv, config=fa.default_config(d, target.smem),
                                 tma=fa.TMA[d] and target.variant == "hopper")
        # CogVideoX's processor: the raw projections (strided), q/k norm on load — 2B without, 5B with the rotary
        qt = torch.empty(2, 17776, 30, 64, dtype=torch.bfloat16).transpose(1, 2)
        for rope in (None, (cs, cs, 226)):
            norm = sk.layernorm.RowNorm(w, w, 1e-6, rope)
            for opts in ({}, terms) if rope else ({},):
                kv = fa.quantize_kv(qt, qt, k_norm=norm, **opts)
                fa.attention_fp8(qt, kv, config=fa.default_config(64, target.smem),
                                 tma=fa.TMA[64] and target.variant == "hopper", q_norm=norm)


def record(sk, target) -> list[tuple]:
    """``[(kernel, args, kwargs)]`` of every launch :func:`drive` makes, deduplicated by triton's own key."""
    from triton.runtime.jit import JITFunction

    seen: dict = {}
    real_run = JITFunction.run

    def fake_run(self, *args, grid, warmup, **kwargs):
        seen.setdefault((self.fn.__qualname__, repr(_spec_key(args, kwargs))), (self, args, kwargs))

    mods = [sk.gemm_w8a8, sk.gemm_w4, sk.requant, sk.hadamard_quant, sk.block_stats, sk.gated_residual, sk.layernorm, sk.norm_quant, sk.gelu_quant,
            sk.attention_fp8]
    saved = [m.check_launchable for m in mods]
    JITFunction.run = fake_run
    for m in mods:
        m.check_launchable = lambda *t: False  # CPU tensors stand in for the device's
    try:
        drive(sk, target)
    finally:
        JITFunction.run = real_run
        for m, f in zip(mods, saved):
            m.check_launchable = f
    return list(seen.values())


def _spec_key(args, kwargs):
    def one(a):
        if isinstance(a, torch.Tensor):
            return (str(a.dtype), a.data_ptr() % 16 == 0)
        if isinstance(a, int) and not isinstance(a, bool):
            return ("i", a % 16 == 0, a == 1)
        if hasattr(a, "block_shape"):
            return ("desc", str(a.base.dtype), tuple(a.block_shape))
        return repr(a)
    return tuple(one(a) for a in args), tuple(sorted((k, repr(v)) for k, v in kwargs.items()))


def compile_one(fn, args, kwargs, cap: int) -> dict:
    """Compile one recorded launch for ``sm_<cap>`` the way the JIT would; never raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", cap, 32)
    t0 = time.perf_counter()
    out = {"kernel": fn.fn.__name__, "cap": cap,
           "constexprs": {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                          for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}}
    try:
        backend = make_backend(target)
        kw = dict(kwargs, debug=False)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = binder(*args, **kw)
        options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, specialization, options)
        compiled = triton.compile(triton.compiler.ASTSource(fn, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        out["shared"] = int(compiled.metadata.shared)
    except Exception as e:  # recorded, the caller fails on it
        out["error"] = f"{type(e).__name__}: {str(e)[:600]}"
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _worker(job):
    caps, variant = job
    import sixbit_kernels as sk

    results = []
    for cap in caps:
        tgt = sk.targets.target_for((cap // 10, cap % 10), variant=variant)
        budget = sk.targets.SMEM_OPTIN[tgt.capability]
        for fn, args, kwargs in record(sk, tgt):
            r = compile_one(fn, args, kwargs, cap)
            r.update(variant=tgt.variant, budget=budget, over_budget=r.get("shared", 0) > budget)
            results.append(r)
    return results


def jobs_for(caps: list[int]) -> list[tuple[list[int], str]]:
    """One job per (capability, variant): the portable variant everywhere, Hopper's on 9.x too."""
    jobs = [([c], "portable") for c in caps]
    jobs += [([c], "hopper") for c in caps if c // 10 == 9]
    return jobs


def compile_all(caps: list[int], workers: int = 2) -> list[dict]:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("ahead-of-time compiles need TRITON_INTERPRET unset (the interpreter replaces @triton.jit)")
    jobs = jobs_for(caps)
    if workers <= 1:
        return [r for j in jobs for r in _worker(j)]
    with ProcessPoolExecutor(workers) as pool:
        return [r for rs in pool.map(_worker, jobs) for r in rs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", default="80,86,89,90,100,120")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the per-launch results here")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = compile_all([int(c) for c in a.caps.split(",")], a.jobs)
    bad = [r for r in res if "error" in r or r["over_budget"]]
    for r in res:
        flag = "ERROR" if "error" in r else "OVER" if r["over_budget"] else "ok"
        print(f"sm_{r['cap']} {r['variant']:8} {r['kernel']:24} shared {r.get('shared', '-'):>7} / {r['budget']} "
              f"{r['seconds']:5.1f}s {flag} {r.get('error', '')[:160]}")
    print(f"{len(res)} compiles, {len(bad)} failed, {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
