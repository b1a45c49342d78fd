"""Probes of session 28 at CogVideoX-2B/5B shapes, each against its baseline in the same run:

* ``gemm`` / ``attn``: Triton's automatic warp specialization (``tl.range(warp_specialize=True)``) of the
  decode-once GEMM's K loop and the 8-bit attention's key loop against the same kernels without it, cuBLAS bf16
  and cuDNN SDPA (``gemm_w4.DENSE_W_WS``, ``attention_fp8.WARP_SPECIALIZE``);
* ``resid``: ``gated_residual`` against PyTorch's ``x + gate * y`` (bit equality checked), a few tiles;
* ``l1``: ``block_stats.finite_l1_mean`` against ``sixbit.tdc.l1_size`` on a regated piece (a strided view).

``python benchmarks/hopper_probe.py PART OUT.json`` on a GPU."""

# ruff: noqa: B023, E731  (each lambda is timed inside the iteration that made it)
import json
import sys

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from sixbit import formats
from sixbit_kernels import attention_fp8 as A
from sixbit_kernels import gemm_w4 as G
from sixbit_kernels.targets import device_target

dev = torch.device("cuda")
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
res["triton"] = triton.__version__
part = sys.argv[1] if len(sys.argv) > 1 else "all"


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=200)


if part in ("all", "gemm"):
    M = 35552
    shapes = [(1920, 1920), (7680, 1920), (1920, 7680)]
    cfgs = [
        None,
        (256, 128, 64, 8, 8, 3),
        (128, 256, 64, 8, 8, 3),
        (128, 256, 64, 8, 8, 4),
        (128, 128, 64, 8, 4, 4),
        (128, 256, 64, 8, 4, 3),
        (128, 128, 128, 8, 4, 3),
        (256, 128, 64, 8, 4, 3),
    ]
    tgt = device_target(dev)
    rows = []
    for N, K in shapes:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = formats.quantize_nvfp4(torch.randn(N, K, device=dev) * 0.02)
        wdec = G.decode_weight(w, torch.bfloat16)
        t_cublas = bench(lambda: a @ wdec.T)
        row = {"N": N, "K": K, "cublas_ms": t_cublas, "cfgs": []}
        ref = None
        for cfg in cfgs:
            for ws in (False, True):
                G.DENSE_W_WS = ws
                try:
                    f = lambda: G.gemm_w4(a, w, config=cfg, decode="once")
                    y = f()
                    if ref is None:
                        ref = y
                    same = bool(torch.equal(y, ref))
                    t = bench(f)
                    row["cfgs"].append({"cfg": cfg, "ws": ws, "ms": t, "same": same})
                    print(N, K, cfg, ws, f"{t:.3f} ms cublas {t_cublas:.3f} same={same}", flush=True)
                except Exception as e:  # noqa: BLE001
                    row["cfgs"].append({"cfg": cfg, "ws": ws, "error": repr(e)[:300]})
                    print(N, K, cfg, ws, "ERR", repr(e)[:300], flush=True)
        G.DENSE_W_WS = False
        rows.append(row)
    res["gemm"] = rows

if part in ("all", "attn"):
    B, H, S, D = 2, 30, 17776, 64
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    t_cudnn = bench(lambda: F.scaled_dot_product_attention(q, k, v))
    arows = {"cudnn_ms": t_cudnn, "cfgs": []}
    for cfg in [
        (64, 256, 4, 3),
        (128, 128, 4, 3),
        (128, 256, 8, 2),
        (128, 128, 8, 3),
        (64, 256, 4, 2),
        (128, 256, 8, 3),
    ]:
        kv = A.quantize_kv(k, v, block_n=cfg[1])
        ref = A.attention_fp8(q, kv, config=(64, 256, 4, 3)) if cfg[1] == 256 else None
        for ws in (False, True):
            A.WARP_SPECIALIZE = ws
            try:
                f = lambda: A.attention_fp8(q, kv, config=cfg)
                y = f()
                same = None if ref is None else float((y.float() - ref.float()).abs().max())
                t = bench(f)
                arows["cfgs"].append({"cfg": cfg, "ws": ws, "ms": t, "maxdiff_vs_default": same})
                print(
                    "attn",
                    cfg,
                    ws,
                    f"{t:.3f} ms cudnn {t_cudnn:.3f} ({t_cudnn / t:.3f}x) diff={same}",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001
                arows["cfgs"].append({"cfg": cfg, "ws": ws, "error": repr(e)[:300]})
                print("attn", cfg, ws, "ERR", repr(e)[:300], flush=True)
        A.WARP_SPECIALIZE = False
    res["attn"] = arows

if part in ("all", "resid"):
    from sixbit_kernels import gated_residual as R

    rrows = []
    for C in (1920, 3072):
        x = torch.randn(2, 17550, C, device=dev, dtype=torch.bfloat16)
        cat = torch.randn(2, 226 + 17550, C, device=dev, dtype=torch.bfloat16)
        y = cat[:, 226:]
        gate = torch.randn(2, 6 * C, device=dev, dtype=torch.bfloat16).chunk(6, dim=1)[2][:, None, :]
        t_torch = bench(lambda: x + gate * y)
        ref = x + gate * y
        for tile in [(16, 256, 8), (8, 256, 4), (32, 128, 8), (16, 512, 8), (4, 1024, 4), (32, 256, 8)]:
            same = bool(torch.equal(R.gated_residual(x, gate, y, tile=tile), ref))
            t = bench(lambda: R.gated_residual(x, gate, y, tile=tile))
            rrows.append(
                {
                    "C": C,
                    "tile": tile,
                    "ms": t,
                    "torch_ms": t_torch,
                    "same": same,
                    "gbps": 3 * x.numel() * 2 / t / 1e6,
                }
            )
            print(
                "resid",
                C,
                tile,
                f"{t:.4f} ms torch {t_torch:.4f} same={same} {3 * x.numel() * 2 / t / 1e6:.0f} GB/s",
                flush=True,
            )
    res["resid"] = rrows

if part in ("all", "l1"):
    from sixbit.tdc import l1_size
    from sixbit_kernels import block_stats as BS

    lrows = []
    for C in (1920, 3072):
        cat = torch.randn(2, 226 + 17550, C, device=dev, dtype=torch.bfloat16)
        for name, t in (("strided piece", cat[:, 226:]), ("contiguous", cat[:, 226:].contiguous())):
            t_torch = bench(lambda: l1_size(t))
            t_k = bench(lambda: BS.finite_l1_mean(t))
            rel = float((BS.finite_l1_mean(t) - l1_size(t)).abs() / l1_size(t))
            lrows.append({"C": C, "tensor": name, "ms": t_k, "torch_ms": t_torch, "rel_diff": rel,
                          "gbps": t.numel() * 2 / t_k / 1e6})
            print("l1", C, name, f"{t_k:.4f} ms torch {t_torch:.4f} rel {rel:.1e} {t.numel() * 2 / t_k / 1e6:.0f} GB/s",
                  flush=True)
    res["l1"] = lrows

out = sys.argv[2] if len(sys.argv) > 2 else "ws_probe.json"
json.dump(res, open(out, "w"), indent=1)
