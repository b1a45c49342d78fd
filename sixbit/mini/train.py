"""Train sixbit-mini from scratch: VAE, then denoiser + text encoder, then export a pipeline folder.

    python -m sixbit.mini.train --out runs/mini --minutes 9 --device cuda

Phases (each one resumable):

1. **VAE** (``--vae-steps``): ``AutoencoderKLCogVideoX`` on fresh renders every step, through the same
   chunked ``encode``/``decode`` calls the pipeline uses. Loss: L1 + L2 on pixels, weighted x9 on
   object pixels (shapes are a few percent of the frame), + a small KL term.
2. **Latent pool** (``--pool``): that many clips rendered and encoded once (posterior mean and std
   kept, a fresh latent sample is drawn every time a clip is used); the latent scaling factor is
   1 / std of the latents.
3. **Denoiser + text encoder** (``--dit-steps``): ``CogVideoXTransformer3DModel`` and ``T5EncoderModel``
   trained jointly with the v-prediction loss of ``CogVideoXDDIMScheduler`` (uniform timesteps), 10%
   caption dropout (the empty prompt, as the pipeline's negative prompt) for classifier-free guidance,
   and an auxiliary loss that asks the pooled text encoding for the caption's attributes (a linear
   head per attribute, discarded after training) so the byte-level encoder learns words quickly. An
   exponential moving average of both is what gets exported. ``--object-weight w`` (off by default;
   4 for the committed model) weights the latent cells that objects cover by 1 + w.

Every random draw is seeded from ``--seed`` and the step number, so a run is reproducible from its seed
and step counts (GPU kernels aside). ``--minutes`` is a wall-clock budget: the VAE phase stops at
``--vae-minutes`` and the denoiser phase early enough to export; the log records the steps reached, and
re-running with those step counts (and a large budget) repeats the run.

Outputs under ``--out``: ``ckpt.pt`` (full state: weights, EMA, optimiser, phase, step; written every
``--ckpt-every`` seconds, ``--resume`` continues from it), ``pipeline/`` (the exported pipeline, fp16),
``train_log.json`` (loss curves, timings, settings) and ``loss.png``; with ``--pool-cache`` also
``pool.pt``, the encoded latent pool, which a ``--resume`` of the same configuration loads instead of
rebuilding it. ``--compile MODE`` trains the denoiser and text encoder under ``torch.compile`` (about 2x
the step rate on an H200). ``--stop-after N`` ends a run at denoiser step N with the schedule of the full
``--dit-steps`` (a planned split into several runs; ``--minutes`` splits by time). ``--tar-to DIR`` also writes the
pipeline folder as a tar split into <=15 MB parts (for size-limited transfers). ``--init-from PIPE``
warm-starts from an exported pipeline (VAE frozen, denoiser/text encoder and their EMA from its
weights, fresh optimiser): the way to continue training when only the exported folder was kept.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import data as D
from . import model as M

_AUX_SIZES = {
    "colour0": len(D.COLOUR_NAMES), "shape0": len(D.SHAPES), "motion0": len(D.MOTIONS),
    "colour1": len(D.COLOUR_NAMES) + 1, "shape1": len(D.SHAPES) + 1, "motion1": len(D.MOTIONS) + 1,
    "bg": len(D.BACKGROUNDS),
}


def aux_labels(sc: D.Scenes) -> dict[str, np.ndarray]:
    two = sc.n_obj == 2
    return {
        "colour0": sc.colour[:, 0], "shape0": sc.shape[:, 0], "motion0": sc.motion[:, 0],
        "colour1": np.where(two, sc.colour[:, 1] + 1, 0), "shape1": np.where(two, sc.shape[:, 1] + 1, 0),
        "motion1": np.where(two, sc.motion[:, 1] + 1, 0), "bg": sc.bg,
    }


class AuxHeads(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.heads = torch.nn.ModuleDict({k: torch.nn.Linear(dim, n) for k, n in _AUX_SIZES.items()})

    def forward(self, emb, ids, labels):
        mask = (ids != 0).unsqueeze(-1).to(emb.dtype)
        pooled = (emb * mask).sum(1) / mask.sum(1).clamp(min=1)
        return sum(F.cross_entropy(h(pooled).float(), labels[k]) for k, h in self.heads.items()) / len(self.heads)


def latent_mask(alpha: torch.Tensor) -> torch.Tensor:
    """Object coverage (B, 17, H, W) -> (B, 5, H/4, W/4) on the latent grid: max over each latent
    cell's 4x4 pixels and its frames (latent frame 0 = frame 0, latent k = frames 4k-3 .. 4k)."""
    B, Fr, H, W = alpha.shape
    t = torch.cat([alpha[:, :1], alpha[:, 1:].reshape(B, (Fr - 1) // 4, 4, H, W).amax(2)], 1)
    return F.max_pool2d(t.reshape(-1, 1, H, W), 4).reshape(B, t.shape[1], H // 4, W // 4)


def step_rng(seed: int, phase: int, step: int) -> np.random.Generator:
    return np.random.default_rng([seed, phase, step])


def torch_gen(seed: int, phase: int, step: int, device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(int(step_rng(seed, phase, step).integers(2**62)))
    return g


@torch.no_grad()
def ema_update(ema: dict, model: torch.nn.Module, decay: float):
    sd = model.state_dict()
    keys = [k for k, v in sd.items() if v.dtype.is_floating_point]
    e = [ema[k] for k in keys]
    torch._foreach_mul_(e, decay)
    torch._foreach_add_(e, [sd[k].detach().float() for k in keys], alpha=1 - decay)


def lr_at(step: int, base: float, warmup: int) -> float:
    return base * min(1.0, (step + 1) / max(1, warmup))


def decay_factor(step: int, total: int, frac: float, begin: int = 0) -> float:
    """1 until the last ``frac`` of the steps begin..total, then linearly down to 0.1."""
    if total >= 10**9 or frac <= 0:
        return 1.0
    start = begin + (total - begin) * (1 - frac)
    return 1.0 if step < start else max(0.1, 1.0 - 0.9 * (step - start) / max(1.0, total - start))


# ------------------------------------------------------------------------------------------------


class _DataPhases:
    """Trainer phases 1–2 (methods of :class:`Trainer`, which holds the state): the VAE, then the latent
    pool the denoiser trains on."""

    # -- phase 1: VAE -----------------------------------------------------------------------------
    def train_vae(self):
        a = self.a
        self.vae.train()
        self.vae.requires_grad_(True)
        deadline = a.vae_minutes * 60
        if a.vae_steps <= 0 and "vae_total" in self.state:
            a.vae_steps = self.state["vae_total"]
        auto = a.vae_steps <= 0
        total = a.vae_steps if not auto else 10**9
        while self.state["vae_step"] < total and self.elapsed() < deadline:
            s = self.state["vae_step"]
            if auto:
                total = self.auto_steps("vae", s, 0, deadline, total)
            if a.vae_video_every <= 1 or s % a.vae_video_every == 0:  # a batch of 17-frame clips
                sc = D.sample_scenes(step_rng(a.seed, 1, s), a.vae_batch, split="train")
                x, alpha = D.render(sc, M.NUM_FRAMES, M.SIZE, self.dev, return_alpha=True)
            else:  # a batch of single frames (the 1-frame path of the same VAE): 17x cheaper per sample
                n = max(1, a.vae_image_batch // 4)
                sc = D.sample_scenes(step_rng(a.seed, 1, s), n, split="train")
                x, alpha = D.render(sc, M.NUM_FRAMES, M.SIZE, self.dev, return_alpha=True)
                fi = torch.randint(0, M.NUM_FRAMES, (n, 4), generator=torch_gen(a.seed, 6, s, self.dev), device=self.dev)
                ar = torch.arange(n, device=self.dev)[:, None]
                x = x.permute(0, 2, 1, 3, 4)[ar, fi].reshape(n * 4, 3, 1, M.SIZE, M.SIZE)
                alpha = alpha[ar, fi].reshape(n * 4, 1, M.SIZE, M.SIZE)
            w = 1.0 + 8.0 * alpha.unsqueeze(1)
            for g in self.vae_opt.param_groups:
                # cosine to 0.1 once the step count is known (from step 60 on, also when it is given,
                # so that re-running with the logged count repeats an auto-sized run exactly)
                g["lr"] = g["lr_mult"] * lr_at(s, a.vae_lr, 100) * (
                    1.0 if total >= 10**9 or s < 60 else 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))) * 0.9 + 0.1)
            with torch.autocast(**self.amp):
                post = self.vae.encode(x).latent_dist
                z = post.mean + post.std * torch.randn(post.mean.shape, generator=torch_gen(a.seed, 2, s, self.dev),
                                                       device=self.dev, dtype=post.mean.dtype)
                rec = self.vae.decode(z).sample
            err = rec.float() - x
            rec_loss = (w * err.abs()).mean() + (w * err * err).mean()
            kl = 0.5 * (post.mean.float() ** 2 + post.var.float() - 1.0 - post.logvar.float()).mean()
            loss = rec_loss + a.kl_weight * kl
            self.vae_opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.vae.parameters(), 1.0)
            self.vae_opt.step()
            self.state["vae_step"] = s + 1
            if s % a.log_every == 0:
                psnr = -10 * math.log10(max(((err / 2) ** 2).mean().item(), 1e-10))
                self.log["vae"].append({"step": s, "t": round(self.elapsed(), 1), "loss": loss.item(),
                                        "rec": rec_loss.item(), "kl": kl.item(), "psnr": psnr})
                self.event(f"vae {s:5d} loss {loss.item():.4f} kl {kl.item():.3f} psnr {psnr:.2f}")
            if time.time() - self.last_ckpt > a.ckpt_every:
                self.save_ckpt()
        self.vae.eval()
        self.vae.requires_grad_(False)
        self.state["phase"] = "pool"
        self.event(f"vae done at step {self.state['vae_step']}")

    # -- phase 2: latent pool ---------------------------------------------------------------------
    def _pool_key(self) -> dict:
        a = self.a
        return {"seed": a.seed, "pool": a.pool, "pool_batch": a.pool_batch, "object_weight": a.object_weight > 0,
                "vae_step": self.state["vae_step"]}

    @torch.no_grad()
    def build_pool(self):
        a = self.a
        self.vae.eval()
        self.vae.requires_grad_(False)
        cache = self.out / "pool.pt"
        if a.pool_cache and cache.exists():  # a resumed run: the same seeded pool, without re-rendering it
            c = torch.load(cache, map_location=self.dev, weights_only=False)
            if c["key"] == self._pool_key():
                self.pool_mean, self.pool_std, self.pool_ids = c["mean"], c["std"], c["ids"]
                self.pool_masks, self.pool_labels = c["masks"], c["labels"]
                self.vae.register_to_config(scaling_factor=self.state["scaling_factor"])
                self.state["phase"] = "dit"
                self.log["pool_clips"] = len(self.pool_mean)
                self.event(f"pool of {len(self.pool_mean)} clips loaded from {cache}")
                return
            self.event(f"{cache} is for {c['key']}, not {self._pool_key()}: rebuilding the pool")
        n = a.pool
        means, stds, ids, masks, labels = [], [], [], [], {k: [] for k in _AUX_SIZES}
        chunk = a.pool_batch
        for i0 in range(0, n, chunk):
            sc = D.sample_scenes(step_rng(a.seed, 3, i0), min(chunk, n - i0), split="train")
            x, alpha = D.render(sc, M.NUM_FRAMES, M.SIZE, self.dev, return_alpha=True)
            with torch.autocast(**self.amp):
                post = self.vae.encode(x).latent_dist
            if a.object_weight > 0:
                masks.append((latent_mask(alpha) * 255).round().to(torch.uint8))
            means.append(post.mean.to(torch.bfloat16))
            stds.append(post.std.to(torch.bfloat16))
            ids.append(M.tokenize(self.tok, sc.captions()).to(self.dev))
            for k, v in aux_labels(sc).items():
                labels[k].append(torch.from_numpy(v))
            if self.elapsed() > a.pool_deadline_minutes * 60:
                self.event(f"pool stopped early at {i0 + chunk} clips (time)")
                break
        self.pool_mean = torch.cat(means)
        self.pool_std = torch.cat(stds)
        self.pool_ids = torch.cat(ids)
        self.pool_masks = torch.cat(masks) if masks else None
        self.pool_labels = {k: torch.cat(v).to(self.dev) for k, v in labels.items()}
        if self.state["scaling_factor"] is None:
            m = self.pool_mean[:2048].float()
            s = self.pool_std[:2048].float()
            z = m + s * torch.randn(m.shape, generator=torch_gen(a.seed, 4, 0, self.dev), device=self.dev)
            self.state["scaling_factor"] = float(1.0 / z.std().item())
            self.event(f"latent mean {z.mean().item():.4f} std {z.std().item():.4f} -> scaling_factor "
                       f"{self.state['scaling_factor']:.5f}")
        self.vae.register_to_config(scaling_factor=self.state["scaling_factor"])
        self.state["phase"] = "dit"
        self.log["pool_clips"] = len(self.pool_mean)
        self.event(f"pool of {len(self.pool_mean)} clips ready")
        if a.pool_cache:
            torch.save({"key": self._pool_key(), "mean": self.pool_mean, "std": self.pool_std, "ids": self.pool_ids,
                        "masks": self.pool_masks, "labels": self.pool_labels}, cache)
            self.event(f"pool saved to {cache}")


class _DenoiserPhases:
    """Trainer phase 3 and the export (methods of :class:`Trainer`): the denoiser + text encoder, and the
    pipeline folder written from their EMA weights."""

    # -- phase 3: denoiser + text encoder ----------------------------------------------------------
    def train_dit(self):
        a = self.a
        self.tr.train()
        self.te.train()
        sf = self.state["scaling_factor"]
        lat_f = (M.NUM_FRAMES - 1) // 4 + 1
        rope = self.pipe._prepare_rotary_positional_embeddings(M.SIZE, M.SIZE, lat_f, self.dev)
        empty = M.tokenize(self.tok, [""]).to(self.dev)
        P = len(self.pool_mean)
        stop_at = a.minutes * 60 - a.reserve_seconds
        t_last = time.time()
        if a.dit_steps <= 0 and "dit_total" in self.state:
            a.dit_steps = self.state["dit_total"]
        auto = a.dit_steps <= 0
        total = a.dit_steps if not auto else 10**9
        s_begin = self.state["dit_step"]
        stop_step = min(total, a.stop_after or total)
        while self.state["dit_step"] < stop_step and self.elapsed() < stop_at:
            s = self.state["dit_step"]
            if auto:
                total = self.auto_steps("dit", s, s_begin, stop_at, total)
            g = torch_gen(a.seed, 5, s, self.dev)
            idx = torch.randint(0, P, (a.batch,), generator=g, device=self.dev)
            m, sd = self.pool_mean[idx].float(), self.pool_std[idx].float()
            z = (m + sd * torch.randn(m.shape, generator=g, device=self.dev)) * sf
            z = z.permute(0, 2, 1, 3, 4).contiguous()  # (B, F, C, H, W)
            ids = self.pool_ids[idx]
            drop = torch.rand(a.batch, generator=g, device=self.dev) < a.cfg_dropout
            ids = torch.where(drop[:, None], empty.expand_as(ids), ids)
            labels = {k: v[idx] for k, v in self.pool_labels.items()}
            t = torch.randint(0, self.sched.config.num_train_timesteps, (a.batch,), generator=g, device=self.dev)
            noise = torch.randn(z.shape, generator=g, device=self.dev)
            zt = self.sched.add_noise(z, noise, t)
            target = self.sched.get_velocity(z, noise, t)
            for grp in self.dit_opt.param_groups:
                grp["lr"] = lr_at(s - a.warmup_offset, a.lr, a.warmup) * decay_factor(s, total, a.decay_frac, a.warmup_offset)
            with torch.autocast(**self.amp):
                emb = self.te(ids)[0]
                pred = self.tr(hidden_states=zt, encoder_hidden_states=emb, timestep=t, image_rotary_emb=rope,
                               return_dict=False)[0]
                keep = ~drop
                aux = self.aux(emb[keep], ids[keep], {k: v[keep] for k, v in labels.items()})
            sq = (pred.float() - target.float()) ** 2
            loss = sq.mean()
            if self.pool_masks is not None:  # weight the latent cells that hold objects
                w = 1.0 + a.object_weight * (self.pool_masks[idx].float() / 255.0).unsqueeze(2)
                diff_loss = (w * sq).mean() / w.mean()
            else:
                diff_loss = loss
            objective = diff_loss + a.aux_weight * aux
            self.dit_opt.zero_grad(set_to_none=True)
            objective.backward()
            gn = torch.nn.utils.clip_grad_norm_([p for grp in self.dit_opt.param_groups for p in grp["params"]], 1.0)
            self.dit_opt.step()
            decay = min(a.ema, (1 + s) / (10 + s))
            ema_update(self.ema_tr, self.tr, decay)
            ema_update(self.ema_te, self.te, decay)
            self.state["dit_step"] = s + 1
            if s % a.log_every == 0:
                now = time.time()
                rate = a.log_every / max(now - t_last, 1e-9) if s else 0.0
                t_last = now
                self.log["dit"].append({"step": s, "t": round(self.elapsed(), 1), "loss": loss.item(),
                                        "aux": aux.item(), "grad_norm": gn.item(), "steps_per_s": rate})
                self.event(f"dit {s:5d} loss {loss.item():.4f} aux {aux.item():.3f} gn {gn.item():.2f} "
                           f"{rate:.2f} it/s")
            if time.time() - self.last_ckpt > a.ckpt_every:
                self.save_ckpt()
                self.write_log()
            if a.export_every and time.time() - self.last_export > a.export_every:
                self.export()
        self.state["phase"] = "done" if self.state["dit_step"] >= total else "dit"
        self.event(f"dit stopped at step {self.state['dit_step']}")

    # -- export -----------------------------------------------------------------------------------
    def export(self):
        a = self.a
        tr = M.build_transformer()
        tr.load_state_dict({k: v.float().cpu() for k, v in self.ema_tr.items()})
        te = M.build_text_encoder()
        te.load_state_dict({k: v.float().cpu() for k, v in self.ema_te.items()})
        vae = M.build_vae(scaling_factor=self.state["scaling_factor"] or 1.0)
        vae.load_state_dict({k: v.float().cpu() for k, v in self.vae.state_dict().items()})
        pipe = M.assemble(vae, te.eval(), tr.eval(), M.build_tokenizer(), M.build_scheduler())
        # fp16 storage for the big parts; the small text encoder stays fp32 so that a plain
        # from_pretrained (diffusers loads its models as fp32, transformers keeps the stored dtype)
        # gives an all-fp32 pipeline
        pipe.transformer.to(torch.float16)
        pipe.vae.to(torch.float16)
        dst = self.out / "pipeline"
        tmp = self.out / "pipeline.tmp"
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
        pipe.save_pretrained(tmp, safe_serialization=True)
        meta = {
            "seed": a.seed, "vae_steps": self.state["vae_step"], "dit_steps": self.state["dit_step"],
            "scaling_factor": self.state["scaling_factor"], "pool_clips": self.log.get("pool_clips"),
            "batch": a.batch, "vae_batch": a.vae_batch, "lr": a.lr, "device": str(self.dev),
            "device_name": torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda" else "cpu",
            "wall_seconds": round(self.total_wall(), 1), "params": self.log["params"],
            "max_text_len": M.MAX_TEXT_LEN,
            "init_from": self.log.get("init_meta"),  # the run this one continued, if any
        }
        (tmp / "training.json").write_text(json.dumps(meta, indent=1))
        if dst.exists():
            import shutil

            shutil.rmtree(dst)
        os.replace(tmp, dst)
        if a.tar_to:
            write_tar_parts(dst, Path(a.tar_to), "sixbit-mini.tar")
        self.last_export = time.time()
        self.write_log()
        plot_losses(self.log, self.out / "loss.png")
        self.event(f"exported pipeline (vae {self.state['vae_step']} / dit {self.state['dit_step']} steps) to {dst}")


class Trainer(_DataPhases, _DenoiserPhases):
    """The whole training run: state, checkpoints, log, and :meth:`run` through the phases."""

    def __init__(self, a):
        self.a = a
        self.dev = torch.device(a.device)
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self.last_ckpt = self.last_export = time.time()
        torch.manual_seed(a.seed)
        if self.dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.amp = dict(device_type=self.dev.type, dtype=torch.bfloat16, enabled=self.dev.type == "cuda")
        self.vae = M.build_vae().to(self.dev)
        self.te = M.build_text_encoder().to(self.dev)
        self.tr = M.build_transformer().to(self.dev)
        self.aux = AuxHeads(M.TEXT_CONFIG["d_model"]).to(self.dev)
        if a.compile != "off":  # in place: state_dict keys and the exported modules stay as they are
            for mod in (self.tr, self.te):
                mod.compile(mode=None if a.compile == "default" else a.compile)
        self.tok = M.build_tokenizer()
        self.sched = M.build_scheduler()
        self.pipe = M.assemble(self.vae, self.te, self.tr, self.tok, self.sched)
        self.state = {"phase": "vae", "vae_step": 0, "dit_step": 0, "scaling_factor": None, "wall_before": 0.0}
        self.log = {"args": vars(a), "vae": [], "dit": [], "events": [],
                    "params": {"vae": M.n_params(self.vae), "transformer": M.n_params(self.tr),
                               "text_encoder": M.n_params(self.te)}}
        enc = [p for n, p in self.vae.named_parameters() if n.startswith(("encoder.", "quant_conv."))]
        dec = [p for n, p in self.vae.named_parameters() if not n.startswith(("encoder.", "quant_conv."))]
        self.vae_opt = torch.optim.AdamW([{"params": enc, "lr_mult": a.vae_encoder_lr_mult}, {"params": dec, "lr_mult": 1.0}],
                                         lr=a.vae_lr, weight_decay=0.0)
        dit_params = list(self.tr.parameters()) + list(self.te.parameters()) + list(self.aux.parameters())
        self.dit_opt = torch.optim.AdamW(dit_params, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.01)
        self.ema_tr = {k: v.detach().clone().float() for k, v in self.tr.state_dict().items()}
        self.ema_te = {k: v.detach().clone().float() for k, v in self.te.state_dict().items()}
        self.event(f"params {self.log['params']}  max_text_len {M.MAX_TEXT_LEN}")

    # -- bookkeeping ------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.time() - self.t0

    def event(self, msg: str):
        line = f"[{self.elapsed():7.1f}s] {msg}"
        print(line, flush=True)
        self.log["events"].append(line)

    def total_wall(self) -> float:
        """Seconds of training over this run and the earlier runs it resumed (not warm starts)."""
        return self.state.get("wall_before", 0.0) + self.elapsed()

    def save_ckpt(self):
        self.state["wall_saved"] = round(self.total_wall(), 1)
        st = {
            "state": self.state, "log": self.log,
            "vae": self.vae.state_dict(), "vae_opt": self.vae_opt.state_dict(),
            "tr": self.tr.state_dict(), "te": self.te.state_dict(), "aux": self.aux.state_dict(),
            "dit_opt": self.dit_opt.state_dict(), "ema_tr": self.ema_tr, "ema_te": self.ema_te,
        }
        tmp = self.out / "ckpt.pt.tmp"
        torch.save(st, tmp)
        os.replace(tmp, self.out / "ckpt.pt")
        self.last_ckpt = time.time()

    def load_ckpt(self, path: Path):
        st = torch.load(path, map_location=self.dev, weights_only=False)
        self.state = st["state"]
        self.state["wall_before"] = self.state.get("wall_saved", 0.0)
        prev = st["log"]
        for k in ("vae", "dit", "events"):
            self.log[k] = prev.get(k, []) + self.log[k]
        self.vae.load_state_dict(st["vae"])
        self.vae_opt.load_state_dict(st["vae_opt"])
        self.tr.load_state_dict(st["tr"])
        self.te.load_state_dict(st["te"])
        self.aux.load_state_dict(st["aux"])
        self.dit_opt.load_state_dict(st["dit_opt"])
        self.ema_tr = {k: v.to(self.dev) for k, v in st["ema_tr"].items()}
        self.ema_te = {k: v.to(self.dev) for k, v in st["ema_te"].items()}
        self.event(f"resumed from {path}: {self.state}")

    def init_from_pipeline(self, path: str):
        from diffusers import CogVideoXPipeline

        p = CogVideoXPipeline.from_pretrained(path, torch_dtype=torch.float32)
        self.vae.load_state_dict(p.vae.state_dict())
        self.tr.load_state_dict(p.transformer.state_dict())
        self.te.load_state_dict(p.text_encoder.state_dict())
        self.ema_tr = {k: v.detach().clone().float().to(self.dev) for k, v in self.tr.state_dict().items()}
        self.ema_te = {k: v.detach().clone().float().to(self.dev) for k, v in self.te.state_dict().items()}
        meta = {}
        if (Path(path) / "training.json").exists():
            meta = json.loads((Path(path) / "training.json").read_text())
        self.state = {"phase": "pool", "vae_step": meta.get("vae_steps", 0), "dit_step": meta.get("dit_steps", 0),
                      "scaling_factor": float(p.vae.config.scaling_factor)}
        self.log["init_meta"] = meta
        if self.a.init_vae_train:  # continue the VAE too: new latent space, new scaling factor
            self.state.update(phase="vae", vae_step=0, scaling_factor=None)
        self.event(f"initialised from pipeline {path}: {self.state}")

    def write_log(self):
        text = json.dumps(self.log, indent=0)
        (self.out / "train_log.json").write_text(text)
        if self.a.tar_to:  # keep a copy beside the tar parts (size-limited transfers)
            Path(self.a.tar_to).mkdir(parents=True, exist_ok=True)
            (Path(self.a.tar_to) / "train_log.json").write_text(text)

    def auto_steps(self, phase: str, step: int, first: int, deadline_s: float, total: int) -> int:
        """With --{phase}-steps 0: time steps first+20 .. first+60, then fit the step count to the
        deadline (5% margin). The count is logged and kept in the checkpoint; pass it explicitly to
        repeat the run."""
        if step not in (first + 20, first + 60):
            return total
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
        if step == first + 20:
            self._mark = time.time()
            return total
        sec = (time.time() - self._mark) / 40
        total = step + int(0.95 * (deadline_s - self.elapsed()) / sec)
        self.state[f"{phase}_total"] = total
        self.event(f"{phase}: {1 / sec:.2f} steps/s measured -> {total} steps fit the budget")
        return total

    def run(self):
        a = self.a
        ck = self.out / "ckpt.pt"
        if a.resume and ck.exists():
            self.load_ckpt(ck)
        elif a.init_from:
            self.init_from_pipeline(a.init_from)
            a.warmup_offset = self.state["dit_step"]
        if self.state["phase"] == "vae":
            self.train_vae()
            self.save_ckpt()
        self.build_pool()
        self.train_dit()
        self.save_ckpt()
        self.export()
        self.event("finished")


def write_tar_parts(folder: Path, dst: Path, name: str, part_bytes: int = 15 * 2**20):
    """Tar ``folder`` (as its own basename) and split it into parts ``name.00``, ``name.01``, ..."""
    dst.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        tf.add(folder, arcname=folder.name)
    raw = buf.getvalue()
    for old in dst.glob(name + ".*"):
        old.unlink()
    for i in range(0, max(1, math.ceil(len(raw) / part_bytes))):
        tmp = dst / f".{name}.{i:02d}.tmp"
        tmp.write_bytes(raw[i * part_bytes:(i + 1) * part_bytes])
        os.replace(tmp, dst / f"{name}.{i:02d}")


def plot_losses(log: dict, path: Path):
    """Loss curves as a PNG, drawn with OpenCV (no plotting library needed)."""
    try:
        import cv2
    except ImportError:  # pragma: no cover
        return
    W, H, pad = 900, 360, 50
    img = np.full((H, W, 3), 255, np.uint8)
    panels = [("vae", "rec"), ("dit", "loss")]
    for pi, (phase, key) in enumerate(panels):
        pts = [(r["step"], r[key]) for r in log.get(phase, []) if r.get(key) is not None and r[key] > 0]
        x0 = pi * W // 2 + pad
        x1 = (pi + 1) * W // 2 - 15
        cv2.rectangle(img, (x0, 20), (x1, H - pad), (0, 0, 0), 1)
        cv2.putText(img, f"{phase} {key} (log10)", (x0 + 5, 15), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1)
        if len(pts) < 2:
            continue
        st = np.array([p[0] for p in pts], np.float64)
        lv = np.log10(np.array([p[1] for p in pts], np.float64))
        lo, hi = lv.min(), lv.max() + 1e-9
        xs = x0 + (st - st.min()) / max(np.ptp(st), 1) * (x1 - x0)
        ys = (H - pad) - (lv - lo) / (hi - lo) * (H - pad - 20)
        cv2.polylines(img, [np.stack([xs, ys], 1).astype(np.int32)], False, (200, 60, 20), 1, cv2.LINE_AA)
        cv2.putText(img, f"{10**hi:.3g}", (x0 - 45, 30), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (0, 0, 0), 1)
        cv2.putText(img, f"{10**lo:.3g}", (x0 - 45, H - pad), cv2.FONT_HERSHEY_SIMPLEX, 0.35, (0, 0, 0), 1)
        cv2.putText(img, f"step {int(st.min())}..{int(st.max())}", (x0 + 5, H - pad + 20),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1)
    cv2.imwrite(str(path), img[:, :, ::-1])


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-clock budget for the whole run")
    ap.add_argument("--reserve-seconds", type=float, default=20.0, help="kept free at the end for the export")
    ap.add_argument("--vae-steps", type=int, default=0, help="0: as many as fit --vae-minutes (measured)")
    ap.add_argument("--vae-minutes", type=float, default=2.0, help="the VAE phase ends by this time")
    ap.add_argument("--vae-batch", type=int, default=32)
    ap.add_argument("--vae-lr", type=float, default=1e-3)
    ap.add_argument("--vae-video-every", type=int, default=1,
                    help="every k-th VAE step uses 17-frame clips, the others single frames (1: clips only)")
    ap.add_argument("--vae-image-batch", type=int, default=256, help="frames per single-frame VAE step")
    ap.add_argument("--vae-encoder-lr-mult", type=float, default=1.0,
                    help="encoder lr factor (< 1 limits latent drift when continuing a trained VAE)")
    ap.add_argument("--kl-weight", type=float, default=1e-4)
    ap.add_argument("--pool", type=int, default=131072, help="clips in the latent pool")
    ap.add_argument("--pool-batch", type=int, default=512)
    ap.add_argument("--pool-cache", action="store_true",
                    help="save the latent pool as OUT/pool.pt and load it on --resume (GBs on disk)")
    ap.add_argument("--pool-deadline-minutes", type=float, default=3.0)
    ap.add_argument("--dit-steps", type=int, default=0, help="0: as many as fit --minutes (measured)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--decay-frac", type=float, default=0.3, help="final fraction of steps with linear lr decay")
    ap.add_argument("--cfg-dropout", type=float, default=0.1)
    ap.add_argument("--aux-weight", type=float, default=0.1)
    ap.add_argument("--object-weight", type=float, default=0.0,
                    help="extra denoiser-loss weight on latent cells covered by objects (0: plain loss)")
    ap.add_argument("--compile", default="off",
                    help="torch.compile the denoiser and text encoder for training: off, default, "
                         "max-autotune-no-cudagraphs, ... (a torch.compile mode)")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--ckpt-every", type=float, default=120.0, help="seconds between full checkpoints")
    ap.add_argument("--export-every", type=float, default=150.0, help="seconds between pipeline exports (0: end only)")
    ap.add_argument("--tar-to", default=None, help="also write the exported pipeline as tar parts here")
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop (checkpoint, export) at this denoiser step; the schedule still runs to --dit-steps")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt if present")
    ap.add_argument("--init-from", default=None, help="warm-start from an exported pipeline folder")
    ap.add_argument("--init-vae-train", action="store_true", help="with --init-from: continue training the VAE too")
    a = ap.parse_args(argv)
    a.warmup_offset = 0
    return a


def main(argv=None):
    Trainer(parse_args(argv)).run()


if __name__ == "__main__":
    main()
