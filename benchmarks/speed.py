"""Speed and memory at real CogVideoX sizes (GPU): ``python -m benchmarks speed``.

On a GPU at real CogVideoX sizes with random weights (49 frames 480×720, CFG batched, 50 steps): the bf16
diffusers baseline and each configuration, all in one run, timed over the denoising loop
(``output_type="latent"``) with per-step times, plus peak memory and the transformer's resident weight
bytes. Random weights make TDC's and DMPQ's own decisions meaningless, so the configurations with TDC
replay the schedule recorded on sixbit-mini with the full method (``--schedule``, written by
``python -m benchmarks quality``; or ``--record-schedule`` first) — which blocks were skipped and, for DMPQ
configurations, each computed block's routes (NVFP4/INT8/16-bit) and attention route (8-bit or bf16;
schedule format 3) — resampled to the model's depth and step count; the tables say so. The method rows
(``full``, ``full_w8a8``) route attention by the policy, which on random weights means the replayed
routes (a schedule without attention routes: bf16 everywhere, said in the table); ``full_bf16attn`` and
``full_w8a8_bf16attn`` are the same rows with bf16 attention, so one run gives the attention's share.
``sixbit.apply`` compiles every kernel configuration first (``kernels_compiled_s``, sixbit/warmup.py),
and the identical untimed warm-up loop then meets every route, attention route and shape once more. Whole-pipeline memory (text encoder + transformer + VAE decode) is
``python -m benchmarks memory``. ``--render FILE`` re-renders the markdown of a result JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import (
    LABELS,
    RESULTS,
    compile_log,
    env_md,
    environment,
    events_by_step,
    gc_log,
    make_config,
    module_bytes,
    num_blocks,
    parse,
    random_cogvideox,
    resident_weight_bytes,
    speed_call,
    sync,
    tdc_overrides,
    write_results,
)

SPEED_CONFIGS = ("bf16", "bf16_fast_attn", "w8a8", "w4a4", "dmpq_only", "tdc_only", "dmpq_tdc", "full", "w8a8_tdc",
                 "full_stream", "full_w8a8", "full_bf16attn", "full_w8a8_bf16attn",
                 # TDC's attention scope (tdc_scope="attention"): replay a schedule recorded with it
                 "tdc_attn", "full_attn", "w8a8_tdc_attn", "full_w8a8_attn",
                 # full_w8a8 with after-skip attention by the stale Γ (docs/ATTENTION.md): replay its own schedule
                 "fast",
                 # the same with a cached Δ per block instead of the span's residual (tdc_store="blocks")
                 "full_blocks", "fast_blocks", "tdc_only_blocks",
                 # the block's delta instead of its gated pieces (tdc_regate="off"; the defaults regate below 40 steps)
                 "tdc_only_noregate", "full_noregate", "fast_noregate",
                 # the full method without its two full-precision warm-up steps (warmup_steps=0)
                 "full_nowarmup",
                 # the INT8 decisions (and, with nvfp4_route="auto", the NVFP4 ones) on the int8 tensor cores from
                 # the resident 4-bit weights, re-quantized per call (int8_route="w4a8_requant")
                 "full_requant", "full_requant_auto", "fast_requant",
                 # the paper's routes W4A4 / W4A8 (the default routes until session 34)
                 "full_w4a8")
#: speed rows without the engine: the bf16 baseline with only sixbit's attention processor
#: (``sixbit.attention``, what ``fast_qk_norm`` installs), so a table can separate the method's speed-up
#: from that engineering's
ENGINEERING_ONLY = ("bf16_fast_attn",)


def _run_denoise(pipe, call: dict, steps: int, device, marks: list[float] | None = None) -> tuple[float, list[float], float]:
    """Time one denoising loop (latent output): ``(total s, per-step s, set-up s)``. The loop starts at the
    transformer's first call (a synchronizing forward pre-hook): what the pipeline does before it — the text
    encoder, latents, rotary tables — is the set-up, in the total but not in step 0. Per-step times come from a
    synchronizing step callback (``marks``, when given, receives the loop's start and every step's end,
    ``time.perf_counter``)."""
    marks = [] if marks is None else marks

    def cb(p, i, t, kw):
        sync(device)
        marks.append(time.perf_counter())
        return {}

    def first_call(module, args):
        if not marks:
            sync(device)
            marks.append(time.perf_counter())

    sync(device)
    t0 = time.perf_counter()
    hook = pipe.transformer.register_forward_pre_hook(first_call)
    try:
        pipe(**call, num_inference_steps=steps, output_type="latent", callback_on_step_end=cb)
    finally:
        hook.remove()
    sync(device)
    total = time.perf_counter() - t0
    return total, [b - a for a, b in zip(marks, marks[1:])], marks[0] - t0



#: a timed step slower than this × the median of its kind (same number of computed block evaluations, same
#: precision) is reported: a first-use compile or another one-off inside the timed loop
STEP_OUTLIER_RATIO = 1.2


def step_kinds(trace: dict | None, n_steps: int) -> list[int | str]:
    """Per step, its kind: the number of block evaluations computed in it (all branches) — from a sixbit
    trace; without one (the bf16 rows) every step computes everything and is of one kind. A cell of TDC's
    attention scope that reused its attention (computed *and* skipped) is not counted: it costs a fraction
    of a computed one. A full-precision step — every linear it ran on the 16-bit route (DMPQ's first steps,
    which have no Γ yet) — is a kind of its own, ``"<n> at 16 bits"``: it does other work than a quantized
    step computing as many blocks, by design, not by a one-off."""
    if trace is None:
        return [0] * n_steps
    kinds: list[int | str] = []
    for st in trace["steps"][:n_steps]:
        branches = [st, *(st.get("other_branches") or {}).values()]
        n = sum(1 for br in branches for b in br.get("blocks", []) if b and b.get("computed") and not b.get("skipped"))
        ran = [r for br in branches for r in br.get("routes") or [] if r not in (None, "skipped")]
        kinds.append(f"{n} at 16 bits" if ran and all(r == "fp16" for r in ran) else n)
    return kinds + [0] * (n_steps - len(kinds))


def step_outliers(step_s: list[float], kinds: list[int | str], ratio: float = STEP_OUTLIER_RATIO) -> dict[str, Any]:
    """Steps slower than ``ratio`` × the median step of their kind: ``{"ratio", "worst", "outliers":
    [{"step", "kind", "s", "median_s"}], "kinds"}`` (``worst``: the largest step / median-of-its-kind)."""
    by_kind: dict[int | str, list[float]] = {}
    for t, k in zip(step_s, kinds):
        by_kind.setdefault(k, []).append(t)
    med = {k: float(np.median(v)) for k, v in by_kind.items()}
    worst, found = 0.0, []
    for i, (t, k) in enumerate(zip(step_s, kinds)):
        r = t / med[k] if med[k] > 0 else 1.0
        worst = max(worst, r)
        if r > ratio:
            found.append({"step": i, "kind": k, "s": t, "median_s": med[k]})
    return {"ratio": ratio, "worst": worst, "outliers": found, "kinds": list(kinds)}


def speed(args) -> dict:
    import sixbit
    from sixbit import attention
    from sixbit.adapters import get_adapter
    from sixbit.linear import ops
    from sixbit.tdc import SkipSchedule

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    results: dict[str, Any] = {"benchmark": "speed", "environment": environment(device, args.command), "models": {}}
    out = Path(args.out)
    if args.record_schedule:
        args.schedule = str(record_schedule(args.record_schedule, device, out, args.tdc_threshold, args.tdc_budget,
                                            config=args.record_config, steps=args.record_steps))
    sched = SkipSchedule.load(args.schedule) if args.schedule else None
    configs = args.configs or SPEED_CONFIGS
    row_paths = row_schedules(getattr(args, "row_schedule", None), configs)
    row_sched = {n: SkipSchedule.load(path) for n, path in row_paths.items()}
    # a schedule replays only under the scope it was recorded with (whole blocks / attention)
    wrong = []
    for n in configs:
        if n in ("bf16", *ENGINEERING_ONLY):
            continue
        cfg, replays = make_config(n), row_sched.get(n, sched)
        if cfg.tdc and replays is not None and cfg.tdc_scope != replays.scope:
            wrong.append((n, row_paths.get(n, args.schedule)))
    if wrong:
        raise SystemExit("these --configs have another tdc_scope than the schedule they would replay: "
                         + ", ".join(f"{n} ({path})" for n, path in wrong)
                         + " (give them a schedule of their scope with --row-schedule CONFIG=PATH)")
    results["schedule"] = schedule_info(args.schedule, sched)
    results["row_schedules"] = {n: schedule_info(row_paths[n], s_) for n, s_ in row_sched.items()}
    for size in args.sizes:
        t_build = time.perf_counter()
        pipe = random_cogvideox(size, device, dtype, text_encoder=True)
        build_s = time.perf_counter() - t_build
        call = speed_call(size, args.height, args.width, args.frames)
        tr = pipe.transformer
        bf16_weight_bytes = module_bytes(tr)
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
                    installed = attention.install(get_adapter(tr).blocks(tr), ops())
                    entry["compute_path"] = ops().compute_path(device) + " (attention processor only)"
                elif name != "bf16":
                    cfg = make_config(name)
                    row = row_sched.get(name, sched)
                    use_sched = row is not None and cfg.tdc
                    handle = sixbit.apply(pipe, cfg, schedule=row.resample(num_blocks(tr), args.steps)
                                          if use_sched else None)
                    entry["schedule_replayed"] = bool(use_sched)
                    if use_sched:
                        entry["schedule"] = row_paths.get(name, args.schedule)
                    entry["compute_path"] = handle.trace.to_dict().get("compute_path")
                    entry["kernels_compiled_s"] = handle.kernels_compiled_s
                # warm-up (Triton compilation, the kernels' load-time self-check, cuDNN plans): an
                # identical untimed loop, so every route × shape the timed loop meets has run once
                t_warm = time.perf_counter()
                _run_denoise(pipe, call, args.steps if args.warmup_steps is None else args.warmup_steps, device)
                entry["warmup_s"] = time.perf_counter() - t_warm
                if device.type == "cuda":
                    # no empty_cache(): it would hand the warm-up's blocks back to the driver, and the first
                    # timed step would pay the cudaMalloc calls again (session 11: step 0 at 1.18-1.24x in
                    # every row, the bf16 baseline's included); the peak below counts allocated bytes
                    torch.cuda.reset_peak_memory_stats(device)
                marks: list[float] = []
                with compile_log() as compiled, gc_log() as paused:
                    total, steps, setup = _run_denoise(pipe, call, args.steps, device, marks)
                entry.update(denoise_s=total, setup_s=setup, step_s=steps, step_median_s=float(np.median(steps)),
                             compiles_timed=events_by_step(compiled, marks),
                             gc_pauses_timed=events_by_step(paused, marks))
                trace = handle.trace.to_dict() if handle is not None else None
                entry["step_check"] = step_outliers(steps, step_kinds(trace, len(steps)))
                if device.type == "cuda":
                    entry["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
                if handle is not None:
                    summ = handle.trace.summary()
                    entry.update(avg_act_bits=summ["avg_act_bits"], skip_fraction=summ["skip_fraction"],
                                 pdr_count=summ["pdr_count"], route_counts=summ["route_counts"],
                                 attention_fp8=summ["attention_fp8_fraction"],
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
            render(results, out, args.name)
        del pipe
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def row_schedules(specs: list[str] | None, configs) -> dict[str, str]:
    """``--row-schedule CONFIG=PATH`` → ``{config: path}``: the schedule that row replays instead of
    ``--schedule`` (rows of another TDC scope or recorded with another option, in the same run)."""
    rows: dict[str, str] = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            raise SystemExit(f"--row-schedule {spec!r}: expected CONFIG=PATH")
        if name not in configs:
            raise SystemExit(f"--row-schedule {spec!r}: {name!r} is not one of --configs ({', '.join(configs)})")
        if not Path(path).exists():
            raise SystemExit(f"--row-schedule {spec!r}: no schedule file at {path}")
        rows[name] = path
    return rows


def schedule_info(path: str | None, sched) -> dict[str, Any]:
    """What a result file records of a replayed schedule."""
    return {"path": path, "source": sched.source if sched else None,
            "skip_fraction": sched.skip_fraction if sched else None,
            "route_fractions": sched.route_fractions if sched else None,
            "attention_fp8_fraction": sched.attention_fp8_fraction if sched else None}


def record_schedule(model: str, device, out: Path, tdc_threshold: float | None, tdc_budget: float | None, *,
                    config: str = "full", steps: int | None = None) -> Path:
    """Run sixbit-mini (or ``model``) once with the full method (or the row ``config``; ``steps`` denoising steps,
    default sixbit-mini's) and save its skip pattern for replay.

    The torch reference backend in fp32 is used so the decisions are those of the CPU demo."""
    import sixbit
    from sixbit.mini import DEFAULT_GENERATION, EXAMPLE_PROMPTS

    pipe = sixbit.load_pipeline(model, device=device, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    overrides = tdc_overrides(tdc_threshold, tdc_budget)
    cfg = make_config(config, backend="torch", **overrides)
    gen = {**DEFAULT_GENERATION, **({} if steps is None else {"num_inference_steps": steps})}
    handle = sixbit.apply(pipe, cfg)
    try:
        pipe(prompt=EXAMPLE_PROMPTS[0], generator=torch.Generator("cpu").manual_seed(0), output_type="latent", **gen)
        sched = handle.trace.skip_schedule()
        summ = handle.trace.summary()
    finally:
        handle.remove()
    sched.source.update(model="sixbit-mini" if model in (None, "", "mini") else str(model), preset=config,
                        overrides=overrides, generation=gen, prompt=EXAMPLE_PROMPTS[0], seed=0,
                        avg_act_bits=summ["avg_act_bits"], device=str(device))
    out.mkdir(parents=True, exist_ok=True)
    path = sched.save(out / ("schedule_mini.json" if config == "full" and steps is None
                             else f"schedule_mini_{config}_{gen['num_inference_steps']}.json"))
    print(f"recorded skip schedule: skip {sched.skip_fraction:.1%}, {summ['avg_act_bits']:.2f} act bits → {path}",
          flush=True)
    del pipe
    return path


def _route_note(sched: dict | None) -> str:
    fr = (sched or {}).get("route_fractions")
    if not fr:
        return "when the schedule holds them (this one does not: DMPQ routed by Γ of the random weights)"
    return ("recorded as " + ", ".join(f"{fr[r]:.0%} {r.upper() if r != 'fp16' else '16-bit'}"
                                        for r in ("nvfp4", "int8", "fp16")) + " of the linear evaluations")


def _attention_note(sched: dict | None) -> str:
    fr = (sched or {}).get("attention_fp8_fraction")
    if fr is None:
        return ("This schedule records no attention routes (format < 3): every attention runs bf16, so the "
                "*8-bit attn* column is 0 % and the `*_bf16attn` rows equal their pairs.")
    return f"The schedule's attention routes: {fr:.0%} of the computed block evaluations 8-bit (replayed)."


def _check_cell(check: dict | None, compiles: list | None = None, pauses: list | None = None) -> str:
    if not check:
        return "—"
    bad = check["outliers"]
    cell = f"{check['worst']:.2f}" + (f" ⚠ {len(bad)} step(s) > {check['ratio']}×" if bad else "")
    if compiles:  # Triton compiles inside the timed loop (None: not recorded; []: none)
        steps = sorted({c["step"] for c in compiles})
        cell += f" · {len(compiles)} Triton compile(s) timed, step(s) {', '.join(map(str, steps))}"
    if pauses:  # garbage-collector pauses ≥ 10 ms inside the timed loop
        cell += " · GC " + ", ".join(f"{p['s'] * 1e3:.0f} ms at step {p['step']}" for p in pauses)
    return cell


def _fmt_s(v) -> str:
    return "—" if v is None else f"{v:.1f}"


def render(results: dict, out: Path, name: str | None) -> None:
    """Write ``<name>.json`` and the markdown table rendered from it (``--render FILE`` re-renders a JSON
    file with the current renderer)."""
    env = results["environment"]
    md = ["# Speed and memory at real CogVideoX sizes (random weights)", "",
          "Denoising loop only (`output_type=\"latent\"`), CFG batched, after an identical untimed warm-up loop (unless `--warmup-steps` says otherwise); before the timed loop the Python heap is collected and frozen (`gc.freeze`); step 0 starts at the transformer's first call (the pipeline's set-up before it — text encoder, latents — is in *denoise s*, not in a step), and the *slowest step* column names every Triton compile and every garbage-collector pause ≥ 10 ms inside it (a step's kind: how many block evaluations it computed; full-precision steps — every linear at 16 bits, DMPQ's warm-up — are a kind apart). Random weights "
          "make TDC's own decisions meaningless: configurations with TDC **replay the skip schedule recorded on "
          "sixbit-mini** with the full method (resampled to this depth and step count): which blocks are skipped "
          "and, for the DMPQ configurations, each computed block's routes (NVFP4 / INT8 / 16-bit for PDR), "
          f"{_route_note(results.get('schedule'))}. *peak GiB* is the allocator's peak over the denoising loop with the "
          "whole pipeline resident (the T5-XXL text encoder alone is 9.5 GB in bf16); TDC keeps one cached Δ per "
          "block and token stream, which is why configurations with TDC peak higher. *transformer weights* are "
          "the bytes the transformer keeps on the device: packed 4/8-bit weights plus the layers that stay 16-bit "
          "(embedders, norms, and by default the modulation linears). *8-bit attn*: share of computed block "
          "evaluations whose attention ran the FP8 kernel. " + _attention_note(results.get("schedule")), ""]
    for row, info in (results.get("row_schedules") or {}).items():
        md += [f"- `{row}` replays its own schedule `{Path(info['path']).name}` ({info['skip_fraction']:.0%} of the "
               f"block evaluations skipped; {_route_note(info)}; {_attention_note(info)})"]
    if results.get("row_schedules"):
        md += [""]
    for size, rec in results["models"].items():
        base = rec["configs"].get("bf16", {}).get("denoise_s")
        c = rec.get("call", {})
        md += [f"## CogVideoX-{size.upper()} — {c.get('num_frames')} frames {c.get('height')}×{c.get('width')}, "
               f"{rec['steps']} steps, {rec['transformer_params'] / 1e9:.2f} B transformer parameters", "",
               "| configuration | denoise s | median step ms | speed-up | skipped | act bits | 8-bit attn | peak GiB | "
               "transformer weights GiB | slowest step ÷ its kind's median | kernels compiled s | path |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        bf16_w = rec["transformer_weight_bytes_bf16"]
        for e in rec["configs"].values():
            if "error" in e:
                md.append(f"| {e['label']} | error: {e['error'][:80]} | | | | | | | | | | |")
                continue
            sp = f"{base / e['denoise_s']:.2f}×" if base else "—"
            wb = resident_weight_bytes(e, rec)
            md.append(f"| {e['label']}{' (replayed schedule)' if e.get('schedule_replayed') else ''} | "
                      f"{e['denoise_s']:.1f} | {e['step_median_s'] * 1e3:.0f} | {sp} | "
                      f"{e.get('skip_fraction', 0):.0%} | {e.get('avg_act_bits', 16):.2f} | "
                      f"{e.get('attention_fp8', 0):.0%} | {e.get('peak_mem_bytes', 0) / 2**30:.2f} | "
                      f"{wb / 2**30:.2f} ({bf16_w / wb:.2f}× smaller) | {_check_cell(e.get('step_check'), e.get('compiles_timed'), e.get('gc_pauses_timed'))} | "
                      f"{_fmt_s(e.get('kernels_compiled_s'))} | "
                      f"{e.get('compute_path', 'torch bf16')} |")
        md.append("")
    md += [env_md(env), ""]
    write_results(name or "speed", results, "\n".join(md), out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["2b"], choices=["tiny", "2b", "5b"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="steps of the untimed warm-up loop (default: as many as the timed loop, so every "
                        "route and shape it meets is compiled and self-checked before timing)")
    p.add_argument("--frames", type=int, default=49)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=720)
    p.add_argument("--configs", nargs="*", choices=SPEED_CONFIGS)
    p.add_argument("--schedule", default=str(RESULTS / "schedule_mini.json"))
    p.add_argument("--row-schedule", nargs="*", default=None, metavar="CONFIG=PATH",
                   help="a row that replays another schedule than --schedule (e.g. tdc_attn=schedule_mini_50_attn.json)")
    p.add_argument("--record-schedule", default=None, metavar="MODEL",
                   help="first record the full method's skip schedule on MODEL (a sixbit-mini folder) and replay it")
    p.add_argument("--record-config", default="full", choices=SPEED_CONFIGS[2:],
                   help="the row --record-schedule records (default: full)")
    p.add_argument("--record-steps", type=int, default=None, help="denoising steps of --record-schedule (default: 20)")
    p.add_argument("--tdc-threshold", type=float, default=None, help="override for --record-schedule")
    p.add_argument("--tdc-budget", type=float, default=None, help="override for --record-schedule")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default=None)
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="only re-render the markdown table of a speed result file")
    p.add_argument("--nproc-per-node", type=int, default=1,
                   help="N > 1: 1-GPU vs N-GPU rows (CFG parallel) in one torchrun job (benchmarks.parallel)")
    args = parse(p, argv)
    if args.nproc_per_node > 1:
        from benchmarks.parallel import from_speed

        return from_speed(args)
    if args.render is not None:
        render(json.loads(args.render.read_text()), args.render.parent, args.render.stem)
        return 0
    if args.schedule and not Path(args.schedule).exists():
        print(f"note: no schedule at {args.schedule}; TDC configurations decide on their own", flush=True)
        args.schedule = None
    speed(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
