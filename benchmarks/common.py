"""What every benchmark shares: the environment record, result files, statistics, the configuration rows,
and the real-size CogVideoX pipeline with random weights.

Every result file carries :func:`environment` (device, versions, the exact command) and is written by
:func:`write_results` as ``<out>/<name>.json`` + ``<out>/<name>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["RESULTS", "LABELS", "EXTRA_CONFIGS", "SIZES", "parse", "environment", "env_md", "write_results",
           "stats", "fmt_stats", "sync", "make_config", "tdc_overrides", "random_cogvideox", "speed_call",
           "module_bytes", "resident_weight_bytes", "num_blocks"]

#: committed results live here (the default ``--out`` of every benchmark)
RESULTS = Path(__file__).resolve().parent / "results"

#: rows that are not a preset: (preset, overrides). W8A8+TDC is the fastest pairing on Hopper, which has
#: int8 tensor cores but no FP4 units. The *_stream rows run warm-up and PDR steps with the original 16-bit
#: weights, copied from host memory (fp_weights="stream"), instead of 4-bit weights × 16-bit activations.
#: full_w8a8 runs DMPQ's INT8 decisions as W8A8 (int8_route="w8a8": an INT8 copy of every weight is kept,
#: 12.5 bits/weight in all) — the Hopper speed pairing of the full method; NVFP4 decisions stay W4A4.
EXTRA_CONFIGS = {"w8a8_tdc": ("w8a8", dict(tdc=True)),
                 "dmpq_tdc_stream": ("dmpq_tdc", dict(fp_weights="stream")),
                 "full_stream": ("full", dict(fp_weights="stream")),
                 "full_w8a8": ("full", dict(int8_route="w8a8")),
                 # INT8 decisions on the int8 tensor cores from the resident NVFP4 weight, re-quantized per call
                 "full_requant": ("full", dict(int8_route="w4a8_requant")),
                 # ... and its NVFP4 decisions on the same route where there are no FP4 tensor cores: every
                 # quantized GEMM on the int8 tensor cores, 4-bit weights only
                 "full_requant_auto": ("full", dict(int8_route="w4a8_requant", nvfp4_route="auto")),
                 # the fast preset on those routes: its INT8 (and, by its nvfp4_route="auto", NVFP4) decisions on the
                 # int8 tensor cores from the resident NVFP4 weights — no INT8 copies (session 36)
                 "fast_requant": ("fast", dict(int8_route="w4a8_requant")),
                 # the paper's routes on every device: W4A4 / W4A8 (at 16-bit rate on Hopper) — the default routes
                 # until session 34 (since then "auto": the two rows above on a GPU, this one on the CPU)
                 "full_w4a8": ("full", dict(int8_route="int8", nvfp4_route="nvfp4")),
                 # the method presets route attention by the policy (8-bit where predicted error ≤ τ_attn);
                 # these rows are the same configurations with bf16 attention, for the comparison
                 "full_bf16attn": ("full", dict(attention="bf16")),
                 "full_w8a8_bf16attn": ("full", dict(int8_route="w8a8", attention="bf16")),
                 "full_same_skips": ("full", {}),
                 # the attention of the first computed step after a skip (no fresh Γ): the policy on the stale
                 # Γ, or 8-bit (the presets: bf16); _tNN: τ_attn at attention_target NN %; attn_fp8: every block
                 "full_attn_as_policy": ("full", dict(attention_after_skip="policy")),
                 "full_attn_as_policy_t50": ("full", dict(attention_after_skip="policy", attention_target=0.5)),
                 "full_attn_as_policy_t90": ("full", dict(attention_after_skip="policy", attention_target=0.9)),
                 "full_attn_as_fp8": ("full", dict(attention_after_skip="fp8")),
                 "full_attn_fp8": ("full", dict(attention="fp8")),
                 # TDC's attention scope with W8A8 (the speed pairing on Hopper)
                 "w8a8_tdc_attn": ("w8a8", dict(tdc=True, tdc_scope="attention")),
                 "full_w8a8_attn": ("full_attn", dict(int8_route="w8a8")),
                 # a delta per block instead of the span's combined residual (tdc_store, docs/TDC.md §17)
                 "full_blocks": ("full", dict(tdc_store="blocks", tdc_regate="off")),
                 "fast_blocks": ("fast", dict(tdc_store="blocks", tdc_regate="off")),
                 "tdc_only_blocks": ("tdc_only", dict(tdc_store="blocks", tdc_regate="off")),
                 # the block's delta instead of its gated pieces where the defaults regate (below 40 steps:
                 # tdc_regate, docs/TDC.md §18): the defaults of sessions 16-23 there
                 "tdc_only_noregate": ("tdc_only", dict(tdc_regate="off")),
                 "full_noregate": ("full", dict(tdc_regate="off")),
                 "fast_noregate": ("fast", dict(tdc_regate="off")),
                 # step 0 at INT8, no full-precision warm-up steps: the defaults up to session 26 (warmup_steps)
                 "full_nowarmup": ("full", dict(warmup_steps=0)),
                 # ff.net.0's GELU as PyTorch's own pass after the GEMM (the default runs it in the epilogue)
                 "full_nogelu": ("full", dict(gelu_epilogue=False)),
                 "full_w8a8_nogelu": ("full", dict(int8_route="w8a8", gelu_epilogue=False)),
                 # NVFP4 decisions on the INT8 route (W4A8): 4-bit weights only, as the default, without W4A4's
                 # 16-bit-rate GEMM behind a two-pass NVFP4 quantize on a GPU without FP4 tensor cores
                 "full_nvfp4_int8": ("full", dict(nvfp4_route="int8"))}
LABELS = {
    "fp16": "FP16/FP32 (reference)", "bf16": "bf16 diffusers baseline", "w8a8": "static W8A8",
    "w4a4": "static W4A4 (all NVFP4)", "dmpq_only": "DMPQ only", "tdc_only": "TDC only",
    "dmpq_tdc": "DMPQ+TDC, no PDR", "full": "full 6Bit (DMPQ+TDC+PDR) + 8-bit attention by policy",
    "full_bf16attn": "full 6Bit (DMPQ+TDC+PDR) · bf16 attention",
    "full_w8a8_bf16attn": "full 6Bit · INT8 decisions on W8A8 · bf16 attention", "w8a8_tdc": "static W8A8 + TDC",
    "dmpq_tdc_stream": "DMPQ+TDC, no PDR · FP16 weights streamed",
    "full_stream": "full 6Bit · FP16 weights streamed",
    "full_same_skips": "full 6Bit · DMPQ+TDC's skips replayed (PDR's effect alone)",
    "full_w8a8": "full 6Bit · INT8 decisions on W8A8 (int8 tensor cores; INT8 weight copies) + 8-bit attention by policy",
    "full_requant": "full 6Bit · INT8 decisions on the int8 tensor cores, NVFP4 weights re-quantized per call "
                    "(int8_route=\"w4a8_requant\") + 8-bit attention by policy",
    "full_w4a8": "full 6Bit · the paper's routes W4A4 / W4A8 (int8_route=\"int8\", nvfp4_route=\"nvfp4\"; the "
                 "default until session 34) + 8-bit attention by policy",
    "full_requant_auto": "full 6Bit · INT8 and (without FP4 tensor cores) NVFP4 decisions on the int8 tensor "
                         "cores, NVFP4 weights re-quantized per call (int8_route=\"w4a8_requant\", "
                         "nvfp4_route=\"auto\") + 8-bit attention by policy",
    "full_attn_as_policy": "full 6Bit · after-skip attention by the policy on the stale Γ",
    "full_attn_as_policy_t50": "full 6Bit · after-skip attention by the stale Γ · τ_attn at 50 %",
    "full_attn_as_policy_t90": "full 6Bit · after-skip attention by the stale Γ · τ_attn at 90 %",
    "full_attn_as_fp8": "full 6Bit · after-skip attention 8-bit",
    "fast": "fast preset: full 6Bit · INT8 decisions on W8A8 · after-skip attention by the stale Γ",
    "fast_requant": "fast preset · INT8 and NVFP4 decisions on the int8 tensor cores from the NVFP4 weights "
                    "re-quantized per call (int8_route=\"w4a8_requant\"; no INT8 copies)",
    "full_attn_fp8": "full 6Bit · 8-bit attention on every computed block (attention=\"fp8\")",
    "tdc_attn": "TDC only, attention reuse (tdc_scope=attention)",
    "full_attn": "full 6Bit, attention reuse (tdc_scope=attention) + 8-bit attention by policy",
    "w8a8_tdc_attn": "static W8A8 + TDC attention reuse",
    "full_w8a8_attn": "full 6Bit, attention reuse · INT8 decisions on W8A8 + 8-bit attention by policy",
    "bf16_fast_attn": "bf16 + sixbit's fused q/k LayerNorm (+rotary) only — the engineering share, no method",
    "full_blocks": "full 6Bit · a cached Δ per block (tdc_store=\"blocks\", before session 23)",
    "fast_blocks": "fast preset · a cached Δ per block (tdc_store=\"blocks\", before session 23)",
    "tdc_only_blocks": "TDC only · a cached Δ per block (tdc_store=\"blocks\", before session 23)",
    "tdc_only_noregate": "TDC only · the block's Δ, not its gated pieces (tdc_regate=\"off\", before session 24)",
    "full_noregate": "full 6Bit · the block's Δ, not its gated pieces (tdc_regate=\"off\", before session 24)",
    "fast_noregate": "fast preset · the block's Δ, not its gated pieces (tdc_regate=\"off\", before session 24)",
    "full_nowarmup": "full 6Bit · no full-precision warm-up steps (warmup_steps=0, before session 27)",
    "full_nogelu": "full 6Bit · ff.net.0's GELU as PyTorch's pass (gelu_epilogue=False, before session 29)",
    "full_w8a8_nogelu": "full 6Bit · INT8 decisions on W8A8 · GELU as PyTorch's pass (gelu_epilogue=False)",
    "full_nvfp4_int8": "full 6Bit · NVFP4 decisions on the INT8 route (W4A8; NVFP4 weights only, nvfp4_route=\"int8\")",
}

#: real CogVideoX transformer configurations (random weights)
SIZES = {
    "2b": dict(num_attention_heads=30, num_layers=30, use_rotary_positional_embeddings=False),
    "5b": dict(num_attention_heads=48, num_layers=42, use_rotary_positional_embeddings=True),
}


# ------------------------------------------------------------------------------------- results


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv`` (default: the command line); ``args.command`` is the command that reproduces the run
    (the parser's ``prog``, ``python -m benchmarks NAME``, and the arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.command = " ".join([parser.prog, *(shlex.quote(a) for a in argv)])
    return args


def environment(device: torch.device | str, cmd: str) -> dict[str, Any]:
    """Device, versions and the exact command: every result file carries this."""
    import diffusers

    device = torch.device(device)
    env = {
        "command": cmd,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "device": str(device),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["threads"] = torch.get_num_threads()
    return env


def env_md(env: dict) -> str:
    keys = [k for k in ("gpu", "capability", "cpu", "threads", "device", "torch", "triton", "diffusers", "python",
                        "date") if env.get(k) is not None]
    return "\n".join([f"- {k}: `{env[k]}`" for k in keys] + [f"- command: `{env['command']}`"])


def write_results(name: str, payload: dict, markdown: str, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    jp, mp = out / f"{name}.json", out / f"{name}.md"
    jp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    mp.write_text(markdown)
    return jp, mp


def stats(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation and count of the finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size)}


def fmt_stats(s: dict[str, float], digits: int = 2) -> str:
    if not s or s.get("n", 0) == 0:
        return "—"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------- rows


@contextlib.contextmanager
def compile_log():
    """Record every Triton JIT compile inside the ``with`` (Triton's ``knobs.runtime.jit_cache_hook``, called on
    an in-memory cache miss before compiling): yields a list of ``(time.perf_counter(), kernel repr)``.
    A disk-cache hit still counts (loading a compiled kernel is first-use work too). Triton without the
    hook (or not installed): the list stays empty and ``None`` is appended, so a reader can tell."""
    log: list = []
    try:
        from triton import knobs
    except Exception:  # no triton, or a triton before knobs
        log.append(None)
        yield log
        return
    prev = knobs.runtime.jit_cache_hook

    def hook(*args, **kwargs):
        log.append((time.perf_counter(), str(kwargs.get("repr", "?"))))
        return prev(*args, **kwargs) if prev is not None else None  # None: compile as usual

    knobs.runtime.jit_cache_hook = hook
    try:
        yield log
    finally:
        knobs.runtime.jit_cache_hook = prev


@contextlib.contextmanager
def gc_log(min_s: float = 0.01):
    """Record the Python garbage collector's pauses of at least ``min_s`` inside the ``with``
    (``gc.callbacks``): yields a list of ``(time.perf_counter() at the end, kernel-style label, seconds)``,
    the label ``"gc gen<N>"``. Before the block the heap is collected and frozen (``gc.freeze``: what exists
    now — the pipeline, the model, Triton's caches — is never scanned again), so a pause inside is the
    loop's own garbage; unfrozen afterwards."""
    import gc

    log: list = []
    start: list[float] = []

    def cb(phase, info):
        if phase == "start":
            start[:] = [time.perf_counter()]
        elif start:
            dt = time.perf_counter() - start[0]
            if dt >= min_s:
                log.append((time.perf_counter(), f"gc gen{info.get('generation')}", dt))

    gc.collect()
    gc.freeze()
    gc.callbacks.append(cb)
    try:
        yield log
    finally:
        gc.callbacks.remove(cb)
        gc.unfreeze()


def events_by_step(log: list, marks: list[float]) -> list[dict[str, Any]] | None:
    """:func:`compile_log`'s or :func:`gc_log`'s entries as ``[{"step", "kernel"}]`` (plus ``"s"``, a GC pause's
    length) given a loop's ``marks`` (its start, then every step's end); ``None`` where the log could not be
    taken. Step −1 = before the loop started."""
    if None in log:
        return None
    return [{"step": int(np.searchsorted(marks, e[0])) - 1, "kernel": e[1][:300], **({"s": e[2]} if len(e) > 2 else {})}
            for e in log]


def make_config(name: str, **extra):
    """SixBitConfig of a benchmark row (a preset name or one of :data:`EXTRA_CONFIGS`), with ``extra``
    field overrides on top."""
    import sixbit

    preset, overrides = EXTRA_CONFIGS.get(name, (name, {}))
    return sixbit.SixBitConfig.preset(preset, **{**overrides, **extra})


def tdc_overrides(threshold: float | None, budget: float | None) -> dict[str, float]:
    """The TDC threshold/budget given on the command line, as SixBitConfig field overrides."""
    return {k: v for k, v in (("tdc_threshold", threshold), ("tdc_budget", budget)) if v is not None}


# ------------------------------------------------------------------------------ the real-size model


def random_cogvideox(size: str, device, dtype=torch.bfloat16, *, text_encoder: bool = True):
    """A CogVideoXPipeline at real size with random weights, built on ``device`` from configs (no download).
    ``size``: "2b", "5b", or "tiny" (for a CPU smoke test)."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(0)
    tiny = size == "tiny"
    with torch.device(device):
        if tiny:
            # head dim 32: the smallest the 8-bit attention takes (its route is exercised on the CPU too)
            tr = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=32, num_layers=3,
                                             text_embed_dim=32, time_embed_dim=16, sample_height=8, sample_width=8,
                                             sample_frames=9, max_text_seq_length=16, in_channels=4, out_channels=4,
                                             use_rotary_positional_embeddings=True)
            vae = AutoencoderKLCogVideoX(block_out_channels=(8, 8, 8, 8), latent_channels=4, norm_num_groups=2,
                                         temporal_compression_ratio=4, sample_height=64, sample_width=64)
            tcfg = T5Config(vocab_size=384, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
        else:
            tr = CogVideoXTransformer3DModel(**SIZES[size])
            vae = AutoencoderKLCogVideoX()
            # T5-XXL encoder (CogVideoX's text encoder), feed-forward gated-gelu
            tcfg = T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                            feed_forward_proj="gated-gelu", is_gated_act=True, dense_act_fn="gelu_new")
        te = T5EncoderModel(tcfg).eval() if text_encoder else None
    tr, vae = tr.to(dtype).eval(), vae.to(dtype).eval()
    te = te.to(dtype) if te is not None else None
    sched = CogVideoXDDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012,
                                   clip_sample=False, prediction_type="v_prediction", rescale_betas_zero_snr=True,
                                   set_alpha_to_one=True, timestep_spacing="trailing", snr_shift_scale=3.0)
    pipe = CogVideoXPipeline(tokenizer=ByT5Tokenizer(), text_encoder=te, vae=vae, transformer=tr, scheduler=sched)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def mini_setup(model, device, steps: int | None, n_prompts: int):
    """The quality-style benchmarks' set-up on sixbit-mini (or ``model``): the pipeline on ``device`` with
    its progress bar off, the generation arguments (``steps`` overrides the step count when given) and
    the evaluation prompts — in-grammar captions drawn with seed 7, the seed of sixbit-mini's model-card
    evaluation. Returns ``(pipe, gen, prompts)``."""
    import sixbit
    from sixbit.mini import DEFAULT_GENERATION
    from sixbit.mini.data import prompt_set

    pipe = sixbit.load_pipeline(model, device=device)
    pipe.set_progress_bar_config(disable=True)
    gen = {**DEFAULT_GENERATION, **({"num_inference_steps": steps} if steps else {})}
    return pipe, gen, prompt_set(7, n_prompts, split="train")


def speed_call(size: str, height: int = 480, width: int = 720, frames: int = 49) -> dict:
    """The pipeline call the speed and memory benchmarks time (seeded generator included)."""
    if size == "tiny":
        call = dict(prompt="a red circle", height=64, width=64, num_frames=9, guidance_scale=6.0,
                    max_sequence_length=16)
    else:
        call = dict(prompt="a red circle moving left on a blue background", height=height, width=width,
                    num_frames=frames, guidance_scale=6.0, max_sequence_length=226)
    call["generator"] = torch.Generator("cpu").manual_seed(0)
    return call


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers (each storage once; meta tensors not counted)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() in seen or t.device.type == "meta":
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def resident_weight_bytes(entry: dict, rec: dict) -> int:
    """Transformer weight bytes resident on the device for one speed row: the bf16 parameters for the
    baseline, sixbit's packed weights + the layers it leaves in 16 bits otherwise (``handle.memory()``)."""
    mem = entry.get("memory")
    total = rec["transformer_weight_bytes_bf16"]  # parameters and buffers of the plain model
    if not mem or not mem["packed_bytes"]:
        return total
    other = int(mem.get("other_transformer_bytes", 0))
    buffers = total - int(mem["original_bytes"]) - other  # e.g. positional tables: unchanged by sixbit
    return int(mem["packed_bytes"]) + other + int(mem["fp_bytes_on_device"]) + buffers


def num_blocks(transformer) -> int:
    """Transformer blocks of a model family sixbit knows (what a skip schedule is resampled to)."""
    from sixbit.adapters import get_adapter

    return len(get_adapter(transformer).blocks(transformer))
