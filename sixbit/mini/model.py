"""The parts of sixbit-mini: stock diffusers/transformers classes with small configurations.

| part | class | size |
|---|---|---|
| VAE | ``AutoencoderKLCogVideoX``, 3 blocks (32, 64, 64), 8 latent channels | 4x spatial, 4x temporal |
| denoiser | ``CogVideoXTransformer3DModel``, 12 layers, 4 heads x 64, RoPE, patch 2 | 1,280 video tokens -> 320 |
| text encoder | ``T5EncoderModel`` 4 layers, d_model 128, on ``ByT5Tokenizer`` bytes | no vocabulary files |
| scheduler | ``CogVideoXDDIMScheduler``, v-prediction, zero terminal SNR, trailing spacing | |

A 17-frame 64x64 clip becomes a (5, 8, 16, 16) latent and 5 x 8 x 8 = 320 video tokens; captions are
bytes, padded to ``MAX_TEXT_LEN``. Weights are stored in float16 (the folder stays under 40 MB); load
with ``torch_dtype=torch.float32`` to run on the CPU.
"""

from __future__ import annotations

import torch

from .data import max_caption_bytes

SIZE = 64
NUM_FRAMES = 17
LATENT_CHANNELS = 8
# longest caption + </s>, rounded up to a multiple of 16
MAX_TEXT_LEN = ((max_caption_bytes() + 1 + 15) // 16) * 16

VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("CogVideoXDownBlock3D",) * 3,
    up_block_types=("CogVideoXUpBlock3D",) * 3,
    block_out_channels=(32, 64, 64),
    latent_channels=LATENT_CHANNELS,
    layers_per_block=1,
    norm_num_groups=8,
    temporal_compression_ratio=4,
    sample_height=SIZE,
    sample_width=SIZE,
    scaling_factor=1.0,  # set from the trained encoder's latent std before export
)

TEXT_CONFIG = dict(
    vocab_size=384,  # ByT5: 3 specials + 256 bytes + 125 extra ids
    d_model=128,
    d_kv=32,
    d_ff=512,
    num_layers=4,
    num_heads=4,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    is_encoder_decoder=False,
    use_cache=False,
)

TRANSFORMER_CONFIG = dict(
    num_attention_heads=4,
    attention_head_dim=64,
    in_channels=LATENT_CHANNELS,
    out_channels=LATENT_CHANNELS,
    time_embed_dim=128,
    text_embed_dim=TEXT_CONFIG["d_model"],
    num_layers=12,
    sample_width=SIZE // 4,
    sample_height=SIZE // 4,
    sample_frames=NUM_FRAMES,
    patch_size=2,
    temporal_compression_ratio=4,
    max_text_seq_length=MAX_TEXT_LEN,
    use_rotary_positional_embeddings=True,
)

SCHEDULER_CONFIG = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    clip_sample=False,
    set_alpha_to_one=True,
    steps_offset=0,
    prediction_type="v_prediction",
    timestep_spacing="trailing",
    rescale_betas_zero_snr=True,
    snr_shift_scale=1.0,
)


def build_vae(**overrides):
    from diffusers import AutoencoderKLCogVideoX

    return AutoencoderKLCogVideoX(**{**VAE_CONFIG, **overrides})


def build_text_encoder(**overrides):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**{**TEXT_CONFIG, **overrides}))


def build_transformer(**overrides):
    from diffusers import CogVideoXTransformer3DModel

    return CogVideoXTransformer3DModel(**{**TRANSFORMER_CONFIG, **overrides})


def build_scheduler():
    from diffusers import CogVideoXDDIMScheduler

    return CogVideoXDDIMScheduler(**SCHEDULER_CONFIG)


def build_tokenizer():
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


def assemble(vae, text_encoder, transformer, tokenizer=None, scheduler=None):
    from diffusers import CogVideoXPipeline

    return CogVideoXPipeline(
        tokenizer=tokenizer or build_tokenizer(),
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=scheduler or build_scheduler(),
    )


def tokenize(tokenizer, prompts: list[str], max_len: int = MAX_TEXT_LEN) -> torch.Tensor:
    """Token ids exactly as CogVideoXPipeline._get_t5_prompt_embeds makes them."""
    return tokenizer(
        prompts, padding="max_length", max_length=max_len, truncation=True, add_special_tokens=True,
        return_tensors="pt",
    ).input_ids


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())
