"""What the chosen preset is expected to do on this device (before a run) and what it did (after one).

The numbers come from ``sixbit.costs`` only: per-route unit costs measured per device class (Hopper —
measured on an H100 — and the CPU so far) and the engine's measured weight-memory ratios; a class without
measurements says "not measured" and shows no number. After a run the measured per-step speed-up is shown
next to the model's estimate for that run's own decisions (its route counts, skipped fraction and 8-bit
attention share), and a 6Bit run that was slower than the baseline is never shown without the reasons the
trace gives.
"""

from __future__ import annotations

from sixbit import costs

CLASS_NAMES = {"cpu": "this CPU", "sm_90": "Hopper (sm_90)", "sm_80-89": "Ampere/Ada (sm_80–89)",
               "sm_100": "Blackwell (sm_100)", "sm_120": "Blackwell (sm_120)", "sm_<80": "a GPU below sm_80",
               "cuda": "this GPU (capability unknown)"}

SPEED_ALTERNATIVE = ("For speed instead: Advanced → **INT8 route = auto** and **NVFP4 route = auto** (the defaults: "
                     "every quantized layer on the int8 tensor cores from the 4-bit weights alone, re-quantized per "
                     "call), **INT8 route = w8a8** (the same tensor cores from an 8-bit copy of each weight) or "
                     "**Quantization = w8a8** (static W8A8 + TDC).")


def _x(v: float) -> str:
    return f"{v:.2f}×"


def _range(b: tuple[float, float]) -> str:
    lo, hi = b
    return _x(lo) if abs(hi - lo) < 0.005 else f"{_x(lo)}–{_x(hi)}"


def _speed_line(e: costs.Effect) -> str:
    if e.computed is None:
        if not e.measured:
            return "per-step speed: **not measured** on this device class (no number is invented)"
        return "per-step speed: **not measured** for this configuration on this device class"
    text = f"per-step speed {_range(e.computed)} with every block computed (what random weights give)"
    if e.at_skip is not None:
        text += f", {_range(e.at_skip)} if TDC skips {e.skip:.0%} of block evaluations"
    return text


def _memory_line(e: costs.Effect, cfg) -> str:
    if e.weight_ratio is not None:
        return f"transformer weights {e.weight_ratio:.2f}× smaller"
    if e.device_class == "cpu" and costs.weight_format(cfg) not in (None, "bf16"):
        return "no weight-memory saving on the CPU (the original weights stay in the same memory)"
    return "weight memory: not measured for this model and setting"


def _rest_of_speed(cls: str) -> str:
    """Where a GPU's speed comes from besides the linears: skipped blocks, and the 8-bit (e4m3) attention where the
    class has FP8 tensor cores throughout (sm_80-89 has them from 8.9 only)."""
    if cls == "sm_80-89":
        return "skipped blocks (and the 8-bit attention on capability 8.9)"
    return "skipped blocks and the 8-bit attention"


def expected_markdown(cfg, cls: str, shape: costs.TransformerShape | None, preset: str = "") -> str:
    """The "expected effect" panel for ``cfg`` on device class ``cls`` (shown before generating)."""
    where = CLASS_NAMES.get(cls, cls)
    e = costs.expected_effect(cfg, cls, shape)
    if cfg.quant == "off" and not cfg.tdc:
        return f"**Expected on {where}:** the baseline model itself (no quantization, no skipping): 1×."
    lines = [f"**Expected on {where}** ({preset or 'this configuration'}): {_speed_line(e)}; "
             f"{_memory_line(e, cfg)}."]
    four_bit = costs.weight_format(cfg) in ("nvfp4", "nvfp4+int8")
    if cls == "cpu" and cfg.quant != "off":
        lines.append("On the CPU every quantized layer is simulated in plain torch (slower than the baseline's); "
                     "the speed comes from skipped blocks only. On a GPU this setting optimises "
                     + ("**memory (4-bit weights)**" if four_bit else "memory and INT8 speed") + ".")
    elif costs.int8_tensor_core_routes(cfg, cls):
        src = ("its INT8 weight copy" if cfg.int8_route == "w8a8" else
               "its 4-bit weight, re-quantized to INT8 per call")
        lines.append(f"This GPU has no FP4 tensor cores: every quantized layer — DMPQ's NVFP4 decisions too — multiplies "
                     f"INT8 activations by {src} on the int8 tensor cores (INT8 / NVFP4 route = auto); the rest of "
                     f"the speed comes from {_rest_of_speed(cls)}.")
    elif cfg.quant != "off" and not costs.fp4_tensor_cores(cls) and cfg.quant != "w8a8":
        opt = "memory (4-bit weights)" if four_bit else "memory"
        lines.append(f"This GPU has no FP4 tensor cores: NVFP4 layers decode their 4-bit weights and multiply "
                     f"at 16-bit rate, so this setting optimises **{opt}**, not speed; the speed comes from "
                     f"{_rest_of_speed(cls)}. " + SPEED_ALTERNATIVE)
    if e.sources:
        lines.append("Model from measured unit costs: " + ", ".join(f"`{s}`" for s in e.sources) + " (sixbit/costs.py"
                     + (f"; {e.fit}" if e.fit else "") + ").")
    return "\n\n".join(lines)


def slower_reasons(cls: str, summary: dict, compute_path: str, self_check_s: float | None) -> list[str]:
    """Why a 6Bit run may be slower than its baseline, from what the run recorded."""
    reasons = []
    counts = summary.get("route_counts") or {}
    computed = sum(v for k, v in counts.items() if k != "skipped")
    if not summary.get("skip_fraction"):
        reasons.append("nothing was skipped (TDC found no block stable enough to reuse; random weights never are)")
    if cls == "cpu":
        reasons.append("on the CPU quantization is simulated in plain torch: a quantized layer costs more than a "
                       "plain one")
    elif counts.get("nvfp4") and not costs.fp4_tensor_cores(cls):
        reasons.append(f"{counts['nvfp4'] / max(1, computed):.0%} of computed linear calls ran NVFP4, which has no "
                       "tensor cores below capability 10 (decoded and multiplied at 16-bit rate)")
    if "self-check fallback" in compute_path:
        reasons.append("a kernel failed its self-check and ran a slower safe path (see the compute path)")
    if self_check_s:
        reasons.append(f"this run included the kernels' first use on this device (self-check and compilation, "
                       f"{self_check_s:.1f} s)")
    return reasons


def measured_rows(cls: str, cfg, summary: dict, step_speed: float | None) -> list[list[str]]:
    """Metrics rows: the model's estimate for this run's decisions next to the measured per-step speed-up."""
    est = costs.run_estimate(cls, cfg, summary.get("route_counts") or {}, float(summary.get("skip_fraction") or 0),
                             summary.get("attention_fp8_fraction"))
    wb = summary.get("weight_bytes") or {}
    rows = [["expected per-step speed-up for this run's routes and skips (sixbit/costs.py)", "1×",
             "not measured on this device class" if est is None else _x(est)],
            ["measured per-step speed-up", "1×", "n/a" if step_speed is None else _x(step_speed)]]
    if wb.get("original_bytes"):
        base = wb["original_bytes"] + wb.get("other_transformer_bytes", 0)
        six = wb.get("packed_bytes", 0) + wb.get("fp_bytes_on_device", 0) + wb.get("other_transformer_bytes", 0)
        where = " (on a GPU; the CPU keeps the originals too)" if cls == "cpu" else ""
        rows.append([f"transformer weights resident (measured by the engine){where}", f"{base / 2**30:.3g} GiB",
                     f"{six / 2**30:.3g} GiB ({base / six:.2f}× smaller)"])
    return rows
