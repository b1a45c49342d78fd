"""Loading a pipeline: ``load_pipeline(model_id_or_path=None, device=None, dtype=None)``.

* ``None`` → the embedded sixbit-mini (``sixbit.mini.MINI_PATH``), offline;
* a local folder or a Hugging Face hub id → ``DiffusionPipeline.from_pretrained`` (which picks
  ``CogVideoXPipeline``, ``WanPipeline``, … from ``model_index.json``). Hub ids need network access
  unless the model is already in the local cache; ``HF_HUB_OFFLINE=1`` is honoured.

Defaults: ``device`` = CUDA when available, else CPU; ``dtype`` = bfloat16 on CUDA, float32 on CPU
(CPU bf16 matmuls are slow and the reference kernels compute in fp32 anyway).

``text_encoder_4bit=True`` stores the text encoder's linear weights in NVFP4
(:func:`sixbit.quantize_text_encoder`) while the pipeline is still on the CPU, before it moves to
``device``, so a 16-bit copy of the encoder never reaches the device (T5-XXL: 8.87 → 4.02 GiB). It is
memory engineering, not part of 6Bit-Diffusion, and it applies to every run of that pipeline, the
full-precision baseline included. The handle is ``pipe.sixbit_text_encoder`` (``.remove()`` restores).
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["load_pipeline", "default_model_path"]


def _dtype_kw() -> str:
    # diffusers >= 0.42 renamed from_pretrained's ``torch_dtype`` to ``dtype`` (the old name warns)
    from diffusers.utils import deprecation_utils

    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


_DTYPE_KW = _dtype_kw()


def default_model_path() -> str:
    """Path of the embedded sixbit-mini pipeline folder."""
    try:
        from sixbit.mini import MINI_PATH
    except ImportError as e:
        raise FileNotFoundError(
            "the embedded sixbit-mini model is not available in this checkout (sixbit.mini.MINI_PATH); "
            "pass a CogVideoX hub id or a local pipeline folder to load_pipeline()"
        ) from e
    return str(MINI_PATH)


def load_pipeline(model_id_or_path: str | Path | None = None, device: str | torch.device | None = None,
                  dtype: torch.dtype | str | None = None, *, text_encoder_4bit: bool = False):
    """Load a diffusers video pipeline (see the module docstring); progress bar off, ``.eval()``."""
    from diffusers import DiffusionPipeline

    src = default_model_path() if model_id_or_path is None else str(model_id_or_path)
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    local = Path(src)
    if model_id_or_path is not None and not local.exists() and (src.startswith((".", "/")) or src.count("/") > 1):
        raise FileNotFoundError(f"no pipeline folder at {src!r}")
    pipe = DiffusionPipeline.from_pretrained(src, **{_DTYPE_KW: dtype})
    pipe.sixbit_text_encoder = None
    if text_encoder_4bit:
        if getattr(pipe, "text_encoder", None) is None:
            raise ValueError(f"{type(pipe).__name__} has no text encoder to store in 4 bits")
        from sixbit.text_encoder import quantize_text_encoder

        pipe.sixbit_text_encoder = quantize_text_encoder(pipe)  # packs on the CPU, before the move
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    for comp in pipe.components.values():
        if isinstance(comp, torch.nn.Module):
            comp.eval()
    return pipe
