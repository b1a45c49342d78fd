"""The peer arena's GPU half: what a computed and a skipped unit cost at CogVideoX sizes, per tool.

    python -m benchmarks.peers speed --sizes 2b --out $OUT          # H200: ~8-20 s per family at 2B
    python -m benchmarks.peers speed --sizes 5b --families baseline fbc ... --name peers_speed_h200_5b_a --out $OUT
    python -m benchmarks.peers speed --sizes tiny --device cpu      # smoke test of the code path

At 5B (~3× the time of 2B) the families do not fit one 10-minute call: split them with ``--families`` and a
``--name`` per call (include ``baseline`` in each: a row's speed-up is taken against the baseline its own run
timed); ``python -m benchmarks.peers report`` merges every ``peers_speed_*.json`` (docs/PEERS.md has the calls).

Random weights make every cache's decisions meaningless, so no row decides at the big size. One transfer
protocol for every caching row, sixbit's included (:data:`PROTOCOL`):

1. A *unit* is one block's attention for one CFG row — what :class:`~benchmarks.peers_rows.WorkCounter`
   counts on sixbit-mini; a CFG-batched step that computes everything runs ``U_full = 2 × blocks`` units.
2. Per tool (a *family*: a cache's threshold sweep shares its costs), at the big size: the tool with its knob
   forced to compute every unit (``ctx.mode="compute"``), then forced to skip every unit it can
   (``"skip"``). Each mode: untimed calls of ``--timed-steps`` steps until one compiles nothing (at most
   :data:`WARMUP_CALLS`; they warm every kernel that mode runs, Triton compiles and torch.compile included),
   then a timed call of the same length with a synchronizing step callback (per-step times) and the counter.
   Each mode records the warm-up's wall time (``warmup_s``: compilation lands there), its calls, and the frames
   TorchDynamo compiled in the warm-up and in the timed call (``compiles_warmup``, ``compiles_timed``; the
   latter 0 means no compile was timed). A compiled block that hits Dynamo's recompile limit fails its row
   (``fail_on_recompile_limit_hit``) instead of running eager unnoticed. ``T_full`` = median
   step time of the compute call; ``T_skip`` = median over the skip call's steps that ran its minimum
   ``U_skip`` units; ``saving per unit = (T_full − T_skip) / (U_full − U_skip)``.
3. A row's estimated 50-step denoising loop = Σ_t [T_full − saving × U_full × (1 − c_t)], with c_t the row's
   mean computed fraction at the same relative step on sixbit-mini (``per_step_computed`` of
   ``peers_mini_<steps>.json``, from the 50-step run when there is one). The baseline is 50 × T_full of the
   bf16 diffusers row; speed-up = baseline / estimate. Rows without a cache: 50 × their T_full.

sixbit's forced modes are skip schedules (all computed, with the routes recorded on sixbit-mini for DMPQ
rows; all skipped), replayed through ``sixbit.apply(..., schedule=...)``, with what depends on the step count
resolved for the ``--steps`` loop (``tdc_reuse="auto"``: the second-order forecast at 50 steps — its two extra
delta sets are in the peak, its three-term forecast in ``T_skip`` — the magnitude forecast at 20 — not the few
timed steps' own resolution). The report takes a quality table's sixbit families from a run at that table's
step count when there is one (``--steps 20`` for the 20-step table), else from the 50-step run. The
denoising loop is timed with ``output_type="latent"`` and precomputed random prompt embeddings (the text encoder
is not the subject).
Results: ``peers_speed_<device>.{json,md}``; one JSON per size × family under ``--run-dir`` is reused on a
re-run, so an interrupted run resumes where it stopped (and one JSON per forced mode, so a compiled family whose
two modes outlast one call resumes at its second mode).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from benchmarks.peers_rows import ROWS, Ctx, WorkCounter, weight_bytes

PROTOCOL = ("a unit = one block's attention for one CFG row (the counter of the mini run); per tool at the big "
            "size, its knob forced to compute every unit and to skip every unit it can, each mode warmed by an "
            "identical untimed call; saving per skipped unit = (T_full − T_skip) / (U_full − U_skip) from median "
            "step times; a row's 50-step loop = Σ_t T_full − saving · U_full · (1 − c_t) with c_t its computed "
            "fraction at the same relative step on sixbit-mini; speed-up vs 50 × T_full of the bf16 baseline; sixbit's "
            "step-count-dependent options (tdc_reuse='auto') resolved for the run's --steps loop.")

#: one representative row per family (its documented setting); the order the GPU run takes them in
DEFAULT_FAMILIES = ("baseline", "fbc", "taylorseer", "magcache", "fastercache", "pab", "dbcache", "dbcache_ts",
                    "torchao_int8", "torchao_fp8", "sage", "stack_fbc_int8", "stack_dbcache_int8", "stack_fbc_fp8",
                    "stack_fbc_fp8_sage", "sixbit_tdc_only", "sixbit_full", "sixbit_full_w8a8", "sixbit_w8a8_tdc",
                    "sixbit_aggressive", "sixbit_full_mod4", "sixbit_aggressive_mod4", "torchao_fp8_compile",
                    "torchao_int8_compile",
                    "stack_fbc_fp8_compile",
                    "sixbit_tdc_attn", "sixbit_fast", "sixbit_tdc_q2", "sixbit_tdc_auto")


def add_arguments(p) -> None:
    p.add_argument("--sizes", nargs="+", default=["2b"], choices=["tiny", "2b", "5b"])
    p.add_argument("--families", nargs="*", default=None, choices=DEFAULT_FAMILIES, metavar="FAMILY",
                   help=f"default: {' '.join(DEFAULT_FAMILIES)}")
    p.add_argument("--steps", type=int, default=50, help="steps of the estimated denoising loop")
    p.add_argument("--timed-steps", type=int, default=4, help="steps per timed call (and per warm-up call)")
    p.add_argument("--frames", type=int, default=49)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=720)
    p.add_argument("--quality", default=None, help="peers_mini_<steps>.json holding sixbit's recorded schedules")
    p.add_argument("--device", default=None)
    p.add_argument("--run-dir", default=None, help="per size × family JSON cache (default: $TMPDIR/sixbit-peers/speed)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    p.add_argument("--name", default=None)


def resample(pattern: list[float], steps: int) -> list[float]:
    """Nearest-neighbour resampling of a per-step pattern to ``steps`` steps (same relative position)."""
    n = len(pattern)
    return [pattern[min(n - 1, int((t + 0.5) * n / steps))] for t in range(steps)]


def family_row(family: str):
    return next(r for r in ROWS.values() if r.family == family)


def _call(pipe, size: str, args, device, dtype) -> dict:
    tr = pipe.transformer.config
    if size == "tiny":
        h, w, f, seq = 64, 64, 9, tr.max_text_seq_length
    else:
        h, w, f, seq = args.height, args.width, args.frames, 226
    g = torch.Generator("cpu").manual_seed(0)
    emb = [torch.randn(1, seq, tr.text_embed_dim, generator=g).to(device, dtype) for _ in range(2)]
    return dict(prompt_embeds=emb[0], negative_prompt_embeds=emb[1], height=h, width=w, num_frames=f,
                guidance_scale=6.0, output_type="latent")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(pipe, call: dict, steps: int, device) -> tuple[list[float], list[int]]:
    marks: list[float] = []

    def cb(p, i, t, kw):
        _sync(device)
        marks.append(time.perf_counter())
        return {}

    with WorkCounter(pipe.transformer) as wc:
        _sync(device)
        t0 = time.perf_counter()
        pipe(**call, num_inference_steps=steps, generator=torch.Generator("cpu").manual_seed(0), callback_on_step_end=cb)
    edges = [t0, *marks]
    return [b - a for a, b in zip(edges, edges[1:])], [sum(s) for s in wc.steps]


#: warm-up calls at most per forced mode (a call that compiles nothing ends the warm-up)
WARMUP_CALLS = 3


def _compiles() -> int:
    """Frames torch.compile has compiled in this process so far (TorchDynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def _measure_mode(row, mode, size: str, args, device, dtype, schedules: dict) -> dict[str, Any]:
    """One forced mode of one row on a fresh random-weight pipeline: warm-up call, then the timed call."""
    from benchmarks.common import random_cogvideox

    torch._dynamo.reset()  # a mode compiles from scratch: no earlier row's graphs or recompile count carry over
    pipe = random_cogvideox(size, device, dtype, text_encoder=False)
    call = _call(pipe, size, args, device, dtype)
    nb = len(pipe.transformer.transformer_blocks)
    undo = row.apply(pipe, Ctx(args.timed_steps, device, mode=mode, schedule=schedules.get(row.name), num_blocks=nb,
                         loop_steps=args.steps))
    try:
        # a compiled block that hits Dynamo's recompile limit would run eager, silently: fail the row instead
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            rec: dict[str, Any] = {"weight_bytes": weight_bytes(pipe)}
            # warm-up: the same call, untimed, until one compiles nothing (torch.compile runs here; a cache's hooks
            # under compile add a variant in the second call, when their state first starts from a reset)
            c0, t0 = _compiles(), time.perf_counter()
            for rec["warmup_calls"] in range(1, WARMUP_CALLS + 1):
                c = _compiles()
                _timed(pipe, call, args.timed_steps, device)
                if _compiles() == c:
                    break
            c1 = _compiles()
            rec["warmup_s"], rec["compiles_warmup"] = time.perf_counter() - t0, c1 - c0
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            rec["step_s"], rec["units"] = _timed(pipe, call, args.timed_steps, device)
            rec["compiles_timed"] = _compiles() - c1  # 0 unless a guard failed: the timing would hold a compile
            if device.type == "cuda":
                rec["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(device))
            return rec
    finally:
        undo()


def measure_family(family: str, size: str, args, device, dtype, schedules: dict,
                   run: Path | None = None) -> dict[str, Any]:
    """Both forced modes of a family (one for a row without a cache); with ``run``, each mode's record is kept
    there as it finishes and reused (a compiled family's two modes can outlast one 10-minute call)."""
    import gc

    row = family_row(family)
    modes = ("compute", "skip") if row.caching else (None,)
    entry: dict[str, Any] = {"row": row.name, "label": row.label, "caching": row.caching, "modes": {}}
    for mode in modes:
        gc.collect()  # the previous mode's pipeline must be gone before this one is built (peak memory)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        part = run / f"{size}__{family}__{mode}.json" if run else None
        if part and part.exists():
            rec = json.loads(part.read_text())
        else:
            rec = _measure_mode(row, mode, size, args, device, dtype, schedules)
            if part:
                part.write_text(json.dumps(rec))
        entry["modes"][str(mode)] = rec
        entry["weight_bytes"] = rec.pop("weight_bytes")
    full = entry["modes"]["compute" if row.caching else "None"]
    entry["units_full"] = int(statistics.median(full["units"]))
    entry["t_full_s"] = statistics.median(full["step_s"][1:] or full["step_s"])
    entry["saving_per_unit_s"] = 0.0
    if row.caching:
        sk = entry["modes"]["skip"]
        u_min = min(sk["units"][1:] or sk["units"])
        entry["units_skip"] = u_min
        entry["t_skip_s"] = statistics.median([t for t, u in zip(sk["step_s"], sk["units"]) if u == u_min])
        if entry["units_full"] > u_min:
            entry["saving_per_unit_s"] = (entry["t_full_s"] - entry["t_skip_s"]) / (entry["units_full"] - u_min)
    for k in ("warmup_s", "compiles_warmup", "compiles_timed"):  # per family: the sum over its modes
        entry[k] = sum(m[k] for m in entry["modes"].values())
    peaks = [m["peak_mem_bytes"] for m in entry["modes"].values() if "peak_mem_bytes" in m]
    if peaks:
        entry["peak_mem_bytes"] = max(peaks)
    return entry


def _schedules(path: str | None) -> dict:
    results = Path(__file__).resolve().parent / "results"
    cands = [Path(path)] if path else [results / "peers_mini_20.json", results / "peers_mini_50.json"]
    out = {}
    for p in (p for p in cands if p.exists()):  # per row, the last file that recorded one (50 steps first)
        out.update({n: r["schedule"] for n, r in json.loads(p.read_text())["rows"].items() if r.get("schedule")})
    return out


def speed(args) -> dict:
    from benchmarks.peers import environment

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    families = args.families or [f for f in DEFAULT_FAMILIES if device.type == "cuda" or not family_row(f).gpu_only]
    run = Path(args.run_dir or Path(tempfile.gettempdir()) / "sixbit-peers" / "speed")
    run.mkdir(parents=True, exist_ok=True)
    schedules = _schedules(args.quality)
    results: dict[str, Any] = {"benchmark": "peers_speed", "environment": environment(device), "protocol": PROTOCOL,
                               "steps": args.steps, "timed_steps": args.timed_steps, "models": {}}
    name = args.name or f"peers_speed_{'h200' if 'H200' in results['environment'].get('gpu', '') else device.type}"
    for size in args.sizes:
        model = results["models"].setdefault(size, {"families": {}})
        for fam in families:
            cache = run / f"{size}__{fam}.json"
            if cache.exists():
                entry = json.loads(cache.read_text())
            else:
                t0 = time.perf_counter()
                try:
                    entry = measure_family(fam, size, args, device, dtype, schedules, run)
                except Exception as e:  # a tool that cannot run here: its one-line reason
                    import traceback

                    entry = {"row": family_row(fam).name, "error": f"{type(e).__name__}: {e}"[:300],
                             "traceback": traceback.format_exc()[-2000:]}
                entry["wall_s"] = time.perf_counter() - t0
                cache.write_text(json.dumps(entry))
            model["families"][fam] = entry
            print(f"[peers speed {size}] {fam}: " + json.dumps({k: entry.get(k) for k in (
                "t_full_s", "t_skip_s", "units_full", "units_skip", "saving_per_unit_s", "peak_mem_bytes", "error")}),
                flush=True)
            _write(results, Path(args.out), name)
    return results


def _opt(x, fmt: str = "") -> str:
    """A value older result files lack (warm-up time, compile counts) as "—"."""
    return "—" if x is None else format(x, fmt)


def _write(results: dict, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
    env = results["environment"]
    md = ["# Peer arena: unit costs at CogVideoX sizes (random weights)", "", "Protocol: " + results["protocol"], "",
          f"Timed calls of {results['timed_steps']} steps after an identical warm-up call. *warm-up s*: the untimed "
          "calls' wall time, summed over the family's modes (torch.compile and Triton compile there); *compiles*: "
          "frames TorchDynamo compiled in those calls / in the timed calls (0: no compile was timed).", ""]
    for size, m in results["models"].items():
        md += [f"## {size}", "", "| family (row) | T_full ms | T_skip ms | U_full | U_skip | saving/unit ms | "
               "peak GiB | weights GiB | warm-up s | compiles: warm-up / timed |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for fam, e in m["families"].items():
            if "error" in e:
                md.append(f"| {fam} ({e['row']}) | cannot run: {e['error'][:150]} | | | | | | | | |")
                continue
            skip = f"{e['t_skip_s'] * 1e3:.0f}" if "t_skip_s" in e else "—"
            md.append(f"| {fam} ({e['row']}) | {e['t_full_s'] * 1e3:.0f} | {skip} | {e['units_full']} | "
                      f"{e.get('units_skip', '—')} | {e['saving_per_unit_s'] * 1e3:.2f} | "
                      f"{e.get('peak_mem_bytes', 0) / 2**30:.2f} | {e['weight_bytes'] / 2**30:.2f} | "
                      f"{_opt(e.get('warmup_s'), '.1f')} | {_opt(e.get('compiles_warmup'))} / {_opt(e.get('compiles_timed'))} |")
        md.append("")
    md += ["- " + "\n- ".join(f"{k}: `{v}`" for k, v in env.items() if v is not None and k != "command"),
           f"- command: `{env['command']}`", ""]
    (out / f"{name}.md").write_text("\n".join(md))


def weights(args) -> dict:
    """Transformer weight bytes at real sizes of the rows that change weights and run on the CPU (torchao
    int8), beside the bf16 model: a random-weight transformer built in bf16 on the CPU, as
    ``python -m benchmarks weights`` does for sixbit's rows (the byte count does not depend on the values or
    the device). fp8 and sixbit's GPU rows are measured by ``speed`` on the device."""
    from diffusers import CogVideoXTransformer3DModel

    from benchmarks.common import SIZES
    from benchmarks.peers import environment

    out: dict[str, Any] = {"benchmark": "peers_weights", "environment": environment("cpu"), "models": {}}
    for size in args.sizes:
        for name in ("baseline", "torchao_int8"):
            prev = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                torch.manual_seed(0)
                tr = CogVideoXTransformer3DModel(**SIZES[size]).to(torch.bfloat16).eval()
            finally:
                torch.set_default_dtype(prev)
            pipe = SimpleNamespace(transformer=tr)
            ROWS[name].apply(pipe, Ctx(1, torch.device("cpu")))
            out["models"].setdefault(size, {})[name] = {"weight_bytes": weight_bytes(pipe),
                                                        "params": sum(p.numel() for p in tr.parameters())}
            print(f"[peers weights {size}] {name}: {weight_bytes(pipe) / 2**30:.3f} GiB", flush=True)
            del pipe, tr
    path = Path(args.out) / "peers_weights_cpu.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    path.with_suffix(".md").write_text(weights_markdown(out))
    return out


def weights_markdown(out: dict) -> str:
    md = ["# Peer weight bytes at real CogVideoX sizes (CPU, random bf16 weights)", "",
          "| model | row | transformer weights GiB |", "|---|---|---|"]
    md += [f"| CogVideoX-{size.upper()} | {'bf16 model, no tool' if n == 'baseline' else ROWS[n].label} | "
           f"{e['weight_bytes'] / 2**30:.3f} |" for size, rows in out["models"].items() for n, e in rows.items()]
    md += ["", "sixbit's rows at the same sizes: `benchmarks/results/weights.md` (`python -m benchmarks weights`).", "",
           "- " + "\n- ".join(f"{k}: `{v}`" for k, v in out["environment"].items() if v is not None), ""]
    return "\n".join(md)
