"""sixbit-mini: a small text-to-video model of stock diffusers parts, trained here, shipped in the repo.

    from sixbit.mini import load_pipeline, DEFAULT_GENERATION, EXAMPLE_PROMPTS
    pipe = load_pipeline()                      # CogVideoXPipeline, fp32, CPU, offline
    video = pipe(EXAMPLE_PROMPTS[0], generator=torch.Generator().manual_seed(0),
                 output_type="np", **DEFAULT_GENERATION).frames[0]   # (17, 64, 64, 3) in [0, 1]

Equivalent without this package: ``CogVideoXPipeline.from_pretrained(MINI_PATH)`` (all parts load as
fp32). The data grammar lives in ``sixbit.mini.data``, the adherence judge in ``sixbit.mini.judge``,
training in ``sixbit.mini.train``, evaluation in ``sixbit.mini.evaluate``; the model card is
``assets/sixbit-mini/README.md``. Importing this module is cheap (no torch/diffusers import).
"""

from __future__ import annotations

import os
from pathlib import Path

#: absolute path of the committed pipeline folder (override with the SIXBIT_MINI_PATH variable)
MINI_PATH: str = os.environ.get(
    "SIXBIT_MINI_PATH", str(Path(__file__).resolve().parents[2] / "assets" / "sixbit-mini")
)

#: keyword arguments of CogVideoXPipeline.__call__ for the default demo video: 17 frames of 64x64,
#: 20 DDIM steps with classifier-free guidance (batched cond/uncond), captions padded to 112 bytes
DEFAULT_GENERATION: dict = {
    "num_frames": 17,
    "height": 64,
    "width": 64,
    "num_inference_steps": 20,
    "guidance_scale": 3.0,
    "max_sequence_length": 112,
}

#: frames per second to play the 17-frame clips at
FPS: int = 8

#: prompts of the grammar that the committed model renders well: in the model-card evaluation
#: (assets/sixbit-mini/eval.json) each was fully correct — colour, shape, motion, background — on both seeds
EXAMPLE_PROMPTS: list[str] = [
    "a red circle moving right on a black background",
    "a yellow square growing on a black background",
    "a green circle moving up-right and a purple square moving down-left on a blue to black gradient",
    "a white circle shrinking on a gray to red gradient",
    "a green triangle bouncing on a blue to red gradient",
    "a cyan triangle growing on a red background",
    "a blue triangle moving up and a green circle moving left on a black background",
    "a red square moving down on a gray to white gradient",
]


def load_pipeline(path: str | None = None, device: str = "cpu", dtype=None):
    """The committed sixbit-mini CogVideoXPipeline (fp32 by default), progress bar off."""
    import torch
    from diffusers import CogVideoXPipeline

    pipe = CogVideoXPipeline.from_pretrained(path or MINI_PATH, torch_dtype=dtype or torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def example_prompts_by_attribute() -> dict:
    """The caption vocabulary, for UIs that build prompts from menus."""
    from . import data

    return {
        "colours": list(data.COLOUR_NAMES),
        "shapes": list(data.SHAPES),
        "motions": list(data.MOTIONS),
        "backgrounds": [data.bg_phrase(b) for b in data.BACKGROUNDS],
    }


__all__ = ["MINI_PATH", "DEFAULT_GENERATION", "FPS", "EXAMPLE_PROMPTS", "load_pipeline",
           "example_prompts_by_attribute"]
