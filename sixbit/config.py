"""SixBitConfig: every switch and threshold of the method, with presets and help text.

One dataclass, one field per knob. Each field carries ``metadata`` with a ``help`` line and a short
``label`` (rendered by the UI's "Advanced" panel), and where it applies ``choices`` or a ``min``/``max`` range; :meth:`fields_help`
returns them as plain dicts. :meth:`SixBitConfig.preset` builds the named presets, including the
ablation rows of the quality tables:

==============  ===========  =====  =====  ===============================================
preset          quant        TDC    PDR    meaning
==============  ===========  =====  =====  ===============================================
off / fp16      off          no     no     the plain model (hooks only observe)
balanced/full   dmpq         yes    yes    the full method, τ for 5.0 bits, step-mode TDC (~50 % skipped)
aggressive      dmpq         yes    yes    τ for 4.75 bits, looser skipping
dmpq_only       dmpq         no     no     mixed precision, every block computed
tdc_only        off          yes    no     delta caching on the full-precision model
dmpq_tdc        dmpq         yes    no     both, without the purified refresh
tdc_paper       off          yes    no     the paper's per-block TDC (tdc_mode=block, reuse=last): ablation
full_paper      dmpq         yes    yes    the full method with the paper's per-block TDC, no warm-up steps
                                           and the paper's routes everywhere (W4A4 / W4A8: nvfp4_route="nvfp4",
                                           int8_route="int8")
fast            dmpq         yes    yes    full on Hopper's int8 tensor cores (int8_route="w8a8"; without FP4
                                           tensor cores its NVFP4 decisions run INT8 too: nvfp4_route="auto")
                                           with 8-bit attention after skips (attention_after_skip="policy")
tdc_attn        off          yes    no     attention-only reuse (tdc_scope=attention): the MLP always runs
full_attn       dmpq         yes    yes    the full method with attention-only reuse
w4a4            w4a4         no     no     static baseline: every linear NVFP4 × NVFP4
w4a8            w4a8         no     no     static: NVFP4 weights × INT8 activations
w8a8            w8a8         no     no     static baseline: INT8 weights × INT8 activations
==============  ===========  =====  =====  ===============================================

Attention: the DMPQ presets (balanced/full, aggressive, dmpq_only, dmpq_tdc, full_paper, fast) route each block's
attention by the policy (``attention="policy"``: 8-bit where its predicted error is at most τ_attn); the
static baselines, ``off``/``fp16``, ``tdc_only`` and ``tdc_paper`` keep bf16 attention. The DMPQ presets but
``full_paper`` run their first two steps with full-precision activations and bf16 attention (``warmup_steps=2``:
with it the full method's adherence on sixbit-mini is within 2 points of FP32, docs/RESULTS.md; the paper's rule,
step 0 at INT8, is ``warmup_steps=0``).

Default thresholds were set on sixbit-mini (20 DDIM steps, CPU; the quality benchmark's videos, docs/ENGINE.md
"Defaults"; TDC's mode and probe threshold from ``benchmarks/results/tdc_curves_mini_20*``, docs/TDC.md):
``balanced`` skips ~50 % of block evaluations (step mode, probe threshold 0.2), ``aggressive`` ~57 %
(0.3). Step mode's thresholds are given for 20 steps and follow the step count N (``tdc_threshold_rule="steps"``:
× 20/N; ``tdc_reuse="auto"``: from 40 steps on the second-order forecast, the probe compared with its last
delta at the same θ·20/N (``tdc_probe_reference="last"``; docs/TDC.md §11: at 50 steps 52 % skipped at 55.3 dB,
TDC alone), below 40 steps the last delta with its size extrapolated (``"magnitude"``, docs/TDC.md §13). They
are starting points for other models, not calibrated
values (``tdc_threshold_rule="profile"`` reads per-step weights calibrated into the policy).

What ``balanced`` runs depends on the hardware; the weights are 4-bit everywhere (CogVideoX-2B's transformer
2.29× smaller). The routes default to ``"auto"`` (session 34): on a GPU where sixbit's kernels run (CUDA capability
≥ 8.0) every INT8 decision runs on the int8 tensor cores from the 4-bit weight re-quantized per call
(``int8_route`` → ``w4a8_requant``), and below capability 10 (Hopper, Ada, Ampere: no FP4 tensor cores, where W4A4
would decode and multiply at 16-bit rate) so does every NVFP4 decision (``nvfp4_route``); with FP4 tensor cores
(capability ≥ 10, Blackwell) the NVFP4 decisions stay W4A4 (that path is unverified). On the CPU (and with
``backend="torch"``) both resolve to the paper's routes, W4A4 / W4A8 — the same cost there, one rounding fewer.
``full_paper`` pins the paper's routes everywhere. The faster alternative on Hopper: ``fast`` (INT8 weight copies,
``int8_route="w8a8"``: no re-quantize pass, 1.20× smaller weights instead of 2.29×) or ``quant="w8a8"`` with TDC
(static W8A8 + TDC). ``sixbit.costs.expected_effect`` gives the numbers per device class; the app shows them before
a run.

Thresholds without a policy: DMPQ needs a calibrated policy (``python -m sixbit.calibrate``); without
one every linear uses E = Γ (α = 1, β = 0) and ``tau`` (default :data:`UNCALIBRATED_TAU`), which the
trace reports as ``"policy": "uncalibrated"``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sixbit.routes import AUTO, FP16, INT8, INT8_ROUTE_CHOICES, NVFP4, STATIC, W8A8

__all__ = ["SixBitConfig", "PRESETS", "UNCALIBRATED_TAU", "ConfigError"]

#: τ applied to E = Γ when no calibrated policy is available
UNCALIBRATED_TAU = 0.5

#: "off", DMPQ, and the static baselines (one route for every layer: ``sixbit.routes.STATIC``)
QUANT_MODES = ("off", "dmpq", *STATIC)


class ConfigError(ValueError):
    """An invalid SixBitConfig value; the message names the field."""


def _f(default, help: str, **meta):
    return field(default=default, metadata={"help": help, **meta})


@dataclass
class SixBitConfig:
    """Configuration of :func:`sixbit.apply`. Build with ``SixBitConfig.preset(name, **overrides)``."""

    # --- DMPQ: per-step, per-layer activation precision -------------------------------------------------
    quant: str = _f(
        "dmpq",
        "Linear-layer quantization: 'dmpq' = dynamic NVFP4/INT8 activations from the Γ predictor; "
        "'w4a4', 'w4a8', 'w8a8' = static baselines (one route for every layer); 'off' = original weights.",
        choices=QUANT_MODES,
        label="Quantization",
    )
    int8_route: str = _f(
        AUTO,
        "What an INT8 decision runs: 'int8' = NVFP4 weights × INT8 activations (the paper's W4A8, "
        "weights stay 4-bit); 'w8a8' = INT8 weights × INT8 activations (int8 tensor cores on Hopper; "
        "also keeps an 8-bit copy of every weight resident); 'w4a8_requant' = W4A8 on the int8 tensor cores: "
        "the 4-bit weights stay the only ones resident and are re-quantized to per-channel INT8 for each "
        "call (one more rounding of the weight, at most 1/254 of its row's largest magnitude); 'auto' = "
        "'w4a8_requant' on a GPU where sixbit's kernels run (CUDA capability ≥ 8.0, backend not 'torch'), "
        "'int8' on the CPU and the torch reference — resolved on the device the transformer is on at apply() "
        "(the default since session 34: on sixbit-mini as accurate as 'int8', docs/ENGINE.md).",
        choices=INT8_ROUTE_CHOICES,
        label="INT8 route",
    )
    nvfp4_route: str = _f(
        "auto",
        "What an NVFP4 decision runs: 'nvfp4' = NVFP4 × NVFP4 (W4A4, the paper's 4-bit route); 'int8' = "
        "the INT8 route instead (int8_route says which); 'auto' = 'int8' where it is the faster and more "
        "accurate of the two — int8_route 'w8a8' or 'w4a8_requant' (the int8 tensor cores) on a device without "
        "FP4 tensor cores (Hopper, Ada, Ampere, the CPU), where W4A4 runs at 16-bit rate behind a slower "
        "quantize pass — else 'nvfp4' (the default since session 34; with int8_route='auto' that is: INT8 on a "
        "GPU below capability 10, the paper's W4A4 on the CPU and on Blackwell). The trace records what ran (its "
        "'nvfp4_as_int8' count per block).",
        choices=(NVFP4, INT8, "auto"),
        label="NVFP4 route",
    )
    target_bits: float | None = _f(
        5.0,
        "Average activation bits DMPQ aims for; τ is read from the policy's calibrated τ-for-bits table. "
        "The realised average is higher: after-skip steps run INT8, warm-up and PDR steps 16 bits. "
        "Ignored when 'tau' is set.",
        min=4.5, max=8.0,
        label="Target activation bits",
    )
    tau: float | None = _f(
        None,
        "Threshold on the predicted relative error E = α·Γ + β: a layer runs INT8 when E > τ, else "
        "NVFP4. Empty = from the policy (see target_bits).",
        min=0.0,
        label="τ (error threshold)",
    )
    policy: str | None = _f(
        "auto",
        "Calibrated policy (α, β per layer, τ): a JSON path, 'auto' (the shipped policy for the "
        "model, if any), or empty for uncalibrated E = Γ.",
        label="Policy",
    )
    warmup_steps: int = _f(
        2, "First denoising steps run with full-precision activations and bf16 attention; 0 = none (step 0, "
        "which has no Γ yet, runs INT8: the paper's rule). 2 keeps the outcome of the videos whose motion or "
        "shape the early steps decide (docs/RESULTS.md).", min=0, max=1000,
        label="Warm-up steps (full precision)",
    )
    hadamard_block: int = _f(
        64,
        "Block size of the online Hadamard rotation before quantizing activations (power of two; "
        "reduced per layer to the largest power of two ≥ 16 that divides its width; 0 = off).",
        choices=(0, 16, 32, 64, 128),
        label="Hadamard block",
    )
    fp_weights: str = _f(
        "cpu",
        "Where the original (bf16/fp16) weights of quantized layers live: 'cpu' = offloaded (the GPU "
        "holds only packed weights; full-precision steps use 4-bit weights × 16-bit activations, "
        "'w4a16'); 'stream' = offloaded to pinned host memory and copied to the GPU layer by layer for "
        "full-precision steps only (true FP16 warm-up/PDR, packed-only residency, costs host→device "
        "bandwidth on those steps); 'device' = kept on the device (true FP16 steps, no memory saving).",
        choices=("cpu", "stream", "device"),
        label="Original weights",
    )
    modulation_weights: str = _f(
        "fp",
        "Weights of the blocks' modulation linears (norm1.linear/norm2.linear: M = batch rows, ~21 % of "
        "CogVideoX-2B's parameters): 'fp' = untouched; 'nvfp4' = weight-only 4-bit (activations stay "
        "16-bit, route w4a16) — memory only, never routed by DMPQ.",
        choices=("fp", "nvfp4"),
        label="Modulation weights",
    )
    embedder_weights: str = _f(
        "fp",
        "Weights of the transformer's linears outside the blocks — text projection, time-embedding MLP, "
        "final modulation (~0.6 % of CogVideoX-2B's parameters; the output projection always stays "
        "16-bit): 'fp' = untouched; 'nvfp4' = weight-only 4-bit, like modulation_weights.",
        choices=("fp", "nvfp4"),
        label="Embedder weights",
    )
    # --- 8-bit attention: per block and step, like the linears (sixbit.dmpq.attention_route) -----------
    attention: str = _f(
        "policy",
        "Attention precision of each computed block: 'policy' = 8-bit (FP8 e4m3, docs/ATTENTION.md) where the "
        "policy predicts its error E_attn = α_attn·Γ + β_attn ≤ τ_attn, else bf16 (warm-up and PDR steps run "
        "bf16, after-skip steps as attention_after_skip says; a policy without attention fits runs bf16); 'fp8' = 8-bit on every computed block "
        "except warm-up and PDR steps; 'bf16' = never. CogVideoX only (sixbit's attention processor, "
        "fast_qk_norm); on the CPU the 8-bit route is a torch emulation of the kernel's numerics.",
        choices=("bf16", "policy", "fp8"),
        label="Attention",
    )
    attention_target: float | None = _f(
        0.75,
        "Fraction of computed blocks' attentions the policy aims to run in 8-bit; τ_attn is read from the "
        "policy's calibrated τ-for-fraction table. Ignored when 'tau_attn' is set.",
        min=0.0, max=1.0,
        label="Target 8-bit attention fraction",
    )
    tau_attn: float | None = _f(
        None,
        "Threshold on the predicted relative error of the 8-bit attention: a block's attention runs 8-bit when "
        "E_attn ≤ τ_attn. Empty = from the policy (see attention_target).",
        min=0.0,
        label="τ_attn (attention error threshold)",
    )
    attention_after_skip: str = _f(
        "bf16",
        "With attention='policy': the attention of a block's first computed step after a skip, which has no "
        "fresh Γ: 'bf16' (the safe choice); 'policy' = the policy's rule on the block's last measured Γ, several "
        "steps old (like after_skip='dmpq' for the linears); 'fp8' = 8-bit. In step-mode TDC most computed "
        "blocks follow a skip, so this decides most of the 8-bit attention's coverage (docs/ATTENTION.md).",
        choices=("bf16", "policy", "fp8"),
        label="After-skip attention",
    )
    # --- TDC: temporal delta cache ---------------------------------------------------------------------
    tdc: bool = _f(True, "Temporal Delta Cache: skip a block when its residual Δ = out − in is stable.", label="Temporal Delta Cache")
    tdc_threshold: float = _f(
        0.165,
        "Skip only while the relative L1 change per step between the block's last two computed deltas "
        "is at most this.",
        min=0.0,
        label="TDC similarity threshold",
    )
    tdc_budget: float = _f(
        0.4,
        "Accumulated skip-error budget per block: every skipped step adds the per-step change; when the "
        "next skip would exceed the budget the block is recomputed (refresh) and the sum resets.",
        min=0.0,
        label="TDC error budget",
    )
    tdc_mode: str = _f(
        "step",
        "Decision granularity: 'block' = every block decides from its own delta's change (the paper's); "
        "'step' = block 0 is a probe computed every step, and the other blocks skip together when its delta "
        "drifted at most tdc_probe_threshold since the last computed step (the default: +4.8 dB at 50 % skipped "
        "on sixbit-mini, docs/TDC.md).",
        choices=("block", "step"),
        label="TDC decision",
    )
    tdc_reuse: str = _f(
        "auto",
        "What a skipped block returns: 'last' = input + its last computed Δ (the paper's); 'linear' = input + "
        "the first-order forecast of Δ from its last two computed deltas (one more Δ per block kept); 'quadratic' "
        "= the second-order forecast from the last three (TaylorSeer's order 2; two more Δ kept); 'magnitude' "
        "(block scope) = input + the last Δ with its size extrapolated from the last two (one more Δ kept; +2.1 dB "
        "at 20 steps on sixbit-mini, docs/TDC.md §12); 'scaled' "
        "(step mode) = input + Δ × the probe's magnitude ratio ‖Δ₀‖/‖reference‖ (MagCache-style); 'auto' (step "
        "mode) = 'quadratic' ('linear' in attention scope) at tdc_forecast_steps steps or more, 'magnitude' "
        "('last' in attention scope) below; 'last' in block mode or with an unknown step count "
        "(docs/TDC.md §11, §13).",
        choices=("last", "linear", "quadratic", "magnitude", "scaled", "auto"),
        label="TDC reuse",
    )
    tdc_scope: str = _f(
        "block",
        "What a skipped cell reuses: 'block' = the whole block returns input + its cached Δ; 'attention' (step mode) = "
        "the block still runs, but its self-attention (attn1: projections, attention, output projection) returns "
        "the output cached at the last computed step (or its linear forecast), while the norms, modulation and MLP "
        "run on the fresh input — PyramidAttentionBroadcast/FasterCache's lever (docs/TDC.md §7).",
        choices=("block", "attention"),
        label="TDC scope",
    )
    tdc_store: str = _f(
        "auto",
        "Step mode, block scope: what is kept for the skipped blocks — 'span' = one combined residual per stream "
        "for the blocks between the probe and the tail, which skip together (out of the last, minus in of the "
        "first), its earlier values for a forecast; 'blocks' = every block's own delta (~29× the memory at "
        "CogVideoX-2B); 'auto' = 'span' where it computes what per-block deltas would (reuse last, linear, "
        "quadratic, scaled), 'blocks' for 'magnitude' (docs/TDC.md §17).",
        choices=("auto", "span", "blocks"),
        label="TDC store",
    )
    tdc_regate: str = _f(
        "auto",
        "Step mode, block scope, a delta per block: keep each skippable block's update as its gated pieces "
        "(CogVideoX: the self-attention's and the MLP's outputs per stream before their gates; Wan: self-attention, "
        "cross-attention, MLP) and recompose a skipped block with the skipped step's own gates, computed from the "
        "timestep embedding (two tiny GEMMs per block): +1.8 to +2.1 dB at the same skips at 20 steps on "
        "sixbit-mini (docs/TDC.md §18); twice a delta's memory per block. 'on' = always (then a delta per block "
        "also where tdc_store='auto' would keep the span); 'off' = the block's delta; 'auto' = on wherever step "
        "mode keeps a delta per block (tdc_store resolving to 'blocks': the 20-step 'magnitude' default).",
        choices=("auto", "on", "off"),
        label="TDC regate",
    )
    tdc_probe_threshold: float = _f(
        0.2,
        "Step mode: the rest of a step is skipped while the probe block's delta differs from its reference "
        "(relative L1) by at most this.",
        min=0.0,
        label="TDC probe threshold",
    )
    tdc_threshold_rule: str = _f(
        "steps",
        "Step mode: how the probe threshold follows the step count N. 'fixed' = the threshold at every N; 'steps' "
        "= threshold × tdc_threshold_steps / N (one step's drift shrinks ~1/N); 'profile' = that, ÷ the policy's "
        "calibrated per-step weight (the rest of the network's drift per unit of probe drift, `python -m "
        "sixbit.calibrate`), 'steps' when the policy has none (docs/TDC.md §8).",
        choices=("fixed", "steps", "profile"),
        label="TDC threshold rule",
    )
    tdc_probe_route: str = _f(
        FP16,
        "Step-mode TDC with DMPQ: the probe block's linears (its attention then runs bf16). 'fp16' (default) = "
        "16-bit activations (with the original "
        "weights offloaded: 4-bit weights × 16-bit activations); 'int8' = INT8 activations every step; 'policy' "
        "= DMPQ like every block (before session 11). The probe's delta only decides, it is never "
        "reused; a quantized probe's step-to-step drift has a noise floor (NVFP4 rounding, route changes) that "
        "a tight threshold never gets under (docs/TDC.md §9).",
        choices=("policy", INT8, FP16),
        label="TDC probe route",
    )
    tdc_threshold_steps: int = _f(
        20, "Step mode, rules 'steps'/'profile': the step count the probe thresholds are given for.", min=1,
        max=1000, label="TDC thresholds given for N steps",
    )
    tdc_forecast_steps: int = _f(
        40, "tdc_reuse='auto': forecast ('quadratic') at this many steps or more, reuse the last delta below.", min=1,
        max=1000, label="TDC forecast from N steps",
    )
    tdc_forecast_threshold: float = _f(
        0.075,
        "tdc_reuse='auto' where it forecasts the whole delta (at tdc_forecast_steps steps or more) and "
        "tdc_probe_reference='forecast': the probe threshold instead of "
        "tdc_probe_threshold (a forecast is closer than the last reference); scaled by the threshold rule.",
        min=0.0,
        label="TDC forecast probe threshold",
    )
    tdc_probe_reference: str = _f(
        "last",
        "Step mode with a forecasting reuse: what the probe's delta is compared with — 'last' = its last computed "
        "delta, cache-dit DBCache's rule, thresholded by tdc_probe_threshold like plain reuse (the default since "
        "session 14: +~1 dB at the same skips at 50 steps, docs/TDC.md §11); 'forecast' = the forecast of it, what "
        "the skipped blocks will use, thresholded by tdc_forecast_threshold under 'auto' (sessions 10–14).",
        choices=("forecast", "last"),
        label="TDC probe compared with",
    )
    tdc_tail: int = _f(
        0,
        "The last K transformer blocks never skip (cache-dit's 'Bn'): they compute every step on the input the "
        "skipped blocks before them produced; the last block amplifies its own skip error most (docs/TDC.md).",
        min=0, max=1000,
        label="TDC always-computed tail blocks",
    )
    tdc_max_skips: int = _f(
        0,
        "At most K consecutive skipped steps (per block in block mode, per step in step mode); 0 = no cap.",
        min=0, max=1000,
        label="TDC max consecutive skips",
    )
    tdc_first: int = _f(2, "Never skip during the first K denoising steps.", min=0, max=1000, label="Never skip first K steps")
    tdc_last: int = _f(1, "Never skip during the last K denoising steps.", min=0, max=1000, label="Never skip last K steps")
    after_skip: str = _f(
        INT8,
        "Route of a block's first computed step after a skip, which has no fresh Γ: 'int8' (the method) "
        "or 'dmpq' (route by the block's last measured Γ, several steps old — fewer bits when TDC skips "
        "often, not the paper's rule).",
        choices=(INT8, "dmpq"),
        label="After-skip route",
    )
    # --- PDR: purified delta refresh -------------------------------------------------------------------
    pdr: bool = _f(
        True,
        "Purified Delta Refresh: when a computed block's Δ is about to be cached and the block input's "
        "outlier ratio exceeds ρ, run that block's layers with full-precision activations.",
        label="Purified Delta Refresh",
    )
    pdr_rho: float | None = _f(
        None,
        "ρ: outlier-ratio threshold of PDR (fraction of input elements beyond k_σ · token RMS). Empty = the "
        "calibrated policy's ρ (the 95th percentile of the model's block-input ratio, measured by "
        "`python -m sixbit.calibrate`), or 3.6e-3 without one.",
        min=0.0, max=1.0,
        label="PDR ρ (outlier ratio)",
    )
    pdr_k_sigma: float = _f(8.0, "k_σ: an element is an outlier if |x| > k_σ · rms(its token).", min=1.0, label="PDR k_σ")
    # --- engine ------------------------------------------------------------------------------------------
    backend: str = _f("auto", "Kernel backend passed to sixbit_kernels.ops.linear.", choices=("auto", "triton", "torch"), label="Kernel backend")
    fast_qk_norm: bool = _f(
        True,
        "Engineering, not the method: CogVideoX's attention gets sixbit's processor (sixbit/attention.py), which "
        "runs the per-head q/k LayerNorm and the rotary embedding as one Triton kernel on CUDA (PyTorch's "
        "LayerNorm on 64-wide rows plus diffusers' rotary code cost the bf16 baseline 10 % of a 2B and 17 % of "
        "a 5B step on the H200); same numbers to fp32 rounding. No effect on the CPU.",
        label="Fused q/k LayerNorm + rotary (CUDA)",
    )
    fused_producers: bool = _f(
        True,
        "Engineering, not the method: where a CogVideoX block's to_q/to_k/to_v (or ff.net.0.proj) run an INT8 "
        "route, its norm + modulate writes their INT8 operand directly (sixbit/fused.py, one Triton kernel "
        "instead of LayerNorm, multiply, add, concatenation and quantize: 0.66 → 0.35 ms per call on the H200 "
        "at 2B). Same codes up to rare one-step flips. Where they run other quantized routes (NVFP4, W4A16, an "
        "outlier count) the same kernel writes the 16-bit norm output in one pass (a value may differ by one "
        "ulp). No effect on the CPU or on 16-bit (full-precision) consumers.",
        label="Quantize fused into the norm (CUDA, quantized routes)",
    )
    gelu_epilogue: bool = _f(
        True,
        "Engineering, not the method: the feed-forward's tanh-GELU runs in ff.net.0.proj's GEMM epilogue on "
        "every kernel route (CogVideoX and Wan, sixbit/fused.py): the GEMM writes GELU(y), and PyTorch's GELU pass "
        "over the [tokens, 4·dim] output goes (H100, 2B: 1.31 → 1.10 ms per W8A8 call, 1.85 → 1.69 W4A8). The same "
        "function up to one-ulp roundings. The 16-bit route and the torch reference keep PyTorch's GELU.",
        label="GELU in the GEMM epilogue (kernel routes)",
    )
    precompile: bool = _f(
        True,
        "Engineering, not the method: on a GPU, sixbit.apply compiles and self-checks every Triton kernel "
        "configuration the run can use, once, on small problems (sixbit/warmup.py; the time is in "
        "handle.kernels_compiled_s and the trace), so no step of the run or of a user's first video compiles.",
        label="Compile kernels at apply (GPU)",
    )
    trace_linear_outliers: bool = _f(
        False, "Record each layer's input outlier ratio in the trace (counted by the quantize kernels, no extra "
        "sync, but not free: on the H200 the count makes the INT8 quantize 1.5–1.8× slower). A diagnostic, not part "
        "of the method: PDR counts its block-input outliers separately.",
        label="Trace layer outliers",
    )
    sync_timing: bool = _f(True, "Synchronize the GPU at the end of each step so step times are real.", label="Synchronized step timing")

    # ------------------------------------------------------------------------------------------------------
    def __post_init__(self):
        self.validate()

    def validate(self) -> SixBitConfig:
        """Check every field against its metadata (choices, min/max, finite); raises :class:`ConfigError`."""
        _validate(self)
        return self

    # ------------------------------------------------------------------------------------------------------
    @property
    def quantized(self) -> bool:
        return self.quant != "off"

    @property
    def weight_formats(self) -> tuple[str, ...]:
        """Packed weight formats the configuration needs resident."""
        if self.quant == "w8a8":
            return ("int8",)
        if self.quant == "dmpq" and self.int8_route == "w8a8":
            return ("nvfp4", "int8")
        return ("nvfp4",)

    def replace(self, **overrides) -> SixBitConfig:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown SixBitConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SixBitConfig:
        return cls().replace(**d)

    @classmethod
    def preset(cls, name: str, **overrides) -> SixBitConfig:
        """A named preset (see the module docstring) with ``overrides`` applied."""
        key = name.lower().replace("-", "_").replace("+", "_").replace(" ", "_")
        if key not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
        return cls(**{**PRESETS[key], **overrides})

    @staticmethod
    def presets() -> list[str]:
        return list(PRESETS)

    @classmethod
    def fields_help(cls) -> list[dict[str, Any]]:
        """One dict per field: name, type, default, help and (where given) choices/min/max."""
        out = []
        for f in dataclasses.fields(cls):
            d = {"name": f.name, "type": str(f.type), "default": f.default, "help": f.metadata.get("help", "")}
            for k in ("label", "choices", "min", "max"):
                if k in f.metadata:
                    d[k] = f.metadata[k]
            out.append(d)
        return out


def _validate(cfg: SixBitConfig) -> None:
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        meta = f.metadata
        if "choices" in meta and v not in meta["choices"]:
            raise ConfigError(f"SixBitConfig.{f.name} must be one of {meta['choices']}, got {v!r}")
        if v is None or isinstance(v, (bool, str)):
            continue
        if isinstance(v, float) and not math.isfinite(v) and not (f.name.startswith("tdc_") and v > 0):
            raise ConfigError(f"SixBitConfig.{f.name} must be finite, got {v!r}")
        if "min" in meta and v < meta["min"]:
            raise ConfigError(f"SixBitConfig.{f.name} must be >= {meta['min']}, got {v!r}")
        if "max" in meta and v > meta["max"]:
            raise ConfigError(f"SixBitConfig.{f.name} must be <= {meta['max']}, got {v!r}")
    if cfg.tdc_scope == "attention":
        if cfg.tdc_mode != "step":
            raise ConfigError("SixBitConfig.tdc_scope='attention' needs tdc_mode='step' (block mode decides from each "
                              f"block's own cached delta, which attention reuse does not keep), got {cfg.tdc_mode!r}")
        if cfg.tdc_reuse in ("scaled", "magnitude"):
            raise ConfigError(f"SixBitConfig.tdc_reuse={cfg.tdc_reuse!r} scales cached block deltas by a magnitude "
                              "ratio: not defined for tdc_scope='attention' (use 'last' or 'linear')")
    if cfg.tdc_store == "span" and (cfg.tdc_mode != "step" or cfg.tdc_scope != "block"):
        raise ConfigError("SixBitConfig.tdc_store='span' keeps one residual for the blocks that skip together: it "
                          f"needs tdc_mode='step' and tdc_scope='block', got {cfg.tdc_mode!r} / {cfg.tdc_scope!r}")
    if cfg.tdc_regate == "on" and (cfg.tdc_mode != "step" or cfg.tdc_scope != "block" or cfg.tdc_store == "span"):
        raise ConfigError("SixBitConfig.tdc_regate='on' recomposes each skipped block from its own gated pieces: it "
                          "needs tdc_mode='step', tdc_scope='block' and a delta per block (tdc_store 'blocks' or "
                          f"'auto'), got {cfg.tdc_mode!r} / {cfg.tdc_scope!r} / {cfg.tdc_store!r}")
    if cfg.tdc_reuse == "scaled" and cfg.tdc_mode != "step":
        raise ConfigError("SixBitConfig.tdc_reuse='scaled' scales by the probe's magnitude ratio: it needs "
                          f"tdc_mode='step', got {cfg.tdc_mode!r}")


_STATIC = dict(tdc=False, pdr=False, warmup_steps=0, attention="bf16")
PRESETS: dict[str, dict[str, Any]] = {
    "off": dict(quant="off", tdc=False, pdr=False, attention="bf16"),
    "fp16": dict(quant="off", tdc=False, pdr=False, attention="bf16"),
    "balanced": dict(),
    "full": dict(),
    "aggressive": dict(target_bits=4.75, tdc_threshold=0.2, tdc_budget=0.5, tdc_probe_threshold=0.3, tdc_first=1),
    "dmpq_only": dict(tdc=False, pdr=False),
    "tdc_only": dict(quant="off", pdr=False, attention="bf16"),
    "tdc_paper": dict(quant="off", pdr=False, tdc_mode="block", tdc_reuse="last", attention="bf16"),
    "full_paper": dict(tdc_mode="block", tdc_reuse="last", warmup_steps=0, int8_route=INT8, nvfp4_route=NVFP4),
    "dmpq_tdc": dict(pdr=False),
    "fast": dict(int8_route=W8A8, nvfp4_route="auto", attention_after_skip="policy"),
    # attention scope: from 40 steps the first-order forecast, the probe compared with it at 0.05·20/N (measured
    # there, sessions 10–13; the second order lost 3.3 dB)
    "tdc_attn": dict(quant="off", pdr=False, attention="bf16", tdc_scope="attention", tdc_probe_reference="forecast",
                     tdc_forecast_threshold=0.05),
    "full_attn": dict(tdc_scope="attention", tdc_probe_reference="forecast", tdc_forecast_threshold=0.05),
    "w4a4": dict(quant="w4a4", **_STATIC),
    "w4a8": dict(quant="w4a8", **_STATIC),
    "w8a8": dict(quant="w8a8", **_STATIC),
}
