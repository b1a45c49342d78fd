"""1 GPU vs N GPUs in the same ``torchrun`` job, with sixbit's decisions reduced across the ranks.

``torchrun --standalone --nproc-per-node 2 -m benchmarks.parallel --model cogvideox-5b --configs bf16 tdc_only full``
(or ``python -m benchmarks speed --sizes 5b --nproc-per-node 2 ...``, which launches exactly that).

Two engines, both diffusers' own parallel machinery (``docs/PARALLEL.md`` says why):

* ``cogvideox-2b`` / ``cogvideox-5b`` / ``cogvideox-tiny``: CFG parallel — the batched ``[uncond; cond]``
  call split over the ranks (``sixbit.parallel.enable_cogvideox_cfg_parallel``; N = 2 = the CFG batch).
  The whole pipeline at real size with random weights (``benchmarks.common.random_cogvideox``, the speed
  benchmark's model and call: 49×480×720, guidance 6), timed over the denoising loop (latent output). As
  in ``benchmarks.speed``, configurations with TDC replay the schedule recorded on sixbit-mini
  (``--schedule``), resampled to the model's depth and ``--steps``: random weights make TDC's own
  decisions meaningless.
* ``wan-1.3b`` / ``wan-14b`` / ``tiny``: context parallelism (Ulysses, diffusers' shipped Wan plan) on
  the transformer alone, one call per step (no CFG), random latents and text states.

Per configuration: a fresh model (the same seed on every rank), ``sixbit.apply``; rank 0 alone runs a
warm-up loop and the timed loop (the 1-GPU row) while the others wait; then the parallel split and
``sixbit.parallel.enable`` on every rank, and all ranks run the same loops (the N-GPU row; its time is
the slowest rank's). The row records whether the trace's decisions are identical on every rank and equal
to the 1-GPU run's, and the PSNR of the N-GPU output (latents) against the 1-GPU output (peak: the 1-GPU
output's max |x|). ``--device cpu`` runs on CPU processes with gloo (a smoke test of the script: the
``tiny`` / ``cogvideox-tiny`` models; its times are meaningless).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.common import RESULTS, env_md, environment, make_config, parse, write_results

#: WanTransformer3DModel configurations (Wan 2.1 T2V 1.3B / 14B) and a tiny one for the CPU smoke run;
#: latent shape (frames, height, width) of 81×480×832
WAN = {
    "wan-1.3b": (dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30), (21, 60, 104)),
    "wan-14b": (dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=40), (21, 60, 104)),
    "tiny": (dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2, text_dim=32,
                  freq_dim=32, rope_max_seq_len=32), (2, 8, 8)),
}
COGVIDEOX = ("cogvideox-2b", "cogvideox-5b", "cogvideox-tiny")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _wan(args, name: str, device, dtype, world: int):
    """(handle, run(steps) -> (seconds, output), split()) for Wan's transformer under Ulysses."""
    from diffusers import ContextParallelConfig, WanTransformer3DModel

    import sixbit

    kw, (f, h, w) = WAN[args.model]
    torch.manual_seed(0)
    with torch.device(device):
        tr = WanTransformer3DModel(**{"in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
                                      "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", **kw})
    tr = tr.to(dtype).eval()
    handle = None if name == "bf16" else sixbit.apply(tr, make_config(name, policy=None))
    g = torch.Generator(device).manual_seed(1)
    lat = torch.randn(1, tr.config.in_channels, f, h, w, generator=g, device=device, dtype=dtype)
    txt = torch.randn(1, args.text_len, tr.config.text_dim, generator=g, device=device, dtype=dtype)

    def run(steps: int):
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for t in torch.linspace(999, 1, steps):
                out = tr(lat, timestep=t.reshape(1).to(device), encoder_hidden_states=txt, return_dict=False)[0]
        _sync(device)
        return time.perf_counter() - t0, out

    def split():
        tr.set_attention_backend(args.attention)
        tr.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))

    return handle, run, split


def _cogvideox(args, name: str, device, dtype, world: int):
    """(handle, run(steps) -> (seconds, latents), split()) for the CogVideoX pipeline under CFG parallel."""
    import sixbit
    from benchmarks.common import num_blocks, random_cogvideox, speed_call
    from sixbit import parallel
    from sixbit.tdc import SkipSchedule

    size = args.model.split("-")[1]
    pipe = random_cogvideox(size, device, dtype, text_encoder=True)
    handle = None
    if name != "bf16":
        cfg = make_config(name)
        sched = SkipSchedule.load(args.schedule) if args.schedule and cfg.tdc else None
        handle = sixbit.apply(pipe, cfg, schedule=sched.resample(num_blocks(pipe.transformer), args.steps)
                              if sched else None)
    call = speed_call(size, args.height, args.width, args.frames)

    def run(steps: int):
        call["generator"] = torch.Generator("cpu").manual_seed(0)
        _sync(device)
        t0 = time.perf_counter()
        out = pipe(**call, num_inference_steps=steps, output_type="latent").frames
        _sync(device)
        return time.perf_counter() - t0, out

    return handle, run, lambda: parallel.enable_cogvideox_cfg_parallel(pipe.transformer, world)


def _decisions(handle) -> list | None:
    if handle is None:
        return None
    return [[[b["computed"], b["mode"]] for b in s["blocks"]] + [s["routes"]] for s in handle.trace.to_dict()["steps"]]


def _psnr(out: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR (dB) of ``out`` against ``ref``, peak = max |ref| (inf when equal)."""
    mse = (out.float() - ref.float()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(ref.float().abs().max().item() ** 2 / mse)


def _row(args, name: str, device, rank: int, world: int) -> dict:
    import sixbit.parallel

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    build = _cogvideox if args.model in COGVIDEOX else _wan
    handle, run, split = build(args, name, device, dtype, world)
    warm = args.steps if args.warmup_steps is None else args.warmup_steps
    one = single = ref = None
    if rank == 0:
        run(warm)  # Triton compilation, the kernels' self-check, cuDNN plans
        one, ref = run(args.steps)
        single = _decisions(handle)
    dist.barrier()
    split()
    if handle is not None:
        sixbit.parallel.enable(handle, check=args.check)
    run(warm)
    many, out = run(args.steps)
    decisions, times = [None] * world, [None] * world
    dist.all_gather_object(decisions, _decisions(handle))
    dist.all_gather_object(times, many)
    slowest = max(times)
    return {"config": name, "one_gpu_s": one, "n_gpu_s": slowest, "speedup": one / slowest if one else None,
            "psnr_db": _psnr(out, ref) if rank == 0 else None,
            "ranks_agree": all(d == decisions[0] for d in decisions), "equal_to_one_gpu": decisions[0] == single,
            "decisions_one_gpu": single, "decisions_n_gpu": decisions[0]}


def _markdown(args, env: dict, rows: list[dict], world: int) -> str:
    engine = "CFG parallel" if args.model in COGVIDEOX else "context parallel, Ulysses"
    lines = [f"# {args.model}: 1 vs {world} ranks ({engine}, diffusers' plan machinery), {args.steps} steps", "",
             env_md(env), "", "| config | 1 rank s | N ranks s | speed-up | PSNR dB (N vs 1) | ranks agree | = 1 rank |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['config']} | {r['one_gpu_s']:.3f} | {r['n_gpu_s']:.3f} | {r['speedup']:.2f}× | "
              f"{r['psnr_db']:.1f} | {r['ranks_agree']} | {r['equal_to_one_gpu']} |" for r in rows]
    return "\n".join(lines) + "\n"


def launch(nproc: int, argv: list[str]) -> int:
    """Run this benchmark under ``torchrun --standalone --nproc-per-node nproc`` (``benchmarks.speed``'s
    ``--nproc-per-node``); returns torchrun's exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "benchmarks.parallel", *argv]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def from_speed(args) -> int:
    """``python -m benchmarks speed --nproc-per-node N``: one :func:`launch` per ``--sizes`` entry with the
    speed benchmark's call, steps, configurations, schedule and output folder."""
    rc = 0
    for size in args.sizes:
        argv = ["--model", f"cogvideox-{size}", "--steps", str(args.steps), "--frames", str(args.frames),
                "--height", str(args.height), "--width", str(args.width), "--schedule", args.schedule or "",
                "--out", args.out, "--device", "cuda" if (args.device or "cuda").startswith("cuda") else "cpu"]
        argv += ["--warmup-steps", str(args.warmup_steps)] if args.warmup_steps is not None else []
        argv += ["--configs", *args.configs] if args.configs else []
        rc = rc or launch(args.nproc_per_node, argv)
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m benchmarks.parallel", description=__doc__)
    p.add_argument("--model", choices=[*COGVIDEOX, *sorted(WAN)], default="cogvideox-5b")
    p.add_argument("--configs", nargs="+", default=["bf16", "tdc_only", "full"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup-steps", type=int, default=None, help="steps of each warm-up loop (default: --steps)")
    p.add_argument("--frames", type=int, default=49, help="CogVideoX")
    p.add_argument("--height", type=int, default=480, help="CogVideoX")
    p.add_argument("--width", type=int, default=720, help="CogVideoX")
    p.add_argument("--schedule", default=str(RESULTS / "schedule_mini.json"),
                   help="CogVideoX: the skip schedule TDC configurations replay ('' : decide on their own)")
    p.add_argument("--text-len", type=int, default=512, help="Wan")
    p.add_argument("--attention", default="_native_cudnn", help="Wan: a diffusers attention backend that supports CP")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--check", action="store_true", help="bit-check the reduced statistics on every read")
    p.add_argument("--out", default=str(RESULTS))
    args = parse(p, argv)
    if args.schedule and not Path(args.schedule).exists():
        print(f"note: no schedule at {args.schedule}; TDC configurations decide on their own", flush=True)
        args.schedule = None
    # rank 0 runs the 1-GPU rows alone while the others wait in a barrier: allow a long wait
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", timeout=timedelta(hours=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.accelerator.device_count = lambda: 1  # diffusers picks device index rank % device_count (0 on CPU)
    rows = [_row(args, name, device, rank, world) for name in args.configs]
    if rank == 0:
        env = {**environment(device, args.command), "world_size": world, "model": args.model, "steps": args.steps,
               "schedule": args.schedule if args.model in COGVIDEOX else None}
        md = _markdown(args, env, rows, world)
        write_results(f"parallel_{args.model}_x{world}", {"environment": env, "rows": rows}, md, Path(args.out))
        print(md)
    dist.barrier()  # no collective in flight when the group goes
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: in one fresh-clone CI run (session 15) rank 1 aborted after rank 0
    # had written and printed the results ("terminate called without an active exception", SIGABRT: a C++ thread
    # of the collectives outliving Python's finalization), and the job failed for nothing it measured. The barrier
    # above means no collective is pending here; an exception in main() still exits non-zero before this line.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
