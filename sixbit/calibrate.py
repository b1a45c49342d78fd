"""Calibrate DMPQ: fit E = α·Γ + β per linear layer and choose τ for a target average bit width.

    python -m sixbit.calibrate --model PATH_OR_ID --prompts FILE --out policy.json [--steps 20 ...]

What it does, per prompt: runs the pipeline in full precision (every block computed, every layer on its
original weights) with sixbit's hooks observing. At every step t and for every routed layer ℓ it feeds
the layer's *actual* input x to the quantized routes side by side and measures the relative error of the
NVFP4 route against the full-precision output::

    E_ℓ,t = ‖linear_nvfp4(x) − linear_fp(x)‖_F / ‖linear_fp(x)‖_F       (sixbit.formats.relative_error)

(the INT8 route's error is measured too, for the report). The predictor is the block's Γ at the previous
step, Γ_{b,t−1}, exactly what the router will see at inference. Per layer, ordinary least squares over all
(prompt, branch, step ≥ 1) samples gives α, β and R²; the report states R² per layer, pooled within
layers (1 − ΣSS_res/ΣSS_tot) and for one global line over all layers, so "strong linear correlation" is a
measured number.

PDR's ρ: at the steps where PDR would check a block (``sixbit.pdr.reuse_window`` with the default
config's warm-up and TDC window), a forward pre-hook on every block measures the outlier ratio of its
input streams (elements beyond k_σ · token RMS, k_σ from the default config); the policy stores the 95th
percentile (``sixbit.pdr.POLICY_RHO_QUANTILE``) as ``pdr.rho``, so PDR fires on about one check in twenty
of this model's inputs. The inputs here are those of the full-precision run.

8-bit attention: a ``FusedQKNormRopeProcessor`` observer (``sixbit.attention``) sees each block's own q/k/v
at every step and measures ``formats.relative_error(fp8_attention(q, k, v), sdpa(q, k, v))`` — the kernel on
a GPU, its torch emulation (``formats.attention_fp8_reference``) on the CPU. Per block, least squares
against Γ_{b,t−1} gives α_attn, β_attn (the same line as the linears'); τ_attn(f) is the f-quantile of the
fitted predictions (a fraction f of the calibration samples at or under it), stored for
``--attention-target`` and as a τ-for-fraction table (0 … 1). CogVideoX only (other models: no attention
fits, their attention stays bf16).

Step-mode TDC's per-step thresholds: after the DMPQ runs, the same prompts run once more at full compute
and the policy stores the probe profile (``sixbit.tdc_calibrate``: per step, the one-step drift of block 0's
delta and of the combined residual of the blocks after it), which ``tdc_threshold_rule="profile"`` reads.
``--tdc-only`` measures only that profile and writes it into an existing policy.

τ: with E_hat the fitted predictions over the calibration samples, a fraction f of INT8 decisions gives
4.5·(1−f) + 8·f average activation bits; τ(bits) is the (1−f)-quantile of E_hat. The policy stores τ for
``--target-bits`` and a τ-for-bits table (4.5 … 8.0) so the config can move the target without
re-calibrating. The realised average in a run also counts warm-up, PDR (16 bits) and after-skip INT8
steps; the trace reports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sixbit import attention as attention_mod
from sixbit import pdr as pdr_rule
from sixbit.config import SixBitConfig
from sixbit.formats import relative_error
from sixbit.linear import ops
from sixbit.policy import LinearFit, Policy, bits_to_int8_fraction
from sixbit.routes import BITS, INT8, NVFP4
from sixbit.tdc_calibrate import probe_profile, profile_markdown

__all__ = ["calibrate", "fit_line", "read_prompts", "main", "report_markdown", "transformer_fingerprint"]

BITS_GRID = [BITS[NVFP4] + 0.25 * k for k in range(15)]  # 4.5 … 8.0
FRACTION_GRID = [0.1 * k for k in range(11)]  # 8-bit attention fraction 0 … 1


def fit_line(x: list[float], y: list[float]) -> tuple[float, float, float | None, float, float]:
    """Least squares y ≈ a·x + b → (a, b, R², SS_res, SS_tot). R² is None when y is constant.
    With constant x the fit is the mean (a = 0)."""
    n = len(x)
    if n == 0:
        raise ValueError("no samples to fit")
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    sxy = sum((u - mx) * (v - my) for u, v in zip(x, y))
    a = sxy / sxx if sxx > 0 else 0.0
    b = my - a * mx
    ss_res = sum((v - (a * u + b)) ** 2 for u, v in zip(x, y))
    ss_tot = sum((v - my) ** 2 for v in y)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else None
    return a, b, r2, ss_res, ss_tot


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        raise ValueError("empty")
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a JSON list or a text file (one per line; blank lines and ``#`` comments ignored)."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        prompts = json.loads(text)
        if not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"{path}: expected a JSON list of strings")
    else:
        prompts = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def transformer_fingerprint(model_path: str | Path | None) -> str | None:
    """sha256 of a local pipeline folder's transformer weights (``transformer/*.safetensors``), or None
    for a hub id. Stored in the policy so a stale policy (the model was retrained) can be detected."""
    if not model_path:
        return None
    folder = Path(model_path) / "transformer"
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def _default_call(pipe) -> dict[str, Any]:
    kw: dict[str, Any] = {"output_type": "latent"}
    tcfg = getattr(pipe.transformer, "config", None)
    if type(pipe).__name__.startswith("CogVideoX") and tcfg is not None:
        kw["max_sequence_length"] = tcfg.max_text_seq_length
    return kw


def attention_error(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float | None:
    """Relative error of the 8-bit attention (kernel, or its emulation) against SDPA on ``[B, H, S, D]``
    q/k/v; None where neither runs (head dim, GPU capability)."""
    got = attention_mod.fp8_attention(q, k, v, emulate=not q.is_cuda)
    if got is None:
        return None
    B, H, S, D = q.shape
    ref = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, H * D)
    return float(relative_error(got[0], ref))


def _fit_attention(xs: dict[int, list[float]], ys: dict[int, list[float]], block_names: list[str],
                   target: float) -> tuple[dict[str, LinearFit], float | None, dict[float, float], list[dict]]:
    """Per-block lines of the 8-bit attention's error, τ_attn at ``target`` and the τ-for-fraction table."""
    fits, rows, preds = {}, [], []
    for b, name in enumerate(block_names):
        if not xs.get(b):
            continue
        a, c, r2, _, _ = fit_line(xs[b], ys[b])
        fits[name] = LinearFit(alpha=a, beta=c, r2=r2, n=len(xs[b]))
        preds += [a * g + c for g in xs[b]]
        rows.append({"name": name, "alpha": a, "beta": c, "r2": r2, "n": len(xs[b]),
                     "mean_err": sum(ys[b]) / len(ys[b]), "max_err": max(ys[b])})
    if not preds:
        return {}, None, {}, rows
    table = {f: _quantile(preds, f) for f in FRACTION_GRID}
    return fits, _quantile(preds, target), table, rows


def calibrate(pipe, prompts: list[str], *, steps: int = 20, seed: int = 0, target_bits: float = 6.0,
              hadamard_block: int = 64, negative_prompt: str = "", call_kwargs: dict | None = None,
              model_name: str | None = None, log=None, fingerprint: str | None = None,
              attention_target: float = 0.75) -> tuple[Policy, dict[str, Any]]:
    """Calibrate on ``pipe`` (see the module docstring). Returns (policy, report). ``fingerprint``: the
    transformer weights' sha256 when the caller already took it (else it is computed here)."""
    from sixbit.engine import apply

    if fingerprint is None:  # before the weights are used
        fingerprint = transformer_fingerprint(getattr(pipe, "name_or_path", None))
    cfg = SixBitConfig(quant="dmpq", tdc=False, pdr=False, warmup_steps=1000, fp_weights="device",
                       hadamard_block=hadamard_block, policy=None)
    handle = apply(pipe, cfg)
    names = handle.linear_names
    block_of = [b for b, idx in enumerate(handle.block_linear_idx) for _ in idx]
    errs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
    kernel_ops = ops()

    def observer(j):
        def obs(module, x, y):
            cur = handle.current
            if cur is None:
                return
            y4, _ = kernel_ops.linear(x, module.packed, NVFP4, backend=module.backend)
            y8, _ = kernel_ops.linear(x, module.packed, module.resolve(INT8), backend=module.backend)
            errs[(run_id, cur[0], cur[1], j)] = (relative_error(y4, y), relative_error(y8, y))
        return obs

    for j, m in enumerate(handle.modules):
        m.observer = observer(j)
    pdr_cfg = SixBitConfig()  # PDR's default window and k_σ: where and how the engine will measure
    ratios: list[float] = []

    def block_observer(module, args, kwargs):
        cur = handle.current
        if cur is None or not pdr_rule.reuse_window(cur[1], steps, pdr_cfg):
            return
        c, tot = pdr_rule.outlier_sums(handle.adapter.streams_in(module, args, kwargs), pdr_cfg.pdr_k_sigma).tolist()
        ratios.append(c / tot if tot else 0.0)

    pre_hooks = [blk.register_forward_pre_hook(block_observer, with_kwargs=True)
                 for _, blk in handle.adapter.blocks(handle.transformer)]
    attn_errs: dict[tuple, float] = {}

    def attention_observer(b):
        def obs(q, k, v):
            cur = handle.current
            e = None if cur is None else attention_error(q, k, v)
            if e is not None:
                attn_errs[(cur[0], cur[1], b)] = e
        return obs

    for b, hook in enumerate(handle.block_hooks):
        for proc in hook.attn_procs:
            proc.observer = attention_observer(b)
    ax: dict[int, list[float]] = {}
    ay: dict[int, list[float]] = {}
    xs: list[list[float]] = [[] for _ in names]
    ys: list[list[float]] = [[] for _ in names]
    e8s: list[list[float]] = [[] for _ in names]
    call = {**_default_call(pipe), **(call_kwargs or {})}
    t_start = time.perf_counter()
    try:
        for run_id, prompt in enumerate(prompts):
            errs.clear()
            attn_errs.clear()
            gen = torch.Generator(device="cpu").manual_seed(seed + run_id)
            pipe(prompt, negative_prompt=negative_prompt, num_inference_steps=steps, generator=gen, **call)
            trace = handle.trace
            gammas: dict[tuple[str, int], list[float | None]] = {}
            for st in trace.steps:
                for br, rec in st.branches.items():
                    gammas[(br, st.step)] = [b["gamma"] if b else None for b in rec.blocks]
            for (_rid, br, t, j), (e4, e8) in errs.items():
                prev = gammas.get((br, t - 1))
                if t < 1 or prev is None or prev[block_of[j]] is None:
                    continue
                xs[j].append(prev[block_of[j]])
                ys[j].append(float(e4))
                e8s[j].append(float(e8))
            for (br, t, b), e in attn_errs.items():
                prev = gammas.get((br, t - 1))
                if t >= 1 and prev is not None and prev[b] is not None:
                    ax.setdefault(b, []).append(prev[b])
                    ay.setdefault(b, []).append(e)
            if log:
                log(f"prompt {run_id + 1}/{len(prompts)} done ({time.perf_counter() - t_start:.1f}s): {prompt!r}")
    finally:
        for h in pre_hooks:
            h.remove()
        handle.remove()

    profile = probe_profile(pipe, prompts, steps=steps, seed=seed, negative_prompt=negative_prompt, call=call, log=log)
    fits, layers = {}, []
    tot_res = tot_tot = 0.0
    all_x, all_y, preds = [], [], []
    for j, name in enumerate(names):
        if not xs[j]:
            raise RuntimeError(f"no calibration samples for {name}; use at least 2 steps")
        a, b, r2, ss_res, ss_tot = fit_line(xs[j], ys[j])
        fits[name] = LinearFit(alpha=a, beta=b, r2=r2, n=len(xs[j]))
        tot_res += ss_res
        tot_tot += ss_tot
        all_x += xs[j]
        all_y += ys[j]
        preds += [a * g + b for g in xs[j]]
        layers.append({"name": name, "alpha": a, "beta": b, "r2": r2, "n": len(xs[j]),
                       "mean_err_nvfp4": sum(ys[j]) / len(ys[j]), "mean_err_int8": sum(e8s[j]) / len(e8s[j]),
                       "gamma_min": min(xs[j]), "gamma_max": max(xs[j])})
    r2_pooled = 1.0 - tot_res / tot_tot if tot_tot > 0 else None
    _, _, r2_global, _, _ = fit_line(all_x, all_y)
    tau_table = {bits: _quantile(preds, 1.0 - bits_to_int8_fraction(bits)) for bits in BITS_GRID}
    tau = _quantile(preds, 1.0 - bits_to_int8_fraction(target_bits))
    frac = sum(p > tau for p in preds) / len(preds)
    rho = _quantile(ratios, pdr_rule.POLICY_RHO_QUANTILE) if ratios else None
    att_fits, att_tau, att_table, att_rows = _fit_attention(ax, ay, handle.block_names, attention_target)
    meta = {
        "prompts": prompts, "steps": steps, "seed": seed, "negative_prompt": negative_prompt,
        "call_kwargs": {k: v for k, v in call.items() if isinstance(v, (int, float, str, bool))},
        "samples": len(preds), "seconds": round(time.perf_counter() - t_start, 2),
        "compute_path": handle.trace.compute_path, "device": handle.trace.device,
        "int8_fraction_at_tau": frac, "avg_act_bits_at_tau": BITS[NVFP4] * (1 - frac) + BITS[INT8] * frac,
        "r2_global_line": r2_global, "torch": torch.__version__,
        "transformer_sha256": fingerprint,
        "pdr_ratio_quantiles": {f"{q:g}": _quantile(ratios, q) for q in (0.05, 0.5, 0.95, 0.99)} if ratios else None,
    }
    policy = Policy(linears=fits, tau=tau, model=model_name or str(getattr(pipe, "name_or_path", "") or ""),
                    target_bits=target_bits, tau_table=tau_table, hadamard_block=hadamard_block,
                    r2_overall=r2_pooled, meta=meta, pdr_rho=rho,
                    pdr_k_sigma=pdr_cfg.pdr_k_sigma if rho is not None else None,
                    pdr_quantile=pdr_rule.POLICY_RHO_QUANTILE if rho is not None else None, pdr_n=len(ratios),
                    attention=att_fits, attention_tau=att_tau, attention_target=attention_target if att_fits else None,
                    attention_tau_table=att_table, probe_profile=profile)
    report = {"model": policy.model, "layers": layers, "r2_overall": r2_pooled, "r2_global_line": r2_global, "tau": tau,
              "target_bits": target_bits, "tau_table": tau_table, "pdr_rho": rho, "pdr_n": len(ratios),
              "pdr_k_sigma": pdr_cfg.pdr_k_sigma, "attention": att_rows, "attention_tau": att_tau,
              "attention_target": attention_target, "probe_profile": profile, **meta}
    return policy, report


def report_markdown(report: dict[str, Any], command: str | None = None) -> str:
    def f(v, nd=4):
        return "—" if v is None else f"{v:.{nd}f}"

    r2s = sorted(layer["r2"] for layer in report["layers"] if layer["r2"] is not None)
    med = r2s[len(r2s) // 2] if r2s else None
    sha = report.get("transformer_sha256")
    lines = [
        "# DMPQ calibration report",
        "",
        f"- model: {report.get('model') or '?'}" + (f" (transformer weights sha256 `{sha[:16]}…`)" if sha else ""),
        f"- samples: {report['samples']} (layer × step × branch × prompt), {len(report['prompts'])} prompts, "
        f"{report['steps']} steps, seed {report['seed']}; device {report['device']} ({report['compute_path']}); "
        f"{report['seconds']} s",
        f"- R² pooled within layers: **{f(report['r2_overall'], 3)}**; median per-layer R²: {f(med, 3)}; "
        f"one global line for all layers: {f(report['r2_global_line'], 3)}",
        f"- τ = {f(report['tau'], 5)} for a target of {report['target_bits']} average activation bits "
        f"(INT8 fraction on the calibration samples: {report['int8_fraction_at_tau']:.3f})",
    ]
    if report.get("pdr_rho") is not None:
        qs = report.get("pdr_ratio_quantiles") or {}
        lines.append(
            f"- PDR ρ = {report['pdr_rho']:.3e}: 95th percentile of {report['pdr_n']} block-input outlier ratios "
            f"(k_σ = {report['pdr_k_sigma']:g}; 5 / 50 / 99 %: "
            + " / ".join(f"{qs.get(k, float('nan')):.2e}" for k in ("0.05", "0.5", "0.99")) + ")"
        )
    if report.get("attention"):
        lines.append(f"- 8-bit attention: τ_attn = {f(report['attention_tau'], 5)} for {report['attention_target']:g} "
                     f"of the calibration samples in 8-bit ({len(report['attention'])} blocks)")
    if command:
        lines += [f"- command: `{command}`"]
    lines += ["", "| layer | α | β | R² | n | mean E (NVFP4) | mean E (INT8) | Γ range |", "|---|---|---|---|---|---|---|---|"]
    for layer in report["layers"]:
        lines.append(
            f"| {layer['name']} | {f(layer['alpha'])} | {f(layer['beta'])} | {f(layer['r2'], 3)} | {layer['n']} | "
            f"{f(layer['mean_err_nvfp4'])} | {f(layer['mean_err_int8'])} | "
            f"{f(layer['gamma_min'], 3)}–{f(layer['gamma_max'], 3)} |"
        )
    if report.get("attention"):
        lines += ["", "| block attention | α | β | R² | n | mean E (8-bit) | max E |", "|---|---|---|---|---|---|---|"]
        for a in report["attention"]:
            lines.append(f"| {a['name']} | {f(a['alpha'])} | {f(a['beta'])} | {f(a['r2'], 3)} | {a['n']} | "
                         f"{f(a['mean_err'])} | {f(a['max_err'])} |")
    out = "\n".join(lines) + "\n"
    return out + ("\n" + profile_markdown(report["probe_profile"]) if report.get("probe_profile") else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sixbit.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="hub id or local pipeline folder (default: sixbit-mini)")
    ap.add_argument("--prompts", required=True, help="text file (one prompt per line) or JSON list")
    ap.add_argument("--out", required=True, help="policy JSON to write")
    ap.add_argument("--report", default=None, help="markdown R² report (default: OUT with .md)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frames", type=int, default=None)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--guidance", type=float, default=None)
    ap.add_argument("--negative-prompt", default="")
    ap.add_argument("--target-bits", type=float, default=6.0)
    ap.add_argument("--hadamard-block", type=int, default=64)
    ap.add_argument("--attention-target", type=float, default=0.75,
                    help="fraction of the calibration samples whose attention τ_attn lets run 8-bit")
    ap.add_argument("--tdc-only", action="store_true",
                    help="measure only step-mode TDC's probe profile and write it into the existing policy OUT "
                         "(its DMPQ, PDR and attention calibration kept; the report gets the profile's section)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: per device)")
    args = ap.parse_args(argv)

    from sixbit.pipeline import default_model_path, load_pipeline

    prompts = read_prompts(args.prompts)
    model_path = args.model or default_model_path()
    before = transformer_fingerprint(model_path)
    pipe = load_pipeline(args.model, device=args.device, dtype=args.dtype)
    call = {}
    for k, v in (("num_frames", args.frames), ("height", args.height), ("width", args.width),
                 ("guidance_scale", args.guidance)):
        if v is not None:
            call[k] = v
    if args.tdc_only:
        return _tdc_only(args, pipe, prompts, call, argv, before)
    policy, report = calibrate(
        pipe, prompts, steps=args.steps, seed=args.seed, target_bits=args.target_bits,
        hadamard_block=args.hadamard_block, negative_prompt=args.negative_prompt, call_kwargs=call,
        model_name=args.model or "sixbit-mini", log=lambda s: print(s, file=sys.stderr), fingerprint=before,
        attention_target=args.attention_target,
    )
    if before != transformer_fingerprint(model_path):
        print(f"error: the weights in {model_path} changed while calibrating; nothing written", file=sys.stderr)
        return 1
    command = "python -m sixbit.calibrate " + " ".join(argv if argv is not None else sys.argv[1:])
    policy.meta["command"] = command
    out = policy.save(args.out)
    rep = Path(args.report) if args.report else out.with_suffix(".md")
    rep.write_text(report_markdown(report, command))
    print(f"wrote {out} and {rep}: R² pooled {report['r2_overall']}, τ {report['tau']:.5g} "
          f"for {args.target_bits} bits, {len(policy.linears)} layers")
    return 0


def _tdc_only(args, pipe, prompts: list[str], call: dict[str, Any], argv, fingerprint: str | None) -> int:
    """``--tdc-only``: the probe profile into the existing policy ``--out`` (of the same weights) and its report."""
    out = Path(args.out)
    policy = Policy.load(out)
    sha = policy.meta.get("transformer_sha256")
    if sha and fingerprint and sha != fingerprint:
        print(f"error: {out} was calibrated on other weights (sha256 {sha[:16]}…); nothing written", file=sys.stderr)
        return 1
    policy.probe_profile = probe_profile(pipe, prompts, steps=args.steps, seed=args.seed,
                                         negative_prompt=args.negative_prompt, call={**_default_call(pipe), **call},
                                         log=lambda s: print(s, file=sys.stderr))
    policy.meta["tdc_command"] = "python -m sixbit.calibrate " + " ".join(argv if argv is not None else sys.argv[1:])
    policy.save(out)
    rep = Path(args.report) if args.report else out.with_suffix(".md")
    head = rep.read_text().split("\n## TDC probe profile")[0].rstrip("\n") + "\n" if rep.exists() else ""
    rep.write_text(head + "\n" + profile_markdown(policy.probe_profile))
    print(f"wrote the TDC probe profile ({args.steps} steps, n={policy.probe_profile.n}) into {out} and {rep}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
