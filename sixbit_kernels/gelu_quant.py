"""The feed-forward's tanh-GELU emitting the INT8 operand of ff.net.2 (fused producer).

CogVideoX's feed-forward is ``ff.net.2(GELU_tanh(ff.net.0.proj(x)))``; diffusers writes the GELU output
(``[M, 7680]`` at 2B: 0.55 GB in bf16) and sixbit's Hadamard + INT8 pass reads it back. Here one kernel
reads the projection's output once and writes the per-token INT8 codes (+ scales) of the rotated GELU:
``formats.gelu_int8`` is the reference.

Arithmetic (fp contraction off): PyTorch's ``gelu(approximate="tanh")`` in fp32,
``0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))``, computed as ``_common.gelu_tanh`` does (``x / (1 + e^{−2u})``,
the same function, a few fp32 ulps from PyTorch's ``tanhf`` form), rounded to the model dtype, then
``rows_int8.store_int8_rows`` (the INT8 pass's rotation and rounding). A GELU value can differ from PyTorch's
by one ulp of the model dtype where it lies near a rounding boundary, and then a code by one step (tests bound
the rate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sixbit.formats import Int8Tensor

from ._common import GELU_BETA, GELU_KAPPA, cast_out, check_launchable, gelu_tanh, make_h, num_sms
from .hadamard_quant import _inv_sqrt
from .rows_int8 import geometry, grid_size, store_int8_rows, tile_index


@triton.jit
def _gelu_int8_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm,
    BETA: tl.constexpr, KAPPA: tl.constexpr, DENSE: tl.constexpr,
    HB: tl.constexpr, INV_SQRT: tl.constexpr, TOK: tl.constexpr, G: tl.constexpr, BK: tl.constexpr,
    INTERP: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    dt = x_ptr.dtype.element_ty
    h = make_h(dt, BK, HB)
    for blk in range(pid, tl.cdiv(M, TOK), nprog):
        tok, kk, valid = tile_index(blk, M, K, TOK, G, BK)
        x = tl.load(x_ptr + tok[:, None] * stride_xm + kk, mask=valid, other=0.0).to(tl.float32)
        y = cast_out(gelu_tanh(x, BETA, KAPPA), dt, INTERP)  # GELU(0) = 0: masked entries stay 0
        t1 = blk * TOK + tl.arange(0, TOK)
        store_int8_rows(y, h, kk, valid, tok, t1, t1 < M, q_ptr, s_ptr, K, HB, INV_SQRT, TOK, G, DENSE, INTERP)


def gelu_int8(x: torch.Tensor, hadamard_block: int | None, *, dense: bool = False) -> Int8Tensor:
    """Per-token INT8 of ``block_hadamard(gelu_tanh(x))`` for ``x [..., K]`` (rows flattened):
    ``Int8Tensor(codes [M, K], scale [M, 1])``, the codes as fp16 with ``dense`` (W4A8's operand)."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"gelu_int8: activations must be bf16, fp16 or fp32, got {x.dtype}")
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    interp = check_launchable(x2)
    hb = int(hadamard_block or 0)
    bk, tok, g, waves, nw = geometry(k, hb, interp)
    m = x2.shape[0]
    q = torch.empty((m, k), dtype=torch.float16 if dense else torch.int8, device=x.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        _gelu_int8_kernel[(grid_size(m, tok, num_sms(x.device), waves),)](
            x2, q, scale, m, k, x2.stride(0), BETA=GELU_BETA, KAPPA=GELU_KAPPA, DENSE=dense,
            HB=hb, INV_SQRT=_inv_sqrt(hb), TOK=tok, G=g, BK=bk, INTERP=interp, num_warps=nw,
            enable_fp_fusion=False,
        )
    return Int8Tensor(q, scale, x.dtype)


__all__ = ["gelu_int8", "GELU_BETA", "GELU_KAPPA"]
