"""Which attention heads of a real model ``residual_ratio`` would pick: ``python -m benchmarks attention_heads``.

The 8-bit attention's accuracy option ``residual_ratio`` (docs/ATTENTION.md "Session 40") gives second e4m3 terms
only to the heads whose K has outlier channels — a head's largest smoothed-K channel amax at least ``ratio`` × its
median one (``formats.attention_residual_heads``). What that costs on a model is the share of heads it picks. This
runs a CogVideoX pipeline unchanged (default: the committed sixbit-mini, CPU, offline), takes K as every attention
call sees it (after the q/k norm and the rotary: the SDPA's own input), and reports per denoising step and block the
heads' ratio and the share picked at ``formats.RESIDUAL_RATIO``, and per head the spec's relative L2 (one term; 16 K
channels + V residual) against fp32 on the same q/k/v — whether the rule picks the heads that need the terms. sixbit-mini is small and trained on synthetic
videos: its statistic says how the rule behaves on a trained CogVideoX, not what CogVideoX-2B/5B would give.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from benchmarks.common import RESULTS, env_md, environment, parse, write_results


def head_ratios(k: torch.Tensor) -> torch.Tensor:
    """``[B, H]``: each head's largest smoothed-K channel amax over its median one, for K ``[B, H, S, D]``."""
    kf = k.float()
    amax = (kf - kf.mean(2, keepdim=True)).abs().amax(2)
    return amax.amax(-1) / amax.median(-1).values


#: the residual-terms form the errors are taken for (the cheapest under 2 % with K outliers, docs/ATTENTION.md)
TERMS = {"residual_channels": 16, "v_residual": True}


def head_errors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> torch.Tensor:
    """``[B, H]``: the relative L2 of the 8-bit attention's spec (``formats.attention_fp8_reference`` at the kernel's
    256-key blocks, options ``kw``) against fp32 attention, per head."""
    from sixbit import formats as spec

    exact = torch.softmax(q.float() @ k.float().transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v.float()
    out = spec.attention_fp8_reference(q, k, v, block_n=256, **kw)
    return (out - exact).flatten(2).norm(dim=-1) / exact.flatten(2).norm(dim=-1)


def collect(pipe, prompt: str, seed: int, **generation) -> list[list[torch.Tensor]]:
    """Run ``pipe`` once; per denoising step, per attention call (block order) ``[3, B, H]``: the heads' ratios, the
    one-term spec's relative L2 and the :data:`TERMS` spec's."""
    F = torch.nn.functional
    sdpa, calls, inside = F.scaled_dot_product_attention, [], []

    def probe(q, k, v, *args, **kwargs):
        if inside:  # the transformer's attention, not the text encoder's
            calls.append(torch.stack([head_ratios(k), head_errors(q, k, v), head_errors(q, k, v, **TERMS)]))
        return sdpa(q, k, v, *args, **kwargs)

    steps = []

    def on_step(p, i, t, kw):  # the step's calls, then a fresh list
        steps.append(list(calls))
        calls.clear()
        return kw

    hooks = [pipe.transformer.register_forward_pre_hook(lambda m, a: inside.append(1)),
             pipe.transformer.register_forward_hook(lambda m, a, o: inside.clear())]
    F.scaled_dot_product_attention = probe
    try:
        pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="latent",
             callback_on_step_end=on_step, **generation)
    finally:
        F.scaled_dot_product_attention = sdpa
        for h in hooks:
            h.remove()
    return steps


def main(argv: list[str] | None = None) -> int:
    from sixbit import formats as spec
    from sixbit.mini import DEFAULT_GENERATION, EXAMPLE_PROMPTS, load_pipeline

    p = argparse.ArgumentParser(prog="python -m benchmarks attention_heads", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a CogVideoX pipeline folder (default: the committed sixbit-mini)")
    p.add_argument("--prompts", type=int, default=8, help="how many of sixbit.mini.EXAMPLE_PROMPTS (default all 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=DEFAULT_GENERATION["num_inference_steps"])
    p.add_argument("--frames", type=int, default=DEFAULT_GENERATION["num_frames"])
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="attention_heads_mini_cpu")
    args = parse(p, argv)
    pipe = load_pipeline(args.model)
    generation = {**DEFAULT_GENERATION, "num_inference_steps": args.steps, "num_frames": args.frames}
    ratio = spec.RESIDUAL_RATIO
    found = None  # [3, steps, blocks, B·prompts, H]: ratios, one-term and residual-terms errors
    for prompt in EXAMPLE_PROMPTS[:args.prompts]:
        steps = collect(pipe, prompt, args.seed, **generation)
        r = torch.stack([torch.stack(calls, 1) for calls in steps], 1)  # [3, steps, blocks, B, H]
        found = r if found is None else torch.cat([found, r], 3)
        print(f"[attention_heads] {prompt!r}: {r.shape[1]} steps × {r.shape[2]} attention calls, "
              f"{(r[0] >= ratio).float().mean():.1%} of heads ≥ {ratio:g}", flush=True)
    per_step, one, terms = found
    picked = per_step >= ratio

    def rms(e, where):  # the error's root mean square over the (step, block, head)s selected
        return float(e[where].square().mean().sqrt()) if where.any() else None

    errors = {kind: {"one_term": rms(one, sel), "terms": rms(terms, sel), "count": int(sel.sum())}
              for kind, sel in (("picked", picked), ("not picked", ~picked), ("all", torch.ones_like(picked)))}
    q = torch.tensor([0.5, 0.9, 0.99])
    flat = per_step.flatten()
    rows = [{"step": s, "picked": float(picked[s].float().mean()), "ratio_median": float(per_step[s].median()),
             "ratio_max": float(per_step[s].max())} for s in range(per_step.shape[0])]
    blocks = [{"block": b, "picked": float(picked[:, b].float().mean()), "ratio_median": float(per_step[:, b].median()),
               "ratio_max": float(per_step[:, b].max())} for b in range(per_step.shape[1])]
    env = environment("cpu", args.command)
    payload = {"benchmark": "attention_heads", "model": args.model or "sixbit-mini (committed)",
               "prompts": EXAMPLE_PROMPTS[:args.prompts], "seed": args.seed, "generation": generation,
               "residual_ratio": ratio, "picked": float(picked.float().mean()),
               "ratio_quantiles": dict(zip(("p50", "p90", "p99"), map(float, torch.quantile(flat, q)))),
               "ratio_max": float(flat.max()), "terms": TERMS, "relative_l2_rms": errors, "steps": rows,
               "blocks": blocks, "environment": env}
    qs = payload["ratio_quantiles"]
    md = [f"# Heads `residual_ratio={ratio:g}` picks on {payload['model']}", "",
          f"K as each attention call sees it (after the q/k norm and rotary), {args.prompts} prompt(s) × CFG batch, "
          f"{per_step.shape[0]} steps, {per_step.shape[1]} attention calls per step, {per_step.shape[-1]} heads. "
          "Ratio: a head's largest smoothed-K channel amax over its median one (`formats.attention_residual_heads`).",
          "", f"**{payload['picked']:.1%}** of (step, block, head) picked; ratio median {qs['p50']:.2f}, p90 "
          f"{qs['p90']:.2f}, p99 {qs['p99']:.2f}, max {payload['ratio_max']:.2f}.", "",
          "Relative L2 vs fp32 attention per head (the spec at 256-key blocks; root mean square over the (step, "
          f"block, head)s): today's one-term kernel and the residual terms ({TERMS['residual_channels']} K channels "
          "+ V residual).", "", "| heads | count | one term | residual terms |", "|---|---|---|---|"]
    md += [f"| {kind} | {e['count']} | " + " | ".join("—" if e[x] is None else f"{e[x]:.2%}" for x in ("one_term", "terms"))
           + " |" for kind, e in errors.items()]
    md += ["", "| block | picked | ratio median | ratio max |", "|---|---|---|---|"]
    md += [f"| {r['block']} | {r['picked']:.1%} | {r['ratio_median']:.2f} | {r['ratio_max']:.2f} |" for r in blocks]
    md += ["", "| step | picked | ratio median | ratio max |", "|---|---|---|---|"]
    md += [f"| {r['step']} | {r['picked']:.1%} | {r['ratio_median']:.2f} | {r['ratio_max']:.2f} |" for r in rows]
    md += ["", env_md(env), ""]
    write_results(args.name, payload, "\n".join(md), Path(args.out))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
