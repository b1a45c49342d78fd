"""How long a denoising step takes, and what 6Bit is expected to change on a device class.

Two models, both built from committed measurements only. (1) The bf16 step time: a FLOP count of the
transformer at a rate measured on the H200 — used to reserve GPU time before a run (the app's
``spaces.GPU(duration=...)`` on Hugging Face ZeroGPU). (2) The expected effect of a 6Bit configuration
(:func:`expected_effect`): per-route unit costs per device class, documented below "Per-route unit costs". The FLOPs of one CogVideoX/Wan-style transformer step, CFG batched
(``batch`` = 2), with ``T`` tokens (video + text), ``L`` blocks of width ``d`` and feed-forward width ``f``:

    linears   2 · batch · T · L · (4·d² + 2·d·f)          (q, k, v, out; ff in, ff out)
    attention 4 · batch · T² · d · L                      (QKᵀ and PV over all heads)

**Measured rate** (bf16, H200, diffusers' own CogVideoX transformer, 49 frames 480×720 = 17,776 tokens):
CogVideoX-2B 0.634 s/step (``benchmarks/results/peers_speed_h200.md``, baseline row) → 240 TFLOP at
379 TFLOP/s effective; CogVideoX-5B 1.78 s/step (the project's FACTS, 2026-11-30) → 664 TFLOP at 373 TFLOP/s.
:data:`H200_EFFECTIVE_TFLOPS` is the lower of the two.

**Other GPUs are estimates, not measurements**: the rate is scaled by the GPU's dense bf16 tensor rate
relative to the H200's (:data:`RELATIVE_RATE`: the RTX Pro 6000 Blackwell of today's ZeroGPU has about
half the H200's dense bf16 rate). A GPU missing from the table is assumed to be as slow as the slowest
listed one, so a reservation errs long.

**Per-route unit costs** (:data:`UNIT_COSTS`, one :class:`ClassCosts` per measured device class). A bf16
step splits into attention, linear GEMMs and the rest (fractions of the step); 6Bit changes the rest
(``other_sixbit``: its fused q/k LayerNorm and rotary, norms that emit INT8 codes, gated residuals — profiled
with quantization on only, so a config without quantization keeps the bf16 rest ``other``), each computed
linear call by its route's cost relative to a bf16 call (``route``), each computed block's attention that ran
8-bit by ``attention_8bit`` (the whole 8-bit call ÷ cuDNN bf16), and a skipped block evaluation costs
``skipped`` of a computed bf16 one.
With fractions p_r of the computed linear calls per route, the fraction a of computed block evaluations whose
attention ran 8-bit and the skipped fraction s of block evaluations:

    step ratio = (1 − s) · (attention · (1 − a + a · attention_8bit) + other_sixbit
                            + linear · Σ p_r · route_r) + s · skipped
    expected per-step speed-up = 1 / step ratio

A run's own a comes from its trace (``attention_fp8_fraction``); before a run, :func:`expected_effect` takes
the a measured in the class's reference runs for the config's ``attention_after_skip`` (``attention_shares``;
0 with ``attention="bf16"``, 1 with ``"fp8"``).

* ``sm_90`` (Hopper; measured on an NVIDIA H100 80GB HBM3, one session's runs — the H200 is the same class and
  ran the bf16 step within 0.1 % of it, 629 ms): ``route`` = ``ops.linear`` end to end (quantize + GEMM) summed
  over the four CogVideoX-2B linear shapes at M = 35,552 rows ÷ bf16 cuBLAS (``kernels_linear_h100_s34.json``);
  shares from ``step_profile_h100_2b_s34.json`` (bf16: attention 343.9, cuBLAS GEMM 120.1, rest 165.1 of
  629.1 ms; the full method's rest 41.4 ms); ``attention_8bit`` = the whole 8-bit call (norm on load, K/V
  pass, kernel) ÷ cuDNN after the same norms at the 2B shape (``probe_normload_h100_s33.json``: 8.660 /
  11.525 ms); ``skipped`` fitted to the default's 50-step row of ``speed_h100_2b_s34.json`` (52.3 % skipped,
  20 % 8-bit attention, 12.27 s vs 31.54 s), and ``attention_shares`` are the 8-bit attention fractions of that
  row (after-skip bf16) and of ``speed_h100_2b_s35.json``'s ``fast`` row (after-skip by the policy). Against
  the measured 2B rows the model is exact for the fitted row, +2.0 % (optimistic) for the paper's routes in the
  same run, −1.3 % for the default and −2.2 % for ``fast`` in the next run (``tests/test_costs_effect.py``).
  The profile's computed step (every block computed, 87 % 8-bit attention) is reproduced to 0.3 %. The shares are
  the 2B step's: against the 5B rows of ``speed_h100_5b_s35.json`` the model is 12–16 % pessimistic (tested).
* ``cpu`` (sixbit-mini, one thread, ``app_cpu.json`` profile): ``linear`` = F.linear's share of the
  baseline transformer's CPU time; NVFP4, INT8 and FP16 (4-bit weights) are simulated in torch and were
  measured together: one cost = the quantized linears' time per computed call ÷ a plain F.linear call's;
  ``skipped`` fitted to the 6Bit transformer time at its 35.4 % skipped. W8A8 is not measured there.
* **Not measured** (:func:`expected_effect` says so and gives no number): ``sm_80-89`` (the portable kernels
  ran only on an H200 with the portable variant forced), ``sm_100`` and ``sm_120`` (ZeroGPU's RTX Pro 6000
  Blackwell; native FP4 unverified), CUDA below 8.0.

Below capability 10 no GPU has FP4 tensor cores: NVFP4 layers decode their 4-bit weights and multiply at
16-bit rate (a memory win, slower per call than bf16 on the H200); INT8 decisions on W8A8 use the int8
tensor cores. **Weight memory** (:data:`WEIGHT_RATIOS`): the transformer's resident weight bytes, bf16 ÷
6Bit, from the engine's own count (``memory()``: (original + other) ÷ (packed + fp on device + other)) in
``speed_h200_2b.json``, ``speed_h200_5b.json`` and ``app_cpu.json``, per model shape and weight format;
on a GPU only — on the CPU the offloaded original weights stay in the same memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from sixbit import routes as _routes

__all__ = ["TransformerShape", "COGVIDEOX_5B", "step_flops", "step_seconds", "relative_rate", "H200_EFFECTIVE_TFLOPS",
           "RELATIVE_RATE", "ClassCosts", "UNIT_COSTS", "WEIGHT_RATIOS", "device_class", "Effect", "expected_effect",
           "run_estimate", "attention_share", "weight_format", "fp4_tensor_cores", "NAME_CAPABILITY",
           "int8_tensor_core_routes"]

#: effective bf16 rate of a whole CogVideoX transformer step on the H200 (measured; see the docstring)
H200_EFFECTIVE_TFLOPS = 373.0

#: dense bf16 tensor rate relative to the H200, by a substring of ``torch.cuda.get_device_name`` (lower
#: case). H200/H100 measured or the same chip; the rest from vendor datasheets — estimates.
RELATIVE_RATE = {
    "h200": 1.0,
    "h100": 1.0,
    "rtx pro 6000": 0.5,   # ZeroGPU since May 2026 (sm_120)
    "b200": 2.2,
    "a100": 0.32,
    "l40s": 0.37,
    "rtx 4090": 0.17,
    "l4": 0.12,
    "a10g": 0.07,
}


@dataclass(frozen=True)
class TransformerShape:
    blocks: int
    width: int
    ff_width: int

    @classmethod
    def of(cls, transformer) -> TransformerShape:
        """From a diffusers CogVideoX/Wan transformer's config (Wan states ``ffn_dim``; CogVideoX's
        feed-forward is 4× the width)."""
        c = dict(transformer.config)
        width = int(c["num_attention_heads"]) * int(c["attention_head_dim"])
        return cls(blocks=int(c["num_layers"]), width=width, ff_width=int(c.get("ffn_dim") or 4 * width))


#: CogVideoX-5B (42 blocks × 3072): the shape assumed when the model is not loaded yet (errs long)
COGVIDEOX_5B = TransformerShape(blocks=42, width=3072, ff_width=12288)


def step_flops(shape: TransformerShape, tokens: int, batch: int = 2) -> float:
    """FLOPs of one transformer call (see the module docstring)."""
    d, f, n = shape.width, shape.ff_width, shape.blocks
    linears = 2.0 * batch * tokens * n * (4 * d * d + 2 * d * f)
    attention = 4.0 * batch * tokens * tokens * d * n
    return linears + attention


def relative_rate(device_name: str | None) -> float:
    """The table's rate for a GPU name; the slowest listed rate when it is unknown (errs long)."""
    name = (device_name or "").lower()
    for key, rate in RELATIVE_RATE.items():
        if key in name:
            return rate
    return min(RELATIVE_RATE.values())


def step_seconds(shape: TransformerShape, tokens: int, device_name: str | None, batch: int = 2) -> float:
    """Estimated bf16 seconds of one denoising step on ``device_name``."""
    return step_flops(shape, tokens, batch) / (H200_EFFECTIVE_TFLOPS * 1e12 * relative_rate(device_name))


# ------------------------------------------------------------------------- expected effect of 6Bit
@dataclass(frozen=True)
class ClassCosts:
    """Unit costs of one device class (see the module docstring): step shares as fractions of a bf16 step,
    per-route cost of a computed linear call ÷ a bf16 call, the cost of a skipped block evaluation."""

    measured_on: str
    sources: tuple[str, ...]
    attention: float
    linear: float
    other: float
    other_sixbit: float
    skipped: float
    route: dict[str, float]
    #: the whole 8-bit attention call ÷ the bf16 one (1: no 8-bit attention measured on the class)
    attention_8bit: float = 1.0
    #: measured fraction of computed block evaluations with 8-bit attention, by ``attention_after_skip``
    attention_shares: dict[str, float] | None = None
    #: how far the model is from the measured runs it was not fitted to (empty: not checked), for the app's text
    fit: str = ""


#: measured device classes only; every number is traceable to the named result files (tests recompute them)
UNIT_COSTS: dict[str, ClassCosts] = {
    "sm_90": ClassCosts(
        measured_on="NVIDIA H100 80GB HBM3 (Hopper), CogVideoX-2B size 49×480×720",
        sources=("kernels_linear_h100_s34.json", "step_profile_h100_2b_s34.json", "probe_normload_h100_s33.json",
                 "speed_h100_2b_s34.json", "speed_h100_2b_s35.json"),
        attention=0.5466, linear=0.1909, other=0.2625, other_sixbit=0.0658, skipped=0.0471,
        route={"bf16": 1.0, "nvfp4": 1.3616, "int8": 1.1894, "w8a8": 0.8293, "w4a8_requant": 0.837,
               "w4a16": 1.2336},
        attention_8bit=0.7514, attention_shares={"bf16": 0.1997, "policy": 0.5503},
        fit="within ±2.2 % of the measured 50-step 2B rows on an H100, 12–16 % low at 5B"),
    "cpu": ClassCosts(
        measured_on="CPU, sixbit-mini, one thread",
        sources=("app_cpu.json",),
        attention=0.0, linear=0.6165, other=0.3835, other_sixbit=0.3835, skipped=0.1622,
        route={"bf16": 1.0, "nvfp4": 1.6751, "int8": 1.6751, "w4a16": 1.6751}),
}

#: bf16 ÷ 6Bit resident transformer weight bytes, by (model shape, weight format); see the module docstring
WEIGHT_RATIOS: dict[tuple[TransformerShape, str], tuple[float, str]] = {
    (TransformerShape(30, 1920, 7680), "nvfp4"): (2.2891, "speed_h200_2b.json"),
    (TransformerShape(30, 1920, 7680), "nvfp4+int8"): (1.2060, "speed_h200_2b.json"),
    (TransformerShape(30, 1920, 7680), "int8"): (1.6424, "speed_h200_2b.json"),
    (TransformerShape(42, 3072, 12288), "nvfp4"): (2.5889, "speed_h200_5b.json"),
    (TransformerShape(42, 3072, 12288), "nvfp4+int8"): (1.2291, "speed_h200_5b.json"),
    (TransformerShape(42, 3072, 12288), "int8"): (1.7437, "speed_h200_5b.json"),
    (TransformerShape(12, 256, 1024), "nvfp4"): (2.2890, "app_cpu.json"),
}

#: capability by a substring of the GPU's name (vendor specifications), for a GPU not visible yet (ZeroGPU)
NAME_CAPABILITY = {"h200": (9, 0), "h100": (9, 0), "rtx pro 6000": (12, 0), "b200": (10, 0), "a100": (8, 0),
                   "l40s": (8, 9), "rtx 4090": (8, 9), "l4": (8, 9), "a10g": (8, 6), "rtx 3090": (8, 6)}


def device_class(device: str | None, capability: tuple[int, int] | None = None, name: str | None = None) -> str:
    """``"cpu"``, ``"sm_90"``, ``"sm_80-89"``, ``"sm_100"``, ``"sm_120"``, ``"sm_<80"`` or ``"cuda"`` (capability
    unknown), from the device string and the CUDA capability (or the GPU's name, :data:`NAME_CAPABILITY`)."""
    if device is None or str(device).startswith("cpu"):
        return "cpu"
    if capability is None and name:
        capability = next((c for k, c in NAME_CAPABILITY.items() if k in name.lower()), None)
    if capability is None:
        return "cuda"
    major = capability[0]
    if major == 9:
        return "sm_90"
    if major == 8:
        return "sm_80-89"
    if major >= 10:
        return "sm_100" if major == 10 else f"sm_{major}0"
    return "sm_<80"


def fp4_tensor_cores(cls: str) -> bool:
    """Whether a device class has FP4 tensor cores (capability ≥ 10)."""
    return cls.startswith("sm_") and cls[3:].isdigit() and int(cls[3:]) >= 100


def weight_format(cfg) -> str | None:
    """The resident weight format a config packs (``"nvfp4"``, ``"nvfp4+int8"``: NVFP4 plus INT8 copies,
    ``"int8"``, ``"bf16"``: nothing packed), or ``None`` for a setting without a measurement."""
    if cfg.quant == "off":
        return "bf16"
    if cfg.fp_weights == "device" or cfg.modulation_weights != "fp":
        return None
    if cfg.quant == "w8a8":
        return "int8"
    if cfg.quant == "dmpq":
        return "nvfp4+int8" if cfg.int8_route == "w8a8" else "nvfp4"
    return None


def _int8_route(cls: str, cfg) -> str:
    """``cfg.int8_route`` as it runs on device class ``cls`` (``routes.int8_route_for``: sixbit's GPU kernels run
    from capability 8.0 unless the backend is ``"torch"``)."""
    kernels = cls.startswith("sm_") and cls != "sm_<80" and cfg.backend != "torch"
    return _routes.int8_route_for(cfg.int8_route, kernels)


def _nvfp4_runs_int8(cls: str, cfg) -> bool:
    """Whether DMPQ's NVFP4 decisions run its INT8 route on device class ``cls`` (``routes.nvfp4_as_int8``)."""
    return cfg.quant == "dmpq" and _routes.nvfp4_as_int8(cfg.nvfp4_route, _int8_route(cls, cfg), fp4_tensor_cores(cls))


def int8_tensor_core_routes(cfg, cls: str) -> bool:
    """Whether every quantized decision of ``cfg`` runs on the int8 tensor cores on device class ``cls``: DMPQ with
    its INT8 decisions on ``w8a8`` or ``w4a8_requant`` there and its NVFP4 decisions on the INT8 route
    (``routes.nvfp4_as_int8``)."""
    return (cfg.quant == "dmpq" and _int8_route(cls, cfg) in (_routes.W8A8, _routes.W4A8_REQUANT)
            and _nvfp4_runs_int8(cls, cfg))


def _route_cost(costs: ClassCosts, trace_route: str, cfg, cls: str) -> float | None:
    """The unit cost of a decision (``nvfp4`` / ``int8`` / ``fp16``, as a trace or schedule names it) under ``cfg``
    on device class ``cls`` — the route it runs there: an NVFP4 decision costs the INT8 route's where
    ``nvfp4_route`` sends it there (``routes.nvfp4_as_int8``); None if not measured."""
    int8 = "w8a8" if cfg.quant == "w8a8" else _int8_route(cls, cfg) if cfg.quant == "dmpq" else "int8"
    if trace_route == "fp16":
        key = "bf16" if cfg.quant == "off" or cfg.fp_weights == "device" else "w4a16"
    elif trace_route == "int8":  # the INT8 route that ran
        key = int8
    elif trace_route == "nvfp4" and _nvfp4_runs_int8(cls, cfg):
        key = int8
    else:
        key = trace_route
    return costs.route.get(key)


def attention_share(costs: ClassCosts, cfg) -> float:
    """The fraction of computed block evaluations expected to run 8-bit attention under ``cfg`` on a class with
    ``costs``: 0 with ``attention="bf16"`` or none measured, 1 with ``"fp8"``, the reference runs' measured
    fraction for the config's ``attention_after_skip`` with ``"policy"`` (the smaller one where that setting
    was not measured)."""
    shares = costs.attention_shares
    if not shares or cfg.attention == "bf16":
        return 0.0
    if cfg.attention == "fp8":
        return 1.0
    return shares.get(cfg.attention_after_skip, min(shares.values()))


def run_estimate(cls: str, cfg, route_counts: dict[str, int], skip_fraction: float,
                 attention_fp8: float | None = None) -> float | None:
    """The model's per-step speed-up for a run's own decisions (its route counts, skipped fraction and, when
    given, the fraction of computed block evaluations with 8-bit attention; else :func:`attention_share`) on
    device class ``cls``; ``None`` where the class or a route it used is not measured."""
    costs = UNIT_COSTS.get(cls)
    computed = {r: n for r, n in route_counts.items() if r != "skipped" and n}
    if costs is None:
        return None
    total = sum(computed.values())
    mix = 0.0
    for r, n in computed.items():
        c = _route_cost(costs, r, cfg, cls)
        if c is None:
            return None
        mix += n / total * c
    if not total:
        mix = 1.0
    a = attention_share(costs, cfg) if attention_fp8 is None else attention_fp8
    attention = costs.attention * (1.0 - a + a * costs.attention_8bit)
    other = costs.other if cfg.quant == "off" else costs.other_sixbit  # fusions measured with quantization only
    computed_step = attention + other + costs.linear * mix
    ratio = (1.0 - skip_fraction) * computed_step + skip_fraction * costs.skipped
    return 1.0 / ratio


@dataclass(frozen=True)
class Effect:
    """What a config is expected to do on a device class before a run: per-step speed-up bounds with every
    block computed and at ``skip`` (None when the config has no TDC), the weight-memory ratio; ``None``
    values are not measured (``sources`` names the result files the numbers come from)."""

    device_class: str
    measured: bool
    computed: tuple[float, float] | None
    skip: float | None
    at_skip: tuple[float, float] | None
    weight_ratio: float | None
    sources: tuple[str, ...]
    #: how far the class's unit-cost model is from the runs it was not fitted to (``UnitCosts.fit``; "" if unchecked)
    fit: str = ""


def _bounds(cls: str, cfg, skip: float) -> tuple[float, float] | None:
    # all NVFP4 … all INT8 decisions (where NVFP4 decisions run the INT8 route, _route_cost costs them so)
    routes = {"w8a8": ["int8"], "w4a4": ["nvfp4"], "w4a8": ["int8"], "off": ["fp16"]}.get(cfg.quant, ["nvfp4", "int8"])
    vals = [run_estimate(cls, cfg, {r: 1}, skip) for r in routes]
    if any(v is None for v in vals):
        return None
    return (min(vals), max(vals))


def expected_effect(cfg, cls: str, shape: TransformerShape | None = None, skip: float = 0.5) -> Effect:
    """The expected effect of ``cfg`` (a :class:`sixbit.SixBitConfig`) on device class ``cls`` for a model of
    ``shape``: per-step speed-up bounds over the routes DMPQ may pick (all NVFP4 … all INT8) with every
    block computed (what random weights give) and, with TDC, at the skipped fraction ``skip``."""
    costs = UNIT_COSTS.get(cls)
    fmt = weight_format(cfg)
    ratio, wsrc = (1.0, None) if fmt == "bf16" else WEIGHT_RATIOS.get((shape, fmt), (None, None))
    if cls == "cpu" and fmt != "bf16":
        ratio = None  # the offloaded originals stay in the same (host) memory
    sources = tuple(dict.fromkeys((*(costs.sources if costs else ()), *((wsrc,) if wsrc else ()))))
    fit = costs.fit if costs else ""
    if cfg.quant == "off" and not cfg.tdc:
        return Effect(cls, True, (1.0, 1.0), None, None, 1.0, sources, fit)
    computed = _bounds(cls, cfg, 0.0) if costs else None
    at_skip = _bounds(cls, cfg, skip) if costs and cfg.tdc else None
    return Effect(cls, costs is not None, computed, skip if cfg.tdc else None, at_skip, ratio, sources, fit)
