"""Shared pieces of the kernel benchmark (``python -m benchmarks.kernels``): shapes, the run context.

A :class:`Run` carries everything a section needs — device, sizes, the log, and the dispatch ``target``
(``sixbit_kernels.targets.Target``) that tuning refines with explicit config overrides — so no section
reads or writes module state of the kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from triton.testing import do_bench

import sixbit_kernels as sk
from sixbit import formats as spec

ops, g4, g8, hq, targets = sk.ops, sk.gemm_w4, sk.gemm_w8a8, sk.hadamard_quant, sk.targets

# (model, layer, K, N)
SHAPES = [
    ("2B", "qkv (fused)", 1920, 5760),
    ("2B", "attn out", 1920, 1920),
    ("2B", "ff in", 1920, 7680),
    ("2B", "ff out", 7680, 1920),
    ("5B", "qkv (fused)", 3072, 9216),
    ("5B", "attn out", 3072, 3072),
    ("5B", "ff in", 3072, 12288),
    ("5B", "ff out", 12288, 3072),
]
TUNE_SHAPES = [("2B", "qkv (fused)", 1920, 5760), ("5B", "ff out", 12288, 3072)]
#: the activation widths each token-resident quantize config serves (N unused)
ROW_SHAPES = {"rows": [("2B", "qkv", 1920, 0)],
              "rows_long": [("5B", "qkv", 3072, 0), ("2B", "ff out", 7680, 0), ("5B", "ff out", 12288, 0)]}

#: vendor 8-bit GEMMs at the same shapes, for scale: what cuBLAS does with the same operand sizes
CUBLAS_INT8 = "  reference: cuBLAS int8 torch._int_mm (int32 out; no scales, no bias)"
CUBLAS_FP8 = "  reference: cuBLAS fp8 e4m3 torch._scaled_mm, row/column scales, bias, bf16 out"
TMA_GEMM = "W8A8 int8 GEMM (TMA descriptors)"
Q_INT8 = "int8 (codes int8)"


@dataclass
class Run:
    """One benchmark run: device (``"cpu"`` for ``--smoke``: interpreter, tiny shapes, measures nothing),
    sizes, shapes, the dispatch target (tuned configs as explicit overrides) and the log."""

    dev: str = "cuda"
    M: int = 35552
    rep: int = 100
    hb: int = 64
    shapes: list = field(default_factory=lambda: list(SHAPES))
    tune_shapes: list = field(default_factory=lambda: list(TUNE_SHAPES))
    row_shapes: dict = field(default_factory=lambda: dict(ROW_SHAPES))
    tune_lists: dict | None = None
    target: object = None
    lines: list = field(default_factory=list)

    def __post_init__(self):
        if self.target is None:
            self.target = targets.device_target(self.dev)

    def variant(self, name: str):
        """The run's target with another GEMM variant (``"hopper"`` / ``"portable"``), overrides kept."""
        return replace(self.target, variant=name)

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        self.lines.append(line)
        print(line, flush=True)

    def bench(self, fn, rep: int | None = None) -> float:
        fn()
        if self.dev == "cpu":
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        rep = rep or self.rep
        return float(do_bench(fn, warmup=max(10, rep // 4), rep=rep, return_mode="median"))

    def host_ms(self, fn, n=None):
        """CPU time per call of ``fn`` (launches queued, no synchronisation inside the loop): when it exceeds
        the GPU time, a benchmark loop — unlike the model, whose GPU queue runs ahead — measures the host."""
        n = n or (50 if self.dev == "cuda" else 1)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t0) / n * 1e3
        if self.dev == "cuda":
            torch.cuda.synchronize()
        return host

    def empty_cache(self):
        if self.dev == "cuda":
            torch.cuda.empty_cache()

    def gen(self, shape, seed, dtype=torch.bfloat16, outlier_cols=()):
        g = torch.Generator(device=self.dev).manual_seed(seed)
        x = torch.randn(shape, generator=g, device=self.dev, dtype=torch.float32)
        for c in outlier_cols:
            x[..., c] *= 30.0
        return x.to(dtype)

    def gemm_case(self, M, K, N, seed=0):
        x = self.gen((M, K), seed, outlier_cols=(7, K // 2))
        w = self.gen((N, K), seed + 1, torch.float32) / K**0.5
        b = self.gen((N,), seed + 2, torch.float32)
        return x, w, b


def rel(y, ref) -> float:
    return float(spec.relative_error(y.float(), ref.float()))


def ceilings(run: Run):
    n = (1 << 29) if run.dev == "cuda" else (1 << 20)  # 1 GiB of bf16
    src = torch.randn(n // 2, device=run.dev).to(torch.bfloat16).repeat(2)
    dst = torch.empty_like(src)
    t = run.bench(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() * 2 / (t * 1e-3) / 1e9
    d = 8192 if run.dev == "cuda" else 256
    a = torch.randn(d, d, device=run.dev, dtype=torch.bfloat16)
    b = torch.randn(d, d, device=run.dev, dtype=torch.bfloat16)
    tm = run.bench(lambda: a @ b)
    return {"copy_GBps": copy_gbs, "copy_ms_1GiB": t, "bf16_8192_TFLOPs": 2 * d**3 / (tm * 1e-3) / 1e12}
