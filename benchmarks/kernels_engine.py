"""Kernel benchmark, engine sections: the attention's per-head q/k LayerNorm (+ rotary) and the engine's
per-block bookkeeping (Δ, Γ sums, TDC delta change, PDR outlier count), torch against the kernels."""

from __future__ import annotations

import torch

from benchmarks.kernels_common import Run, rel, sk, spec


def bench_norm(run: Run, results):
    """The attention's per-head q/k LayerNorm on the strided [B, heads, S, 64] view, PyTorch vs sixbit."""
    M, rep = run.M, run.rep
    rows = []
    for model, heads in (("2B", 30), ("5B", 48)):
        S = M // 2
        x = run.gen((2, S, heads * 64), 11).view(2, S, heads, 64).transpose(1, 2)
        ln = torch.nn.LayerNorm(64, eps=1e-6).to(run.dev, torch.bfloat16)
        t_ref = run.bench(lambda x=x, ln=ln: ln(x), rep)
        t = run.bench(lambda x=x, ln=ln: sk.layernorm.layer_norm_rows(x, ln.weight, ln.bias, 1e-6), rep)
        e = rel(sk.layernorm.layer_norm_rows(x, ln.weight, ln.bias, 1e-6), ln(x).float())
        gbs = 2 * 2 * x.numel() / (t * 1e-3) / 1e9
        rows.append({"model": model, "shape": list(x.shape), "torch_ms": t_ref, "sixbit_ms": t, "speedup": t_ref / t,
                     "GBps": gbs, "rel_err_vs_torch": e})
        run.log(f"norm {model} {list(x.shape)}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x, {gbs:.0f} GB/s), "
            f"rel err {e:.1e}")
        # + the rotary embedding of the video tokens, as CogVideoX's attention processor does it
        from diffusers.models.embeddings import apply_rotary_emb

        text = min(226, S // 4)  # CogVideoX: 226 text tokens first
        ang = run.gen((S - text, 32), 12).float()
        cos = ang.cos().repeat_interleave(2, -1).contiguous()
        sin = ang.sin().repeat_interleave(2, -1).contiguous()

        def torch_chain(x=x, ln=ln, cos=cos, sin=sin, text=text):
            y = ln(x)
            y[:, :, text:] = apply_rotary_emb(y[:, :, text:], (cos, sin))
            return y

        def fused(x=x, ln=ln, cos=cos, sin=sin, text=text):
            return sk.layernorm.layer_norm_rows(x, ln.weight, ln.bias, 1e-6, rope=(cos, sin, text))

        t_ref = run.bench(torch_chain, rep)
        t = run.bench(fused, rep)
        e = rel(fused(), torch_chain().float())
        gbs = 2 * 2 * x.numel() / (t * 1e-3) / 1e9
        rows.append({"model": model, "shape": list(x.shape), "op": "layernorm+rotary", "torch_ms": t_ref, "sixbit_ms": t,
                     "speedup": t_ref / t, "GBps": gbs, "rel_err_vs_torch": e})
        run.log(f"norm+rope {model}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x, {gbs:.0f} GB/s), rel err {e:.1e}")
    results["norm"] = rows


def bench_bookkeeping(run: Run, results):
    """The engine's per-computed-block statistics: Δ, Γ's sums, the delta change (TDC) and PDR's outlier
    count — the torch reference against block_stats / the outlier-count kernel, at CogVideoX sizes."""
    from sixbit.dmpq import gamma_sums
    from sixbit.tdc import delta_change_sums

    M, rep = run.M, run.rep
    rows = []
    for model, width in (("2B", 1920), ("5B", 3072)):
        text = min(226, M // 8)
        video = M // 2 - text
        ins = [run.gen((2, video, width), 21), run.gen((2, text, width), 22)]
        outs = [i + 0.1 * run.gen(i.shape, 23 + k) for k, i in enumerate(ins)]
        olds = [o - i + 0.01 * run.gen(i.shape, 25 + k) for k, (o, i) in enumerate(zip(outs, ins))]

        def ref(outs=outs, ins=ins, olds=olds):
            d = [o - i for o, i in zip(outs, ins)]
            return d, torch.stack([*gamma_sums(d[0], ins[0]), *delta_change_sums(d, olds)])

        def fused(outs=outs, ins=ins, olds=olds):
            return sk.ops.block_stats(outs, ins, olds)

        t_ref, t = run.bench(ref, rep), run.bench(fused, rep)
        e = rel(fused()[1], ref()[1].double())
        nbytes = sum(4 * t_.numel() * t_.element_size() for t_ in ins)  # read out, in, old; write Δ
        rows.append({"model": model, "op": "Δ + Γ sums + delta change (2 streams)", "torch_ms": t_ref, "sixbit_ms": t,
                     "speedup": t_ref / t, "GBps": nbytes / (t * 1e-3) / 1e9, "rel_err_vs_torch": e})
        run.log(f"bookkeeping {model}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x)")
        t_ref = run.bench(lambda ins=ins: [spec.outlier_count(s, 8.0) for s in ins], rep)
        t = run.bench(lambda ins=ins: [sk.ops.outlier_count(s, 8.0) for s in ins], rep)
        same = all(int(a[0]) == int(b[0]) for a, b in zip([spec.outlier_count(s, 8.0) for s in ins],
                                                         [sk.ops.outlier_count(s, 8.0) for s in ins]))
        nbytes = sum(s.numel() * s.element_size() for s in ins)
        rows.append({"model": model, "op": "PDR outlier count (2 streams)", "torch_ms": t_ref, "sixbit_ms": t,
                     "speedup": t_ref / t, "GBps": nbytes / (t * 1e-3) / 1e9, "rel_err_vs_torch": 0.0 if same else 1.0})
        run.log(f"outlier count {model}: torch {t_ref:.3f} ms, sixbit {t:.3f} ms ({t_ref / t:.1f}x), equal counts {same}")
        del ins, outs, olds
        run.empty_cache()
    results["bookkeeping"] = rows
