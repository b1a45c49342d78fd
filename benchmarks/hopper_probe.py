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
  (W8A8 and the decode-once W4A8);
* ``sweep``: launch geometries of the computed step's memory-bound passes at 2B shapes (TDC's size, the block
  statistics, the q/k norm + rotary, the norm producer's three forms also at 5B, the INT8 and NVFP4 quantize),
  each against its default in the same run, with the largest difference from the default config's output
  (session 31);
* ``normload``: the 8-bit attention call as the processor runs it — q/k LayerNorm (2B) or LayerNorm + rotary (5B) by
  ``layer_norm_rows``, the K/V pass, the attention — against the same call with the norm applied on load by the
  K/V pass and the attention kernel (``q_norm``/``k_norm``, session 32), and cuDNN SDPA after the same norms, with
  the largest output difference between the two 8-bit forms;
* ``requant``: the ``w4a8_requant`` route's weight operand (session 33) at the six 2B/5B block shapes — the NVFP4
  weight re-quantized to INT8 (``requant.requantize_int8``, a few launch geometries, outputs compared) + the W8A8
  GEMM, against W4A8's decode-once GEMM (the ``int8`` route), W8A8 on a resident INT8 weight and cuBLAS bf16, with
  each route's relative error against the fp32 product of the same (random, unrotated) weights;
* ``overlap`` (session 36): the whole 8-bit call as the processor runs it, against its parts (kernel, K/V pass,
  statistics, quantize), the kernel at query lengths whose tiles fill whole waves of 2 programs per SM, and the call
  split into 2–10 chunks of (batch, heads) whose K/V passes run on a side stream (low / high priority, eligible at
  once or after the first chunk's pass) while the first chunks' attention runs — outputs compared bit for bit;
* earlier parts of session 36, removed with the kernel option they timed (docs/ATTENTION.md "Session 36"): ``tail`` —
  the whole call and the kernel with a split of the last partial wave's tiles over their key blocks and without
  (``probe_tail_h100_s36.json``, ``_s36b`` with 9 rounds, ``_s36c`` with 150 single-call pairs) — and ``tailscan`` —
  the kernel at query lengths of 264–286 tiles a head (``probe_tailscan_h100_s36.json``: the same cost per tile,
  0.528–0.533 µs, at whole and partial last waves, so no tail to recover).
* ``pvorder`` (session 37): the 8-bit attention with V's keys stored in the P·V key order (``attention_fp8``'s module
  docstring; no register shuffles turning P into an MMA operand) against the module before it, loaded from the file
  ``$SIXBIT_BASE_ATTN`` (default ``sixbit_kernels/_attention_fp8_base.py``, written by ``git show
  2fb18ce:sixbit_kernels/attention_fp8.py``): the kernel alone, the K/V pass and the whole call as the processor runs
  it, and the kernel alone on contiguous, normalized Q (as ``benchmarks.attention`` times it), each form and cuDNN
  SDPA after the same norms in ``$ROUNDS`` (default 15) rounds, each round in its own shuffled order (seeded), with
  the largest output difference between the two forms. (The first run, ``probe_pvorder_h100_s37_fixed_order.json``, timed the
  rounds in one fixed order with do_bench means: there the whole call and the kernel alone disagreed by ±0.5 ms with
  the order of the rows.)

``python benchmarks/hopper_probe.py PART OUT.json`` on a GPU."""

# ruff: noqa: B023, E731  (each lambda is timed inside the iteration that made it)
import json
import sys
from dataclasses import dataclass

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


@dataclass
class ProcessorInputs:
    """What CogVideoX's attention processor holds at the 2B / 5B shapes (``normload``, ``overlap``, ``pvorder``): the
    raw q/k/v projections as strided ``[B, H, S, D]`` views, the q/k LayerNorm's weight and bias, the rotary tables
    (5B), their ``RowNorm`` and a strided output buffer — with the processor's 8-bit call and cuDNN after the same
    norms."""

    H: int
    rope_on: bool
    B: int = 2
    S: int = 17776
    D: int = 64

    def __post_init__(self):
        from sixbit_kernels.layernorm import RowNorm

        B, S, H, D, T = self.B, self.S, self.H, self.D, 226
        self.q, self.k, self.v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2) * 2 + 0.3
                                  for _ in range(3))
        self.w, self.b = (torch.randn(2, D, device=dev) * 0.3
                          + torch.tensor([[1.0], [0.0]], device=dev)).to(torch.bfloat16)
        ang = torch.randn(S - T, D // 2, device=dev)
        self.rope = (ang.cos().repeat_interleave(2, -1), ang.sin().repeat_interleave(2, -1), T) if self.rope_on else None
        self.norm = RowNorm(self.w, self.b, 1e-6, self.rope)
        self.out = torch.empty(B, S, H, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)

    @property
    def shape(self):
        return self.B, self.H, self.S, self.D

    def normed(self):
        """q and k after ``layer_norm_rows`` (+ rotary): the norm applied first."""
        from sixbit_kernels.layernorm import layer_norm_rows

        return tuple(layer_norm_rows(t, self.w, self.b, 1e-6, rope=self.rope) for t in (self.q, self.k))

    def call_inputs(self):
        """(q, k, norm) as the processor passes them: normalized first where there is rotary
        (``attention.NORM_ON_LOAD_ROTARY``), raw with the norm applied on load otherwise."""
        return (*self.normed(), None) if self.rope_on else (self.q, self.k, self.norm)

    def call(self, mod=A):
        """The whole 8-bit call as the processor runs it, with attention module ``mod``."""
        qa, ka, n = self.call_inputs()
        return mod.attention_fp8(qa, mod.quantize_kv(ka, self.v, k_norm=n), out=self.out, q_norm=n)

    def cudnn(self):
        """cuDNN SDPA (bf16) after the same norms."""
        return F.scaled_dot_product_attention(*self.normed(), self.v)


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

if part in ("all", "sweep"):  # session 31: launch geometry of the computed step's memory-bound passes (2B)
    from sixbit_kernels import block_stats as BS
    from sixbit_kernels import hadamard_quant as HQ
    from sixbit_kernels import layernorm as LN
    from sixbit_kernels import norm_quant as NQ
    from sixbit_kernels import rows_int8 as RI

    srows = []

    def trial(kernel, shape, cfg, fn, ref, default):
        """Time ``fn`` (one config) and compare its output with the default config's ``ref``."""
        out = fn()
        outs = out if isinstance(out, (tuple, list)) else (out,)
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        diff = max(float((a.float() - b.float()).abs().max()) if a is not None else 0.0 for a, b in zip(outs, refs))
        t = bench(fn)
        row = {"kernel": kernel, "shape": shape, "config": cfg, "default": default, "ms": t, "max_abs_diff_vs_default": diff}
        srows.append(row)
        print("sweep", kernel, shape, cfg, "default" if default else "", f"{t:.4f} ms diff {diff:.3g}", flush=True)

    C, S_T, S_V, B = 1920, 226, 17550, 2
    cat = torch.randn(B, S_T + S_V, C, device=dev, dtype=torch.bfloat16)
    piece = cat[:, S_T:]
    l1_default = BS.L1_CUDA_CONFIG
    for t_name, t in (("strided piece", piece), ("contiguous", piece.contiguous())):
        ref = BS.finite_l1_mean(t)
        for cfg in [l1_default, (4, 512, 4, 4), (4, 1024, 8, 4), (16, 512, 16, 2), (8, 512, 8, 8), (8, 512, 16, 4),
                    (16, 512, 8, 4), (8, 1024, 16, 2)]:
            trial("finite_l1 " + t_name, list(t.shape), cfg, lambda: BS.finite_l1_mean(t, config=cfg), ref,
                  cfg == l1_default)

    out_t, in_t, old_t = (torch.randn(B, S_V, C, device=dev, dtype=torch.bfloat16) for _ in range(3))
    ref = BS.delta_stats(out_t, in_t, old_t)
    for cfg in [tuple(BS.CUDA_CONFIG), (4096, 8, 4), (1024, 4, 8), (2048, 4, 8), (8192, 8, 2), (4096, 16, 2),
                (2048, 8, 8)]:
        trial("delta_stats", [B, S_V, C], cfg, lambda: BS.delta_stats(out_t, in_t, old_t, config=cfg), ref,
              cfg == tuple(BS.CUDA_CONFIG))

    proj = torch.randn(B, S_T + S_V, C, device=dev, dtype=torch.bfloat16)
    x4 = proj.view(B, S_T + S_V, 30, 64).transpose(1, 2)
    lnw, lnb = torch.randn(64, device=dev, dtype=torch.bfloat16), torch.randn(64, device=dev, dtype=torch.bfloat16)
    cos, sin = torch.randn(S_V, 64, device=dev), torch.randn(S_V, 64, device=dev)
    ref = LN.layer_norm_rows(x4, lnw, lnb, 1e-6, rope=(cos, sin, S_T))
    for br, nw in [(32, 4), (64, 4), (128, 4), (16, 4), (32, 8), (64, 2), (32, 2), (16, 2), (16, 1)]:
        trial("ln_rows+rope", list(x4.shape), (br, nw),
              lambda: LN.layer_norm_rows(x4, lnw, lnb, 1e-6, rope=(cos, sin, S_T), block_rows=br, num_warps=nw),
              ref, (br, nw) == (32, 4))

    for Cn in (1920, 3072):
        xt, xv = torch.randn(B, S_T, Cn, device=dev, dtype=torch.bfloat16), torch.randn(B, S_V, Cn, device=dev,
                                                                                        dtype=torch.bfloat16)
        op, sh = (torch.randn(B, Cn, device=dev, dtype=torch.bfloat16) * 0.1 + 1.0 for _ in range(2))
        wn, bn = torch.ones(Cn, device=dev, dtype=torch.bfloat16), torch.zeros(Cn, device=dev, dtype=torch.bfloat16)
        parts = [(xt, op, sh), (xv, op, sh)]
        d_rows, d_pps = RI.CUDA_ROWS, NQ.GRID_PROGRAMS_PER_SM
        for form, kw in (("int8", {}), ("int8 as fp16", {"dense": True}), ("16-bit", {"codes": False, "norm": True})):
            def run(**extra):
                q8, y = NQ.norm_modulate(parts, wn, bn, 1e-5, 64, **kw, **extra)
                return (q8.data, q8.scale) if q8 is not None else (y,)
            ref = run()
            d_w = NQ.default_warps(Cn, 64)
            norm_only = "codes" in kw
            # (rows of the tile, programs per SM, warps); the 16-bit form: (tokens per step or None for the codes
            # forms' geometry, programs per SM, warps) — its own geometry since session 31
            d_tok, d_no = NQ.NORM_ONLY_TOKENS, NQ.NORM_ONLY_PROGRAMS_PER_SM
            dflt = (d_tok, d_no, d_w) if norm_only else (d_rows, d_pps, d_w)
            cfgs = ([dflt, (None, 12, 4), (None, 12, 8), (None, 16, 4), (1, 12, 4), (1, 16, 4), (1, 32, 4), (2, 24, 4),
                     (1, 24, 8)] if norm_only else
                    [dflt, (d_rows, 8, d_w), (d_rows, 16, d_w), (d_rows, 4, d_w), (d_rows, d_pps, 8),
                     (32, d_pps, d_w), (128, d_pps, d_w), (32, 16, d_w), (32, 24, d_w)])
            for a, pps, nw in cfgs:
                if Cn == 3072 and not norm_only and a != d_rows:
                    continue  # 48 chunks: one token per step whatever CUDA_ROWS says
                if norm_only:
                    NQ.NORM_ONLY_TOKENS, NQ.NORM_ONLY_PROGRAMS_PER_SM = a, pps
                else:
                    RI.CUDA_ROWS, NQ.GRID_PROGRAMS_PER_SM = a, pps
                try:
                    trial(f"norm_modulate {form}", [B, S_T + S_V, Cn], (a, pps, nw), lambda: run(num_warps=nw),
                          ref, (a, pps, nw) == dflt)
                except Exception as e:  # noqa: BLE001 (a config that does not compile is a result too)
                    srows.append({"kernel": f"norm_modulate {form}", "config": (a, pps, nw), "error": repr(e)[:300]})
                    print("sweep error", form, a, pps, nw, repr(e)[:200], flush=True)
                finally:
                    RI.CUDA_ROWS, NQ.GRID_PROGRAMS_PER_SM = d_rows, d_pps
                    NQ.NORM_ONLY_TOKENS, NQ.NORM_ONLY_PROGRAMS_PER_SM = d_tok, d_no
        del xt, xv

    for K in (1920, 7680):
        x = torch.randn(B * (S_T + S_V), K, device=dev, dtype=torch.bfloat16)
        dflt = tuple(HQ.rows_config(HQ.MODE_INT8, K // 64))
        alts = ([(64, 4, 4), (64, 4, 12), (64, 8, 8), (128, 8, 4), (32, 4, 16), (128, 4, 4)] if K == 1920 else
                [(256, 8, 2), (256, 4, 3), (128, 4, 4), (256, 8, 1), (128, 8, 4)])
        for dense in (True, False):
            ref = HQ.quantize_int8_act(x, 64, dense=dense)[0]
            ref = (ref.data, ref.scale)
            for cfg in [dflt] + alts:
                def run():
                    r = HQ.quantize_int8_act(x, 64, dense=dense, config=cfg)[0]
                    return r.data, r.scale
                try:
                    trial("int8 quantize" + (" as fp16" if dense else ""), [x.shape[0], K], cfg, run, ref, cfg == dflt)
                except Exception as e:  # noqa: BLE001
                    srows.append({"kernel": "int8 quantize", "config": cfg, "error": repr(e)[:300]})
                    print("sweep error int8", K, cfg, repr(e)[:200], flush=True)
        nref = HQ.quantize_nvfp4_act(x, 64, dense=True)[0]
        dn = tuple(HQ.CUDA_NVFP4_CONFIG)
        for cfg in [dn, (32, 4, 8), (128, 4, 4), (64, 8, 8), (128, 8, 4), (64, 4, 16), (32, 2, 16)]:
            trial("nvfp4 quantize as fp16 (both passes)", [x.shape[0], K], cfg,
                  lambda: HQ.quantize_nvfp4_act(x, 64, dense=True, config=cfg)[0][:2], nref[:2], cfg == dn)
        del x
        torch.cuda.empty_cache()
    res["sweep"] = srows

if part in ("all", "normload"):  # session 32: q/k norm (+ rotary) on load vs normalizing first
    from sixbit_kernels.layernorm import layer_norm_rows

    nrows = []
    for size, H, rope_on in (("2b", 30, False), ("5b", 48, True)):
        p = ProcessorInputs(H, rope_on)

        def first():
            qn, kn = p.normed()
            return A.attention_fp8(qn, A.quantize_kv(kn, p.v), out=p.out)

        def on_load():
            return A.attention_fp8(p.q, A.quantize_kv(p.k, p.v, k_norm=p.norm), out=p.out, q_norm=p.norm)

        ref = first().clone()
        got = on_load().clone()
        diff = float((got.float() - ref.float()).abs().max())
        rel = float((got.float() - ref.float()).norm() / ref.float().norm())
        t_first, t_load, t_cudnn = bench(first), bench(on_load), bench(p.cudnn)
        t_norm = bench(lambda: layer_norm_rows(p.q, p.w, p.b, 1e-6, rope=p.rope))
        warps, A.KV_NORM_WARPS = A.KV_NORM_WARPS, 4  # the K passes' warps with the norm on load: 4 against the default
        same4 = bool(torch.equal(on_load(), got))
        t_load4 = bench(on_load)
        A.KV_NORM_WARPS = warps
        row = {"size": size, "shape": p.shape, "rope": rope_on, "norm_first_ms": t_first, "norm_on_load_ms": t_load,
               "saved_ms": t_first - t_load, "one_norm_ms": t_norm,
               "norm_on_load_kv_4_warps_ms": t_load4, "kv_4_warps_same": same4, "cudnn_whole_ms": t_cudnn,
               "x_cudnn_first": t_cudnn / t_first, "x_cudnn_on_load": t_cudnn / t_load,
               "max_abs_diff": diff, "rel_l2_diff": rel, "ref_max": float(ref.float().abs().max())}
        nrows.append(row)
        print("normload", row, flush=True)
        del p, ref, got
        torch.cuda.empty_cache()
    res["normload"] = nrows

if part in ("all", "requant"):  # session 33: W4A8 on the int8 tensor cores from the resident NVFP4 weight
    from sixbit_kernels import gemm_w8a8 as G8
    from sixbit_kernels import hadamard_quant as HQ
    from sixbit_kernels import requant as RQ

    qrows = []
    M = 35552
    for N, K in [(1920, 1920), (7680, 1920), (1920, 7680), (3072, 3072), (12288, 3072), (3072, 12288)]:
        w = torch.randn(N, K, device=dev) * 0.02
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(N, device=dev).to(torch.bfloat16) * 0.1
        w4, w8 = formats.quantize_nvfp4(w), formats.quantize_int8(w)
        q8, _ = HQ.quantize_int8_act(x)
        d8, _ = HQ.quantize_int8_act(x, dense=True)
        da = G.DenseAct(d8.data, "int8", row_scale=d8.scale)
        r8 = RQ.requantize_int8(w4)  # the default config: what every other geometry is compared with
        cfgs = {}
        for cfg in [(8, 256, 4), (4, 256, 4), (16, 256, 4), (8, 512, 4), (8, 128, 4), (16, 512, 8), (32, 256, 8)]:
            got = RQ.requantize_int8(w4, config=cfg)
            same = bool(torch.equal(got.data, r8.data) and torch.equal(got.scale, r8.scale))
            cfgs[str(cfg)] = {"ms": bench(lambda: RQ.requantize_int8(w4, config=cfg)), "same": same}
        y32 = x.float() @ w.T + bias.float()
        err = lambda y: float(formats.relative_error(y.float(), y32))
        row = {"N": N, "K": K, "requant_configs": cfgs,
               "cublas_bf16_ms": bench(lambda: F.linear(x, w.to(torch.bfloat16), bias)),
               "w4a8_decode_once_ms": bench(lambda: G.gemm_w4(da, w4, bias, decode="once")),
               "w8a8_resident_ms": bench(lambda: G8.gemm_w8a8(q8, w8, bias, torch.bfloat16)),
               "w8a8_on_requant_ms": bench(lambda: G8.gemm_w8a8(q8, r8, bias, torch.bfloat16)),
               "requant_plus_w8a8_ms": bench(lambda: G8.gemm_w8a8(q8, RQ.requantize_int8(w4), bias, torch.bfloat16)),
               "rel_err_w4a8": err(G.gemm_w4(da, w4, bias, decode="once")),
               "rel_err_w4a8_requant": err(G8.gemm_w8a8(q8, r8, bias, torch.bfloat16)),
               "rel_err_w8a8": err(G8.gemm_w8a8(q8, w8, bias, torch.bfloat16)),
               "requant_equals_spec": bool(torch.equal(formats.requantize_int8(w4).data, r8.data))}
        qrows.append(row)
        print("requant", row, flush=True)
        del w, x, w4, w8, q8, d8, da, r8, y32
        torch.cuda.empty_cache()
    res["requant"] = qrows

if part in ("all", "overlap"):  # session 36: hiding the K/V pass behind the attention of other heads
    orows = []
    main = torch.cuda.current_stream()
    sides = {"lo": torch.cuda.Stream(priority=0), "hi": torch.cuda.Stream(priority=-1)}
    for size, H, rope_on in (("2b", 30, False), ("5b", 48, True)):
        p = ProcessorInputs(H, rope_on)
        B, D, v, out_s = p.B, p.D, p.v, p.out

        def chunks(n):
            per = max(n // B, 1)
            bounds = [round(i * H / per) for i in range(per + 1)]
            return [(bb, bounds[i], bounds[i + 1]) for bb in range(B) for i in range(per)]

        def sl(t, c):
            return t[c[0]:c[0] + 1, c[1]:c[2]]

        def overlapped(n, side, delayed):
            qa, ka, n_ = p.call_inputs()
            cs = chunks(n)
            side.wait_stream(main)
            kv0 = A.quantize_kv(sl(ka, cs[0]), sl(v, cs[0]), k_norm=n_)
            if delayed:
                side.wait_stream(main)
            evs, kvs = [], []
            with torch.cuda.stream(side):
                for c in cs[1:]:
                    kvs.append(A.quantize_kv(sl(ka, c), sl(v, c), k_norm=n_))
                    ev = torch.cuda.Event()
                    ev.record(side)
                    evs.append(ev)
            A.attention_fp8(sl(qa, cs[0]), kv0, out=sl(out_s, cs[0]), q_norm=n_)
            for c, ev, kv in zip(cs[1:], evs, kvs):
                main.wait_event(ev)
                A.attention_fp8(sl(qa, c), kv, out=sl(out_s, c), q_norm=n_)
                for t in (kv.k, kv.k_scale, kv.v, kv.v_scale):
                    t.record_stream(main)
            return out_s

        def chunked_one_stream(n):
            qa, ka, n_ = p.call_inputs()
            for c in chunks(n):
                A.attention_fp8(sl(qa, c), A.quantize_kv(sl(ka, c), sl(v, c), k_norm=n_), out=sl(out_s, c), q_norm=n_)
            return out_s

        ref = p.call().clone()
        qa, ka, n_ = p.call_inputs()
        kv = A.quantize_kv(ka, v, k_norm=n_)
        row = {"size": size, "shape": p.shape, "rope": rope_on, "cudnn_whole_ms": bench(p.cudnn),
               "seq_ms": bench(p.call), "kernel_ms": bench(lambda: A.attention_fp8(qa, kv, out=out_s, q_norm=n_)),
               "kv_pass_ms": bench(lambda: A.quantize_kv(ka, v, k_norm=n_)),
               "kv_stats_ms": bench(lambda: A.kv_stats(ka, v, k_norm=n_))}
        st = A.kv_stats(ka, v, k_norm=n_)
        row["kv_quant_ms"] = bench(lambda: A.quantize_kv(ka, v, k_norm=n_, stats=st))
        for sq in (16896, 18304):  # query tiles a multiple of 264 (2 programs on each of 132 SMs) at H = 30
            qq = torch.randn(B, H, sq, D, device=dev, dtype=torch.bfloat16)
            oo = torch.empty_like(qq)
            row[f"kernel_q{sq}_ms"] = bench(lambda: A.attention_fp8(qq, kv, out=oo))
            del qq, oo
        for n in (2, 4, 6, 10):
            row[f"one_stream_{n}_ms"] = bench(lambda: chunked_one_stream(n))
            for sname, side in sides.items():
                for delayed in (False, True):
                    key = f"overlap_{n}_{sname}{'_delayed' if delayed else ''}"
                    got = overlapped(n, side, delayed)
                    torch.cuda.synchronize()
                    row[key + "_same"] = bool(torch.equal(got, ref))
                    row[key + "_ms"] = bench(lambda: overlapped(n, side, delayed))
        row["x_cudnn_seq"] = row["cudnn_whole_ms"] / row["seq_ms"]
        best = min((kk for kk in row if kk.startswith("overlap_") and kk.endswith("_ms")), key=row.get)
        row["best"] = best
        row["x_cudnn_best"] = row["cudnn_whole_ms"] / row[best]
        orows.append(row)
        print("overlap", row, flush=True)
        del p, v, out_s, ref, kv, qa, ka
        torch.cuda.empty_cache()
    res["overlap"] = orows
    try:  # programmatic dependent launch in this Triton (launch_pdl / gdc_wait)
        import triton.language as tl

        @triton.jit
        def _pdl_probe(x_ptr):
            tl.extra.cuda.gdc_wait()
            tl.store(x_ptr, tl.load(x_ptr) + 1)

        x = torch.zeros(1, device=dev)
        _pdl_probe[(1,)](x, launch_pdl=True)
        torch.cuda.synchronize()
        res["pdl"] = float(x.item())
    except Exception as e:  # noqa: BLE001
        res["pdl"] = repr(e)[:300]
    print("pdl", res["pdl"], flush=True)

if part in ("all", "pvorder"):  # session 37: V in the P·V key order against the kernel before it
    import importlib.util
    import os
    import random
    import statistics

    path = os.environ.get("SIXBIT_BASE_ATTN", "sixbit_kernels/_attention_fp8_base.py")
    spec_ = importlib.util.spec_from_file_location("sixbit_kernels._attention_fp8_base", path)
    base = importlib.util.module_from_spec(spec_)
    sys.modules[spec_.name] = base  # its dataclass looks its module up
    spec_.loader.exec_module(base)
    rounds = int(os.environ.get("ROUNDS", "15"))
    prows = []
    for size, H, rope_on in (("2b", 30, False), ("5b", 48, True)):
        p = ProcessorInputs(H, rope_on)
        v, out_s = p.v, p.out
        qa, ka, nq = p.call_inputs()
        kvs = {name: mod.quantize_kv(ka, v, k_norm=nq) for name, mod in (("new", A), ("base", base))}
        qc = p.normed()[0].contiguous()
        oc = torch.empty_like(qc)
        fns = {"cudnn_whole": p.cudnn,
               **{f"{name}_whole": (lambda mod=mod: p.call(mod)) for name, mod in (("new", A), ("base", base))},
               **{f"{name}_kernel": (lambda mod=mod, kv=kvs[name]: mod.attention_fp8(qa, kv, out=out_s, q_norm=nq))
                  for name, mod in (("new", A), ("base", base))},
               **{f"{name}_kernel_contiguous": (lambda mod=mod, kv=kvs[name]: mod.attention_fp8(qc, kv, out=oc))
                  for name, mod in (("new", A), ("base", base))},
               **{f"{name}_kv_pass": (lambda mod=mod: mod.quantize_kv(ka, v, k_norm=nq))
                  for name, mod in (("new", A), ("base", base))}}
        got_new, got_base = p.call(A).clone(), p.call(base).clone()
        ref = p.cudnn()
        err = lambda o: float(formats.relative_error(o.float(), ref.float()))
        row = {"size": size, "shape": p.shape, "rope": rope_on, "rounds": rounds,
               "max_abs_diff_new_base": float((got_new.float() - got_base.float()).abs().max()),
               "rel_l2_new_vs_cudnn": err(got_new), "rel_l2_base_vs_cudnn": err(got_base)}
        times = {kk: [] for kk in fns}
        for fn in fns.values():  # compile + warm every form before the first timed round
            fn()
        torch.cuda.synchronize()
        for r in range(rounds):
            order = list(fns)
            random.Random(r).shuffle(order)
            for kk in order:
                times[kk].append(do_bench(fns[kk], warmup=25, rep=200, return_mode="median"))
        row["ms_rounds"] = times
        row["ms"] = {kk: statistics.median(t) for kk, t in times.items()}
        for form in ("whole", "kernel", "kernel_contiguous", "kv_pass"):
            pairs = [b_ / n_ for n_, b_ in zip(times[f"new_{form}"], times[f"base_{form}"])]
            row[f"base_over_new_{form}"] = {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)}
        for form in ("whole", "kernel", "kernel_contiguous"):
            for name in ("new", "base"):
                xs = [c / t for c, t in zip(times["cudnn_whole"], times[f"{name}_{form}"])]
                row[f"x_cudnn_{name}_{form}"] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
        prows.append(row)
        print("pvorder", {kk: vv for kk, vv in row.items() if kk != "ms_rounds"}, flush=True)
        del p, v, out_s, qa, ka, kvs, got_new, got_base, ref, qc, oc
        torch.cuda.empty_cache()
    res["pvorder"] = prows

out = sys.argv[2] if len(sys.argv) > 2 else "ws_probe.json"
json.dump(res, open(out, "w"), indent=1)
