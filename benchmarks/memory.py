"""Whole-pipeline peak memory, split by phase: ``python -m benchmarks memory`` (the one place it is measured).

Text encoder → 2 denoising steps → VAE decode to pixels, one row at a time, in a chosen order, on a
CogVideoX pipeline at real size with random weights; :class:`PhasePeaks` splits each row's peak into the
encode, denoise and decode phases. On the H200 rows run after others started with ~12 GiB more allocated
than their own components (something from an earlier row keeps device memory alive; not yet found — not a
reference cycle: a ``gc.collect()`` before each row did not free it), so the rows run in the order you
give, lean rows first by default, and the allocated bytes before each row are recorded. A row is clean
when its encode phase starts with only its own components resident (the text encoder for lean rows) —
check ``before_row_GiB`` and the encode ``start`` column. ::

    python -m benchmarks memory --schedule benchmarks/results/schedule_mini.json \\
        --out benchmarks/results/pipeline_memory_h200_2b

Writes ``<out>.json`` and ``<out>.md``.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2b", choices=["2b", "5b"])
    ap.add_argument("--rows", nargs="+", default=["full_lean", "bf16_lean", "bf16", "full"],
                    choices=list(PIPELINE_MEMORY_ROWS))
    ap.add_argument("--schedule", default=str(RESULTS / "schedule_mini.json"))
    ap.add_argument("--out", default=str(RESULTS / "pipeline_memory_h200_2b"))
    args = parse(ap, argv)
    cmd = args.command
    if not torch.cuda.is_available():
        sys.exit("the memory benchmark needs a CUDA GPU")
    dev = torch.device("cuda")
    pipe = random_cogvideox(args.size, dev, torch.bfloat16, text_encoder=True)
    call = speed_call(args.size)
    sched = SkipSchedule.load(args.schedule) if args.schedule else None
    res = {"environment": environment(dev, cmd), "command": cmd, "size": args.size,
           "schedule": args.schedule, "rows": {}}
    for row in args.rows:
        before = torch.cuda.memory_allocated(dev)
        r = pipeline_memory(pipe, call, dev, sched, rows=(row,))[row]
        r["before_row_bytes"] = before
        res["rows"][row] = r
        print(row, json.dumps({k: r.get(k) for k in ("peak_bytes", "phases", "error", "before_row_bytes")},
                              default=str), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str))
    base = res["rows"].get("bf16", {}).get("peak_bytes")
    L = [f"# Whole-pipeline peak memory — CogVideoX-{args.size.upper()} size, 49×480×720, CFG, random weights", "",
         "Text encoder (T5-XXL) → 2 denoising steps → VAE decode to pixels; rows in the order run. "
         "`bf16`: diffusers as it comes, all resident. `full`: sixbit's full method, text encoder to the CPU "
         "after encoding, tiled VAE decode. `*_lean`: only the text encoder on the device while encoding, "
         "then the transformer and VAE; tiled decode; `full_lean` also with 4-bit text-encoder, modulation and "
         "embedder weights. GiB allocated at each phase's start → its peak.", "",
         "| row | allocated before the row GiB | encode | denoise | decode | peak GiB | bf16 peak ÷ this |",
         "|---|---|---|---|---|---|---|"]
    for row, r in res["rows"].items():
        if "error" in r:
            L.append(f"| {row} | | error: {r['error'][:80]} | | | | |")
            continue
        ph = r["phases"]
        cells = [f"{ph[p]['start_bytes'] / GiB:.2f} → {ph[p]['peak_bytes'] / GiB:.2f}" if p in ph else "" for p in
                 ("encode", "denoise", "decode")]
        ratio = f"{base / r['peak_bytes']:.2f}×" if base else ""
        L.append(f"| {row} | {r['before_row_bytes'] / GiB:.2f} | " + " | ".join(cells)
                 + f" | {r['peak_bytes'] / GiB:.2f} | {ratio} |")
    env = res["environment"]
    L += ["", "- " + ", ".join(f"{k}: `{env[k]}`" for k in ("gpu", "torch", "triton", "diffusers", "date") if k in env),
          f"- command: `{res['command']}`", ""]
    out.with_suffix(".md").write_text("\n".join(L))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
