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

import html
import logging
import math
import re
from dataclasses import dataclass, field

import gradio as gr

MAX_PROMPT_CHARS = 2000
MAX_STEPS = 100
GUIDANCE_RANGE = (1.0, 20.0)
SEED_MAX = 2**32 - 1

LOG = logging.getLogger("sixbit.app")


def shown(value, limit: int = 60) -> str:
    """A user's value as a message may echo it: its repr, cut to ``limit`` characters and HTML-escaped
    (Gradio renders error toasts as HTML, so ``<img src=x>`` typed by a user must arrive as text)."""
    text = repr(value)
    return html.escape(text if len(text) <= limit else text[: limit - 1] + "…", quote=False)


def refuse(message: str, title: str = "Invalid input") -> gr.Error:
    """The error of a refused input: one log line, no traceback (real failures keep theirs)."""
    LOG.info("refused input: %s", message)
    return gr.Error(message, title=title, print_exception=False)


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


def _number(value, name: str, accepted: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise refuse(f"{name} is empty: enter {accepted}.")
    if isinstance(value, bool):
        raise refuse(f"{name} must be {accepted}, got {shown(value)}.")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise refuse(f"{name} must be a number ({accepted}), got {shown(value)}.") from None
    if not math.isfinite(x):
        raise refuse(f"{name} must be a finite number ({accepted}), got {shown(value)}.")
    return x


def _integer(value, name: str, lo: int, hi: int) -> int:
    accepted = f"a whole number between {lo} and {hi}"
    x = _number(value, name, accepted)
    if x != int(x):
        raise refuse(f"{name} must be a whole number between {lo} and {hi}, got {shown(value)}.")
    if not lo <= x <= hi:
        raise refuse(f"{name} must be between {lo} and {hi}, got {int(x)}.")
    return int(x)


def size_rule(limits: ModelLimits) -> str:
    """The sizes a model takes, in its own terms (for labels and messages)."""
    g = limits.spatial_multiple
    return (f"width x height, each a multiple of {g}, from {limits.min_side}x{limits.min_side} "
            f"to {limits.max_width}x{limits.max_height}")


def frame_rule(limits: ModelLimits) -> str:
    choices = limits.frame_choices
    listed = ", ".join(map(str, choices)) if len(choices) <= 8 else f"{choices[0]}, {choices[1]}, …, {choices[-1]}"
    return f"{limits.frame_step}·k+1 frames up to {limits.max_frames} ({listed})"


def parse_resolution(text, limits: ModelLimits) -> tuple[int, int]:
    """'WxH' (also 'W×H', 'W x H') → (width, height), checked against the model's grid and size."""
    def bad(reason: str) -> gr.Error:
        return refuse(f"Resolution {shown(text)}: {reason}. This model takes {size_rule(limits)}.",
                      title="Size the model cannot take")

    m = re.fullmatch(r"\s*(\d{1,9})\s*[x×X*]\s*(\d{1,9})\s*", str(text or "")[:100])
    if not m:
        raise bad("not of the form width x height")
    w, h = int(m.group(1)), int(m.group(2))
    g = limits.spatial_multiple
    if w > limits.max_width or h > limits.max_height:
        raise bad(f"the largest size this model takes is {limits.max_width}x{limits.max_height} (its native size)")
    if w < limits.min_side or h < limits.min_side:
        raise bad(f"the smallest size this model takes is {limits.min_side}x{limits.min_side}")
    if w % g or h % g:
        raise bad(f"width and height must be multiples of {g}")
    return w, h


def validate_request(limits: ModelLimits, prompt, negative_prompt, seed, steps, frames, resolution,
                     guidance) -> dict:
    """Check every generation input; return the normalised settings or raise ``gr.Error``."""
    texts = []
    for name, text in (("Prompt", prompt), ("Negative prompt", negative_prompt)):
        if text is not None and not isinstance(text, str):
            raise refuse(f"{name} must be text, got {shown(text)}.")
        texts.append((text or "").strip())
    prompt, negative_prompt = texts
    if not prompt:
        raise refuse("Prompt is empty: please enter a prompt.")
    for name, text in (("Prompt", prompt), ("Negative prompt", negative_prompt)):
        if len(text) > MAX_PROMPT_CHARS:
            raise refuse(f"{name} is too long: {len(text)} characters (limit {MAX_PROMPT_CHARS}).")
        if text and limits.count_tokens is not None:
            n = limits.count_tokens(text)
            if n > limits.max_prompt_tokens:
                raise refuse(f"{name} is too long for this model's text encoder: {n} tokens "
                             f"(limit {limits.max_prompt_tokens}). Shorten it.")
    seed = _integer(seed, "Seed", 0, SEED_MAX)
    steps = _integer(steps, "Steps", 1, MAX_STEPS)
    frames = _integer(frames, "Frames", 1, 10**6)
    t = limits.frame_step
    if (frames - 1) % t or frames > limits.max_frames:
        raise refuse(f"Frames must be {frame_rule(limits)} for this model; got {frames}.",
                     title="Size the model cannot take")
    width, height = parse_resolution(resolution, limits)
    lo, hi = GUIDANCE_RANGE
    guidance = _number(guidance, "Guidance scale", f"a number between {lo:g} and {hi:g}")
    if not lo <= guidance <= hi:
        raise refuse(f"Guidance scale must be between {lo:g} and {hi:g}, got {guidance:g}.")
    return dict(prompt=prompt, negative_prompt=negative_prompt, seed=seed, steps=steps, frames=frames,
                width=width, height=height, guidance=float(guidance))


def resolve_model_id(text, default_id: str, allow_hub: bool, served_name: str = "the embedded model") -> str:
    """The model a request may use: the server's configured model, or (only where the host has a
    network and the operator allows it) a Hub repository id. Local paths typed by users are refused,
    so no user-supplied path is ever opened or served. Messages name the served model by
    ``served_name``, never by its path on the server."""
    if text is not None and not isinstance(text, str):
        raise refuse(f"Model must be text, got {shown(text)}.", title="Unknown model")
    text = (text or "").strip()
    if not text or text == default_id or text == served_name:
        return default_id
    if not allow_hub:
        raise refuse(f"Unknown model {shown(text)}: this server only serves {served_name}; leave the model "
                     "field empty.", title="Unknown model")
    if not _HUB_ID.match(text) or ".." in text:
        raise refuse(f"Unknown model {shown(text)}: enter a Hugging Face Hub id such as "
                     "'THUDM/CogVideoX-2b' (local paths are not accepted).", title="Unknown model")
    return text
