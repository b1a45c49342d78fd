"""Blackwell (compute capability ≥ 10) native NVFP4 GEMM through cuBLAS — UNVERIFIED.

On sm_100/sm_120 the FP4 tensor cores multiply NVFP4 operands directly: ``torch._scaled_mm`` with
``float4_e2m1fn_x2`` data and e4m3 block scales in cuBLAS's swizzled layout. No Blackwell GPU was
available to this project, so this path has never run on hardware: it is labelled
``"blackwell-native (unverified)"`` everywhere (``ops.compute_path``), and its numerics are tested only
by emulation (:func:`emulate_scaled_mm_nvfp4` re-computes, in plain torch, what the cuBLAS call is
specified to compute from exactly the tensors we hand it, swizzled scales included).

Scale layout (cuBLAS "block scaling factors layout" for 1x16 blocks): the ``[rows, K/16]`` scale matrix
is padded to multiples of ``128 x 4`` and cut into ``128 x 4`` tiles stored one after another in
row-major tile order; inside a tile, the scale of (row ``r``, column ``c``) sits at offset
``(r % 32) * 16 + (r // 32) * 4 + c``.
"""

from __future__ import annotations

import torch

from sixbit.formats import E2M1_VALUES, NVFP4Tensor, unpack_fp4


def native_fp4_available(device) -> bool:
    """True when the device is a CUDA GPU of capability ≥ 10 and this torch has the FP4 dtype."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return False
    major, _ = torch.cuda.get_device_capability(dev)
    return major >= 10 and hasattr(torch, "float4_e2m1fn_x2")


def swizzle_scales(scales: torch.Tensor) -> torch.Tensor:
    """``[rows, cols]`` e4m3 block scales → the flat cuBLAS tile layout (padded with zeros)."""
    rows, cols = scales.shape
    pr, pc = -(-rows // 128) * 128, -(-cols // 4) * 4
    u = scales.view(torch.uint8)
    if (pr, pc) != (rows, cols):
        p = torch.zeros((pr, pc), dtype=torch.uint8, device=scales.device)
        p[:rows, :cols] = u
        u = p
    # [tile_r, 4 (r // 32), 32 (r % 32), tile_c, 4 (c)] → [tile_r, tile_c, r % 32, r // 32, c]
    t = u.view(pr // 128, 4, 32, pc // 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(-1).view(torch.float8_e4m3fn)


def unswizzle_scales(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: flat tile layout → ``[rows, cols]`` e4m3."""
    pr, pc = -(-rows // 128) * 128, -(-cols // 4) * 4
    t = flat.view(torch.uint8).view(pr // 128, pc // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(pr, pc)[:rows, :cols].contiguous().view(torch.float8_e4m3fn)


def _finish(raw: torch.Tensor, a: NVFP4Tensor, w: NVFP4Tensor, bias, out_dtype) -> torch.Tensor:
    y = raw.float() * (a.tensor_scale.float() * w.tensor_scale.float())
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def scaled_mm_nvfp4(a: NVFP4Tensor, w: NVFP4Tensor, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """W4A4 on FP4 tensor cores: ``dequant(a) @ dequant(w)^T + bias`` via ``torch._scaled_mm``. UNVERIFIED.

    cuBLAS takes the block scales (swizzled) and returns the fp32 product without the per-tensor scales,
    which are applied here in fp32 together with the bias (``_scaled_mm`` cannot add a bias after a
    per-tensor scale, nor a bias with an fp32 output).
    """
    if not native_fp4_available(a.data.device):
        raise RuntimeError("native NVFP4 GEMM needs a CUDA device of capability >= 10 and torch.float4_e2m1fn_x2")
    M, N = a.data.shape[0], w.data.shape[0]
    kb = a.scales.shape[1]
    raw = torch._scaled_mm(
        a.data.contiguous().view(torch.float4_e2m1fn_x2),
        w.data.contiguous().view(torch.float4_e2m1fn_x2).t(),
        swizzle_scales(a.scales.reshape(M, kb)),
        swizzle_scales(w.scales.reshape(N, kb)),
        out_dtype=torch.float32,
    )
    return _finish(raw, a, w, bias, out_dtype)


def emulate_scaled_mm_nvfp4(
    a_data: torch.Tensor, w_data_t: torch.Tensor, a_scales_swz: torch.Tensor, w_scales_swz: torch.Tensor,
) -> torch.Tensor:
    """What ``torch._scaled_mm`` computes for the arguments :func:`scaled_mm_nvfp4` passes it (fp32
    result): FP4 codes × un-swizzled e4m3 block scales, multiplied with fp32 accumulation.
    ``w_data_t`` is the ``[K/2, N]`` transposed view exactly as handed to cuBLAS."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32, device=a_data.device)
    M, K = a_data.shape[0], a_data.shape[1] * 2
    N = w_data_t.shape[1]
    sa = unswizzle_scales(a_scales_swz, M, K // 16).float().repeat_interleave(16, dim=1)
    sw = unswizzle_scales(w_scales_swz, N, K // 16).float().repeat_interleave(16, dim=1)
    av = lut[unpack_fp4(a_data).long()] * sa
    wv = lut[unpack_fp4(w_data_t.t()).long()] * sw
    return av @ wv.T


def emulated_linear_nvfp4(a: NVFP4Tensor, w: NVFP4Tensor, bias=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """:func:`scaled_mm_nvfp4` with the cuBLAS call replaced by :func:`emulate_scaled_mm_nvfp4` (same
    arguments, same swizzled scales): runs anywhere, used by the tests."""
    M, N = a.data.shape[0], w.data.shape[0]
    kb = a.scales.shape[1]
    raw = emulate_scaled_mm_nvfp4(
        a.data, w.data.t(), swizzle_scales(a.scales.reshape(M, kb)), swizzle_scales(w.scales.reshape(N, kb))
    )
    return _finish(raw, a, w, bias, out_dtype)
