"""The committed sixbit-mini pipeline: loads offline with stock diffusers, generates on the CPU."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from sixbit.mini import DEFAULT_GENERATION, EXAMPLE_PROMPTS, MINI_PATH, load_pipeline
from sixbit.mini import judge as J

pytestmark = pytest.mark.skipif(not Path(MINI_PATH, "model_index.json").exists(), reason="no committed model")


@pytest.fixture(scope="module")
def pipe():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return load_pipeline()


def _gen(pipe, prompt, seed=0, **over):
    kw = {**DEFAULT_GENERATION, **over}
    return pipe(prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **kw).frames[0]


def test_folder_is_small_safetensors_and_plain_from_pretrained_is_fp32():
    root = Path(MINI_PATH)
    files = [p for p in root.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 40_000_000
    weights = [p for p in files if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".safetensors")]
    assert weights and all(p.suffix == ".safetensors" for p in weights)
    idx = json.loads((root / "model_index.json").read_text())
    assert idx["_class_name"] == "CogVideoXPipeline"
    from diffusers import CogVideoXPipeline

    p = CogVideoXPipeline.from_pretrained(MINI_PATH)
    assert {p.transformer.dtype, p.vae.dtype, p.text_encoder.dtype} == {torch.float32}
    cfg = p.transformer.config
    assert cfg.use_rotary_positional_embeddings and 8 <= cfg.num_layers <= 16


@pytest.fixture(scope="module")
def default_video(pipe):
    return _gen(pipe, EXAMPLE_PROMPTS[0], seed=0)


def test_generates_a_video_of_the_right_shape_and_range(pipe, default_video):
    v = default_video
    assert v.shape == (DEFAULT_GENERATION["num_frames"], DEFAULT_GENERATION["height"], DEFAULT_GENERATION["width"], 3)
    assert np.isfinite(v).all() and v.min() >= 0.0 and v.max() <= 1.0
    assert v.std() > 0.05  # not a flat image
    a = _gen(pipe, EXAMPLE_PROMPTS[1], num_inference_steps=3)
    b = _gen(pipe, EXAMPLE_PROMPTS[1], num_inference_steps=3)
    np.testing.assert_array_equal(a, b)  # seeded: deterministic


def test_different_prompts_give_different_videos(pipe):
    a = _gen(pipe, "a red circle moving left on a blue background", num_inference_steps=4)
    b = _gen(pipe, "a yellow square moving up on a black background", num_inference_steps=4)
    assert np.abs(a - b).mean() > 0.05


def test_default_generation_follows_the_first_example_prompt(default_video):
    """The first example prompt was judged fully correct on both evaluation seeds (model card)."""
    prompt = EXAMPLE_PROMPTS[0]
    v = J.judge(default_video, prompt)
    assert v.all_correct, v.to_dict()


@pytest.mark.parametrize("te4", [False, True])
def test_evaluate_cli_end_to_end_at_toy_size(tmp_path, te4):
    from sixbit.mini import evaluate

    out = tmp_path / "eval.json"
    evaluate.main(["--model", MINI_PATH, "--out", str(out), "--device", "cpu", "--n-prompts", "1", "--n-held-out", "1",
                   "--seeds", "0", "--steps", "2", "--vae-check", "2", "--batch", "2", "--sheet", str(tmp_path / "sheet.png")]
                  + (["--text-encoder-4bit"] if te4 else []))
    res = json.loads(out.read_text())
    assert res["text_encoder_4bit"] is te4
    assert res["generation"]["guidance_scale"] == DEFAULT_GENERATION["guidance_scale"]  # the demo's, by default
    assert res["in_grammar"]["summary"]["n"] == 1 and res["held_out"]["summary"]["n"] == 1
    assert 0.0 <= res["in_grammar"]["summary"]["adherence"] <= 1.0
    assert res["vae_check"]["ground_truth"]["n"] == 2
    assert (tmp_path / "sheet.png").stat().st_size > 0
