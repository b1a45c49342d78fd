"""W8A8: INT8 weights × INT8 activations on the int8 tensor cores (the Hopper speed path).

``y[M, N] = (qa[M, K] @ qw[N, K]^T) * sa[m] * sw[n] (+ bias)``: int32 accumulation (exact: K * 127**2
stays below 2**31 for K < 133,000), one fp32 rescale in the epilogue. Weights are per-output-channel INT8
(``formats.quantize_int8`` on the Hadamard-folded weight), activations per-token INT8 (the fused quantize
kernel). Both operands are K-major (``[rows, K]`` row-major), the layout Hopper's int8 ``wgmma`` wants.

FACTS.md: cuBLAS int8 through ``torch._int_mm`` is no faster than bf16 on the H200, a plain Triton int8
GEMM reached 1.47-1.6x bf16 — hence this kernel. One loop, two operand paths (``targets``): TMA tensor
descriptors (the Hopper variant) or pointer loads (the portable variant, any K, capability >= 8.0; the
interpreter tests both).
Measured at the CogVideoX shapes, GEMM alone (benchmarks/results/kernels_h200.md): TMA 1.60-2.11x bf16
cuBLAS, pointer loads 1.28-1.93x; cuBLAS fp8 ``torch._scaled_mm`` in the same run 1.36-1.98x.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sixbit.formats import Int8Tensor, act_code

from ._common import cdiv, check_launchable, grouped_tile, next_pow2, store_value
from .targets import HOPPER, PORTABLE, GemmConfig, Target, pick, resolve


@triton.jit
def _gemm_w8a8_kernel(
    a_src, w_src, o_desc, sa_ptr, sw_ptr, bias_ptr, out_ptr,
    M, N, K, stride_am, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, TMA: tl.constexpr, TMA_STORE: tl.constexpr, ACT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    INTERP: tl.constexpr,
):
    """One GEMM loop, two operand paths. ``TMA`` (Hopper): ``a_src``/``w_src`` are tensor descriptors
    (zero-filled out of bounds, so no K masks; the copy engine feeds shared memory), and with
    ``TMA_STORE`` the output tile leaves through ``o_desc`` too (rows past M clipped by the copy engine).
    Otherwise (portable, any capability >= 8.0) they are pointers: rows clamped, K tail masked.
    ``ACT``: the activation applied to the rounded output (``_common.store_value``; 0: none)."""
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    if TMA:
        for k0 in range(0, K, BLOCK_K):
            a = a_src.load([m0, k0])
            w = w_src.load([n0, k0])
            acc = tl.dot(a, tl.trans(w), acc, out_dtype=tl.int32)
    else:
        rm = (offs_m % M).to(tl.int64)
        rn = (offs_n % N).to(tl.int64)
        kb = tl.arange(0, BLOCK_K)
        a_ptrs = a_src + rm[:, None] * stride_am + kb[None, :]
        w_ptrs = w_src + rn[None, :] * stride_wn + kb[:, None]  # [BK, BN] view of the K-major weight
        for k0 in range(0, K, BLOCK_K):
            if EVEN_K:
                a = tl.load(a_ptrs)
                w = tl.load(w_ptrs)
            else:
                a = tl.load(a_ptrs, mask=(k0 + kb)[None, :] < K, other=0)
                w = tl.load(w_ptrs, mask=(k0 + kb)[:, None] < K, other=0)
            acc = tl.dot(a, w, acc, out_dtype=tl.int32)
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
    if TMA_STORE:
        o_desc.store([m0, n0], store_value(_w8a8_scale(acc, offs_m, offs_n, M, N, sa_ptr, sw_ptr, bias_ptr, HAS_BIAS),
                                           o_desc.dtype, ACT, INTERP))
    else:
        _w8a8_epilogue(acc, offs_m, offs_n, M, N, stride_om, sa_ptr, sw_ptr, bias_ptr, out_ptr, HAS_BIAS, ACT, INTERP)


@triton.jit
def _w8a8_scale(acc, offs_m, offs_n, M, N, sa_ptr, sw_ptr, bias_ptr, HAS_BIAS: tl.constexpr):
    """``acc · s_token · s_channel (+ bias)`` in fp32 (rows/columns past the edge read wrapped-around
    scales: they are masked or clipped at the store)."""
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    sa = tl.load(sa_ptr + rm)
    sw = tl.load(sw_ptr + rn)
    y = acc.to(tl.float32) * sa[:, None] * sw[None, :]
    if HAS_BIAS:
        y = y + tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    return y


@triton.jit
def _w8a8_epilogue(acc, offs_m, offs_n, M, N, stride_om, sa_ptr, sw_ptr, bias_ptr, out_ptr,
                   HAS_BIAS: tl.constexpr, ACT: tl.constexpr, INTERP: tl.constexpr):
    """The fp32 rescale, one rounding to the output dtype (and the activation), masked pointer store."""
    y = _w8a8_scale(acc, offs_m, offs_n, M, N, sa_ptr, sw_ptr, bias_ptr, HAS_BIAS)
    o_off = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    omask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + o_off, store_value(y, out_ptr.dtype.element_ty, ACT, INTERP), mask=omask)


#: per variant, ``[(min opt-in shared memory, config), ...]`` (``targets.pick``). Hopper: picked by
#: ``benchmarks/kernels.py --tune`` on the H200 — 128x128x128 tiles with 4 warps and 3 stages fit two CTAs
#: per SM, which hides the int8 wgmma wait (triton 3.6 issues int8 wgmma synchronously) better than one
#: 128x256 CTA. Portable: the same tiles with pointer loads (64 KB of shared memory: fits every target)
CONFIGS = {
    HOPPER: [(0, GemmConfig(128, 128, 128, 16, 4, 3))],
    PORTABLE: [(0, GemmConfig(128, 128, 128, 8, 4, 3))],
}
INTERP_CONFIG = GemmConfig(32, 32, 32, 4, 4, 1)


def launch_config(target: Target) -> GemmConfig:
    return target.config("w8a8", pick(CONFIGS[target.variant], target.smem))


def gemm_w8a8(
    a: Int8Tensor,
    w: Int8Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: GemmConfig | None = None,
    target: Target | None = None,
    tma_store: bool = True,
    activation: str | None = None,
) -> torch.Tensor:
    """``dequant(a) @ dequant(w)^T + bias`` for per-token INT8 ``a [M, K]`` and per-channel INT8 ``w [N, K]``.

    ``target`` (default: the device's, ``targets.device_target``) picks the variant and config: ``hopper``
    reads the operands through TMA tensor descriptors (needs K a multiple of 16 and 16-byte aligned bases;
    otherwise it falls back to pointer loads) and, with ``tma_store`` where the row pitch allows, stores
    the output tile through one; ``portable`` uses pointer loads. ``activation`` (``"gelu_tanh"``): the
    activation of the rounded output, in the epilogue (``F.gelu(y, approximate="tanh")`` of the output)."""
    act = act_code(activation)
    qa, qw = a.data, w.data
    if qa.dtype != torch.int8 or qw.dtype != torch.int8:
        raise TypeError("gemm_w8a8 needs int8 codes for both operands")
    M, K = qa.shape
    N, Kw = qw.shape
    if Kw != K:
        raise ValueError(f"activation K={K} does not match the weight's K={Kw}")
    qa = qa.contiguous()
    qw = qw.contiguous()
    sa = a.scale.float().reshape(-1).contiguous()
    sw = w.scale.float().reshape(-1).contiguous()
    interp = check_launchable(qa, qw)
    out = torch.empty((M, N), dtype=out_dtype, device=qa.device)
    if M == 0:
        return out
    tgt = resolve(target, qa.device, interp)
    aligned = K % 16 == 0 and qa.data_ptr() % 16 == 0 and qw.data_ptr() % 16 == 0
    use_tma = tgt.variant == HOPPER and aligned
    bm, bn, bk, gm, nw, ns = config or (INTERP_CONFIG if interp else launch_config(tgt))
    bk = min(bk, max(32, next_pow2(K)))  # int8 tensor-core dots need K tiles of >= 32
    grid = (cdiv(M, bm) * cdiv(N, bn),)
    a_src, w_src, o_desc, store = qa, qw, None, False
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        store = tma_store and (N * out.element_size()) % 16 == 0 and out.data_ptr() % 16 == 0
        o_desc = TensorDescriptor.from_tensor(out, [bm, bn]) if store else None
        a_src, w_src = TensorDescriptor.from_tensor(qa, [bm, bk]), TensorDescriptor.from_tensor(qw, [bn, bk])
    _gemm_w8a8_kernel[grid](
        a_src, w_src, o_desc, sa, sw, bias if bias is not None else sa, out,
        M, N, K, qa.stride(0), qw.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=(K % bk == 0), TMA=use_tma, TMA_STORE=store, ACT=act,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, INTERP=interp, num_warps=nw, num_stages=ns,
    )
    return out
