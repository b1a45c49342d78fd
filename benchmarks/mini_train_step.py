"""sixbit-mini training-step benchmark: denoiser + text-encoder steps per second, eager vs ``torch.compile``.

    python -m benchmarks mini_train_step --out benchmarks/results/mini_train_step_h200

Builds the trainer of ``sixbit.mini.train`` (untrained VAE: the step cost does not depend on its weights),
encodes a small latent pool, then for each variant runs ``--warmup`` steps (compilation happens there) and
times ``--steps`` more (wall clock, synchronised), the same code path ``train_dit`` runs in a real run.
Optionally (``--profile``) prints the 25 most expensive CUDA kernels of 5 eager steps.
Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS, env_md, environment, parse, sync, write_results
from sixbit.mini import train as T


def make_trainer(args, variant: str) -> T.Trainer:
    targs = [
        "--out",
        f"/tmp/mini_step_{variant}",
        "--device",
        args.device,
        "--pool",
        str(args.pool),
        "--pool-batch",
        str(min(512, args.pool)),
        "--batch",
        str(args.batch),
        "--object-weight",
        "4",
        "--minutes",
        "600",
        "--export-every",
        "0",
        "--ckpt-every",
        "1e9",
    ]
    if variant != "eager":
        targs += [
            "--compile",
            variant.removeprefix("compile-") if variant.startswith("compile-") else "default",
        ]
    tr = T.Trainer(T.parse_args(targs))
    tr.state.update(phase="pool", scaling_factor=1.0)
    tr.build_pool()
    return tr


def run_variant(args, variant: str) -> dict:
    tr = make_trainer(args, variant)
    dev = tr.dev
    t0 = time.time()
    tr.a.dit_steps = args.warmup
    tr.train_dit()
    sync(dev)
    warm_s = time.time() - t0
    if args.profile and variant == "eager" and dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        tr.a.dit_steps = tr.state["dit_step"] + 5
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            tr.train_dit()
            sync(dev)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
    s0 = tr.state["dit_step"]
    tr.a.dit_steps = s0 + args.steps
    sync(dev)
    t0 = time.time()
    tr.train_dit()
    sync(dev)
    dt = time.time() - t0
    mem = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
    row = {
        "variant": variant,
        "steps": args.steps,
        "seconds": round(dt, 3),
        "steps_per_s": round(args.steps / dt, 3),
        "warmup_steps": args.warmup,
        "warmup_seconds": round(warm_s, 1),
        "last_loss": tr.log["dit"][-1]["loss"] if tr.log["dit"] else None,
        "peak_gib": None if mem is None else round(mem, 2),
    }
    print(row, flush=True)
    del tr
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks mini_train_step", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(RESULTS / "mini_train_step"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--variants", default="eager,compile-default")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--pool", type=int, default=4096)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--profile", action="store_true")
    args = parse(ap, argv)
    rows = []
    for v in args.variants.split(","):
        try:
            rows.append(run_variant(args, v))
        except Exception as e:  # a variant that fails is recorded, not fatal
            rows.append({"variant": v, "error": f"{type(e).__name__}: {e}"[:500]})
            print(rows[-1], flush=True)
    env = environment(args.device, args.command)
    base = next((r for r in rows if r["variant"] == "eager" and "steps_per_s" in r), None)
    lines = [
        "# sixbit-mini training step",
        "",
        f"Batch {args.batch} clips, {args.steps} timed steps after "
        f"{args.warmup} warm-up steps (compilation happens there), object-weighted loss, EMA, AdamW: the "
        "`train_dit` loop of `sixbit.mini.train`.",
        "",
        "| variant | steps/s | x eager | warm-up s | peak GiB |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | failed: {r['error'][:120]} | | | |")
            continue
        x = f"{r['steps_per_s'] / base['steps_per_s']:.2f}" if base else ""
        lines.append(
            f"| {r['variant']} | {r['steps_per_s']:.2f} | {x} | {r['warmup_seconds']} | {r['peak_gib']} |"
        )
    md = "\n".join(lines + ["", "Environment:", "", env_md(env), ""])
    jp, mp = write_results(
        Path(args.out).name, {"env": env, "args": vars(args), "rows": rows}, md, Path(args.out).parent
    )
    print(md)
    print(f"wrote {jp} and {mp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
