"""The calibrated DMPQ policy: α, β per linear layer and the threshold τ, as versioned plain JSON.

File format (``format: "sixbit-policy"``, ``version: 1``)::

    {
      "format": "sixbit-policy", "version": 1,
      "model": "assets/sixbit-mini",             # what it was calibrated on (informative)
      "gamma_stream": "hidden",                  # Γ is measured on the video-token stream
      "hadamard_block": 64,                      # the rotation the errors were measured with
      "tau": 0.031, "target_bits": 6.0,          # τ chosen for target_bits on the calibration data
      "tau_table": {"4.5": 0.12, "5.0": ..., "8.0": 0.0},   # τ for other bit targets
      "r2_overall": 0.83,
      "linears": {"transformer_blocks.0.attn1.to_q": {"alpha": 0.21, "beta": 0.05, "r2": 0.9, "n": 38}, ...},
      "pdr": {"rho": 0.0036, "k_sigma": 8.0, "quantile": 0.95, "n": 1440},   # optional: PDR's ρ for this model
      "attention": {"blocks": {"transformer_blocks.0": {"alpha": 0.3, "beta": 0.02, "r2": 0.7, "n": 38}, ...},
                    "tau": 0.05, "target": 0.75, "tau_table": {"0.25": 0.03, ..., "1": 0.09}},   # optional
      "tdc": {"steps": 20, "n": 8, "probe_drift": [0.41, ...], "rest_drift": [0.52, ...]},   # optional
      "meta": {...}                              # free-form: prompts, steps, seed, command line
    }

Predicted relative error of a layer's NVFP4 route: ``E = alpha · Γ + beta``; the layer goes INT8 when
``E > tau``. ``pdr`` (optional; files without it still load) is the block-input outlier ratio's
``quantile`` over ``n`` calibration checks at ``k_sigma``: the ρ that ``sixbit.pdr.resolve_rho`` uses
when the config leaves ``pdr_rho`` empty. ``attention`` (optional; files without it still load, and then
every attention runs bf16) holds the per-block fit of the 8-bit attention's relative error
``E_attn = alpha · Γ + beta`` (``sixbit.dmpq.attention_route``: 8-bit when ``E_attn ≤ tau``), τ_attn for
``target`` (the fraction of the calibration samples at or under it) and a τ-for-fraction table. ``tdc`` (optional; files
without it still load, and step-mode TDC's ``tdc_threshold_rule="profile"`` then falls back to ``"steps"``,
saying so in the trace) is the probe profile of a full-compute run (:class:`ProbeProfile`): per step 1…N−1
of an N-step calibration run, the mean one-step drift of block 0's delta (the probe) and of the combined
residual of the blocks after it (what a skipped step reuses). Loading validates every field and raises :class:`PolicyError` naming the first bad one
(``linears['transformer_blocks.3.ff.net.2'].alpha: expected a finite number, got 'x'``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sixbit.routes import BITS, INT8, NVFP4

__all__ = ["Policy", "LinearFit", "ProbeProfile", "PolicyError", "POLICY_FORMAT", "POLICY_VERSION", "bits_to_int8_fraction"]

POLICY_FORMAT = "sixbit-policy"
POLICY_VERSION = 1


def bits_to_int8_fraction(bits: float) -> float:
    """Fraction of INT8 decisions that gives ``bits`` average activation bits (clamped to [0, 1]); the two
    DMPQ routes' bits are the route table's (NVFP4 counts its block scales)."""
    lo, hi = BITS[NVFP4], BITS[INT8]
    return min(1.0, max(0.0, (bits - lo) / (hi - lo)))


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the offending field."""


@dataclass
class LinearFit:
    """Least-squares fit ``E = alpha·Γ + beta`` of one layer (``r2``/``n``: fit quality, sample count)."""

    alpha: float
    beta: float
    r2: float | None = None
    n: int = 0

    def predict(self, gamma: float) -> float:
        return self.alpha * gamma + self.beta


@dataclass
class ProbeProfile:
    """Step-mode TDC's calibrated per-step profile (``sixbit.calibrate.probe_profile``): at every step k = 1…
    ``steps``−1 of a full-compute calibration run, the relative L1 change from step k−1 of the probe's delta
    (``probe_drift[k−1]``) and of the combined residual of the blocks after it (``rest_drift[k−1]``), each
    the mean over ``n`` prompt × CFG-branch runs."""

    steps: int
    probe_drift: list[float]
    rest_drift: list[float]
    n: int = 0

    def weight(self, step: int, num_steps: int) -> float:
        """How much more the rest of the network drifts per unit of probe drift at ``step`` of ``num_steps``
        than at the profile's median step: the ratio rest/probe, interpolated at the same normalised time
        u = step/(num_steps−1) (linear, clamped at the ends), over its median. The probe threshold is
        divided by it (``sixbit.tdc.probe_threshold``)."""
        g = [r / p if p > 0 else 1.0 for p, r in zip(self.probe_drift, self.rest_drift)]
        med = sorted(g)[len(g) // 2]
        u = step / max(1, num_steps - 1) * (self.steps - 1)  # in the calibration's steps; drift k sits at u = k
        xs = range(1, self.steps)
        return _interpolate(dict(zip(xs, g)), u, 1.0) / med if med > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "n": self.n, "probe_drift": self.probe_drift, "rest_drift": self.rest_drift}

    @classmethod
    def from_dict(cls, d: Any) -> ProbeProfile:
        if not isinstance(d, dict):
            raise PolicyError(f"tdc: expected an object with steps, probe_drift and rest_drift, got {_show(d)}")
        steps = _int(d.get("steps"), "tdc.steps", minimum=2)
        drifts = {}
        for key in ("probe_drift", "rest_drift"):
            v = d.get(key)
            if not isinstance(v, list) or len(v) != steps - 1:
                raise PolicyError(f"tdc.{key}: expected a list of {steps - 1} drifts (steps 1…{steps - 1}), got {_show(v)}")
            drifts[key] = [_number(x, f"tdc.{key}[{i}]") for i, x in enumerate(v)]
            if any(x < 0 for x in drifts[key]):
                raise PolicyError(f"tdc.{key}: drifts are relative L1 changes (>= 0), got {_show(v)}")
        return cls(steps=steps, n=_int(d.get("n", 0), "tdc.n", minimum=0), **drifts)


@dataclass
class Policy:
    linears: dict[str, LinearFit]
    tau: float
    model: str = ""
    target_bits: float | None = None
    tau_table: dict[float, float] = field(default_factory=dict)
    hadamard_block: int | None = None
    gamma_stream: str = "hidden"
    r2_overall: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    calibrated: bool = True
    pdr_rho: float | None = None
    pdr_k_sigma: float | None = None
    pdr_quantile: float | None = None
    pdr_n: int = 0
    attention: dict[str, LinearFit] = field(default_factory=dict)
    attention_tau: float | None = None
    attention_target: float | None = None
    attention_tau_table: dict[float, float] = field(default_factory=dict)
    probe_profile: ProbeProfile | None = None

    # -------------------------------------------------------------------------------------- decisions
    def fit(self, name: str) -> LinearFit:
        try:
            return self.linears[name]
        except KeyError:
            if not self.calibrated:
                return _IDENTITY
            raise PolicyError(
                f"policy (calibrated on {self.model or 'an unnamed model'!r}, {len(self.linears)} layers) has no "
                f"entry for layer {name!r}: calibrate this model with `python -m sixbit.calibrate`"
            ) from None

    def tau_for_bits(self, bits: float) -> float:
        """τ for an average-activation-bit target, interpolated linearly in the τ-for-bits table."""
        return _interpolate(self.tau_table, bits, self.tau)

    def attention_fit(self, block: str) -> LinearFit | None:
        """The 8-bit attention's error line of ``block`` (None: no fit, the block's attention runs bf16)."""
        return self.attention.get(block)

    def attention_tau_for(self, target: float | None) -> float | None:
        """τ_attn for a target 8-bit fraction (the table, interpolated), the calibrated τ_attn without a
        target, or None without attention fits."""
        if not self.attention:
            return None
        if target is None:
            return self.attention_tau
        return _interpolate(self.attention_tau_table, target, self.attention_tau)

    @classmethod
    def uncalibrated(cls, tau: float) -> Policy:
        """E = Γ for every layer (α = 1, β = 0): what DMPQ uses when no policy is available."""
        return cls(linears={}, tau=tau, model="", calibrated=False)

    # ------------------------------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        if not self.calibrated:
            raise PolicyError("an uncalibrated policy is not written to disk")
        return {
            "format": POLICY_FORMAT,
            "version": POLICY_VERSION,
            "model": self.model,
            "gamma_stream": self.gamma_stream,
            "hadamard_block": self.hadamard_block,
            "tau": self.tau,
            "target_bits": self.target_bits,
            "tau_table": {f"{b:g}": t for b, t in sorted(self.tau_table.items())},
            "r2_overall": self.r2_overall,
            "linears": {k: _fit_dict(v) for k, v in self.linears.items()},
            **({"pdr": {"rho": self.pdr_rho, "k_sigma": self.pdr_k_sigma, "quantile": self.pdr_quantile,
                        "n": self.pdr_n}} if self.pdr_rho is not None else {}),
            **({"attention": {
                "blocks": {k: _fit_dict(v) for k, v in self.attention.items()}, "tau": self.attention_tau,
                "target": self.attention_target,
                "tau_table": {f"{f:g}": t for f, t in sorted(self.attention_tau_table.items())}}}
               if self.attention else {}),
            **({"tdc": self.probe_profile.to_dict()} if self.probe_profile is not None else {}),
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise PolicyError(f"cannot read policy file {str(path)!r}: {e}") from e
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PolicyError(f"policy file {str(path)!r} is not valid JSON: {e}") from e
        try:
            return cls.from_dict(d)
        except PolicyError as e:
            raise PolicyError(f"policy file {str(path)!r}: {e}") from e

    @classmethod
    def from_dict(cls, d: Any) -> Policy:
        if not isinstance(d, dict):
            raise PolicyError(f"expected a JSON object at the top level, got {type(d).__name__}")
        if d.get("format") != POLICY_FORMAT:
            raise PolicyError(f"format: expected {POLICY_FORMAT!r}, got {d.get('format')!r}")
        version = d.get("version")
        if version != POLICY_VERSION:
            raise PolicyError(f"version: this sixbit reads policy version {POLICY_VERSION}, got {version!r}")
        linears_raw = d.get("linears")
        if not isinstance(linears_raw, dict) or not linears_raw:
            raise PolicyError(f"linears: expected a non-empty object of layer fits, got {_show(linears_raw)}")
        linears = {name: _fit(fit, f"linears[{name!r}]") for name, fit in linears_raw.items()}
        tau_table = _table(d.get("tau_table", {}), "tau_table", "bits")
        hb = d.get("hadamard_block")
        if hb is not None:
            hb = _int(hb, "hadamard_block", minimum=0)
        gs = d.get("gamma_stream", "hidden")
        if gs != "hidden":
            raise PolicyError(f"gamma_stream: only 'hidden' is supported, got {gs!r}")
        tb = d.get("target_bits")
        r2o = d.get("r2_overall")
        meta = d.get("meta", {})
        if not isinstance(meta, dict):
            raise PolicyError(f"meta: expected an object, got {_show(meta)}")
        model = d.get("model", "")
        if not isinstance(model, str):
            raise PolicyError(f"model: expected a string, got {_show(model)}")
        pdr = d.get("pdr")
        if pdr is not None and not isinstance(pdr, dict):
            raise PolicyError(f"pdr: expected an object with rho and k_sigma, got {_show(pdr)}")
        pdr = pdr or {}
        rho = None if not pdr else _number(pdr.get("rho"), "pdr.rho")
        if rho is not None and not 0.0 <= rho <= 1.0:
            raise PolicyError(f"pdr.rho: expected a fraction in [0, 1], got {_show(rho)}")
        q = pdr.get("quantile")
        att = d.get("attention") or {}
        if not isinstance(att, dict) or (att and not isinstance(att.get("blocks"), dict)):
            raise PolicyError(f"attention: expected an object with blocks, tau and tau_table, got {_show(att)}")
        att_blocks = {name: _fit(fit, f"attention.blocks[{name!r}]") for name, fit in (att.get("blocks") or {}).items()}
        att_target = att.get("target")
        return cls(
            linears=linears,
            tau=_number(d.get("tau"), "tau"),
            model=model,
            target_bits=None if tb is None else _number(tb, "target_bits"),
            tau_table=tau_table,
            hadamard_block=hb,
            gamma_stream=gs,
            r2_overall=None if r2o is None else _number(r2o, "r2_overall"),
            meta=meta,
            pdr_rho=rho,
            pdr_k_sigma=None if not pdr else _number(pdr.get("k_sigma"), "pdr.k_sigma"),
            pdr_quantile=None if q is None else _number(q, "pdr.quantile"),
            pdr_n=_int(pdr.get("n", 0), "pdr.n", minimum=0),
            attention=att_blocks,
            attention_tau=_number(att.get("tau"), "attention.tau") if att_blocks else None,
            attention_target=None if att_target is None else _number(att_target, "attention.target"),
            attention_tau_table=_table(att.get("tau_table", {}), "attention.tau_table", "fraction"),
            probe_profile=None if d.get("tdc") is None else ProbeProfile.from_dict(d["tdc"]),
        )

    def describe(self) -> str:
        if not self.calibrated:
            return "uncalibrated"
        att = (f"attention fits for {len(self.attention)} blocks" if self.attention
               else "no attention fit: bf16 attention")
        tdc = (f"TDC probe profile of {self.probe_profile.steps} steps" if self.probe_profile is not None
               else "no TDC probe profile")
        return f"calibrated on {self.model!r} ({len(self.linears)} layers, R² {self.r2_overall}; {att}; {tdc})"


_IDENTITY = LinearFit(alpha=1.0, beta=0.0)


def _interpolate(table: dict[float, float], x: float, default: float):
    """Linear interpolation in ``{x: τ}`` (clamped at the ends; ``default`` for an empty table)."""
    if not table:
        return default
    pts = sorted(table.items())
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, t0), (x1, t1) in zip(pts, pts[1:]):
        if x <= x1:
            w = (x - x0) / (x1 - x0) if x1 > x0 else 1.0
            return t0 + w * (t1 - t0)
    return pts[-1][1]


def _fit_dict(f: LinearFit) -> dict[str, Any]:
    return {"alpha": f.alpha, "beta": f.beta, "r2": f.r2, "n": f.n}


def _fit(fit: Any, where: str) -> LinearFit:
    if not isinstance(fit, dict):
        raise PolicyError(f"{where}: expected an object with alpha and beta, got {_show(fit)}")
    r2 = fit.get("r2")
    return LinearFit(alpha=_number(fit.get("alpha"), f"{where}.alpha"), beta=_number(fit.get("beta"), f"{where}.beta"),
                     r2=None if r2 is None else _number(r2, f"{where}.r2"),
                     n=_int(fit.get("n", 0), f"{where}.n", minimum=0))


def _table(raw: Any, where: str, what: str) -> dict[float, float]:
    raw = raw or {}
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: expected an object {{{what}: tau}}, got {_show(raw)}")
    out = {}
    for k, v in raw.items():
        try:
            x = float(k)
        except ValueError:
            raise PolicyError(f"{where}: key {k!r} is not a number ({what})") from None
        out[x] = _number(v, f"{where}[{k!r}]")
    return out


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise PolicyError(f"{where}: expected a finite number, got {_show(v)}")
    return float(v)


def _int(v: Any, where: str, minimum: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (minimum is not None and v < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise PolicyError(f"{where}: expected an integer{bound}, got {_show(v)}")
    return v
