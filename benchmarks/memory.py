"""Whole-pipeline peak memory, split by phase: ``python -m benchmarks memory`` (the one place it is measured),
and the headroom against a ZeroGPU ``large`` slice (half an RTX Pro 6000 Blackwell: 48 GB).

Text encoder → 2 denoising steps → VAE decode to pixels, one row at a time, in a chosen order, on a
CogVideoX pipeline at real size with random weights; :class:`PhasePeaks` splits each row's peak into the
encode, denoise and decode phases. On the H200 rows run after others started with ~12 GiB more allocated
than their own components (something from an earlier row keeps device memory alive; not yet found — not a
reference cycle: a ``gc.collect()`` before each row did not free it), so the rows run in the order you
give, lean rows first by default, and the allocated bytes before each row are recorded. A row is clean
when its encode phase starts with only its own components resident (the text encoder for lean rows) —
check ``before_row_GiB`` and the encode ``start`` column. ::

    python -m benchmarks memory --sizes 2b 5b --out benchmarks/results/pipeline_memory_h200

Writes ``<out>_<size>.json`` and ``<out>_<size>.md`` per size. The ``app_bf16`` and ``app_balanced`` rows are
the demo's own loading (``sixbit.load_pipeline``: every component resident, the text encoder in bf16, the
VAE decoding untiled) running its baseline and its default preset; their peaks against :data:`SLICE_BYTES`
are the ZeroGPU fit (``allocated``: tensors; ``reserved``: what the caching allocator holds, the number
that has to fit, plus the CUDA context of ~0.5 GiB that neither counts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    RESULTS,
    environment,
    make_config,
    num_blocks,
    parse,
    random_cogvideox,
    speed_call,
    sync,
)
from sixbit.tdc import SkipSchedule

GiB = 2**30
#: a ZeroGPU ``large`` slice as advertised (48 GB; read as 10^9 bytes: the cautious reading)
SLICE_BYTES = 48 * 10**9


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
        self.phases[name] = {"start_bytes": self._mem()[0], "peak_bytes": None, "peak_reserved_bytes": None}

    def _close(self) -> None:
        if self._phase is not None:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.phases[self._phase]["peak_bytes"] = self._mem()[1]
            if self.cuda:
                self.phases[self._phase]["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(self.device))

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


#: whole-pipeline memory rows: (sixbit config or None for plain diffusers, loading: "resident" = diffusers as
#: it comes / the app's loading, "offload" = text encoder to the CPU after encoding + tiled decode, "lean")
PIPELINE_MEMORY_ROWS = {
    "bf16": (None, "resident"),
    "full": ("full", "offload"),
    "bf16_lean": (None, "lean"),
    "full_lean": ("full", "lean"),
    "app_balanced": ("balanced", "resident"),
}
#: the rows the demo runs (its baseline is diffusers as it comes: the ``bf16`` row)
APP_ROWS = {"bf16": "app baseline", "app_balanced": "app 6Bit (balanced)"}
#: the lean full row also stores modulation and embedder weights in 4 bits
LEAN_OVERRIDES = dict(modulation_weights="nvfp4", embedder_weights="nvfp4")


def pipeline_memory(pipe, call, device, sched, rows=tuple(PIPELINE_MEMORY_ROWS), steps: int = 2) -> dict:
    """Peak memory of the whole pipeline (text encoder → ``steps`` denoising steps → VAE decode to pixels),
    split by :class:`PhasePeaks` into encode (everything before the first transformer call), denoise and
    decode.

    * ``bf16``: the diffusers pipeline as it comes, every component resident (the app's baseline).
    * ``app_balanced``: the same loading with sixbit's default preset applied — the app's 6Bit run (random
      weights: no schedule replayed).
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
        preset, mode = PIPELINE_MEMORY_ROWS[name]
        lean = mode == "lean"
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
            if mode == "resident" and preset is not None:
                handle = sixbit.apply(pipe, make_config(preset))
            with PhasePeaks(pipe, device) as pp:
                if mode == "resident":
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
                        sch = sched.resample(num_blocks(pipe.transformer), steps) if sched else None
                        handle = sixbit.apply(pipe, make_config(preset, **(LEAN_OVERRIDES if lean else {})),
                                              schedule=sch)
                    if lean:
                        pipe.vae.to(device)
                    pipe.vae.enable_tiling()
                    kw.update(prompt_embeds=pe, negative_prompt_embeds=npe)
                pipe(**kw, num_inference_steps=steps, output_type="pt")
            sync(device)
            peaks = [p["peak_bytes"] for p in pp.phases.values() if p["peak_bytes"] is not None]
            res[name] = {"seconds": time.perf_counter() - t0, "phases": pp.phases, "loading": mode,
                         "config": preset or "bf16", "text_encoder_4bit": te_handle is not None}
            if te_handle is not None:
                res[name]["text_encoder_memory"] = te_handle.memory()
            if peaks:
                res[name]["peak_bytes"] = max(peaks)
                res[name]["peak_reserved_bytes"] = max(p["peak_reserved_bytes"] for p in pp.phases.values())
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


def run_size(size: str, rows: list[str], schedule: str | None, cmd: str, dev) -> dict:
    """Every row of ``rows`` on a random-weight pipeline of ``size``, one at a time (see the module docstring)."""
    pipe = random_cogvideox(size, dev, torch.bfloat16, text_encoder=True)
    sched = SkipSchedule.load(schedule) if schedule else None
    res = {"environment": environment(dev, cmd), "command": cmd, "size": size,
           "schedule": schedule, "slice_bytes": SLICE_BYTES, "rows": {}}
    call = speed_call(size)
    for row in rows:
        before = torch.cuda.memory_allocated(dev)
        r = pipeline_memory(pipe, call, dev, sched, rows=(row,))[row]
        r["before_row_bytes"] = before
        res["rows"][row] = r
        print(size, row, json.dumps({k: r.get(k) for k in ("peak_bytes", "peak_reserved_bytes", "error")}), flush=True)
    del pipe
    torch.cuda.empty_cache()
    return res


def headroom_lines(res: dict) -> list[str]:
    """The ZeroGPU fit: the app's rows against the 48 GB slice."""
    L = [f"**ZeroGPU `large` slice ({res['slice_bytes'] / 1e9:.0f} GB = {res['slice_bytes'] / GiB:.1f} GiB), the "
         "app's loading:**", ""]
    for row, label in APP_ROWS.items():
        r = res["rows"].get(row, {})
        if "peak_bytes" not in r:
            continue
        for key, what in (("peak_bytes", "allocated"), ("peak_reserved_bytes", "reserved")):
            if r.get(key):
                L.append(f"- {label}: peak {what} {r[key] / GiB:.2f} GiB → headroom "
                         f"{(res['slice_bytes'] - r[key]) / GiB:.2f} GiB ({'fits' if r[key] < res['slice_bytes'] else 'DOES NOT FIT'})")
    return L + [""]


def report(res: dict) -> str:
    size = res["size"]
    base = res["rows"].get("bf16", {}).get("peak_bytes")
    L = [f"# Whole-pipeline peak memory — CogVideoX-{size.upper()} size, 49×480×720, CFG, random weights", "",
         "Text encoder (T5-XXL) → 2 denoising steps → VAE decode to pixels; rows in the order run. "
         "`bf16`: diffusers as it comes, all resident (= the app's baseline). `app_balanced`: the same loading with "
         "the app's default preset. `full`: sixbit's full method, text encoder to the CPU "
         "after encoding, tiled VAE decode. `*_lean`: only the text encoder on the device while encoding, "
         "then the transformer and VAE; tiled decode; `full_lean` also with 4-bit text-encoder, modulation and "
         "embedder weights. GiB allocated at each phase's start → its peak.", "",
         "| row | allocated before the row GiB | encode | denoise | decode | peak GiB | peak reserved GiB "
         "| bf16 peak ÷ this |",
         "|---|---|---|---|---|---|---|---|"]
    for row, r in res["rows"].items():
        if "error" in r:
            L.append(f"| {row} | | error: {r['error'][:80]} | | | | | |")
            continue
        ph = r["phases"]
        cells = [f"{ph[p]['start_bytes'] / GiB:.2f} → {ph[p]['peak_bytes'] / GiB:.2f}" if p in ph else "" for p in
                 ("encode", "denoise", "decode")]
        ratio = f"{base / r['peak_bytes']:.2f}×" if base else ""
        L.append(f"| {row} | {r['before_row_bytes'] / GiB:.2f} | " + " | ".join(cells)
                 + f" | {r['peak_bytes'] / GiB:.2f} | {r['peak_reserved_bytes'] / GiB:.2f} | {ratio} |")
    env = res["environment"]
    L += ["", *headroom_lines(res),
          "- " + ", ".join(f"{k}: `{env[k]}`" for k in ("gpu", "torch", "triton", "diffusers", "date") if k in env),
          f"- command: `{res['command']}`", ""]
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["2b"], choices=["2b", "5b"])
    ap.add_argument("--rows", nargs="+", default=["full_lean", "bf16_lean", "app_balanced", "bf16", "full"],
                    choices=list(PIPELINE_MEMORY_ROWS))
    ap.add_argument("--schedule", default=str(RESULTS / "schedule_mini.json"))
    ap.add_argument("--out", default=str(RESULTS / "pipeline_memory_h200"), help="prefix: <out>_<size>.json/.md")
    args = parse(ap, argv)
    if not torch.cuda.is_available():
        sys.exit("the memory benchmark needs a CUDA GPU")
    dev = torch.device("cuda")
    for size in args.sizes:
        res = run_size(size, args.rows, args.schedule, args.command, dev)
        out = Path(f"{args.out}_{size}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
        out.with_suffix(".md").write_text(report(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
