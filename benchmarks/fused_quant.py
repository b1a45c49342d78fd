"""Fused producers vs today's unfused path, at CogVideoX-2B shapes (``python -m benchmarks fused_quant``).

On a CUDA GPU (written for the H200). Shapes: B = 2 (CFG batched), 17,550 video + 226 text tokens,
dim 1920, FF 7680 — every block linear sees M = 35,552 rows. ``triton.testing.do_bench`` medians (after an
untimed call that compiles), each path timed in the same run on the same inputs:

* **norm → qkv / ff-in operand**: diffusers' ``CogVideoXLayerNormZero`` (the real module, random weights:
  modulation linear, LayerNorm, multiply, add for both streams), the processor's ``torch.cat([text;
  video])`` and ``hadamard_quant.quantize_int8_act`` (block 64) — against the modulation linear + ``1 +
  scale`` + ``norm_quant.norm_modulate`` (INT8 codes; also the fp16-code form W4A8 reads, and the 16-bit
  output alone, what a non-INT8 consumer would get). Each block runs this twice (norm1, norm2).
* **GELU → ff-out operand**: ``F.gelu(approximate="tanh")`` + the INT8 quantize vs ``gelu_quant.gelu_int8``.
* **to_out's input**: the standalone INT8 quantize of ``[M, 1920]`` — what fusing into the attention
  epilogue could save at most.
* a device copy (bandwidth reference) and, in the same run, the fused codes against the unfused ones;
* **one 2B block end to end** under static W8A8 (``--no-block`` skips it): the block's forward with the
  producers fused (``sixbit.fused``) vs its own forward, outputs compared.

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

B, S_VIDEO, S_TEXT, DIM, FF, TEMB = 2, 17550, 226, 1920, 7680, 512
HB = 64
LAYERS = 30
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


def predicted_ms() -> dict:
    """Bytes each path moves per call and the time at :data:`HBM_TBS` (per call and per 2B step)."""
    m = B * (S_VIDEO + S_TEXT)
    x = m * DIM * 2  # one bf16 pass over the norm input
    y = m * FF * 2
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
            "saving_ms_per_block": per_block, "saving_ms_per_step": LAYERS * per_block}


def _code_diff(a, b) -> dict:
    d = (a.data.float() - b.data.float()).abs()
    return {"max_step": float(d.max()), "frac_differing": float((d > 0).float().mean()),
            "scale_max_rel": float(((a.scale - b.scale).abs() / b.scale.abs()).max())}


def run(dev, smoke: bool = False) -> dict:
    from diffusers.models.normalization import CogVideoXLayerNormZero

    from sixbit import kernels as sk

    hq, nq, gq = sk.hadamard_quant, sk.norm_quant, sk.gelu_quant
    torch.manual_seed(0)
    bf = torch.bfloat16
    norm = CogVideoXLayerNormZero(TEMB, DIM, True, 1e-5, bias=True).to(dev, bf).eval()
    with torch.no_grad():
        norm.norm.weight.normal_(1.0, 0.2)
        norm.norm.bias.normal_(0.0, 0.2)
    sv, st = (37, 3) if smoke else (S_VIDEO, S_TEXT)
    hs = torch.randn(B, sv, DIM, device=dev, dtype=bf)
    enc = torch.randn(B, st, DIM, device=dev, dtype=bf)
    temb = torch.randn(B, TEMB, device=dev, dtype=bf)
    h_ff = torch.randn(B * (sv + st), FF, device=dev, dtype=bf) * 2
    x_out = torch.randn(B * (sv + st), DIM, device=dev, dtype=bf)

    def unfused_norm():
        n_hs, n_enc, _, _ = norm(hs, enc, temb)
        return hq.quantize_int8_act(torch.cat([n_enc, n_hs], dim=1).reshape(-1, DIM), HB)[0]

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
    res = {"norm": {}, "gelu": {}, "to_out": {}}
    with torch.no_grad():
        res["norm"]["unfused: diffusers norm+modulate + cat + INT8 quantize"] = _ms(unfused_norm)
        res["norm"]["unfused parts: diffusers norm+modulate + cat"] = _ms(unfused_norm_bf16)
        cat_in = unfused_norm_bf16().reshape(-1, DIM)
        res["norm"]["unfused parts: INT8 quantize alone"] = _ms(lambda: hq.quantize_int8_act(cat_in, HB))
        for name, fn in fused.items():
            res["norm"][f"fused: {name}"] = _ms(fn)
        res["norm_check"] = _code_diff(fused["int8"](), unfused_norm())

        res["gelu"]["unfused: F.gelu(tanh) + INT8 quantize"] = _ms(
            lambda: hq.quantize_int8_act(F.gelu(h_ff, approximate="tanh"), HB))
        res["gelu"]["unfused parts: F.gelu(tanh) alone"] = _ms(lambda: F.gelu(h_ff, approximate="tanh"))
        g = F.gelu(h_ff, approximate="tanh")
        res["gelu"]["unfused parts: INT8 quantize alone"] = _ms(lambda: hq.quantize_int8_act(g, HB))
        res["gelu"]["fused: gelu_int8"] = _ms(lambda: gq.gelu_int8(h_ff, HB))
        res["gelu"]["fused: gelu_int8, fp16 codes (W4A8)"] = _ms(lambda: gq.gelu_int8(h_ff, HB, dense=True))
        res["gelu_check"] = _code_diff(gq.gelu_int8(h_ff, HB), hq.quantize_int8_act(g, HB)[0])

        res["to_out"]["INT8 quantize of [M, 1920] (the most an attention-epilogue fusion saves)"] = _ms(
            lambda: hq.quantize_int8_act(x_out, HB))
        big = torch.empty_like(h_ff)
        copy_ms = _ms(lambda: big.copy_(h_ff))
        res["copy_tbs"] = 2 * h_ff.numel() * 2 / (copy_ms * 1e-3) / 1e12
    n, gl = res["norm"], res["gelu"]
    save_norm = n["unfused: diffusers norm+modulate + cat + INT8 quantize"] - n["fused: int8"]
    save_gelu = gl["unfused: F.gelu(tanh) + INT8 quantize"] - gl["fused: gelu_int8"]
    res["measured_saving_ms_per_block"] = 2 * save_norm + save_gelu
    res["measured_saving_ms_per_step"] = LAYERS * res["measured_saving_ms_per_block"]
    return res


def run_block(dev, smoke: bool = False) -> dict:
    """One CogVideoX-2B block (random weights) under static W8A8 — linears swapped, sixbit's attention
    processor, the fused hook — timed with the producers fused (the hook's forward) and without (the block's
    own forward, what runs when the hook does not apply), same inputs, outputs compared."""
    from diffusers.hooks.hooks import HookRegistry
    from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock

    from sixbit import attention, fused
    from sixbit import formats as spec
    from sixbit.adapters import COGVIDEOX
    from sixbit.linear import ops, swap_linears

    heads, sv, st = (2, 37, 3) if smoke else (DIM // 64, S_VIDEO, S_TEXT)
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
    with torch.no_grad():
        res = {"fused_ms": _ms(lambda: block(*args)), "unfused_ms": _ms(lambda: hook.fn_ref.original_forward(*args))}
        got, ref = block(*args), hook.fn_ref.original_forward(*args)
    res["rel_error"] = [float(spec.relative_error(g, r)) for g, r in zip(got, ref)]
    res["fused_calls"], res["saving_ms_per_step"] = hook.fused, LAYERS * (res["unfused_ms"] - res["fused_ms"])
    return res


def markdown(payload: dict) -> str:
    r, p = payload["results"], payload["predicted"]
    lines = ["# Fused producers (norm/modulate → INT8, GELU → INT8) vs the unfused path — CogVideoX-2B shapes", "",
             f"M = {B} × ({S_VIDEO} + {S_TEXT}) = {B * (S_VIDEO + S_TEXT)} rows, dim {DIM}, FF {FF}, Hadamard "
             f"block {HB}; `do_bench` medians (ms). Device copy in the same run: {r['copy_tbs']:.2f} TB/s.", ""]
    for sec, title, pred in (("norm", "norm + modulate → the qkv / ff-in operand (per call; two per block)", "norm"),
                             ("gelu", "GELU → the ff-out operand (per block)", "gelu")):
        lines += [f"## {title}", "", "| path | ms |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in r[sec].items()]
        lines += [f"| predicted at {HBM_TBS} TB/s: unfused / fused | {p['ms'][pred + '_unfused']:.3f} / "
                  f"{p['ms'][pred + '_fused']:.3f} |", ""]
        chk = r[sec + "_check"]
        lines += [f"Fused vs unfused codes: {chk['frac_differing']:.2e} of codes differ, at most "
                  f"{chk['max_step']:.0f} step; scales within {chk['scale_max_rel']:.1e} relative.", ""]
    lines += ["## to_out's input", "", "| path | ms |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in r["to_out"].items()]
    lines += ["", "## Per 2B step (30 blocks)", "",
              f"- predicted saving: {p['saving_ms_per_block']:.3f} ms per block, **{p['saving_ms_per_step']:.1f} ms** "
              f"per computed step (bytes / {HBM_TBS} TB/s)",
              f"- measured saving: {r['measured_saving_ms_per_block']:.3f} ms per block, "
              f"**{r['measured_saving_ms_per_step']:.1f} ms** per computed step (2 × norm + GELU)", ""]
    blk = payload.get("block")
    if blk:
        lines += ["## One 2B block, static W8A8, end to end", "",
                  f"- block forward with the producers fused: {blk['fused_ms']:.3f} ms, the block's own forward: "
                  f"{blk['unfused_ms']:.3f} ms → **{blk['saving_ms_per_step']:.1f} ms** per computed step (30 blocks)",
                  f"- outputs (video, text stream) relative error fused vs unfused: "
                  f"{blk['rel_error'][0]:.1e}, {blk['rel_error'][1]:.1e}", ""]
    lines += [env_md(payload["env"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fused_quant", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS / "fused_quant_h200"))
    ap.add_argument("--smoke", action="store_true", help="CPU dry run of the script (interpreter, 80 rows)")
    ap.add_argument("--no-block", action="store_true", help="skip the end-to-end 2B block section")
    args = parse(ap, argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first imported
    elif not torch.cuda.is_available():
        print("fused_quant needs a CUDA GPU (or --smoke)", flush=True)
        return 2
    dev = torch.device("cpu" if args.smoke else "cuda")
    out = Path(args.out)
    payload = {"env": environment(dev, args.command), "predicted": predicted_ms(),
               "results": run(dev, smoke=args.smoke)}
    if not args.no_block:
        payload["block"] = run_block(dev, smoke=args.smoke)
    jp, mp = write_results(out.name, payload, markdown(payload), out.parent)
    print(markdown(payload), flush=True)
    print(f"wrote {jp} and {mp}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
