"""Weight-only NVFP4 storage for the text encoder: which layers, how close, how small, exact restore."""

from __future__ import annotations

import pytest
import torch

import sixbit
from sixbit.linear import SixBitLinear
from sixbit.testing import generate, tiny_cogvideox_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


def _embed(pipe, prompt="a red circle moving left"):
    with torch.no_grad():
        return pipe.encode_prompt(prompt, do_classifier_free_guidance=False, max_sequence_length=16,
                                  device=torch.device("cpu"))[0]


def test_text_encoder_weights_in_4_bits_close_smaller_and_restored_exactly():
    pipe = tiny_cogvideox_pipeline(seed=0)
    ref = _embed(pipe)
    te_params = {n: p.detach().clone() for n, p in pipe.text_encoder.named_parameters()}
    handle = sixbit.quantize_text_encoder(pipe)
    swapped = [n for n, m in pipe.text_encoder.named_modules() if isinstance(m, SixBitLinear)]
    assert swapped and all(m.route == "w4a16" for m in handle.modules.values())
    # T5's feed-forward output stays a plain linear (transformers reads wo.weight.dtype)
    assert not any(n.endswith(".wo") for n in swapped)
    assert any(n.endswith(".wo") for n, _ in pipe.text_encoder.named_modules())
    q = _embed(pipe)
    rel = ((q - ref).norm() / ref.norm()).item()
    assert 0 < rel < 0.2, rel  # 4-bit weights move the embedding, a little
    mem = handle.memory()
    assert mem["packed_bytes"] * 3 < mem["original_bytes"]  # fp32 originals: > 7x smaller per layer
    generate(pipe)  # the pipeline runs with the packed encoder
    with pytest.raises(ValueError, match="already quantized"):
        sixbit.quantize_text_encoder(pipe)
    handle.remove()
    assert torch.equal(_embed(pipe), ref)
    for n, p in pipe.text_encoder.named_parameters():
        assert torch.equal(p, te_params[n]), n
    assert not any(isinstance(m, SixBitLinear) for m in pipe.text_encoder.modules())


def test_bad_input_is_refused_clearly():
    with pytest.raises(TypeError, match="text_encoder or an nn.Module"):
        sixbit.quantize_text_encoder(object())
