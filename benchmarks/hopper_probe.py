"""Probes at CogVideoX-2B/5B shapes, each against its baseline in the same run (sessions 28–29):

* ``gemm``: the decode-once GEMM (W4A8's operand: INT8 codes as fp16; the persistent TMA kernel since session 29)
  against cuBLAS fp16 on the same decoded weight, with and without the GELU epilogue. Session 28's version of
  this part timed warp specialization of the old one-tile-per-program kernel (``probe_ws_gemm_h200_s28.log``: no
  effect); session 29's persistent-kernel sweep that replaced that kernel (``probe_pgemm_h100_s29.json`` /
  ``.log``: tiles, stages, TMA store, epilogue subtiling, loop flattening; 1.01–1.17x the old kernel at the six
  shapes) ran a copy of the kernel kept in this file until it moved to ``sixbit_kernels/gemm_w4.py``;
* ``attn``: the 8-bit attention kernel on the strided q / out views the attention processor passes against
  contiguous ones and cuDNN SDPA (session 30). Earlier versions of this part timed warp specialization of the key
  loop (``probe_ws_attn_h200_s28.json``: no effect) and, in session 30, the row sum of P by an MMA with a ones
  column (``probe_rsum_h200_s30.json``/``.log``: 0.92x the kernel at 2B and wrong on the GPU; removed);
* ``resid``: ``gated_residual`` against PyTorch's ``x + gate * y`` (bit equality checked), a few tiles;
* ``l1``: ``block_stats.finite_l1_mean`` against ``sixbit.tdc.l1_size`` on a regated piece (a strided view);
* ``gelu``: ff.net.0.proj's GEMM with the GELU in its epilogue against the GEMM + PyTorch's GELU, at 2B and 5B
  (W8A8 and the decode-once W4A8).

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

dev = torch.device("cuda")
torch.manual_seed(0)
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
res["triton"] = triton.__version__
part = sys.argv[1] if len(sys.argv) > 1 else "all"


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=200)


if part in ("all", "gemm"):  # session 29: the decode-once GEMM (now persistent) against cuBLAS
    M = 35552
    rows = []
    for N, K in [(1920, 1920), (7680, 1920), (1920, 7680), (3072, 3072), (12288, 3072), (3072, 12288)]:
        w = formats.quantize_nvfp4(torch.randn(N, K, device=dev) * 0.02)
        wdec = G.decode_weight(w, torch.float16)
        a = torch.randint(-127, 128, (M, K), device=dev).half()  # W4A8's operand: INT8 codes as fp16
        act = G.DenseAct(a, "int8", row_scale=torch.rand(M, device=dev) * 0.01 + 1e-3)
        bias = torch.randn(N, device=dev).to(torch.bfloat16)
        row = {"N": N, "K": K, "cublas_fp16_ms": bench(lambda: a @ wdec.T),
               "gemm_w4_decode_once_ms": bench(lambda: G.gemm_w4(act, w, bias, decode="once")),
               "gemm_w4_gelu_ms": bench(lambda: G.gemm_w4(act, w, bias, decode="once", activation="gelu_tanh"))}
        rows.append(row)
        print("gemm", row, flush=True)
        del w, wdec, a, act
        torch.cuda.empty_cache()
    res["gemm"] = rows

if part in ("all", "attn"):  # session 30: the kernel on the processor's strided q / out views vs contiguous ones
    arows = []
    for B, H, S, D in [(2, 30, 17776, 64), (2, 48, 17776, 64)]:
        q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        t_cudnn = bench(lambda: F.scaled_dot_product_attention(q, k, v))
        kv = A.quantize_kv(k, v)
        qs = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] memory, as the projections write it
        out_s = torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        ref = A.attention_fp8(q, kv)
        cases = {"contiguous q, out": lambda: A.attention_fp8(q, kv),
                 "strided q": lambda: A.attention_fp8(qs, kv),
                 "strided q, out": lambda: A.attention_fp8(qs, kv, out=out_s),
                 "K/V pass + strided q, out": lambda: A.attention_fp8(qs, A.quantize_kv(k, v), out=out_s)}
        for name, f in cases.items():
            same = bool(torch.equal(f(), ref))
            t = bench(f)
            row = {"shape": (B, H, S, D), "case": name, "ms": t, "cudnn_ms": t_cudnn, "x_cudnn": t_cudnn / t,
                   "same_as_contiguous": same}
            arows.append(row)
            print("attn", row, flush=True)
        del q, k, v, kv, qs, out_s
        torch.cuda.empty_cache()
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

if part in ("all", "gelu"):  # session 29: ff.net.0's GELU in its GEMM's epilogue
    from sixbit_kernels import gemm_w8a8 as G8
    from sixbit_kernels import hadamard_quant as HQ

    grows = []
    for M, K, N in [(35552, 1920, 7680), (35552, 3072, 12288)]:  # 2B, 5B: ff.net.0.proj, CFG batched
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev) * 0.02
        bias = torch.randn(N, device=dev, dtype=torch.bfloat16) * 0.1
        q8, _ = HQ.quantize_int8_act(x)
        d8, _ = HQ.quantize_int8_act(x, dense=True)
        da = G.DenseAct(d8.data, "int8", row_scale=d8.scale)
        w8, w4 = formats.quantize_int8(w), formats.quantize_nvfp4(w)
        cases = {"w8a8": lambda act: G8.gemm_w8a8(q8, w8, bias, torch.bfloat16, activation=act),
                 "w4a8 (decode-once)": lambda act: G.gemm_w4(da, w4, bias, torch.bfloat16, activation=act)}
        for name, run in cases.items():
            y = run(None)
            t_gemm = bench(lambda: run(None))
            t_torch = bench(lambda: F.gelu(run(None), approximate="tanh"))
            t_gelu = bench(lambda: F.gelu(y, approximate="tanh"))
            t_fused = bench(lambda: run("gelu_tanh"))
            ref = F.gelu(y, approximate="tanh")
            diff = (run("gelu_tanh").float() - ref.float()).abs()
            row = {"M": M, "K": K, "N": N, "route": name, "gemm_ms": t_gemm, "gemm_then_torch_gelu_ms": t_torch,
                   "torch_gelu_ms": t_gelu, "fused_ms": t_fused, "max_abs_diff": float(diff.max()),
                   "frac_differing": float((diff > 0).float().mean())}
            grows.append(row)
            print("gelu", row, flush=True)
        del x, w, q8, d8, da, w8, w4, y
        torch.cuda.empty_cache()
    res["gelu"] = grows

out = sys.argv[2] if len(sys.argv) > 2 else "ws_probe.json"
json.dump(res, open(out, "w"), indent=1)
