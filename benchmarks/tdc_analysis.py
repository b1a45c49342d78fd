"""Why per-block TDC loses to a per-step cache: ``python -m benchmarks tdc_analysis``.

On sixbit-mini (FP32, CPU) it records, for a few prompts, every transformer call of a plain run and every
block's residual Δ_b(t) = out − in (both token streams), then replays single transformer calls with
counterfactual skips — a skipped block returns ``in + Δ_b(t−1)``, its previous step's delta, as TDC
does — and measures the error of the noise prediction ε̂ (relative L1 against the call's true ε):

* ``per_block``: block b alone skipped at step t → e_b(t); and the error it injected locally,
  ‖Δ_b(t−1) − Δ_b(t)‖₁ / ‖out_b(t)‖₁ (relative to the residual stream) → amplification = e_b / local;
* ``per_step``: blocks 1…N−1 skipped together at step t (FirstBlockCache's reuse, block 0 computed) →
  e_step(t), against Σ_b e_b(t) (the same cells skipped one at a time): whether stale deltas that come
  from one step compensate each other;
* ``drift``: the zero-order reuse error after k steps, ‖Δ_b(t−k) − Δ_b(t)‖₁/‖Δ_b(t−k)‖₁, against k × the
  one-step rate — TDC's budget assumes linear drift — and the first-order forecast's error at k;
* ``regate``: the same reuse error at k = 1, 2 for what each reuse of step mode returns for a block — its last
  delta (``"last"``), that delta with its size extrapolated (``"magnitude"``), and the block's gated pieces kept
  at t−k recomposed with step t's own gates (``tdc_regate``, without and with each piece's size extrapolated);
* ``tdc_run``: where the paper's TDC (preset ``tdc_paper``) skips (per step, per block), the error its
  budget charged at each skipped cell (``acc_err``) against the true reuse error at that cell on the FP32
  trajectory, and the same for step mode (``tdc_mode="step"``, probe threshold 0.2).

Results: ``results/<name>.json`` + ``.md``; the conclusions are in docs/TDC.md.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import RESULTS, env_md, environment, mini_setup, parse, write_results
from sixbit.dmpq import l1, ratio


def rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Σ‖a − b‖₁ / Σ‖b‖₁ over streams."""
    return ratio(float(sum(l1(x - y) for x, y in zip(a, b))), float(sum(l1(y) for y in b)))


class Blocks:
    """Forward hooks on the transformer's blocks: record every Δ, or replace chosen blocks' outputs."""

    def __init__(self, blocks):
        self.inp: dict[int, tuple] = {}
        self.deltas: list[list[torch.Tensor]] | None = None  # filled while recording
        self.outs: list[list[torch.Tensor]] | None = None
        self.replace: dict[int, list[torch.Tensor]] = {}
        self.handles = []
        for b, blk in enumerate(blocks):
            self.handles.append(blk.register_forward_pre_hook(partial(self.pre, b), with_kwargs=True))
            self.handles.append(blk.register_forward_hook(partial(self.post, b), with_kwargs=True))

    def pre(self, b, mod, args, kwargs):
        self.inp[b] = (kwargs["hidden_states"], kwargs["encoder_hidden_states"])

    def post(self, b, mod, args, kwargs, out):
        if b in self.replace:
            return tuple(i + d for i, d in zip(self.inp[b], self.replace[b]))
        if self.deltas is not None:
            self.deltas.append([(o - i).clone() for o, i in zip(out, self.inp[b])])
            self.outs.append([o.clone() for o in out])
        return None

    def remove(self):
        for h in self.handles:
            h.remove()


class Pieces:
    """Forward hooks recording, per block and call, its gated pieces and its gates (``sixbit.adapters``, the
    ``tdc_regate`` decomposition: ``Δ = Σ gate ⊙ piece``)."""

    def __init__(self, blocks):
        from sixbit.adapters import COGVIDEOX

        self.adapter, self.blocks = COGVIDEOX, list(blocks)
        self.parts: dict = {}
        self.calls: list[list[tuple]] = []  # per call, per block: (pieces, gates)
        self.handles = []
        for b, blk in enumerate(self.blocks):
            for name in self.adapter.gated_parts:
                self.handles.append(blk.get_submodule(name).register_forward_hook(partial(self.part, name)))
            self.handles.append(blk.register_forward_hook(partial(self.block, b), with_kwargs=True))

    def part(self, name, mod, args, out):
        self.parts[name] = out

    def block(self, b, mod, args, kwargs, out):
        if b == 0:
            self.calls.append([])
        streams = self.adapter.streams_in(mod, args, kwargs)
        pieces = [p.clone() for p in self.adapter.pieces(self.parts, streams)]
        self.calls[-1].append((pieces, self.adapter.gates(mod, args, kwargs)))
        self.parts = {}

    def remove(self):
        for h in self.handles:
            h.remove()


def record(pipe, prompt, seed, gen):
    """The plain run's transformer calls (kwargs, ε), per step every block's Δ and output, and its gated pieces and
    gates (:class:`Pieces`)."""
    tr = pipe.transformer
    calls, deltas, outs = [], [], []
    hooks = Blocks(tr.transformer_blocks)
    pieces = Pieces(tr.transformer_blocks)

    def pre(mod, args, kwargs):
        calls.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
        hooks.deltas, hooks.outs = [], []

    def post(mod, args, kwargs, out):
        calls[-1]["_eps"] = out[0].clone()
        deltas.append(hooks.deltas)
        outs.append(hooks.outs)
        hooks.deltas = hooks.outs = None

    h = [tr.register_forward_pre_hook(pre, with_kwargs=True), tr.register_forward_hook(post, with_kwargs=True)]
    pipe(prompt=prompt, generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **gen)
    for x in h:
        x.remove()
    pieces.remove()
    return calls, deltas, outs, hooks, pieces.calls


def eps_with(pipe, hooks: Blocks, call: dict, replace: dict) -> torch.Tensor:
    hooks.replace = replace
    kwargs = {k: v for k, v in call.items() if k != "_eps"}
    with torch.no_grad():
        out = pipe.transformer(**kwargs)[0]
    hooks.replace = {}
    return out


def counterfactuals(pipe, calls, deltas, outs, hooks, first: int, last: int) -> dict:
    n = len(deltas[0])
    per_block = np.zeros((len(calls), n))
    local = np.zeros((len(calls), n))
    per_step = np.zeros(len(calls))
    for t in range(first, len(calls) - last):
        eps = calls[t]["_eps"]
        for b in range(n):
            e = eps_with(pipe, hooks, calls[t], {b: deltas[t - 1][b]})
            per_block[t, b] = rel([e], [eps])
            local[t, b] = rel([o + d0 - d for o, d0, d in zip(outs[t][b], deltas[t - 1][b], deltas[t][b])], outs[t][b])
        e = eps_with(pipe, hooks, calls[t], {b: deltas[t - 1][b] for b in range(1, n)})
        per_step[t] = rel([e], [eps])
    rows = slice(first, len(calls) - last)
    pb, lo, ps = per_block[rows], local[rows], per_step[rows]
    return {"per_block_eps_err": pb.mean(axis=0).round(5).tolist(),
            "per_block_local_err": lo.mean(axis=0).round(5).tolist(),
            "amplification": (pb / np.maximum(lo, 1e-12)).mean(axis=0).round(2).tolist(),
            "per_step_eps_err": ps.round(5).tolist(),
            "sum_of_single_skips": pb[:, 1:].sum(axis=1).round(5).tolist(),
            "per_cell": {"block_skip_mean": float(pb.mean()), "step_skip_per_cell": float(ps.mean() / (n - 1))},
            "coherence": float((ps / np.maximum(pb[:, 1:].sum(axis=1), 1e-12)).mean())}


def drift(deltas, first: int, kmax: int = 4) -> dict:
    """Zero-order reuse error after k steps vs k × the one-step rate, and the first-order forecast's error."""
    n = len(deltas[0])
    out = {}
    for k in range(1, kmax + 1):
        zero, lin, rate = [], [], []
        for t in range(max(first, k + 1), len(deltas)):
            for b in range(n):
                d0, d1, dt = deltas[t - k - 1][b], deltas[t - k][b], deltas[t][b]
                zero.append(rel(dt, d1))
                rate.append(k * rel(d1, d0))
                lin.append(rel(dt, [x + k * (x - y) for x, y in zip(d1, d0)]))
        out[k] = {"reuse_err": float(np.mean(zero)), "linear_drift_pred": float(np.mean(rate)),
                  "forecast_err": float(np.mean(lin))}
    return out


def regate_drift(deltas, pieces, first: int, kmax: int = 2) -> dict:
    """The reuse error at t of what a skipped block returns when its last computed step was t−k (the magnitude
    forecasts read t−k−1 too): its delta, the delta's size extrapolated, its gated pieces times step t's gates,
    and those pieces each with its size extrapolated (``sixbit.tdc.forecast``, as the hooks call it)."""
    from sixbit import tdc
    from sixbit.adapters import COGVIDEOX as ad

    def regated(ps, gates, like):
        return ad.recompose([torch.zeros_like(x) for x in like], ps, gates)

    n = len(deltas[0])
    out = {}
    for k in range(1, kmax + 1):
        errs = {"last": [], "magnitude": [], "regate_last": [], "regate_magnitude": []}
        for t in range(max(first, k + 1), len(deltas)):
            for b in range(n):
                dt, d1, d0 = deltas[t][b], deltas[t - k][b], deltas[t - k - 1][b]
                (p1, _), (p0, _), gates = pieces[t - k][b], pieces[t - k - 1][b], pieces[t][b][1]
                mag = tdc.forecast(d1, d0, t, t - k, t - k - 1, magnitude=True)
                pmag = tdc.forecast(p1, p0, t, t - k, t - k - 1, magnitude=True)
                for key, guess in (("last", d1), ("magnitude", mag), ("regate_last", regated(p1, gates, dt)),
                                   ("regate_magnitude", regated(pmag, gates, dt))):
                    errs[key].append(rel(dt, guess))
        out[k] = {key: float(np.mean(v)) for key, v in errs.items()}
    return out


def tdc_run(pipe, prompt, seed, gen, deltas, cfg) -> dict:
    """Where TDC skipped, and the budget it charged vs the true reuse error on the FP32 trajectory."""
    import sixbit

    handle = sixbit.apply(pipe, cfg)
    try:
        pipe(prompt=prompt, generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **gen)
        tr = handle.trace.to_dict()
    finally:
        handle.remove()
    steps = tr["steps"]
    n = len(steps[0]["blocks"])
    skipped = np.array([[b["skipped"] for b in s["blocks"]] for s in steps], dtype=float)
    charged, true = [], []
    for b in range(n):
        last = None
        for t, s in enumerate(steps):
            if not s["blocks"][b]["skipped"]:
                last = t
            elif last is not None:
                charged.append(s["blocks"][b]["acc_err"])
                true.append(rel(deltas[t][b], deltas[last][b]))
    return {"skip_fraction": float(skipped.mean()), "per_step": skipped.mean(axis=1).round(3).tolist(),
            "per_block": skipped.mean(axis=0).round(3).tolist(),
            "charged_mean": float(np.mean(charged)) if charged else None,
            "true_reuse_err_mean": float(np.mean(true)) if true else None,
            "cells": len(true)}


def analysis(args) -> dict:
    import sixbit

    torch.set_num_threads(args.threads)
    pipe, gen, prompts = mini_setup(args.model, "cpu", args.steps, args.prompts)
    base = sixbit.SixBitConfig.preset("tdc_paper")
    per_prompt = []
    for p in prompts:
        calls, deltas, outs, hooks, pieces = record(pipe, p, 0, gen)
        same = rel([eps_with(pipe, hooks, calls[5], {})], [calls[5]["_eps"]])  # replay = the pipeline's call
        cf = counterfactuals(pipe, calls, deltas, outs, hooks, base.tdc_first, base.tdc_last)
        hooks.remove()
        per_prompt.append({"prompt": p, "replay_err": same, **cf, "drift": drift(deltas, base.tdc_first),
                           "regate": regate_drift(deltas, pieces, base.tdc_first),
                           "tdc_block": tdc_run(pipe, p, 0, gen, deltas, base),
                           "tdc_step": tdc_run(pipe, p, 0, gen, deltas, base.replace(tdc_mode="step"))})
        print(f"[tdc_analysis] {p}: per-cell block {cf['per_cell']['block_skip_mean']:.4f} "
              f"step {cf['per_cell']['step_skip_per_cell']:.4f} coherence {cf['coherence']:.2f}", flush=True)
    env = environment("cpu", args.command)
    payload = {"benchmark": "tdc_analysis", "generation": gen, "environment": env, "prompts": per_prompt}
    md = markdown(payload)
    write_results(args.name, payload, md, Path(args.out))
    print(md)
    return payload


def _mean(rows, *keys):
    vals = []
    for r in rows:
        for k in keys:
            r = r[k]
        vals.append(r)
    return np.mean(np.asarray(vals, dtype=float), axis=0)


def markdown(payload: dict) -> str:
    rows = payload["prompts"]
    n = len(rows[0]["per_block_eps_err"])
    md = [f"# Why per-block TDC loses — sixbit-mini, FP32, {len(rows)} prompts, "
          f"{payload['generation']['num_inference_steps']} steps", "",
          "Errors are relative L1 of the transformer's noise prediction ε against the same call's true ε (one "
          "call replayed with counterfactual skips: a skipped block returns in + Δ(t−1)), mean over the steps "
          "TDC may skip and over prompts. Method: `benchmarks/tdc_analysis.py`; reading: docs/TDC.md.", "",
          f"Replaying a recorded call reproduces ε to {max(r['replay_err'] for r in rows):.1e}.", "",
          "| block | ε error, this block skipped alone | local error injected (rel. to the stream) | amplification |",
          "|---|---|---|---|"]
    pb, lo, am = (_mean(rows, k) for k in ("per_block_eps_err", "per_block_local_err", "amplification"))
    md += [f"| {b} | {pb[b]:.4f} | {lo[b]:.4f} | {am[b]:.2f} |" for b in range(n)]
    cell_b, cell_s = _mean(rows, "per_cell", "block_skip_mean"), _mean(rows, "per_cell", "step_skip_per_cell")
    md += ["", f"- ε error per skipped cell: a block skipped alone **{cell_b:.4f}**; blocks 1…{n - 1} skipped "
           f"together (one step skip), per cell **{cell_s:.4f}**.",
           f"- one step skip / the sum of its {n - 1} cells skipped one at a time: **{_mean(rows, 'coherence'):.2f}**.",
           "", "Reuse error of a block's delta after k steps (mean over blocks, steps, prompts):", "",
           "| k | reuse error | k × one-step rate (the budget's model) | first-order forecast error |",
           "|---|---|---|---|"]
    for k in rows[0]["drift"]:
        md.append(f"| {k} | {_mean(rows, 'drift', k, 'reuse_err'):.4f} | "
                  f"{_mean(rows, 'drift', k, 'linear_drift_pred'):.4f} | {_mean(rows, 'drift', k, 'forecast_err'):.4f} |")
    md += ["", "What a skipped block returns when its last computed step was k steps back, against its true delta "
           "(relative L1; mean over blocks, steps, prompts): the delta (`last`), its size extrapolated (`magnitude`), "
           "its gated pieces recomposed with the skipped step's gates (`tdc_regate`), and with each piece's size "
           "extrapolated:", "",
           "| k | last | magnitude | regate + last | regate + magnitude |", "|---|---|---|---|---|"]
    for k in rows[0]["regate"]:
        md.append(f"| {k} | " + " | ".join(f"{_mean(rows, 'regate', k, key):.4f}" for key in
                                          ("last", "magnitude", "regate_last", "regate_magnitude")) + " |")
    for key, title in (("tdc_block", "paper's TDC (tdc_paper)"), ("tdc_step", "step mode, probe 0.2")):
        sf, charged = _mean(rows, key, "skip_fraction"), [r[key]["charged_mean"] for r in rows]
        true = [r[key]["true_reuse_err_mean"] for r in rows]
        md += ["", f"**{title}**: {sf:.3f} of block evaluations skipped.", "",
               "- skipped per step: " + " ".join(f"{x:.2f}" for x in _mean(rows, key, "per_step")),
               "- skipped per block: " + " ".join(f"{x:.2f}" for x in _mean(rows, key, "per_block"))]
        if key == "tdc_block" and all(c is not None for c in charged):  # step mode decides by the probe
            md.append(f"- budget charged at a skipped cell (acc_err) {np.mean(charged):.4f} vs its true reuse error on "
                      f"the FP32 trajectory {np.mean(true):.4f}")
    md += ["", env_md(payload["environment"]), ""]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks tdc_analysis", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="tdc_analysis_mini")
    args = parse(p, argv)
    analysis(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
