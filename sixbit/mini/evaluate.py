"""Prompt adherence of a sixbit-mini pipeline, scored by the classical-CV judge.

    python -m sixbit.mini.evaluate --model assets/sixbit-mini --out assets/sixbit-mini/eval.json

Prompt sets (fixed seeds, see ``sixbit.mini.data.prompt_set``):

* ``in_grammar``: ``--n-prompts`` (50) distinct training-distribution captions (never a held-out pair),
  each generated with every seed in ``--seeds`` (0 1);
* ``held_out``: ``--n-held-out`` (14) single-object captions whose colour x motion pair was never in
  training (``data.HELD_OUT``), same seeds;
* ``--tune-guidance 3,5,7``: first pick the guidance scale on a separate tuning set (seed 99, 40
  prompts, seed 0) and then evaluate with it (the report says which scale was chosen and why).

Initial noise comes from CPU generators seeded per video, so a given (prompt, seed) starts from the
same latent on any device. The JSON holds the settings, the summaries and every verdict; also judged
and reported: the ground-truth renders themselves and their VAE reconstructions (the ceiling the
denoiser can reach through this VAE).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from . import DEFAULT_GENERATION, load_pipeline
from . import data as D
from . import judge as J

IN_GRAMMAR_SEED = 7
HELD_OUT_SEED = 11
TUNE_SEED = 99


def generate(pipe, prompts: list[str], seeds: list[int], gen_kwargs: dict, batch: int = 64) -> list[np.ndarray]:
    """uint8 videos (F, H, W, 3), one per (prompt, seed) pair in order."""
    out = []
    for i0 in range(0, len(prompts), batch):
        ps = prompts[i0:i0 + batch]
        gens = [torch.Generator("cpu").manual_seed(int(s)) for s in seeds[i0:i0 + batch]]
        with torch.no_grad():
            frames = pipe(prompt=ps, generator=gens, output_type="np", **gen_kwargs).frames
        for v in np.asarray(frames):
            out.append((np.clip(v, 0, 1) * 255).round().astype(np.uint8))
    return out


def run_set(pipe, prompts, seeds, gen_kwargs, batch):
    pairs = [(p, s) for p in prompts for s in seeds]
    t = time.time()
    vids = generate(pipe, [p for p, _ in pairs], [s for _, s in pairs], gen_kwargs, batch)
    gen_s = time.time() - t
    verdicts = [J.judge(v, p) for v, (p, _) in zip(vids, pairs)]
    rows = [dict(seed=s, **v.to_dict()) for v, (_, s) in zip(verdicts, pairs)]
    return J.summarize(verdicts) | {"generate_seconds": round(gen_s, 2)}, rows, vids


@torch.no_grad()
def vae_reconstruction_check(pipe, n: int, seed: int, gen_kwargs: dict) -> dict:
    """Judge VAE reconstructions of ground-truth renders (encode -> decode)."""
    dev = pipe.vae.device
    rng = np.random.default_rng(seed)
    sc = D.sample_scenes(rng, n, split="any")
    caps = sc.captions()
    verdicts_gt, verdicts_rec = [], []
    for i0 in range(0, n, 32):
        x = D.render(sc.subset(np.arange(i0, min(n, i0 + 32))), gen_kwargs["num_frames"], gen_kwargs["height"], dev)
        rec = pipe.vae.decode(pipe.vae.encode(x.to(pipe.vae.dtype)).latent_dist.mode()).sample.float()
        for j in range(x.shape[0]):
            verdicts_gt.append(J.judge(D.to_uint8(x[j]), caps[i0 + j]))
            verdicts_rec.append(J.judge(D.to_uint8(rec[j]), caps[i0 + j]))
    return {"ground_truth": J.summarize(verdicts_gt), "vae_reconstruction": J.summarize(verdicts_rec)}


def contact_sheet(vids: list[np.ndarray], labels: list[str], path: Path, cols: int = 8):
    """First/middle/last frames of a few videos stacked as a PNG."""
    import cv2

    tiles = []
    for v in vids:
        f = v.shape[0]
        tiles.append(np.concatenate([v[0], v[f // 2], v[-1]], 0))
    while len(tiles) % cols:
        tiles.append(np.zeros_like(tiles[0]))
    rows = [np.concatenate(tiles[i:i + cols], 1) for i in range(0, len(tiles), cols)]
    img = np.concatenate(rows, 0)
    img = cv2.resize(img, (img.shape[1] * 2, img.shape[0] * 2), interpolation=cv2.INTER_NEAREST)
    cv2.imwrite(str(path), img[:, :, ::-1])


def main(argv=None):
    from .model import MAX_TEXT_LEN, NUM_FRAMES, SIZE

    ap = argparse.ArgumentParser(description="prompt adherence of a sixbit-mini pipeline")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--n-prompts", type=int, default=50)
    ap.add_argument("--n-held-out", type=int, default=14)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guidance", type=float, default=DEFAULT_GENERATION["guidance_scale"])
    ap.add_argument("--tune-guidance", default="", help="comma list: choose the scale on the tuning set first")
    ap.add_argument("--tune-prompts", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vae-check", type=int, default=200, help="ground-truth clips for the VAE check (0: skip)")
    ap.add_argument("--sheet", default=None, help="write a PNG contact sheet of in-grammar samples here")
    ap.add_argument("--text-encoder-4bit", action="store_true",
                    help="store the text encoder's weights in 4 bits first (sixbit.quantize_text_encoder)")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    pipe = load_pipeline(a.model, a.device)
    if a.text_encoder_4bit:
        from sixbit.text_encoder import quantize_text_encoder

        quantize_text_encoder(pipe)
    seeds = [int(s) for s in a.seeds.split(",")]
    kw = dict(num_frames=NUM_FRAMES, height=SIZE, width=SIZE, num_inference_steps=a.steps,
              guidance_scale=a.guidance, max_sequence_length=MAX_TEXT_LEN)
    res: dict = {"command": "python -m sixbit.mini.evaluate " + " ".join(argv or __import__("sys").argv[1:]),
                 "model": str(a.model), "device": a.device, "text_encoder_4bit": a.text_encoder_4bit,
                 "device_name": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"}
    if a.tune_guidance:
        tune_prompts = D.prompt_set(TUNE_SEED, a.tune_prompts, "train")
        res["tuning"] = {}
        for g in [float(x) for x in a.tune_guidance.split(",")]:
            s, _, _ = run_set(pipe, tune_prompts, [0], kw | {"guidance_scale": g}, a.batch)
            res["tuning"][str(g)] = s
            print(f"tune guidance {g}: {s}", flush=True)
        best = max(res["tuning"], key=lambda g: (res["tuning"][g]["adherence"], res["tuning"][g]["all_correct"]))
        kw["guidance_scale"] = float(best)
        res["tuning_note"] = f"guidance chosen on {a.tune_prompts} tuning prompts (seed {TUNE_SEED}): {best}"
    res["generation"] = kw
    prompts = D.prompt_set(IN_GRAMMAR_SEED, a.n_prompts, "train")
    held = D.prompt_set(HELD_OUT_SEED, a.n_held_out, "held_out")
    s_in, rows_in, vids_in = run_set(pipe, prompts, seeds, kw, a.batch)
    print("in-grammar:", json.dumps(s_in), flush=True)
    s_ho, rows_ho, _ = run_set(pipe, held, seeds, kw, a.batch)
    print("held-out:", json.dumps(s_ho), flush=True)
    res["in_grammar"] = {"summary": s_in, "prompt_seed": IN_GRAMMAR_SEED, "seeds": seeds, "videos": rows_in}
    res["held_out"] = {"summary": s_ho, "prompt_seed": HELD_OUT_SEED, "seeds": seeds, "pairs": D.HELD_OUT,
                       "videos": rows_ho}
    # per-prompt consistency: prompts judged fully correct on every seed (candidates for the demo)
    ok: dict[str, bool] = {}
    for r in rows_in:
        ok[r["prompt"]] = ok.get(r["prompt"], True) and r["all_correct"]
    res["in_grammar"]["all_seeds_correct"] = [p for p, v in ok.items() if v]
    if a.vae_check:
        res["vae_check"] = vae_reconstruction_check(pipe, a.vae_check, 0, kw)
        print("vae check:", json.dumps(res["vae_check"]), flush=True)
    res["seconds"] = round(time.time() - t0, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    if a.sheet:
        idx = list(range(0, min(len(vids_in), 32)))
        contact_sheet([vids_in[i] for i in idx], [rows_in[i]["prompt"] for i in idx], Path(a.sheet))
    print(f"wrote {a.out} in {res['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
