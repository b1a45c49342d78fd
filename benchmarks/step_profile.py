"""Where a denoising step's GPU time goes: attention, 16-bit GEMMs, sixbit's kernels, everything else.

Runs the CogVideoX pipeline at real size with random weights (``benchmarks.common.random_cogvideox``, random
prompt embeddings: no text encoder) for a few steps under ``torch.profiler`` and sums CUDA kernel time per
category over the profiled steps (the first steps are skipped: warm-up, and DMPQ's full-precision first step):

* ``attention``: the SDPA kernels (flash / cuDNN / memory-efficient);
* ``cuBLAS GEMM``: 16-bit matmuls (the baseline's linears; sixbit's remaining 16-bit layers);
* ``sixbit GEMM`` / ``sixbit quantize``: the Triton kernels of ``sixbit_kernels/`` (``_gemm*`` / ``_decode_w`` and
  ``_rows``/``_nvfp4``);
* ``other``: norms, modulation, rotary embeddings, activations, copies, residual adds.

No TDC (every block computed), so the table is the cost of one computed block step, per configuration::

    python -m benchmarks step_profile --size 2b --out benchmarks/results/step_profile_h200_2b

``--ops N`` also lists the N PyTorch operators whose own kernels take the most time, with their input shapes and
calls per step — what "other" is made of (``step_profile_h200_2b_s30ops.md``).

DMPQ routes by Γ of the random weights unless ``--schedule`` gives a recorded schedule with routes
(``benchmarks/results/schedule_mini.json``): then the configurations with TDC (``full``, ``full_w8a8``, …)
replay its routes with every block computed (``SkipSchedule.dense``: a skipped cell takes the routes of
the nearest computed step), i.e. the full method's computed step with sixbit-mini's route mix, including
TDC's per-block bookkeeping.

Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.common import LABELS, RESULTS, environment, make_config, num_blocks, parse, random_cogvideox

CATEGORIES = ("attention", "cuBLAS GEMM", "sixbit GEMM", "sixbit quantize", "other")


def category(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "sdpa", "attention", "attn")):
        return "attention"
    if n.startswith(("_gemm", "_decode_w")):
        return "sixbit GEMM"
    if n.startswith(("_rows", "_nvfp4")):
        return "sixbit quantize"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas")):
        return "cuBLAS GEMM"
    return "other"


def profile(pipe, call, steps: int, skip: int, ops: int = 0) -> dict:
    """CUDA time per step by category and the top kernels; ``ops`` > 0 also records the PyTorch operators whose
    own kernels (not sixbit's) take the most time, with their input shapes and calls per step — what "other" is."""
    from torch.profiler import ProfilerActivity, schedule

    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if ops else [])
    prof = torch.profiler.profile(activities=acts, record_shapes=bool(ops),
                                  schedule=schedule(wait=skip - 1, warmup=1, active=steps - skip))

    def cb(p, i, t, kw):
        torch.cuda.synchronize()
        prof.step()
        return {}

    with prof:
        pipe(**call, num_inference_steps=steps, output_type="latent", callback_on_step_end=cb)
    n = steps - skip
    per: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    top: dict[str, float] = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        if not us or e.key.startswith(("ProfilerStep", "cuda", "aten::")):
            continue
        if ops and e.device_type != torch.autograd.DeviceType.CUDA:  # CPU-side operators and annotations
            continue
        per[category(e.key)] += us / 1e3 / n
        top[e.key] = top.get(e.key, 0.0) + us / 1e3 / n
    total = sum(per.values())
    res = {"ms_per_step": per, "total_ms_per_step": total,
           "top_kernels": sorted(((k, v) for k, v in top.items()), key=lambda kv: -kv[1])[:12],
           "profiled_steps": n}
    if ops:
        rows = []
        for e in prof.key_averages(group_by_input_shape=True):
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
            if us and e.key.startswith("aten::"):
                rows.append({"op": e.key, "shapes": str(e.input_shapes)[:160], "calls_per_step": e.count / n,
                             "ms_per_step": us / 1e3 / n})
        res["top_ops"] = sorted(rows, key=lambda r: -r["ms_per_step"])[:ops]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks step_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2b", choices=["2b", "5b"])
    ap.add_argument("--configs", nargs="+", default=["bf16", "dmpq_only", "w8a8"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--skip", type=int, default=2, help="steps before the profiled ones")
    ap.add_argument("--out", default=str(RESULTS / "step_profile_h200_2b"))
    ap.add_argument("--ops", type=int, default=0,
                    help="also list this many PyTorch operators by their own kernels' time (with input shapes)")
    ap.add_argument("--schedule", default=None,
                    help="recorded schedule with routes: replayed, every block computed, by configurations with TDC")
    args = parse(ap, argv)
    cmd = args.command
    if not torch.cuda.is_available():
        sys.exit("the step profile needs a CUDA GPU")
    import sixbit

    dev = torch.device("cuda")
    pipe = random_cogvideox(args.size, dev, text_encoder=False)
    g = torch.Generator("cpu").manual_seed(0)
    pe = torch.randn(1, 226, 4096, generator=g).to(dev, torch.bfloat16)
    call = dict(prompt_embeds=pe, negative_prompt_embeds=torch.zeros_like(pe), height=480, width=720, num_frames=49,
                guidance_scale=6.0, generator=torch.Generator("cpu").manual_seed(0))
    res = {"environment": environment(dev, cmd), "size": args.size, "steps": args.steps, "skip": args.skip,
           "command": cmd, "configs": {}}
    dense = None
    if args.schedule:
        dense = sixbit.SkipSchedule.load(args.schedule).dense()
        dense = dense.resample(num_blocks(pipe.transformer), args.steps)
        res["schedule"] = {"path": args.schedule, "route_fractions": dense.route_fractions}
    for name in args.configs:
        handle = None
        try:
            if name != "bf16":
                cfg = make_config(name)
                handle = sixbit.apply(pipe, cfg, schedule=dense if dense is not None and cfg.tdc else None)
            pipe(**call, num_inference_steps=2, output_type="latent")  # compile / autotune, not profiled
            res["configs"][name] = profile(pipe, call, args.steps, args.skip, args.ops)
            print(name, json.dumps(res["configs"][name]["ms_per_step"]), flush=True)
        except Exception as e:  # recorded, not fatal
            res["configs"][name] = {"error": f"{type(e).__name__}: {e}"}
            print(name, "FAILED", e, flush=True)
        finally:
            if handle is not None:
                handle.remove()
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    env = res["environment"]
    L = [f"# Where a denoising step's GPU time goes — CogVideoX-{args.size.upper()} size, 49×480×720, CFG batched", "",
         f"CUDA kernel time per step (ms) from `torch.profiler`, averaged over {args.steps - args.skip} steps after "
         f"{args.skip}; random weights, every block computed (no TDC). "
         + (f"Configurations with TDC replay the routes of `{args.schedule}` (every block computed; "
            + ", ".join(f"{v:.0%} {k}" for k, v in res["schedule"]["route_fractions"].items()) + "). "
            if dense is not None else "DMPQ routes by Γ of the random weights. ")
         + f"`{res['command']}`", "",
         "| configuration | " + " | ".join(CATEGORIES) + " | total |", "|---" * (len(CATEGORIES) + 2) + "|"]
    for name, r in res["configs"].items():
        if "error" in r:
            L.append(f"| {name} | error: {r['error'][:80]} |" + " |" * len(CATEGORIES))
            continue
        L.append(f"| {LABELS.get(name, name)} | " + " | ".join(f"{r['ms_per_step'][c]:.1f}" for c in CATEGORIES)
                 + f" | {r['total_ms_per_step']:.1f} |")
    L += ["", "- " + ", ".join(f"{k}: `{env[k]}`" for k in ("gpu", "torch", "triton", "diffusers", "date") if k in env), ""]
    for name, r in res["configs"].items():
        if "top_kernels" in r:
            L += [f"Top kernels, {name}: " + "; ".join(f"`{k[:60]}` {v:.1f}" for k, v in r["top_kernels"][:6]), ""]
        if r.get("top_ops"):
            L += [f"PyTorch operators by their own kernels' time, {name}:", "",
                  "| operator | input shapes | calls / step | ms / step |", "|---|---|---|---|"]
            L += [f"| `{o['op']}` | `{o['shapes']}` | {o['calls_per_step']:g} | {o['ms_per_step']:.2f} |"
                  for o in r["top_ops"]] + [""]
    out.with_suffix(".md").write_text("\n".join(L))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
