"""Calibrate step-mode TDC's per-step thresholds: the probe profile that ``python -m sixbit.calibrate`` stores.

Per calibration prompt, the pipeline runs at full compute (quantization and TDC off; sixbit's hooks only
observe, for the branch and step of every call). At every step t ≥ 1 and for every CFG branch, forward hooks
on the first and the last transformer block measure two one-step drifts (relative L1 summed over the token
streams, ``sixbit.tdc.delta_change_sums``):

* the probe's: block 0's delta ``Δ₀ = out₀ − in₀`` at t against t − 1 — what step mode reads;
* the rest's: the combined residual of blocks 1…n−1, ``R = out_{n−1} − out₀`` at t against t − 1 — what a
  skipped step reuses (each block's input is the previous block's output).

The profile (:class:`sixbit.policy.ProbeProfile`) holds both, averaged per step over prompts × branches. At
inference ``tdc_threshold_rule="profile"`` divides the probe threshold at each step by the rest/probe ratio
there over its median (``ProbeProfile.weight``, interpolated in normalised time to any step count): where the
probe under-reports how much the skipped part moves, the bar is lower.
"""

from __future__ import annotations

from typing import Any

import torch

from sixbit.config import SixBitConfig
from sixbit.policy import ProbeProfile
from sixbit.tdc import delta_change_sums

__all__ = ["probe_profile", "profile_markdown"]


def probe_profile(pipe, prompts: list[str], *, steps: int, seed: int = 0, negative_prompt: str = "",
                  call: dict[str, Any] | None = None, log=None) -> ProbeProfile:
    """The probe profile of ``pipe`` on ``prompts`` (module docstring); ``call``: the pipeline's extra
    keyword arguments (frames, size, guidance, output type), ``seed + i`` the seed of prompt i."""
    from sixbit.engine import apply

    if steps < 2:
        raise ValueError(f"a probe profile needs at least 2 steps, got {steps}")
    handle = apply(pipe, SixBitConfig(quant="off", tdc=False, pdr=False, attention="bf16", policy=None))
    blocks = [b for _, b in handle.adapter.blocks(handle.transformer)]
    if len(blocks) < 2:
        handle.remove()
        raise ValueError("a probe profile needs a transformer with at least 2 blocks")
    adapter = handle.adapter
    now: dict[str, list[torch.Tensor]] = {}  # this call's probe delta and block 0's output
    prev: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # per branch: the last step's (Δ₀, R)
    sums: dict[int, list[list[float]]] = {}  # step -> [[probe num, den, rest num, den], ...]

    def first(module, args, kwargs, output):
        ins, outs = adapter.streams_in(module, args, kwargs), adapter.streams_out(output)
        now["delta"] = [o - i for o, i in zip(outs, ins)]
        now["out0"] = outs

    def last(module, args, kwargs, output):
        cur = handle.current
        if cur is None or "delta" not in now:
            return
        branch, step = cur
        delta = now.pop("delta")
        rest = [o - i for o, i in zip(adapter.streams_out(output), now.pop("out0"))]
        if branch in prev and step > 0:
            (pd, pr) = prev[branch]
            vals = torch.stack([*delta_change_sums(delta, pd), *delta_change_sums(rest, pr)]).tolist()
            sums.setdefault(step, []).append(vals)
        prev[branch] = (delta, rest)

    hooks = [blocks[0].register_forward_hook(first, with_kwargs=True),
             blocks[-1].register_forward_hook(last, with_kwargs=True)]
    try:
        for i, prompt in enumerate(prompts):
            prev.clear()
            gen = torch.Generator(device="cpu").manual_seed(seed + i)
            pipe(prompt, negative_prompt=negative_prompt, num_inference_steps=steps, generator=gen, **(call or {}))
            if log:
                log(f"TDC probe profile: prompt {i + 1}/{len(prompts)} done")
    finally:
        for h in hooks:
            h.remove()
        handle.remove()
    missing = [t for t in range(1, steps) if t not in sums]
    if missing:
        raise RuntimeError(f"TDC probe profile: no drift measured at steps {missing} (did the pipeline run "
                           f"{steps} steps?)")

    def mean(t: int, k: int) -> float:
        rows = sums[t]
        return sum(r[k] / r[k + 1] if r[k + 1] > 0 else 0.0 for r in rows) / len(rows)

    return ProbeProfile(steps=steps, probe_drift=[mean(t, 0) for t in range(1, steps)],
                        rest_drift=[mean(t, 2) for t in range(1, steps)], n=len(sums[1]))


def profile_markdown(p: ProbeProfile) -> str:
    """The profile as a report section: per step the two drifts, their ratio and the threshold weight."""
    lines = ["## TDC probe profile (step mode's per-step thresholds)", "",
             f"{p.steps}-step full-compute runs, {p.n} prompt × branch runs per step. Threshold at step t of N: "
             "θ · S/N ÷ weight (`tdc_threshold_rule=\"profile\"`, docs/TDC.md §8).", "",
             "| step | probe drift | rest drift | rest / probe | weight |", "|---|---|---|---|---|"]
    for k, (a, b) in enumerate(zip(p.probe_drift, p.rest_drift), start=1):
        ratio = b / a if a > 0 else float("nan")
        lines.append(f"| {k} | {a:.4f} | {b:.4f} | {ratio:.3f} | {p.weight(k, p.steps):.3f} |")
    return "\n".join(lines) + "\n"
