"""Tiny random diffusers pipelines, built offline from configs, for tests and examples.

Nothing here downloads anything: every component is constructed from a config with a fixed seed, the
tokenizer is ``ByT5Tokenizer`` (byte-level, needs no vocabulary files). The pipelines are *real*
``CogVideoXPipeline`` / ``WanPipeline`` objects, so everything sixbit does to them is what it does to a
checkpoint loaded with ``from_pretrained``; :func:`save_and_reload` exercises that loading path.

Sizes are chosen so that every block linear has a reduction dimension that is a multiple of 16 (NVFP4)
and one generation of a few steps takes well under a second on 2 CPU cores.

Call arguments that fit the tiny models are in :data:`COGVIDEOX_CALL` / :data:`WAN_CALL`.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = [
    "tiny_cogvideox_pipeline",
    "tiny_wan_pipeline",
    "save_and_reload",
    "COGVIDEOX_CALL",
    "WAN_CALL",
    "generate",
]

#: text length of the tiny models (== the tiny CogVideoX transformer's ``max_text_seq_length``)
TEXT_LEN = 16

#: keyword arguments for a short call of :func:`tiny_cogvideox_pipeline`'s pipeline
COGVIDEOX_CALL = dict(
    height=32, width=32, num_frames=9, num_inference_steps=6, guidance_scale=5.0,
    max_sequence_length=TEXT_LEN, output_type="pt",
)
#: keyword arguments for a short call of :func:`tiny_wan_pipeline`'s pipeline
WAN_CALL = dict(
    height=32, width=32, num_frames=5, num_inference_steps=6, guidance_scale=5.0,
    max_sequence_length=TEXT_LEN, output_type="pt",
)


def _text_encoder(d_model: int = 32, seed: int = 0):
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=384, d_model=d_model, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0,
    )
    return T5EncoderModel(cfg).eval()


def _tokenizer():
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


def tiny_cogvideox_pipeline(
    seed: int = 0,
    num_layers: int = 3,
    *,
    heads: int = 2,
    head_dim: int = 16,
    rope: bool = True,
    v15: bool = False,
    dtype: torch.dtype = torch.float32,
):
    """A ``CogVideoXPipeline`` with random weights: ``num_layers`` blocks of width ``heads·head_dim``.

    ``v15=True`` builds a CogVideoX-1.5-style transformer (temporal patch ``patch_size_t=2``, no
    learned positional embedding), which exercises the frame-padding path of the pipeline.
    """
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    torch.manual_seed(seed)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=4,
        out_channels=4,
        time_embed_dim=32,
        text_embed_dim=32,
        num_layers=num_layers,
        sample_width=8,
        sample_height=8,
        sample_frames=9,
        patch_size=2,
        patch_size_t=2 if v15 else None,
        temporal_compression_ratio=4,
        max_text_seq_length=TEXT_LEN,
        use_rotary_positional_embeddings=rope or v15,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLCogVideoX(
        in_channels=3,
        out_channels=3,
        down_block_types=("CogVideoXDownBlock3D",) * 3,
        up_block_types=("CogVideoXUpBlock3D",) * 3,
        block_out_channels=(8, 8, 8),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=2,
        temporal_compression_ratio=4,
    )
    scheduler = CogVideoXDDIMScheduler(
        beta_schedule="scaled_linear", timestep_spacing="trailing", rescale_betas_zero_snr=True,
        prediction_type="v_prediction", clip_sample=False, set_alpha_to_one=True,
    )
    pipe = CogVideoXPipeline(
        tokenizer=_tokenizer(), text_encoder=_text_encoder(32, seed + 2), vae=vae.eval(),
        transformer=transformer.eval(), scheduler=scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)


def tiny_wan_pipeline(seed: int = 0, num_layers: int = 2, *, heads: int = 2, head_dim: int = 16,
                      dtype: torch.dtype = torch.float32):
    """A Wan 2.1-style ``WanPipeline`` with random weights (CFG runs as two separate transformer calls)."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(seed)
    z = 4
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        in_channels=z,
        out_channels=z,
        text_dim=32,
        freq_dim=32,
        ffn_dim=64,
        num_layers=num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=z, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z, latents_std=[1.0] * z,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    pipe = WanPipeline(
        tokenizer=_tokenizer(), text_encoder=_text_encoder(32, seed + 2), vae=vae.eval(),
        transformer=transformer.eval(), scheduler=scheduler,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)


def save_and_reload(pipe, folder: str | Path):
    """``pipe.save_pretrained(folder)`` then ``type(pipe).from_pretrained(folder)`` — the hub-id path,
    offline. Returns the reloaded pipeline (progress bar off)."""
    folder = Path(folder)
    pipe.save_pretrained(folder, safe_serialization=True)
    again = type(pipe).from_pretrained(folder)
    again.set_progress_bar_config(disable=True)
    return again


def generate(pipe, prompt: str = "red circle", *, seed: int = 0, **overrides):
    """One short generation with the tiny-model call arguments (latents out by default): returns the
    pipeline's ``frames`` tensor."""
    base = COGVIDEOX_CALL if type(pipe).__name__.startswith("CogVideoX") else WAN_CALL
    kw = {**base, "output_type": "latent", **overrides}
    return pipe(prompt, negative_prompt="", generator=torch.Generator().manual_seed(seed), **kw).frames
