"""1 GPU vs N GPUs in the same ``torchrun`` job: Wan's transformer under diffusers' context parallelism.

``torchrun --standalone --nproc-per-node N -m benchmarks.parallel --model wan-1.3b --configs bf16 full``

Per configuration: a fresh random-weight transformer (the same seed on every rank, initialised on the
device), ``sixbit.apply``, then rank 0 alone times ``--steps`` denoising calls (the 1-GPU row) while the
others wait; then ``enable_parallelism(ContextParallelConfig(ulysses_degree=N))`` and
``sixbit.parallel.enable`` on every rank, and all ranks time the same calls (the N-GPU row). The trace's
decisions must be identical on every rank and equal to the 1-GPU run's; the script reports where they
are not. One transformer call per step (no CFG), random latents and text states; random weights make
sixbit's decisions meaningless for quality, so this measures speed and consistency only.

Not run on GPUs yet (no multi-GPU machine was lent when it was written): see docs/PARALLEL.md.
``--device cpu`` runs it on CPU processes with gloo (a smoke test of the script: ``--model tiny``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.common import RESULTS, env_md, environment, make_config, parse, write_results

#: WanTransformer3DModel configurations (Wan 2.1 T2V 1.3B / 14B) and a tiny one for the CPU smoke run;
#: latent shape (frames, height, width) of 81×480×832
MODELS = {
    "wan-1.3b": (dict(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, num_layers=30), (21, 60, 104)),
    "wan-14b": (dict(num_attention_heads=40, attention_head_dim=128, ffn_dim=13824, num_layers=40), (21, 60, 104)),
    "tiny": (dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2, text_dim=32,
                  freq_dim=32, rope_max_seq_len=32), (2, 8, 8)),
}


def _transformer(model: str, device, dtype):
    from diffusers import WanTransformer3DModel

    kw, _ = MODELS[model]
    torch.manual_seed(0)
    with torch.device(device):
        t = WanTransformer3DModel(**{"in_channels": 16, "out_channels": 16, "text_dim": 4096, "freq_dim": 256,
                                     "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", **kw})
    return t.to(dtype).eval()


def _inputs(model: str, transformer, device, dtype, text_len: int):
    f, h, w = MODELS[model][1]
    g = torch.Generator(device).manual_seed(1)
    lat = torch.randn(1, transformer.config.in_channels, f, h, w, generator=g, device=device, dtype=dtype)
    txt = torch.randn(1, text_len, transformer.config.text_dim, generator=g, device=device, dtype=dtype)
    return lat, txt


def _time(transformer, lat, txt, steps: int, device) -> float:
    """Seconds for ``steps`` calls at decreasing timesteps (one sixbit run)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for t in torch.linspace(999, 1, steps):
            transformer(lat, timestep=t.reshape(1).to(device), encoder_hidden_states=txt, return_dict=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _decisions(handle) -> list | None:
    if handle is None:
        return None
    return [[[b["computed"], b["mode"]] for b in s["blocks"]] + [s["routes"]] for s in handle.trace.to_dict()["steps"]]


def _row(args, name: str, device, rank: int, world: int) -> dict:
    from diffusers import ContextParallelConfig

    import sixbit
    import sixbit.parallel

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    transformer = _transformer(args.model, device, dtype)
    handle = None if name == "bf16" else sixbit.apply(transformer, make_config(name, policy=None))
    lat, txt = _inputs(args.model, transformer, device, dtype, args.text_len)
    one = single = None
    if rank == 0:
        _time(transformer, lat, txt, args.steps, device)  # warm-up run
        one = _time(transformer, lat, txt, args.steps, device)
        single = _decisions(handle)
    dist.barrier()
    transformer.set_attention_backend(args.attention)
    transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    if handle is not None:
        sixbit.parallel.enable(handle, check=args.check)
    _time(transformer, lat, txt, args.steps, device)
    many = _time(transformer, lat, txt, args.steps, device)
    decisions = [None] * world
    dist.all_gather_object(decisions, _decisions(handle))
    times = [None] * world
    dist.all_gather_object(times, many)
    return {"config": name, "one_gpu_s": one, "n_gpu_s": max(times), "speedup": one / max(times) if one else None,
            "ranks_agree": all(d == decisions[0] for d in decisions), "equal_to_one_gpu": decisions[0] == single,
            "decisions_one_gpu": single, "decisions_n_gpu": decisions[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m benchmarks.parallel", description=__doc__)
    p.add_argument("--model", choices=sorted(MODELS), default="wan-1.3b")
    p.add_argument("--configs", nargs="+", default=["bf16", "tdc_only", "full"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--text-len", type=int, default=512)
    p.add_argument("--attention", default="_native_cudnn", help="a diffusers attention backend that supports CP")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--check", action="store_true", help="bit-check the reduced statistics on every read")
    p.add_argument("--out", default=str(RESULTS))
    args = parse(p, argv)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.accelerator.device_count = lambda: 1  # diffusers picks device index rank % device_count (0 on CPU)
    rows = [_row(args, name, device, rank, world) for name in args.configs]
    if rank == 0:
        env = {**environment(device, args.command), "world_size": world, "model": args.model, "steps": args.steps}
        lines = [f"# {args.model}: 1 vs {world} ranks (diffusers CP, Ulysses)", "", env_md(env), "",
                 "| config | 1 rank s | N ranks s | speed-up | ranks agree | = 1 rank |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['config']} | {r['one_gpu_s']:.3f} | {r['n_gpu_s']:.3f} | {r['speedup']:.2f}× | "
                  f"{r['ranks_agree']} | {r['equal_to_one_gpu']} |" for r in rows]
        write_results(f"parallel_{args.model}_x{world}", {"environment": env, "rows": rows}, "\n".join(lines) + "\n",
                      Path(args.out))
        print("\n".join(lines))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
