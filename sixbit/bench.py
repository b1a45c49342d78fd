"""Benchmarks that regenerate sixbit's claims: ``python -m sixbit.bench quality | speed``.

quality
    On sixbit-mini (a real trained model, offline): for every configuration of the paper's ablation
    (FP16, static W8A8, static W4A4, DMPQ only, TDC only, DMPQ+TDC without PDR, full), many prompts ×
    seeds: PSNR/SSIM against the FP16 video of the same prompt and seed, temporal flicker, flow score and
    its error vs FP16, prompt adherence (sixbit-mini's judge), average activation bits, fraction of block
    evaluations skipped, PDR firings, wall time. Mean and spread per configuration. It also records the
    full method's skip schedule, which ``speed`` replays at real sizes. ``--tdc-threshold``/``--tdc-budget``
    and ``--pdr-rho`` override those settings in every configuration that uses TDC / PDR (sweeps).

speed
    On a GPU at real CogVideoX sizes with random weights (49 frames 480×720, CFG batched, 50 steps): the
    bf16 diffusers baseline and each configuration, all in one run, timed over the denoising loop
    (``output_type="latent"``) with per-step times, plus peak memory and the transformer's resident weight
    bytes. Random weights make TDC's and DMPQ's own decisions meaningless, so the configurations with TDC
    replay the schedule recorded on sixbit-mini with the full method — which blocks were skipped and, for
    DMPQ configurations, each computed block's routes (NVFP4/INT8/16-bit) — resampled to the model's depth
    and step count; the tables say so. ``--pipeline-memory`` adds whole-pipeline memory (text encoder + transformer + VAE decode) for
    the baseline and sixbit, each as it comes and with lean loading (text encoder offloaded after encoding,
    transformer and VAE brought to the device after it, tiled VAE decode), with the peak of each phase
    (:func:`pipeline_memory`; the lean sixbit row also stores the text encoder's weights in 4 bits).

Both write ``<out>/<name>.json`` and ``<out>/<name>.md`` naming the device, versions and exact command.
"""

from __future__ import annotations

import argparse
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

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"

#: the ablation rows, in the order of the paper's table (preset names of SixBitConfig; "fp16" = no sixbit)
QUALITY_CONFIGS = ("fp16", "w8a8", "w4a4", "dmpq_only", "tdc_only", "dmpq_tdc", "full", "full_same_skips",
                   "dmpq_tdc_stream", "full_stream")
#: quality rows that replay, per prompt and seed, the skip pattern of another row (skips only: DMPQ and PDR
#: decide live). full_same_skips isolates PDR: the full method with exactly DMPQ+TDC's skips, because
#: purified deltas also change TDC's own decisions (a cleaner Δ reads as more stable, so TDC skips more)
SAME_SKIPS = {"full_same_skips": "dmpq_tdc"}
SPEED_CONFIGS = ("bf16", "bf16_fast_attn", "w8a8", "w4a4", "dmpq_only", "tdc_only", "dmpq_tdc", "full", "w8a8_tdc",
                 "full_stream", "full_w8a8")
#: rows that are not a preset: (preset, overrides). W8A8+TDC is the fastest pairing on Hopper, which has
#: int8 tensor cores but no FP4 units. The *_stream rows run warm-up and PDR steps with the original 16-bit
#: weights, copied from host memory (fp_weights="stream"), instead of 4-bit weights × 16-bit activations.
#: full_w8a8 runs DMPQ's INT8 decisions as W8A8 (int8_route="w8a8": an INT8 copy of every weight is kept,
#: 12.5 bits/weight in all) — the Hopper speed pairing of the full method; NVFP4 decisions stay W4A4.
EXTRA_CONFIGS = {"w8a8_tdc": ("w8a8", dict(tdc=True)),
                 "dmpq_tdc_stream": ("dmpq_tdc", dict(fp_weights="stream")),
                 "full_stream": ("full", dict(fp_weights="stream")),
                 "full_w8a8": ("full", dict(int8_route="w8a8")),
                 "full_same_skips": ("full", {})}
LABELS = {
    "fp16": "FP16/FP32 (reference)", "bf16": "bf16 diffusers baseline", "w8a8": "static W8A8",
    "w4a4": "static W4A4 (all NVFP4)", "dmpq_only": "DMPQ only", "tdc_only": "TDC only",
    "dmpq_tdc": "DMPQ+TDC, no PDR", "full": "full 6Bit (DMPQ+TDC+PDR)", "w8a8_tdc": "static W8A8 + TDC",
    "dmpq_tdc_stream": "DMPQ+TDC, no PDR · FP16 weights streamed",
    "full_stream": "full 6Bit · FP16 weights streamed",
    "full_same_skips": "full 6Bit · DMPQ+TDC's skips replayed (PDR's effect alone)",
    "full_w8a8": "full 6Bit · INT8 decisions on W8A8 (int8 tensor cores; INT8 weight copies)",
    "bf16_fast_attn": "bf16 + sixbit's fused q/k LayerNorm (+rotary) only — the engineering share, no method",
}
#: speed rows without the engine: the bf16 baseline with only sixbit's attention processor
#: (``sixbit.attention``, what ``fast_qk_norm`` installs), so a table can separate the method's speed-up
#: from that engineering's
ENGINEERING_ONLY = ("bf16_fast_attn",)


def make_config(name: str, **extra):
    """SixBitConfig of a benchmark row (a preset name or one of :data:`EXTRA_CONFIGS`), with ``extra``
    field overrides on top."""
    import sixbit

    preset, overrides = EXTRA_CONFIGS.get(name, (name, {}))
    return sixbit.SixBitConfig.preset(preset, **{**overrides, **extra})


def _tdc_overrides(threshold: float | None, budget: float | None) -> dict[str, float]:
    """The TDC threshold/budget given on the command line, as SixBitConfig field overrides."""
    return {k: v for k, v in (("tdc_threshold", threshold), ("tdc_budget", budget)) if v is not None}


def environment(device: torch.device | str) -> dict[str, Any]:
    """Device, versions and the exact command: every result file carries this."""
    import diffusers

    device = torch.device(device)
    env = {
        "command": "python -m sixbit.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
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


def _stats(values: list[float]) -> dict[str, float]:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size)}


def _fmt(s: dict[str, float], digits: int = 2) -> str:
    if not s or s.get("n", 0) == 0:
        return "—"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f}"


def write_results(name: str, payload: dict, markdown: str, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    jp, mp = out / f"{name}.json", out / f"{name}.md"
    jp.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    mp.write_text(markdown)
    return jp, mp


def _env_md(env: dict) -> str:
    keys = [k for k in ("gpu", "capability", "cpu", "threads", "device", "torch", "triton", "diffusers", "python",
                        "date") if env.get(k) is not None]
    return "\n".join([f"- {k}: `{env[k]}`" for k in keys] + [f"- command: `{env['command']}`"])


# =============================================================================================== quality


def quality(args) -> dict:
    import sixbit
    from sixbit.metrics import compare, flow_score, temporal_flicker
    from sixbit.mini import DEFAULT_GENERATION
    from sixbit.mini.data import prompt_set
    from sixbit.mini.judge import judge
    from sixbit.video import to_uint8

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    pipe = sixbit.load_pipeline(args.model, device=device)
    pipe.set_progress_bar_config(disable=True)
    gen = {**DEFAULT_GENERATION}
    if args.steps:
        gen["num_inference_steps"] = args.steps
    # in-grammar evaluation captions (the same seed as sixbit-mini's model-card evaluation)
    prompts = prompt_set(7, args.prompts, split="train")
    seeds = list(range(args.seeds))
    configs = [c for c in (args.configs or QUALITY_CONFIGS)]
    if configs[0] != "fp16":
        configs = ["fp16", *[c for c in configs if c != "fp16"]]
    for row, src in SAME_SKIPS.items():
        if row in configs and (src not in configs or configs.index(src) > configs.index(row)):
            raise SystemExit(f"quality row {row!r} replays the skips of {src!r}: list {src!r} before it")

    def generate(prompt, seed, callback=None):
        g = torch.Generator("cpu").manual_seed(seed)
        t0 = time.perf_counter()
        out = pipe(prompt=prompt, generator=g, output_type="np", callback_on_step_end=callback, **gen).frames[0]
        return to_uint8(out), time.perf_counter() - t0

    rows: dict[str, list[dict]] = {c: [] for c in configs}
    refs: dict[tuple[int, int], np.ndarray] = {}
    schedule = None
    total = len(configs) * len(prompts) * len(seeds)
    done = 0
    overrides = _tdc_overrides(args.tdc_threshold, args.tdc_budget)
    pdr_over = {} if args.pdr_rho is None else {"pdr_rho": args.pdr_rho}
    skips: dict[str, dict[tuple[int, int], Any]] = {src: {} for src in SAME_SKIPS.values()}
    for cfg_name in configs:
        handle = None
        replay = SAME_SKIPS.get(cfg_name)
        if cfg_name != "fp16":
            cfg = make_config(cfg_name)
            extra = {**(overrides if cfg.tdc else {}), **(pdr_over if cfg.pdr else {})}
            if extra:
                cfg = make_config(cfg_name, **extra)
            if replay is None:
                handle = sixbit.apply(pipe, cfg)
        try:
            for pi, prompt in enumerate(prompts):
                for seed in seeds:
                    if replay is not None:  # one handle per run: the schedule is this prompt's and seed's
                        if handle is not None:
                            handle.remove()
                        handle = sixbit.apply(pipe, cfg, schedule=skips[replay][(pi, seed)])
                    video, wall = generate(prompt, seed)
                    rec: dict[str, Any] = {"prompt": prompt, "seed": seed, "time_s": wall}
                    rec["adherence"] = judge(video, prompt).adherence * 100.0
                    rec["flicker"] = temporal_flicker(video)
                    rec["flow_score"] = flow_score(video)
                    if cfg_name == "fp16":
                        refs[(pi, seed)] = video
                        rec.update(psnr=float("inf"), ssim=1.0, flow_error=0.0, avg_act_bits=16.0, skip_fraction=0.0)
                    else:
                        ref = refs[(pi, seed)]
                        m = compare(video, ref)
                        rec.update(psnr=m["psnr_db"], ssim=m["ssim"], flow_error=m["flow_error"])
                        summ = handle.trace.summary()
                        rec.update(avg_act_bits=summ["avg_act_bits"], skip_fraction=summ["skip_fraction"],
                                   pdr_count=summ["pdr_count"])
                        if cfg_name == "full" and schedule is None:
                            schedule = handle.trace.skip_schedule()
                        if cfg_name in skips:
                            rec_sched = handle.trace.skip_schedule()
                            rec_sched.routes = None  # skips only: the replaying row routes live
                            skips[cfg_name][(pi, seed)] = rec_sched
                    rows[cfg_name].append(rec)
                    done += 1
                    print(f"[quality {done}/{total}] {cfg_name:9s} seed={seed} psnr={rec['psnr']:.2f} "
                          f"adh={rec['adherence']:.0f} bits={rec['avg_act_bits']:.2f} skip={rec['skip_fraction']:.2f} "
                          f"t={wall:.1f}s", flush=True)
        finally:
            if handle is not None:
                handle.remove()

    metrics = ("psnr", "ssim", "flow_error", "flow_score", "flicker", "adherence", "avg_act_bits", "skip_fraction",
               "pdr_count", "time_s")
    summary = {c: {m: _stats([r.get(m) for r in rows[c]]) for m in metrics} for c in configs}
    env = environment(device)
    payload = {"benchmark": "quality", "model": str(args.model), "generation": gen, "tdc_overrides": overrides,
               "pdr_overrides": pdr_over,
               "prompts": prompts,
               "seeds": seeds, "environment": env, "summary": summary, "runs": rows}
    if schedule is not None:
        payload["full_skip_fraction"] = schedule.skip_fraction
        sched_path = Path(args.out) / f"{args.name or 'quality_mini'}_schedule.json"
        sched_path.parent.mkdir(parents=True, exist_ok=True)
        schedule.source.update(model="sixbit-mini", generation={k: v for k, v in gen.items()}, preset="full")
        schedule.save(sched_path)
    md = [f"# Quality on sixbit-mini — {len(prompts)} prompts × {len(seeds)} seeds", "",
          "Mean ± standard deviation over prompts × seeds. PSNR/SSIM/flow error are against the FP16/FP32 video of "
          "the same prompt and seed (PSNR of identical videos is ∞ and is left out of the mean). Adherence is "
          "sixbit-mini's classical-CV judge (colour, shape, motion), in %. Full-precision steps (warm-up, PDR) use "
          "4-bit weights × 16-bit activations (the default `fp_weights=\"cpu\"`), except in the rows marked "
          "*FP16 weights streamed* (`fp_weights=\"stream\"`: the original weights, copied from host memory).", "",
          "| configuration | PSNR dB ↑ | SSIM ↑ | flow err ↓ | flow score | flicker | adherence % | act bits | "
          "skipped | PDR / run | time s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in configs:
        s = summary[c]
        md.append(f"| {LABELS[c]} | {_fmt(s['psnr'])} | {_fmt(s['ssim'], 3)} | {_fmt(s['flow_error'], 3)} | "
                  f"{_fmt(s['flow_score'], 3)} | {_fmt(s['flicker'], 4)} | {_fmt(s['adherence'], 1)} | "
                  f"{_fmt(s['avg_act_bits'])} | {_fmt(s['skip_fraction'])} | {_fmt(s['pdr_count'], 1)} | "
                  f"{_fmt(s['time_s'])} |")
    md += ["", "Settings: " + ", ".join(f"{k}={v}" for k, v in gen.items())
           + (("; TDC overrides: " + ", ".join(f"{k}={v}" for k, v in overrides.items())) if overrides else "")
           + (f"; PDR ρ override: {args.pdr_rho}" if pdr_over else ""),
           "", _env_md(env), ""]
    write_results(args.name or "quality_mini", payload, "\n".join(md), Path(args.out))
    print("\n".join(md))
    return payload


# ================================================================================================= speed

#: real CogVideoX transformer configurations (random weights)
SIZES = {
    "2b": dict(num_attention_heads=30, num_layers=30, use_rotary_positional_embeddings=False),
    "5b": dict(num_attention_heads=48, num_layers=42, use_rotary_positional_embeddings=True),
}


def random_cogvideox(size: str, device, dtype=torch.bfloat16, *, text_encoder: bool = True):
    """A CogVideoXPipeline at real size with random weights, built on ``device`` from configs (no download).
    ``size``: "2b", "5b", or "tiny" (for a CPU smoke test of this script)."""
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
            tr = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16, num_layers=3,
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


def _param_bytes(module: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() in seen or t.device.type == "meta":
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _transformer_weight_bytes(entry: dict, rec: dict) -> int:
    """Transformer weight bytes resident on the device for one speed row: the bf16 parameters for the
    baseline, sixbit's packed weights + the layers it leaves in 16 bits otherwise (``handle.memory()``)."""
    mem = entry.get("memory")
    total = rec["transformer_weight_bytes_bf16"]  # parameters and buffers of the plain model
    if not mem or not mem["packed_bytes"]:
        return total
    other = int(mem.get("other_transformer_bytes", 0))
    buffers = total - int(mem["original_bytes"]) - other  # e.g. positional tables: unchanged by sixbit
    return int(mem["packed_bytes"]) + other + int(mem["fp_bytes_on_device"]) + buffers


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_denoise(pipe, call: dict, steps: int, device) -> tuple[float, list[float]]:
    """Time one denoising loop (latent output); per-step times from a synchronizing step callback."""
    marks: list[float] = []

    def cb(p, i, t, kw):
        _sync(device)
        marks.append(time.perf_counter())
        return {}

    _sync(device)
    t0 = time.perf_counter()
    pipe(**call, num_inference_steps=steps, output_type="latent", callback_on_step_end=cb)
    _sync(device)
    total = time.perf_counter() - t0
    edges = [t0, *marks]
    return total, [b - a for a, b in zip(edges, edges[1:])]


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


def speed(args) -> dict:
    import sixbit
    from sixbit import attention
    from sixbit.tdc import SkipSchedule

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    results: dict[str, Any] = {"benchmark": "speed", "environment": environment(device), "models": {}}
    out = Path(args.out)
    if args.record_schedule:
        args.schedule = str(record_schedule(args.record_schedule, device, out, args.tdc_threshold, args.tdc_budget))
    sched = SkipSchedule.load(args.schedule) if args.schedule else None
    results["schedule"] = {"path": args.schedule, "source": sched.source if sched else None,
                           "skip_fraction": sched.skip_fraction if sched else None,
                           "route_fractions": sched.route_fractions if sched else None}
    for size in args.sizes:
        t_build = time.perf_counter()
        pipe = random_cogvideox(size, device, dtype, text_encoder=True)
        build_s = time.perf_counter() - t_build
        call = speed_call(size, args.height, args.width, args.frames)
        tr = pipe.transformer
        bf16_weight_bytes = _param_bytes(tr)
        rec: dict[str, Any] = {"build_s": build_s, "call": {k: v for k, v in call.items() if k != "generator"},
                               "steps": args.steps, "transformer_params": sum(p.numel() for p in tr.parameters()),
                               "transformer_weight_bytes_bf16": bf16_weight_bytes, "configs": {}}
        results["models"][size] = rec
        configs = args.configs or SPEED_CONFIGS
        for name in configs:
            handle = None
            installed: list = []
            entry: dict[str, Any] = {"label": LABELS[name]}
            try:
                if name in ENGINEERING_ONLY:
                    from sixbit.linear import ops

                    installed = attention.install(handle_blocks(tr), ops())
                    entry["compute_path"] = ops().compute_path(device) + " (attention processor only)"
                elif name != "bf16":
                    cfg = make_config(name)
                    use_sched = sched is not None and cfg.tdc
                    handle = sixbit.apply(pipe, cfg, schedule=sched.resample(len(handle_blocks(tr)), args.steps)
                                          if use_sched else None)
                    entry["schedule_replayed"] = bool(use_sched)
                    entry["compute_path"] = handle.trace.to_dict().get("compute_path")
                # warm-up (Triton compilation, cuDNN plans): a short loop
                _run_denoise(pipe, call, 2, device)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                total, steps = _run_denoise(pipe, call, args.steps, device)
                entry.update(denoise_s=total, step_s=steps, step_median_s=float(np.median(steps)))
                if device.type == "cuda":
                    entry["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
                if handle is not None:
                    summ = handle.trace.summary()
                    entry.update(avg_act_bits=summ["avg_act_bits"], skip_fraction=summ["skip_fraction"],
                                 pdr_count=summ["pdr_count"], route_counts=summ["route_counts"],
                                 memory=handle.memory(), warnings=handle.warnings[:5])
            except Exception as e:  # keep going: one failing configuration must not lose the others
                import traceback

                entry["error"] = f"{type(e).__name__}: {e}"
                entry["traceback"] = traceback.format_exc()[-3000:]
                print(entry["traceback"], flush=True)
            finally:
                if handle is not None:
                    handle.remove()
                attention.uninstall(installed)
            rec["configs"][name] = entry
            print(f"[speed {size}] {name}: " + json.dumps({k: v for k, v in entry.items()
                                                         if k in ("denoise_s", "step_median_s", "skip_fraction",
                                                                  "avg_act_bits", "peak_mem_bytes", "error")}), flush=True)
            _write_speed(results, out, args.name)
        if args.pipeline_memory and size != "tiny":
            rec["pipeline_memory"] = pipeline_memory(pipe, call, device, sched)
            _write_speed(results, out, args.name)
        del pipe
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def record_schedule(model: str, device, out: Path, tdc_threshold: float | None, tdc_budget: float | None) -> Path:
    """Run sixbit-mini (or ``model``) once with the full method and save its skip pattern for replay.

    The torch reference backend in fp32 is used so the decisions are those of the CPU demo."""
    import sixbit
    from sixbit.mini import DEFAULT_GENERATION, EXAMPLE_PROMPTS

    pipe = sixbit.load_pipeline(model, device=device, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    overrides = _tdc_overrides(tdc_threshold, tdc_budget)
    cfg = make_config("full", backend="torch", **overrides)
    handle = sixbit.apply(pipe, cfg)
    try:
        pipe(prompt=EXAMPLE_PROMPTS[0], generator=torch.Generator("cpu").manual_seed(0), output_type="latent",
             **DEFAULT_GENERATION)
        sched = handle.trace.skip_schedule()
        summ = handle.trace.summary()
    finally:
        handle.remove()
    sched.source.update(model="sixbit-mini" if model in (None, "", "mini") else str(model), preset="full",
                        overrides=overrides, generation=DEFAULT_GENERATION, prompt=EXAMPLE_PROMPTS[0], seed=0,
                        avg_act_bits=summ["avg_act_bits"], device=str(device))
    out.mkdir(parents=True, exist_ok=True)
    path = sched.save(out / "schedule_mini.json")
    print(f"recorded skip schedule: skip {sched.skip_fraction:.1%}, {summ['avg_act_bits']:.2f} act bits → {path}",
          flush=True)
    del pipe
    return path


def handle_blocks(transformer) -> list:
    from sixbit.adapters import get_adapter

    return get_adapter(transformer).blocks(transformer)


class PhasePeaks:
    """Peak allocated device memory per pipeline phase — ``encode`` (until the first transformer call),
    ``denoise`` (until the VAE decoder's first call) and ``decode`` — with the bytes allocated when each phase
    began, so a whole-pipeline peak can be traced to the phase (and the resident part) that sets it. Uses
    forward pre-hooks on the transformer and on ``vae.decoder``; on a CPU device it records the phase order
    only. ``with PhasePeaks(pipe, device) as pp: pipe(...)``; then ``pp.phases``."""

    def __init__(self, pipe, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.targets = [(pipe.transformer, "denoise"), (pipe.vae.decoder, "decode")]
        self.phases: dict[str, dict[str, int | None]] = {}
        self._hooks: list = []
        self._phase: str | None = None

    def _mem(self) -> tuple[int | None, int | None]:
        if not self.cuda:
            return None, None
        return int(torch.cuda.memory_allocated(self.device)), int(torch.cuda.max_memory_allocated(self.device))

    def _enter(self, name: str) -> None:
        if name == self._phase or name in self.phases:
            return
        self._close()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        self._phase = name
        self.phases[name] = {"start_bytes": self._mem()[0], "peak_bytes": None}

    def _close(self) -> None:
        if self._phase is not None:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.phases[self._phase]["peak_bytes"] = self._mem()[1]

    def __enter__(self) -> PhasePeaks:
        for mod, name in self.targets:
            self._hooks.append(mod.register_forward_pre_hook(lambda *_a, _n=name: self._enter(_n)))
        self._enter("encode")
        return self

    def __exit__(self, *exc) -> None:
        self._close()
        self._phase = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


#: whole-pipeline memory rows: (sixbit config or None for plain diffusers, lean loading)
PIPELINE_MEMORY_ROWS = {
    "bf16": (None, False),
    "full": ("full", False),
    "bf16_lean": (None, True),
    "full_lean": ("full", True),
}
#: the lean full row also stores modulation and embedder weights in 4 bits
LEAN_OVERRIDES = dict(modulation_weights="nvfp4", embedder_weights="nvfp4")


def pipeline_memory(pipe, call, device, sched, rows=tuple(PIPELINE_MEMORY_ROWS), steps: int = 2) -> dict:
    """Peak memory of the whole pipeline (text encoder → ``steps`` denoising steps → VAE decode to pixels),
    split by :class:`PhasePeaks` into encode (everything before the first transformer call), denoise and
    decode.

    * ``bf16``: the diffusers pipeline as it comes, every component resident.
    * ``full``: sixbit's full method; every component resident at the start, the text encoder goes back to
      the CPU once the prompt is encoded, the VAE decodes in tiles.
    * ``bf16_lean`` / ``full_lean``: plain loading engineering, the same for both — only the text encoder is
      on the device while the prompt is encoded, then it goes to the CPU and the transformer and the VAE
      come to the device; the VAE decodes in tiles. ``full_lean`` also stores the text encoder's weights in
      4 bits (:func:`sixbit.quantize_text_encoder`, packed on the CPU before the encoder moves) and applies
      sixbit after the transformer's move (packing on the device) with 4-bit modulation and embedder
      weights. ``full_lean`` against ``bf16_lean`` is what sixbit saves over the whole pipeline; against
      ``bf16``, sixbit plus engineering.

    Every component is back on the device after each row. On a device other than CUDA the rows run (the
    code path) but record no bytes."""
    import sixbit

    res: dict[str, Any] = {}
    cuda = device.type == "cuda"

    def empty():
        if cuda:
            torch.cuda.empty_cache()

    parts = [pipe.text_encoder, pipe.transformer, pipe.vae]
    for name in rows:
        preset, lean = PIPELINE_MEMORY_ROWS[name]
        handle = te_handle = None
        try:
            for m in parts:
                m.to("cpu" if lean else device)
            if lean and preset is not None:  # pack the text encoder where it is (CPU), then move it
                te_handle = sixbit.quantize_text_encoder(pipe)
            if lean:
                pipe.text_encoder.to(device)
            empty()
            t0 = time.perf_counter()
            kw = {k: v for k, v in call.items() if k != "prompt"}
            with PhasePeaks(pipe, device) as pp:
                if preset is None and not lean:
                    kw.update(prompt=call["prompt"])
                else:
                    pe, npe = pipe.encode_prompt(call["prompt"], negative_prompt="", do_classifier_free_guidance=True,
                                                 max_sequence_length=call.get("max_sequence_length", 226),
                                                 device=device)
                    pipe.text_encoder.to("cpu")
                    empty()
                    if lean:
                        pipe.transformer.to(device)
                    if preset is not None:
                        sch = sched.resample(len(handle_blocks(pipe.transformer)), steps) if sched else None
                        handle = sixbit.apply(pipe, make_config(preset, **(LEAN_OVERRIDES if lean else {})),
                                              schedule=sch)
                    if lean:
                        pipe.vae.to(device)
                    pipe.vae.enable_tiling()
                    kw.update(prompt_embeds=pe, negative_prompt_embeds=npe)
                pipe(**kw, num_inference_steps=steps, output_type="pt")
            _sync(device)
            peaks = [p["peak_bytes"] for p in pp.phases.values() if p["peak_bytes"] is not None]
            res[name] = {"seconds": time.perf_counter() - t0, "phases": pp.phases, "lean": lean,
                         "config": preset or "bf16", "text_encoder_4bit": te_handle is not None}
            if te_handle is not None:
                res[name]["text_encoder_memory"] = te_handle.memory()
            if peaks:
                res[name]["peak_bytes"] = max(peaks)
        except Exception as e:
            import traceback

            res[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        finally:
            if handle is not None:
                handle.remove()
            if te_handle is not None:
                te_handle.remove()
            pipe.vae.disable_tiling()
            for m in parts:
                m.to(device)
            empty()
    return res


def weights(args) -> dict:
    """Transformer weight bytes at real sizes, measured by applying sixbit to a random-weight model on the
    CPU (the byte count of packed weights does not depend on the device or on the weights' values)."""
    from diffusers import CogVideoXTransformer3DModel

    import sixbit
    from sixbit.linear import param_bytes

    rows = {}
    variants = {
        "full": ("full", {}),
        "full, 4-bit modulation weights": ("full", {"modulation_weights": "nvfp4"}),
        "w8a8": ("w8a8", {}),
        "full, 4-bit modulation + embedder weights": ("full", {"modulation_weights": "nvfp4",
                                                               "embedder_weights": "nvfp4"}),
        "full, INT8 route on W8A8": ("full", {"int8_route": "w8a8", "modulation_weights": "nvfp4"}),
    }
    for size in args.sizes:
        torch.manual_seed(0)
        if size == "t5xxl":
            rows[size] = _text_encoder_weights()
            _write_weights(rows, args)
            continue
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # build in bf16: 5B in fp32 would not fit a 24 GB machine
        try:
            # .to(): the sincos positional table is built in float64 under a bf16 default; cast it as
            # from_pretrained(torch_dtype=bf16) does
            tr = CogVideoXTransformer3DModel(**SIZES[size]).to(torch.bfloat16).eval()
        finally:
            torch.set_default_dtype(prev)
        base = _param_bytes(tr)
        base_params = param_bytes(tr)
        rows[size] = {"params": sum(p.numel() for p in tr.parameters()), "bf16_bytes": base,
                      "bf16_param_bytes": base_params, "variants": {}}
        for label, (preset, over) in variants.items():
            t0 = time.perf_counter()
            handle = sixbit.apply(tr, sixbit.SixBitConfig.preset(preset, **over))
            mem = handle.memory()
            handle.remove()
            entry = {"preset": preset, "overrides": over, "memory": mem}
            resident = _transformer_weight_bytes(entry, {"transformer_weight_bytes_bf16": base})
            params_only = mem["packed_bytes"] + mem["other_transformer_bytes"] + mem["fp_bytes_on_device"]
            entry.update(resident_bytes=resident, reduction=base / resident, param_bytes=params_only,
                         param_reduction=base_params / params_only, pack_seconds=time.perf_counter() - t0)
            rows[size]["variants"][label] = entry
            print(f"[weights {size}] {label}: {resident / 2**30:.2f} GiB ({base / resident:.2f}x smaller; "
                  f"parameters alone {base_params / params_only:.2f}x)", flush=True)
        del tr
        _write_weights(rows, args)
    return {"models": rows}


T5XXL_CONFIG = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                    feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)


def _text_encoder_weights() -> dict:
    """CogVideoX's T5-XXL encoder (random bf16 weights, built on the CPU) under quantize_text_encoder."""
    from transformers import T5Config, T5EncoderModel

    import sixbit
    from sixbit.linear import param_bytes

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        te = T5EncoderModel(T5Config(**T5XXL_CONFIG)).eval()
    finally:
        torch.set_default_dtype(prev)
    base = _param_bytes(te)
    t0 = time.perf_counter()
    h = sixbit.quantize_text_encoder(te)
    mem = h.memory()
    h.remove()
    params_only = mem["packed_bytes"] + mem["other_bytes"]
    resident = params_only + sum(b.numel() * b.element_size() for b in te.buffers())
    base_params = param_bytes(te)
    print(f"[weights t5xxl] 4-bit linears: {resident / 2**30:.2f} GiB ({base / resident:.2f}x smaller)", flush=True)
    return {"model": "T5-XXL text encoder", "params": sum(p.numel() for p in te.parameters()), "bf16_bytes": base,
            "bf16_param_bytes": base_params,
            "variants": {"4-bit linear weights (quantize_text_encoder; wo 16-bit)": {
                "memory": mem, "resident_bytes": resident, "reduction": base / resident, "param_bytes": params_only,
                "param_reduction": base_params / params_only, "pack_seconds": time.perf_counter() - t0}}}


def _write_weights(rows: dict, args) -> None:
    env = environment("cpu")
    md = ["# Weight memory at real CogVideoX sizes", "",
          "Bytes a model keeps on the device after `sixbit.apply` (transformers) or `sixbit.quantize_text_encoder` "
          "(the text encoder): packed weights + the layers left in 16 bits + buffers, against the bf16 model. Measured by packing a random-weight model on the CPU: "
          "the byte count does not depend on the device or the values. *resident* counts parameters and buffers "
          "(CogVideoX-2B has a 68 MB bf16 sin-cos positional table that no weight format changes); "
          "*parameters* counts the weights alone.", "",
          "| model | configuration | resident GiB | × smaller | parameters GiB | × smaller |", "|---|---|---|---|---|---|"]
    for size, r in rows.items():
        bp = r.get("bf16_param_bytes", r["bf16_bytes"])
        model = r.get("model", f"CogVideoX-{size.upper()}")
        md.append(f"| {model} | bf16 | {r['bf16_bytes'] / 2**30:.2f} | 1.00 | {bp / 2**30:.2f} | 1.00 |")
        for label, e in r["variants"].items():
            md.append(f"| {model} | {label} | {e['resident_bytes'] / 2**30:.2f} | {e['reduction']:.2f} | "
                      f"{e['param_bytes'] / 2**30:.2f} | {e['param_reduction']:.2f} |")
    md += ["", _env_md(env), ""]
    payload = {"benchmark": "weights", "environment": env, "models": rows}
    write_results(args.name or "weights", payload, "\n".join(md), Path(args.out))


def _route_note(sched: dict | None) -> str:
    fr = (sched or {}).get("route_fractions")
    if not fr:
        return "when the schedule holds them (this one does not: DMPQ routed by Γ of the random weights)"
    return ("recorded as " + ", ".join(f"{fr[r]:.0%} {r.upper() if r != 'fp16' else '16-bit'}"
                                        for r in ("nvfp4", "int8", "fp16")) + " of the linear evaluations")


def _write_speed(results: dict, out: Path, name: str | None) -> None:
    """Write ``<name>.json`` and the markdown table rendered from it (``python -m sixbit.bench render``
    re-renders a JSON file with the current renderer)."""
    env = results["environment"]
    md = ["# Speed and memory at real CogVideoX sizes (random weights)", "",
          "Denoising loop only (`output_type=\"latent\"`), CFG batched, after a 2-step warm-up. Random weights "
          "make TDC's own decisions meaningless: configurations with TDC **replay the skip schedule recorded on "
          "sixbit-mini** with the full method (resampled to this depth and step count): which blocks are skipped "
          "and, for the DMPQ configurations, each computed block's routes (NVFP4 / INT8 / 16-bit for PDR), "
          f"{_route_note(results.get('schedule'))}. *peak GiB* is the allocator's peak over the denoising loop with the "
          "whole pipeline resident (the T5-XXL text encoder alone is 9.5 GB in bf16); TDC keeps one cached Δ per "
          "block and token stream, which is why configurations with TDC peak higher. *transformer weights* are "
          "the bytes the transformer keeps on the device: packed 4/8-bit weights plus the layers that stay 16-bit "
          "(embedders, norms, and by default the modulation linears).", ""]
    for size, rec in results["models"].items():
        base = rec["configs"].get("bf16", {}).get("denoise_s")
        c = rec.get("call", {})
        md += [f"## CogVideoX-{size.upper()} — {c.get('num_frames')} frames {c.get('height')}×{c.get('width')}, "
               f"{rec['steps']} steps, {rec['transformer_params'] / 1e9:.2f} B transformer parameters", "",
               "| configuration | denoise s | median step ms | speed-up | skipped | act bits | peak GiB | "
               "transformer weights GiB | path |", "|---|---|---|---|---|---|---|---|---|"]
        bf16_w = rec["transformer_weight_bytes_bf16"]
        for e in rec["configs"].values():
            if "error" in e:
                md.append(f"| {e['label']} | error: {e['error'][:80]} | | | | | | | |")
                continue
            sp = f"{base / e['denoise_s']:.2f}×" if base else "—"
            wb = _transformer_weight_bytes(e, rec)
            md.append(f"| {e['label']}{' (replayed schedule)' if e.get('schedule_replayed') else ''} | "
                      f"{e['denoise_s']:.1f} | {e['step_median_s'] * 1e3:.0f} | {sp} | "
                      f"{e.get('skip_fraction', 0):.0%} | {e.get('avg_act_bits', 16):.2f} | "
                      f"{e.get('peak_mem_bytes', 0) / 2**30:.2f} | "
                      f"{wb / 2**30:.2f} ({bf16_w / wb:.2f}× smaller) | "
                      f"{e.get('compute_path', 'torch bf16')} |")
        if rec.get("pipeline_memory"):
            md += ["", "Whole pipeline (text encoder + transformer + VAE decode, 2 steps) peak GiB: " + ", ".join(
                f"{k}: {v['peak_bytes'] / 2**30:.2f}" if "peak_bytes" in v else f"{k}: {v.get('error', 'n/a')}"
                for k, v in rec["pipeline_memory"].items())]
            for k, v in rec["pipeline_memory"].items():
                if v.get("phases"):
                    md.append(f"- {k}, per phase (GiB allocated at start → peak): " + ", ".join(
                        f"{ph} {d['start_bytes'] / 2**30:.2f} → {d['peak_bytes'] / 2**30:.2f}"
                        for ph, d in v["phases"].items() if d.get("start_bytes") is not None and d.get("peak_bytes")))
        md.append("")
    md += [_env_md(env), ""]
    write_results(name or "speed", results, "\n".join(md), out)


# ================================================================================================== CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sixbit.bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality", help="ablation quality table on sixbit-mini")
    q.add_argument("--model", default=None, help="pipeline folder or hub id (default: the embedded sixbit-mini)")
    q.add_argument("--prompts", type=int, default=12, help="number of evaluation prompts (in-grammar)")
    q.add_argument("--seeds", type=int, default=2)
    q.add_argument("--steps", type=int, default=None, help="override num_inference_steps")
    q.add_argument("--configs", nargs="*", choices=QUALITY_CONFIGS)
    q.add_argument("--tdc-threshold", type=float, default=None, help="override for every configuration with TDC")
    q.add_argument("--tdc-budget", type=float, default=None, help="override for every configuration with TDC")
    q.add_argument("--pdr-rho", type=float, default=None,
                   help="PDR's outlier-ratio threshold ρ for every configuration with PDR (default: the policy's)")
    q.add_argument("--device", default=None)
    q.add_argument("--out", default=str(RESULTS))
    q.add_argument("--name", default=None)
    s = sub.add_parser("speed", help="speed and memory at real CogVideoX sizes (GPU)")
    s.add_argument("--sizes", nargs="+", default=["2b"], choices=["tiny", "2b", "5b"])
    s.add_argument("--steps", type=int, default=50)
    s.add_argument("--frames", type=int, default=49)
    s.add_argument("--height", type=int, default=480)
    s.add_argument("--width", type=int, default=720)
    s.add_argument("--configs", nargs="*", choices=SPEED_CONFIGS)
    s.add_argument("--schedule", default=str(RESULTS / "schedule_mini.json"))
    s.add_argument("--pipeline-memory", action="store_true")
    s.add_argument("--record-schedule", default=None, metavar="MODEL",
                   help="first record the full method's skip schedule on MODEL (a sixbit-mini folder) and replay it")
    s.add_argument("--tdc-threshold", type=float, default=None, help="override for --record-schedule")
    s.add_argument("--tdc-budget", type=float, default=None, help="override for --record-schedule")
    s.add_argument("--device", default=None)
    s.add_argument("--out", default=str(RESULTS))
    s.add_argument("--name", default=None)
    w = sub.add_parser("weights", help="transformer weight bytes at real sizes (CPU, random weights)")
    w.add_argument("--sizes", nargs="+", default=["2b", "5b"], choices=["2b", "5b", "t5xxl"],
                   help="t5xxl: CogVideoX's text encoder (T5-XXL encoder) under sixbit.quantize_text_encoder")
    w.add_argument("--out", default=str(RESULTS))
    w.add_argument("--name", default=None)
    r = sub.add_parser("render", help="re-render the markdown table of a speed JSON file")
    r.add_argument("json", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "render":
        _write_speed(json.loads(args.json.read_text()), args.json.parent, args.json.stem)
        return 0
    if args.cmd == "weights":
        weights(args)
        return 0
    if args.cmd == "quality":
        quality(args)
    else:
        if args.schedule and not Path(args.schedule).exists():
            print(f"note: no schedule at {args.schedule}; TDC configurations decide on their own", flush=True)
            args.schedule = None
        speed(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
