"""The per-step record of every decision: what the UI plots and the benchmarks count.

``Trace.to_dict()`` (schema version 1, JSON-safe) — the app codes against exactly this::

    {"version": 1, "model": str, "device": str, "compute_path": str, "config": {...},
     "blocks": [block names], "linears": [routed linear names, block order],
     "steps": [{"step": i, "timestep": float, "time_s": float,
                "blocks": [{"computed", "skipped", "pdr", "gamma", "delta_sim", "acc_err",
                            "outlier_ratio", "mode"}, ... one per block],
                "routes": ["nvfp4" | "int8" | "fp16" | "skipped", ... one per linear],
                "pred_err": [float | null, ... one per linear],
                "linear_outlier_ratio": [float | null, ... one per linear],
                "attention": [{"route": "fp8" | "bf16" | "skipped", "pred_err": float | null, "why": str,
                               "emulated": bool}, ... one per block],
                "branch": str, "other_branches": {name: {"blocks", "routes", "pred_err", ...}}}],
     "summary": {"avg_act_bits", "skip_fraction", "pdr_count", "time_s", "peak_mem_bytes",
                 "route_counts": {"nvfp4", "int8", "fp16", "skipped"}, "nvfp4_as_int8",
                 "attention_counts": {"fp8", "bf16"}, "attention_fp8_fraction", ...}}

A trace saved by the demo (trace.json) has one more key, ``"run"`` (:func:`run_record`, its own version
:data:`RUN_VERSION`): what the run needs to be replayed — model id and revision, pipeline arguments, seed,
the full SixBitConfig, the policy's fingerprint, device, compute path, thread count, package versions and
the videos' digests (README, "Replaying a demo run").

Conventions:

* Non-finite numbers (a threshold set to infinity, Γ of an all-zero input) are written as null.
* Routes are reported by activation precision: ``w8a8`` shows as ``int8``, ``w4a16`` as ``fp16``. An NVFP4
  decision run as INT8 (``SixBitConfig.nvfp4_route``) shows as ``int8``; its block's entry counts such layers
  in ``nvfp4_as_int8`` (absent when none) and the summary adds them up.
* ``gamma`` is Γ measured at this step (the next step routes with it); ``delta_sim`` the block's current
  delta change rate (see ``sixbit.tdc``); ``acc_err`` the accumulated skip error after this step (0 after
  a computed step); ``outlier_ratio`` the block-input outlier ratio when PDR checked it, else null.
  ``mode`` says why the block ran as it did: ``warmup``, ``dmpq``, ``after_skip`` (INT8, no fresh Γ), ``probe`` (step mode's probe, ``tdc_probe_route``),
  ``pdr``, ``static``, ``fp`` (quantization off), ``skip``, ``replay`` (routes from a recorded schedule).
  ``tdc`` says what TDC did (``compute``, ``reuse``, ``forecast``, the probe's ``probe_*``, ``tail_compute``); with
  ``tdc_scope="attention"`` a skipped cell is ``attn_reuse`` / ``attn_forecast``: ``computed`` *and* ``skipped``
  are true (the block ran on its fresh input, its self-attention call did not — it returned the cached output);
  its attention's linears show ``skipped``, the others their routes, ``attention.why`` is ``attn_reuse``.
  ``skip_fraction`` counts it as skipped: the fraction of self-attention calls not run (the peer arena's count).
  The decision is ``sixbit.hooks.BlockHook._refresh``'s; step mode's probe row also has
  ``threshold``, the probe threshold of that step (``sixbit.tdc.probe_threshold``).
* A step's ``blocks``/``routes``/``pred_err`` are those of its first CFG branch (``branch``); with
  separate CFG calls (Wan) the other branch is under ``other_branches``. The ``summary`` counts every
  branch: ``route_counts`` add up to steps × linears × branches, ``skip_fraction`` is over all block
  evaluations, ``avg_act_bits`` the mean over computed linear evaluations of 4.5 (NVFP4, incl. block
  scales), 8 (INT8) or 16 (FP16/W4A16) — every layer counts once, whatever its size.
* ``attention`` per block: the route its attention really ran (``fp8``, ``bf16``; ``skipped`` with the
  block), the policy's predicted 8-bit error (null unless it predicted) and ``why`` (``sixbit.dmpq.
  attention_route``); ``emulated``: the CPU/torch emulation of the 8-bit kernel ran (the compute path then
  says so). ``attention_fp8_fraction`` is over computed block evaluations.
* ``time_s`` of a step is the wall time of the transformer calls of that step (GPU synchronized at the
  end of each step when ``config.sync_timing``); the summary's ``time_s`` is their sum.
"""

from __future__ import annotations

import math
from typing import Any

from sixbit.routes import BITS as ROUTE_BITS
from sixbit.routes import LETTERS, SKIPPED, TRACE_ROUTES
from sixbit.tdc import ATTENTION_LETTERS, NO_ATTENTION, NO_ROUTE, SkipSchedule

__all__ = ["Trace", "TRACE_VERSION", "ROUTE_BITS", "json_safe", "RUN_VERSION", "run_record",
           "policy_fingerprint", "package_versions"]

TRACE_VERSION = 1


def json_safe(v):
    """Recursively replace non-finite floats (JSON has none) by None; tuples become lists."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def _f(v):
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class _Branch:
    def __init__(self, n_blocks: int, n_linears: int):
        self.blocks: list[dict | None] = [None] * n_blocks
        self.routes: list[str | None] = [None] * n_linears
        self.pred_err: list[float | None] = [None] * n_linears
        self.lin_outliers: list[Any] = [None] * n_linears
        self.attention: list[dict | None] = [None] * n_blocks

    def to_dict(self) -> dict[str, Any]:
        out_lin = []
        for o in self.lin_outliers:
            if o is None:
                out_lin.append(None)
            else:
                count, total = o
                out_lin.append(_f(count) / total if total else None)
        return {
            "blocks": [json_safe(b) if b is not None else dict(_NOT_RUN) for b in self.blocks],
            "routes": [r if r is not None else SKIPPED for r in self.routes],
            "pred_err": [_f(p) for p in self.pred_err],
            "linear_outlier_ratio": out_lin,
            "attention": [json_safe(a) if a is not None else dict(_ATTN_NOT_RUN) for a in self.attention],
        }


_ATTN_NOT_RUN = {"route": SKIPPED, "pred_err": None, "why": "not_run", "emulated": False}
_NOT_RUN = {"computed": False, "skipped": False, "pdr": False, "gamma": None, "delta_sim": None,
            "acc_err": 0.0, "outlier_ratio": None, "mode": "not_run", "tdc": None}


class _Step:
    def __init__(self, step: int, timestep: float):
        self.step = step
        self.timestep = timestep
        self.time_s = 0.0
        self.branches: dict[str, _Branch] = {}
        self._frozen: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        if self._frozen is not None:
            return self._frozen
        names = list(self.branches)
        first = self.branches[names[0]].to_dict()
        return {
            "step": self.step, "timestep": self.timestep, "time_s": self.time_s, **first,
            "branch": names[0], "other_branches": {n: self.branches[n].to_dict() for n in names[1:]},
        }

    def freeze(self):
        self._frozen = None
        self._frozen = self.to_dict()


class Trace:
    """Records of one pipeline call; reset by the engine at the start of the next call."""

    def __init__(self, *, model: str, device: str, compute_path: str, config: dict, blocks: list[str],
                 linears: list[str], block_linears: list[range], extra: dict | None = None):
        self.model = model
        self.device = device
        self.compute_path = compute_path
        self.config = config
        self.blocks = blocks
        self.linears = linears
        self.block_linears = block_linears
        self.steps: list[_Step] = []
        self.peak_mem_bytes: int | None = None
        self.extra = dict(extra or {})
        self.finished = False

    # ------------------------------------------------------------------------------------- recording
    def branch(self, step: int, name: str, timestep: float) -> _Branch:
        while len(self.steps) <= step:
            self.steps.append(_Step(len(self.steps), timestep))
        st = self.steps[step]
        if name not in st.branches:
            st.branches[name] = _Branch(len(self.blocks), len(self.linears))
        return st.branches[name]

    def add_time(self, step: int, seconds: float) -> None:
        self.steps[step].time_s += seconds

    def close_step(self, step: int) -> None:
        if step < len(self.steps):
            self.steps[step].freeze()

    # ---------------------------------------------------------------------------------------- output
    def summary(self) -> dict[str, Any]:
        counts = dict.fromkeys(TRACE_ROUTES, 0)
        attn = {"fp8": 0, "bf16": 0}
        n_blocks = n_skipped = n_pdr = n_promoted = 0
        for st in self.steps:
            for br in st.branches.values():
                for a in br.attention:
                    if a is not None and a["route"] in attn:
                        attn[a["route"]] += 1
                for r in br.routes:
                    counts[r if r is not None else SKIPPED] += 1
                for b in br.blocks:
                    if b is None:
                        continue
                    n_blocks += 1
                    n_skipped += bool(b["skipped"])
                    n_pdr += bool(b["pdr"])
                    n_promoted += b.get("nvfp4_as_int8", 0)
        computed = sum(counts[k] for k in ROUTE_BITS)
        bits = sum(ROUTE_BITS[k] * counts[k] for k in ROUTE_BITS) / computed if computed else None
        return {
            "avg_act_bits": bits,
            "skip_fraction": n_skipped / n_blocks if n_blocks else 0.0,
            "pdr_count": n_pdr,
            "time_s": sum(st.time_s for st in self.steps),
            "peak_mem_bytes": self.peak_mem_bytes,
            "route_counts": counts,
            "nvfp4_as_int8": n_promoted,
            "attention_counts": attn,
            "attention_fp8_fraction": attn["fp8"] / sum(attn.values()) if sum(attn.values()) else 0.0,
            "num_steps": len(self.steps),
            "block_evaluations": n_blocks,
            **self.extra,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": TRACE_VERSION,
            "model": self.model,
            "device": self.device,
            "compute_path": self.compute_path,
            "config": json_safe(self.config),
            "blocks": list(self.blocks),
            "linears": list(self.linears),
            "steps": [st.to_dict() for st in self.steps],
            "summary": json_safe(self.summary()),
        }

    def skip_schedule(self) -> SkipSchedule:
        """The computed/skipped pattern of this run per branch (a block never reached counts as computed),
        with the routes of every computed block evaluation (route letters, see :mod:`sixbit.tdc`) and its
        attention route (``sixbit.tdc.ATTENTION_LETTERS``)."""
        names: list[str] = []
        for st in self.steps:
            names += [n for n in st.branches if n not in names]
        branches, routes, attention = {}, {}, {}
        for n in names:
            rows, rrows, arows = [], [], []
            for st in self.steps:
                br = st.branches.get(n)
                blocks = br.blocks if br is not None else [None] * len(self.blocks)
                rows.append([not (b is not None and b["skipped"]) for b in blocks])
                rrows.append(["".join(LETTERS.get(br.routes[j], NO_ROUTE) for j in self.block_linears[b])
                              if blk is not None and blk["computed"] else "" for b, blk in enumerate(blocks)])
                att = br.attention if br is not None else [None] * len(self.blocks)
                arows.append("".join(ATTENTION_LETTERS.get((a or {}).get("route") if blk is not None and blk["computed"]
                                                           else None, NO_ATTENTION) for a, blk in zip(att, blocks)))
            branches[n], routes[n], attention[n] = rows, rrows, arows
        return SkipSchedule(len(self.blocks), len(self.steps), branches,
                            {"model": self.model, "config": self.config, "device": self.device}, routes, attention,
                            self.config.get("tdc_scope", "block"))


# ------------------------------------------------------------------------------------ run metadata
#: version of the ``run`` section (below); the trace's own schema version is unchanged by it
RUN_VERSION = 1


def package_versions() -> dict[str, str | None]:
    """Versions of Python and of every package that decides a run's numbers."""
    import platform
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("sixbit", "torch", "diffusers", "transformers", "numpy", "triton"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def policy_fingerprint(policy) -> dict[str, Any]:
    """A policy's identity: what it was calibrated on, and the SHA-256 of its canonical JSON."""
    import hashlib
    import json

    content = policy.to_dict() if policy.calibrated else {"uncalibrated": True, "tau": policy.tau}  # E = Γ
    body = json.dumps(json_safe(content), sort_keys=True, separators=(",", ":"))
    return {"id": policy.describe(), "model": getattr(policy, "model", None),
            "calibrated": bool(policy.calibrated), "sha256": hashlib.sha256(body.encode()).hexdigest()}


def run_record(*, model: dict[str, Any], pipeline_kwargs: dict[str, Any], seed: int, config, policy,
               device: str, compute_path: str, threads: int, outputs: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``run`` section a saved trace carries (``trace["run"]``): everything needed to replay the run.

    ``model``: ``{"id", "revision", ...}`` (a display id, never a path on the server); ``pipeline_kwargs``: what
    the pipeline was called with, less the generator, which is ``torch.Generator("cpu").manual_seed(seed)``;
    ``config``: the :class:`~sixbit.config.SixBitConfig` (``SixBitConfig.from_dict(run["sixbit_config"])``
    rebuilds it); ``policy``: the resolved :class:`~sixbit.policy.Policy`; ``threads``: torch's intra-op
    threads (CPU results are bit-identical only at the same count); ``outputs``: digests of the videos.
    """
    return json_safe({
        "version": RUN_VERSION,
        "model": dict(model),
        "pipeline_kwargs": dict(pipeline_kwargs),
        "generator": {"device": "cpu", "seed": int(seed)},
        "sixbit_config": config.to_dict(),
        "policy": policy_fingerprint(policy),
        "device": str(device),
        "compute_path": compute_path,
        "torch_threads": int(threads),
        "packages": package_versions(),
        "outputs": dict(outputs or {}),
    })

