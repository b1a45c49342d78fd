"""What a model can take, and checking every user input against it before any work starts.

Every check raises ``gr.Error`` with a sentence a user can act on; nothing here touches the model
weights. `ModelLimits.from_pipeline` reads sizes off a diffusers CogVideoX pipeline:

- height and width must be multiples of ``vae_scale_factor_spatial × patch_size`` (8 × 2 = 16 for
  CogVideoX) and at most the model's native sample size;
- the frame count must give an odd number of latent frames: CogVideoX's VAE compresses time 4× and
  decodes an even latent count to a different length (2 latents → 8 frames, 4 → 16), so only
  ``8·k + 1`` frames (1, 9, 17, …, 49) come back as asked; at most the model's native frame count;
- the prompt must fit the text encoder's token budget (``max_sequence_length``), measured with the
  pipeline's own tokenizer — a longer prompt would be silently truncated by the pipeline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import gradio as gr

MAX_PROMPT_CHARS = 2000
MAX_STEPS = 100
GUIDANCE_RANGE = (1.0, 20.0)
SEED_MAX = 2**32 - 1

# A Hugging Face Hub repository id: "owner/name" — letters, digits, '-', '_', '.'; no path syntax.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


@dataclass
class ModelLimits:
    """Sizes a pipeline accepts, and the defaults the UI starts from."""

    spatial_multiple: int = 16
    frame_step: int = 8  # valid frame counts are frame_step·k + 1
    max_width: int = 720
    max_height: int = 480
    max_frames: int = 49
    min_side: int = 32
    max_prompt_tokens: int = 226
    count_tokens: object = field(default=None, repr=False)  # callable(str) -> int, or None

    @classmethod
    def from_pipeline(cls, pipe, max_sequence_length: int | None = None) -> ModelLimits:
        tcfg = pipe.transformer.config
        s = int(getattr(pipe, "vae_scale_factor_spatial", 8))
        t = int(getattr(pipe, "vae_scale_factor_temporal", 4))
        mult = s * int(tcfg.patch_size)
        max_w = int(tcfg.sample_width) * s
        max_h = int(tcfg.sample_height) * s
        # An even number of latent frames decodes to a different length with CogVideoX's VAE (see the
        # module docstring): step by two latent frames.
        step = 2 * t if type(pipe.vae).__name__ == "AutoencoderKLCogVideoX" else t
        max_f = int(getattr(tcfg, "sample_frames", 49) or 49)
        max_f = (max_f - 1) // step * step + 1  # the largest step*k+1 not above the native length
        tokens = int(max_sequence_length or getattr(tcfg, "max_text_seq_length", 226) or 226)
        tok = getattr(pipe, "tokenizer", None)

        def count_tokens(text: str) -> int:
            return len(tok(text, add_special_tokens=True)["input_ids"])

        return cls(spatial_multiple=mult, frame_step=step, max_width=max_w, max_height=max_h,
                   max_frames=max_f, min_side=min(2 * mult, max_w, max_h), max_prompt_tokens=tokens,
                   count_tokens=count_tokens if tok is not None else None)

    @property
    def frame_choices(self) -> list[int]:
        return list(range(1, self.max_frames + 1, self.frame_step))

    def resolutions(self) -> list[str]:
        """'WxH' choices: the native size and smaller sizes of the same aspect (multiples of the grid)."""
        out = []
        for scale in (1.0, 0.75, 0.5, 0.375, 0.25):
            w = int(round(self.max_width * scale / self.spatial_multiple)) * self.spatial_multiple
            h = int(round(self.max_height * scale / self.spatial_multiple)) * self.spatial_multiple
            if w >= self.min_side and h >= self.min_side:
                label = f"{w}x{h}"
                if label not in out:
                    out.append(label)
        return out


def _number(value, name: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise gr.Error(f"{name} is empty: enter a number.", title="Invalid input")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise gr.Error(f"{name} must be a number, got {value!r}.", title="Invalid input") from None
    if not math.isfinite(x):
        raise gr.Error(f"{name} must be a finite number, got {value!r}.", title="Invalid input")
    return x


def _integer(value, name: str, lo: int, hi: int) -> int:
    x = _number(value, name)
    if x != int(x):
        raise gr.Error(f"{name} must be a whole number, got {value!r}.", title="Invalid input")
    if not lo <= x <= hi:
        raise gr.Error(f"{name} must be between {lo} and {hi}, got {int(x)}.", title="Invalid input")
    return int(x)


def parse_resolution(text, limits: ModelLimits) -> tuple[int, int]:
    """'WxH' (also 'W×H', 'W x H') → (width, height), checked against the model's grid and size."""
    m = re.fullmatch(r"\s*(\d{1,5})\s*[x×X*]\s*(\d{1,5})\s*", str(text or ""))
    if not m:
        raise gr.Error(f"Resolution must look like 128x128 (width x height), got {text!r}.",
                       title="Invalid input")
    w, h = int(m.group(1)), int(m.group(2))
    g = limits.spatial_multiple
    if w % g or h % g:
        raise gr.Error(f"This model needs width and height that are multiples of {g}; got {w}x{h}.",
                       title="Size the model cannot take")
    if w < limits.min_side or h < limits.min_side:
        raise gr.Error(f"The smallest size this model takes is {limits.min_side}x{limits.min_side}; got {w}x{h}.",
                       title="Size the model cannot take")
    if w > limits.max_width or h > limits.max_height:
        raise gr.Error(f"The largest size this model takes is {limits.max_width}x{limits.max_height} "
                       f"(its native size); got {w}x{h}.", title="Size the model cannot take")
    return w, h


def validate_request(limits: ModelLimits, prompt, negative_prompt, seed, steps, frames, resolution,
                     guidance) -> dict:
    """Check every generation input; return the normalised settings or raise ``gr.Error``."""
    prompt = (prompt or "").strip()
    negative_prompt = (negative_prompt or "").strip()
    if not prompt:
        raise gr.Error("Please enter a prompt.", title="Invalid input")
    for name, text in (("Prompt", prompt), ("Negative prompt", negative_prompt)):
        if len(text) > MAX_PROMPT_CHARS:
            raise gr.Error(f"{name} is too long: {len(text)} characters (limit {MAX_PROMPT_CHARS}).",
                           title="Invalid input")
        if text and limits.count_tokens is not None:
            n = limits.count_tokens(text)
            if n > limits.max_prompt_tokens:
                raise gr.Error(f"{name} is too long for this model's text encoder: {n} tokens "
                               f"(limit {limits.max_prompt_tokens}). Shorten it.", title="Invalid input")
    seed = _integer(seed, "Seed", 0, SEED_MAX)
    steps = _integer(steps, "Steps", 1, MAX_STEPS)
    frames = _integer(frames, "Frames", 1, 10**6)
    t = limits.frame_step
    if (frames - 1) % t:
        lo = (frames - 1) // t * t + 1
        raise gr.Error(f"This model takes {t}·k+1 frames (…, {lo}, {lo + t}, …); got {frames}.",
                       title="Size the model cannot take")
    if frames > limits.max_frames:
        raise gr.Error(f"This model takes at most {limits.max_frames} frames; got {frames}.",
                       title="Size the model cannot take")
    width, height = parse_resolution(resolution, limits)
    guidance = _number(guidance, "Guidance scale")
    lo, hi = GUIDANCE_RANGE
    if not lo <= guidance <= hi:
        raise gr.Error(f"Guidance scale must be between {lo:g} and {hi:g}, got {guidance:g}.",
                       title="Invalid input")
    return dict(prompt=prompt, negative_prompt=negative_prompt, seed=seed, steps=steps, frames=frames,
                width=width, height=height, guidance=float(guidance))


def resolve_model_id(text, default_id: str, allow_hub: bool) -> str:
    """The model a request may use: the server's configured model, or (only where the host has a
    network and the operator allows it) a Hub repository id. Local paths typed by users are refused,
    so no user-supplied path is ever opened or served."""
    text = (text or "").strip()
    if not text or text == default_id:
        return default_id
    if not allow_hub:
        raise gr.Error(f"Unknown model {text!r}: this server only serves {default_id!r}.", title="Unknown model")
    if not _HUB_ID.match(text) or ".." in text:
        raise gr.Error(f"Unknown model {text!r}: enter a Hugging Face Hub id such as "
                       "'THUDM/CogVideoX-2b' (local paths are not accepted).", title="Unknown model")
    return text
