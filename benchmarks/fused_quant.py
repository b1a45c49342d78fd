"""Fused producers vs today's unfused path, at CogVideoX-2B and -5B shapes (``python -m benchmarks fused_quant``).

On a CUDA GPU (written for the H200). Shapes: B = 2 (CFG batched), 17,550 video + 226 text tokens (49
frames 480×720, both models) — every block linear sees M = 35,552 rows; 2B: dim 1920, FF 7680, 30 blocks;
5B: dim 3072, FF 12288, 42 blocks, rotary embeddings (``--models 2b,5b``, default both, one section each).
``triton.testing.do_bench`` medians (after an untimed call that compiles), each path timed in the same run
on the same inputs:

* **norm → qkv / ff-in operand**: diffusers' ``CogVideoXLayerNormZero`` (the real module, random weights:
  modulation linear, LayerNorm, multiply, add for both streams), the processor's ``torch.cat([text;
  video])`` and ``hadamard_quant.quantize_int8_act`` (block 64) — against the modulation linear + ``1 +
  scale`` + ``norm_quant.norm_modulate`` (INT8 codes; also the fp16-code form W4A8 reads, and the 16-bit
  output alone, what a non-INT8 consumer would get; both codes forms also on the other warp count —
  4 ↔ 8, ``norm_quant.default_warps`` — to check the launch config). Each block runs this twice (norm1, norm2).
* **GELU → ff-out operand**: ``F.gelu(approximate="tanh")`` + the INT8 quantize vs ``gelu_quant.gelu_int8``
  (2B only: 5B's 12,288-wide rows exceed the kernel's one-step limit).
* **to_out's input**: the standalone INT8 quantize of ``[M, dim]`` — what fusing into the attention
  epilogue could save at most.
* a device copy (bandwidth reference) and, in the same run, the fused codes against the unfused ones;
* **one block end to end** under static W8A8 (``--no-block`` skips it): the block's forward with the
  producers fused (``sixbit.fused``) vs its own forward, outputs compared (5B: with rotary tables).

The prediction (bytes moved / 4.8 TB/s) is computed from the shapes and printed next to the measurement.
Writes ``<out>.json`` and ``<out>.md`` (device, versions, command).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import RESULTS, env_md, environment, parse, write_results

B, S_VIDEO, S_TEXT, TEMB = 2, 17550, 226, 512
#: model → (dim, FF width, blocks, rotary embeddings)
MODELS = {"2b": (1920, 7680, 30, False), "5b": (3072, 12288, 42, True)}
HB = 64
HBM_TBS = 4.8  # H200 HBM3e peak, TB/s


def _ms(fn):
    if not torch.cuda.is_available():  # --smoke on the CPU (interpreter): one timed call, checks the script
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def predicted_ms(model: str) -> dict:
    """Bytes each path moves per call and the time at :data:`HBM_TBS` (per call and per computed step)."""
    dim, ff, layers, _ = MODELS[model]
    m = B * (S_VIDEO + S_TEXT)
    x = m * dim * 2  # one bf16 pass over the norm input
    y = m * ff * 2
    scales = m * 4
    # unfused norm: LayerNorm, · (1+scale), + shift (read + write each), cat (read + write), quantize (read,
    # int8 write); fused: one read, the int8 write
    norm_unfused, norm_fused = 8 * x + x + x // 2 + scales, x + x // 2 + scales
    gelu_unfused, gelu_fused = 2 * y + y + y // 2 + scales, y + y // 2 + scales
    ms = lambda b: b / (HBM_TBS * 1e12) * 1e3  # noqa: E731
    per_block = 2 * (ms(norm_unfused) - ms(norm_fused)) + ms(gelu_unfused) - ms(gelu_fused)
    return {"bytes": {"norm_unfused": norm_unfused, "norm_fused": norm_fused, "gelu_unfused": gelu_unfused,
                      "gelu_fused": gelu_fused},
            "ms": {"norm_unfused": ms(norm_unfused), "norm_fused": ms(norm_fused), "gelu_unfused": ms(gelu_unfused),
                   "gelu_fused": ms(gelu_fused)},
            "saving_ms_per_block": per_block, "saving_ms_per_step": layers * per_block}


def _code_diff(a, b) -> dict:
    d = (a.data.float() - b.data.float()).abs()
    return {"max_step": float(d.max()), "frac_differing": float((d > 0).float().mean()),
            "scale_max_rel": float(((a.scale - b.scale).abs() / b.scale.abs()).max())}


def run(dev, model: str, smoke: bool = False) -> dict:
    from diffusers.models.normalization import CogVideoXLayerNormZero

    import sixbit_kernels as sk

    hq, nq, gq = sk.hadamard_quant, sk.norm_quant, sk.gelu_quant
    dim, ff, layers, _ = MODELS[model]
    torch.manual_seed(0)
    bf = torch.bfloat16
    norm = CogVideoXLayerNormZero(TEMB, dim, True, 1e-5, bias=True).to(dev, bf).eval()
    with torch.no_grad():
        norm.norm.weight.normal_(1.0, 0.2)
        norm.norm.bias.normal_(0.0, 0.2)
    sv, st = (37, 3) if smoke else (S_VIDEO, S_TEXT)
    hs = torch.randn(B, sv, dim, device=dev, dtype=bf)
    enc = torch.randn(B, st, dim, device=dev, dtype=bf)
    temb = torch.randn(B, TEMB, device=dev, dtype=bf)
    h_ff = torch.randn(B * (sv + st), ff, device=dev, dtype=bf) * 2
    x_out = torch.randn(B * (sv + st), dim, device=dev, dtype=bf)

    def unfused_norm():
        n_hs, n_enc, _, _ = norm(hs, enc, temb)
        return hq.quantize_int8_act(torch.cat([n_enc, n_hs], dim=1).reshape(-1, dim), HB)[0]

    def unfused_norm_bf16():
        n_hs, n_enc, _, _ = norm(hs, enc, temb)
        return torch.cat([n_enc, n_hs], dim=1)

    def parts():
        sh, sc, _, esh, esc, _ = norm.linear(norm.silu(temb)).chunk(6, dim=1)
        return [(enc, 1 + esc, esh), (hs, 1 + sc, sh)]

    w, b, eps = norm.norm.weight, norm.norm.bias, norm.norm.eps
    fused = {"int8": lambda: nq.norm_modulate(parts(), w, b, eps, HB)[0],
             "int8 fp16 codes (W4A8)": lambda: nq.norm_modulate(parts(), w, b, eps, HB, dense=True)[0],
             "16-bit output only": lambda: nq.norm_modulate(parts(), w, b, eps, HB, codes=False, norm=True)[1]}
    warps = nq.default_warps(dim, HB)
    other = 4 if warps == 8 else 8  # the launch config's check: the same kernels on the other warp count
    fused[f"int8 on {other} warps (default {warps})"] = lambda: nq.norm_modulate(parts(), w, b, eps, HB,
                                                                                 num_warps=other)[0]
    fused[f"int8 fp16 codes on {other} warps (default {warps})"] = lambda: nq.norm_modulate(
        parts(), w, b, eps, HB, dense=True, num_warps=other)[0]
    res = {"norm": {}, "gelu": {}, "to_out": {}}
    with torch.no_grad():
        res["norm"]["unfused: diffusers norm+modulate + cat + INT8 quantize"] = _ms(unfused_norm)
        res["norm"]["unfused parts: diffusers norm+modulate + cat"] = _ms(unfused_norm_bf16)
        cat_in = unfused_norm_bf16().reshape(-1, dim)
        res["norm"]["unfused parts: INT8 quantize alone"] = _ms(lambda: hq.quantize_int8_act(cat_in, HB))
        for name, fn in fused.items():
            res["norm"][f"fused: {name}"] = _ms(fn)
        res["norm_check"] = _code_diff(fused["int8"](), unfused_norm())

        if ff // HB <= sk.rows_int8.MAX_CHUNKS:  # the GELU kernel holds a token in one step (2B, not 5B)
            res["gelu"]["unfused: F.gelu(tanh) + INT8 quantize"] = _ms(
                lambda: hq.quantize_int8_act(F.gelu(h_ff, approximate="tanh"), HB))
            res["gelu"]["unfused parts: F.gelu(tanh) alone"] = _ms(lambda: F.gelu(h_ff, approximate="tanh"))
            g = F.gelu(h_ff, approximate="tanh")
            res["gelu"]["unfused parts: INT8 quantize alone"] = _ms(lambda: hq.quantize_int8_act(g, HB))
            res["gelu"]["fused: gelu_int8"] = _ms(lambda: gq.gelu_int8(h_ff, HB))
            res["gelu"]["fused: gelu_int8, fp16 codes (W4A8)"] = _ms(lambda: gq.gelu_int8(h_ff, HB, dense=True))
            res["gelu_check"] = _code_diff(gq.gelu_int8(h_ff, HB), hq.quantize_int8_act(g, HB)[0])

        res["to_out"][f"INT8 quantize of [M, {dim}] (the most an attention-epilogue fusion saves)"] = _ms(
            lambda: hq.quantize_int8_act(x_out, HB))
        big = torch.empty_like(h_ff)
        copy_ms = _ms(lambda: big.copy_(h_ff))
        res["copy_tbs"] = 2 * h_ff.numel() * 2 / (copy_ms * 1e-3) / 1e12
    n, gl = res["norm"], res["gelu"]
    save_norm = n["unfused: diffusers norm+modulate + cat + INT8 quantize"] - n["fused: int8"]
    res["norm_saving_ms_per_call"] = save_norm
    res["norm_saving_ms_per_step"] = 2 * layers * save_norm
    if gl:
        save_gelu = gl["unfused: F.gelu(tanh) + INT8 quantize"] - gl["fused: gelu_int8"]
        res["measured_saving_ms_per_block"] = 2 * save_norm + save_gelu
        res["measured_saving_ms_per_step"] = layers * res["measured_saving_ms_per_block"]
    return res


def run_block(dev, model: str, smoke: bool = False) -> dict:
    """One CogVideoX block of ``model`` (random weights) under static W8A8 — linears swapped, sixbit's
    attention processor, the fused hook — timed with the producers fused (the hook's forward) and without
    (the block's own forward, what runs when the hook does not apply), same inputs, outputs compared."""
    from diffusers.hooks.hooks import HookRegistry
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    from sixbit import attention, fused
    from sixbit import formats as spec
    from sixbit.adapters import COGVIDEOX
    from sixbit.linear import ops, swap_linears

    dim, _, layers, rope = MODELS[model]
    heads, sv, st = (2, 37, 3) if smoke else (dim // 64, S_VIDEO, S_TEXT)
    dim = heads * 64
    torch.manual_seed(0)
    block = CogVideoXBlock(dim, heads, 64, TEMB).to(dev, torch.bfloat16).eval()
    names = [n for n, _ in COGVIDEOX.block_linears(block)]
    backend = "triton" if smoke else "auto"
    new, _ = swap_linears(block, names, formats_=("int8",), hadamard_block=HB, fp_weights="cpu", int8_route="w8a8",
                          backend=backend, k_sigma=None)
    for attn, _ in attention.install([("b", block)], ops(), backend):
        attn.processor.allow_cpu = smoke
    hook = fused.FusedProducersHook(backend)
    HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, fused.FUSED_HOOK)
    for m in new.values():
        m.route = "int8"
    args = (torch.randn(B, sv, dim, device=dev, dtype=torch.bfloat16),
            torch.randn(B, st, dim, device=dev, dtype=torch.bfloat16), torch.randn(B, TEMB, device=dev, dtype=torch.bfloat16))
    if rope:  # 5B: rotary tables of the video tokens (random angles; the q/k norm kernel applies them)
        angle = torch.rand(sv, 64, device=dev) * 6.3
        args += ((angle.cos(), angle.sin()),)
    with torch.no_grad():
        res = {"fused_ms": _ms(lambda: block(*args)), "unfused_ms": _ms(lambda: hook.fn_ref.original_forward(*args))}
        hook.fused = 0
        got, ref = block(*args), hook.fn_ref.original_forward(*args)
    res["rel_error"] = [float(spec.relative_error(g, r)) for g, r in zip(got, ref)]
    res["fused_calls"], res["saving_ms_per_step"] = hook.fused, layers * (res["unfused_ms"] - res["fused_ms"])
    return res


def _model_md(name: str, sec: dict) -> list[str]:
    dim, ff, layers, rope = MODELS[name]
    r, p = sec["results"], sec["predicted"]
    lines = [f"## CogVideoX-{name.upper()}: dim {dim}, FF {ff}, {layers} blocks", "",
             f"M = {B} × ({S_VIDEO} + {S_TEXT}) = {B * (S_VIDEO + S_TEXT)} rows, Hadamard block {HB}; `do_bench` "
             f"medians (ms). Device copy in the same run: {r['copy_tbs']:.2f} TB/s.", ""]
    for key, title in (("norm", "norm + modulate → the qkv / ff-in operand (per call; two per block)"),
                       ("gelu", "GELU → the ff-out operand (per block)")):
        if not r[key]:
            lines += [f"### {title}", "", f"not run: FF {ff} exceeds the GELU kernel's one-step row", ""]
            continue
        lines += [f"### {title}", "", "| path | ms |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in r[key].items()]
        lines += [f"| predicted at {HBM_TBS} TB/s: unfused / fused | {p['ms'][key + '_unfused']:.3f} / "
                  f"{p['ms'][key + '_fused']:.3f} |", ""]
        chk = r[key + "_check"]
        lines += [f"Fused vs unfused codes: {chk['frac_differing']:.2e} of codes differ, at most "
                  f"{chk['max_step']:.0f} step; scales within {chk['scale_max_rel']:.1e} relative.", ""]
    lines += ["### to_out's input", "", "| path | ms |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in r["to_out"].items()]
    lines += ["", f"### Per {name.upper()} step ({layers} blocks)", "",
              f"- norm producers: {r['norm_saving_ms_per_call']:.3f} ms saved per call, "
              f"**{r['norm_saving_ms_per_step']:.1f} ms** per computed step (2 × {layers} calls; the wired fusion)"]
    if "measured_saving_ms_per_step" in r:
        lines += [f"- predicted saving, 2 × norm + GELU: {p['saving_ms_per_block']:.3f} ms per block, "
                  f"**{p['saving_ms_per_step']:.1f} ms** per computed step (bytes / {HBM_TBS} TB/s)",
                  f"- measured saving, 2 × norm + GELU: {r['measured_saving_ms_per_block']:.3f} ms per block, "
                  f"**{r['measured_saving_ms_per_step']:.1f} ms** per computed step"]
    blk = sec.get("block")
    if blk:
        lines += ["", f"### One {name.upper()} block, static W8A8, end to end{' (rotary tables)' if rope else ''}", "",
                  f"- block forward with the producers fused: {blk['fused_ms']:.3f} ms, the block's own forward: "
                  f"{blk['unfused_ms']:.3f} ms → **{blk['saving_ms_per_step']:.1f} ms** per computed step "
                  f"({layers} blocks; {blk['fused_calls']} of 2 producers fused)",
                  f"- outputs (video, text stream) relative error fused vs unfused: "
                  f"{blk['rel_error'][0]:.1e}, {blk['rel_error'][1]:.1e}"]
    return lines + [""]


def markdown(payload: dict) -> str:
    lines = ["# Fused producers (norm/modulate → INT8, GELU → INT8) vs the unfused path — "
             + ", ".join(f"CogVideoX-{m.upper()}" for m in payload["models"]), ""]
    for name, sec in payload["models"].items():
        lines += _model_md(name, sec)
    lines += [env_md(payload["env"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fused_quant", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "fused_quant_h200"))
    ap.add_argument("--models", default="2b,5b", help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--smoke", action="store_true", help="CPU dry run of the script (interpreter, 80 rows)")
    ap.add_argument("--no-block", action="store_true", help="skip the end-to-end block sections")
    args = parse(ap, argv)
    models = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        ap.error(f"--models: unknown {bad or 'empty list'}; known: {', '.join(MODELS)}")
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first imported
    elif not torch.cuda.is_available():
        print("fused_quant needs a CUDA GPU (or --smoke)", flush=True)
        return 2
    dev = torch.device("cpu" if args.smoke else "cuda")
    out = Path(args.out)
    payload = {"env": environment(dev, args.command), "models": {}}
    for m in models:
        sec = payload["models"][m] = {"predicted": predicted_ms(m), "results": run(dev, m, smoke=args.smoke)}
        if not args.no_block:
            sec["block"] = run_block(dev, m, smoke=args.smoke)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    jp, mp = write_results(out.name, payload, markdown(payload), out.parent)
    print(markdown(payload), flush=True)
    print(f"wrote {jp} and {mp}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
