"""sixbit under diffusers' own context parallelism: 2 CPU processes (gloo, loopback), tiny Wan pipeline.

Each rank runs the same pipeline with ``transformer.enable_parallelism(ContextParallelConfig(
ulysses_degree=2))`` (diffusers' shipped Wan plan: ``blocks.0`` splits the video tokens, ``proj_out``
gathers them), so every block hook sees half of the tokens. The test fails if any decision (skip/compute,
mode, PDR, every route) differs between the ranks or from the 1-process run on the whole sequence, if the
reduced statistics are not bit-identical across ranks, or if the ranks did not in fact see half the
tokens. Without ``sixbit.parallel.enable`` the local statistics differ between the ranks (what the
reduction is for). Ulysses, not ring: ring attention needs the attention's log-sum-exp, which diffusers'
``native`` backend (the one that runs on the CPU) does not return.

Run as a script, this file is one rank: ``python tests/test_parallel.py RANK PORT OUT.json``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sixbit
from sixbit import SixBitConfig, hooks, parallel
from sixbit.testing import generate, tiny_wan_pipeline

CALL = dict(height=64, width=64, num_inference_steps=6)  # 2 latent frames × 4 × 4 patches = 32 tokens
TOKENS = 32


def _config(name: str) -> SixBitConfig:
    # finite budget and ρ, τ inside Γ's range: skips, refreshes, routes and PDR all depend on the sums
    # (the per-block rule: its thresholds and budget; "tdc_step" is the default step mode, probe block 0)
    tdc = dict(tdc_mode="block", tdc_first=1, tdc_threshold=math.inf, tdc_budget=0.3)
    if name == "tdc_only":
        return SixBitConfig.preset("tdc_only", **tdc)
    if name == "tdc_step":
        return SixBitConfig.preset("tdc_only", tdc_first=1, tdc_probe_threshold=math.inf)
    return SixBitConfig.preset("balanced", policy=None, tau=0.225, pdr_k_sigma=2.5, pdr_rho=0.0063, **tdc)


def _decisions(trace: dict) -> list:
    out = []
    for s in trace["steps"]:
        branches = {s["branch"]: s, **s.get("other_branches", {})}
        for name in sorted(branches):
            b = branches[name]
            out.append([s["step"], name, [[x["computed"], x["skipped"], x["pdr"], x["mode"]] for x in b["blocks"]],
                        b["routes"]])
    return out


def _values(trace: dict) -> list:
    return [[x["gamma"], x["delta_sim"], x["outlier_ratio"]] for s in trace["steps"]
            for b in [s, *s.get("other_branches", {}).values()] for x in b["blocks"]]


def _rank(rank: int, port: int, out: str, config: str) -> None:
    import torch.distributed as dist
    from diffusers import ContextParallelConfig


    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    # diffusers' enable_parallelism picks device index rank % torch.accelerator.device_count(), 0 on a CPU build
    torch.accelerator.device_count = lambda: 1
    seen: list[int] = []
    real = hooks.block_stats
    hooks.block_stats = lambda outs, streams, *a: (seen.append(streams[0].shape[1]), real(outs, streams, *a))[1]

    pipe = tiny_wan_pipeline()
    handle = sixbit.apply(pipe, _config(config))  # before enable_parallelism: sixbit's block hook inside CP's split
    pipe.transformer.set_attention_backend("native")
    pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
    generate(pipe, **CALL)
    local = handle.trace.to_dict()
    parallel.enable(handle, check=True)
    latents = generate(pipe, **CALL)
    reduced = handle.trace.to_dict()
    wrong = tiny_wan_pipeline()  # CP's split hook inside sixbit's: refused
    wrong.transformer.set_attention_backend("native")
    wrong.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))
    with pytest.raises(ValueError, match="enable_parallelism"):
        parallel.enable(sixbit.apply(wrong, _config(config)))
    Path(out).write_text(json.dumps({"local": _values(local), "decisions": _decisions(reduced),
                                     "values": _values(reduced), "tokens": sorted(set(seen)),
                                     "latents": latents.flatten().tolist()}))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("config", ["full", "tdc_only", "tdc_step"])
def test_decisions_identical_across_ranks_and_to_one_process(tmp_path, config):
    port = _free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(port), str(outs[r]), config], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        logs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    r0, r1 = (json.loads(o.read_text()) for o in outs)

    pipe = tiny_wan_pipeline()
    handle = sixbit.apply(pipe, _config(config))
    latents = generate(pipe, **CALL)
    single = handle.trace.to_dict()

    assert r0["tokens"] == r1["tokens"] == [TOKENS // 2]  # each rank's blocks saw half of the sequence
    assert r0["local"] != r1["local"]  # unreduced, the ranks' statistics differ
    assert r0["values"] == r1["values"]  # reduced: the same bits on both ranks
    assert r0["decisions"] == r1["decisions"] == _decisions(single)
    modes = {b[3] for d in _decisions(single) for b in d[2]}
    routes = {r for d in _decisions(single) for r in d[3]}
    if config == "full":  # the configuration exercises every rule
        assert {"skip", "dmpq", "pdr", "after_skip"} <= modes and {"int8", "nvfp4", "skipped"} <= routes, modes
        # NVFP4's per-tensor activation scale comes from each rank's own amax (docs/PARALLEL.md), so the
        # statistics after the first NVFP4 route differ from the 1-process run by more than float noise
        return
    assert "skip" in modes and "fp" in modes, modes
    flat = [[v for row in vals for v in row] for vals in (r0["values"], _values(single))]
    assert [v is None for v in flat[0]] == [v is None for v in flat[1]]
    assert [v for v in flat[0] if v is not None] == pytest.approx([v for v in flat[1] if v is not None], rel=1e-5)
    assert torch.allclose(torch.tensor(r0["latents"]), latents.flatten(), rtol=1e-4, atol=1e-5)


def test_enable_needs_torch_distributed():
    handle = sixbit.apply(tiny_wan_pipeline(), _config("tdc_only"))
    with pytest.raises(RuntimeError, match="not initialized"):
        parallel.enable(handle)


if __name__ == "__main__":
    _rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
