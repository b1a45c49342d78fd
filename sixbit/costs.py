"""How long a denoising step takes: a FLOP count of the transformer, at a rate measured on the H200.

Used to reserve GPU time before a run (the app's ``spaces.GPU(duration=...)`` on Hugging Face ZeroGPU)
and to say what to expect. The FLOPs of one CogVideoX/Wan-style transformer step, CFG batched
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
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TransformerShape", "COGVIDEOX_5B", "step_flops", "step_seconds", "relative_rate", "H200_EFFECTIVE_TFLOPS",
           "RELATIVE_RATE"]

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
