"""Fidelity metrics of a generated video against a baseline video.

All functions take video arrays ``[T, H, W, 3]`` — ``uint8`` (0..255) or float in ``[0, 1]`` (see
`sixbit.video`) — and compute in float64 on the ``[0, 1]`` scale, so a uint8 video and its float
version give the same numbers (up to the uint8 rounding itself).

- `psnr` — peak signal-to-noise ratio over the whole clip (one MSE over all frames, pixels, channels),
  in dB; ``inf`` when the videos are identical.
- `ssim` — structural similarity (scikit-image, Gaussian-free 7×7 window, colour channels averaged),
  computed per frame and averaged over frames; 1.0 when identical.
- `temporal_flicker` — mean absolute frame-to-frame change of luma (BT.601), on the ``[0, 1]`` scale.
  It includes genuine motion, so read it *relative to the baseline*: a quantized video that flickers
  more than its baseline shows a higher number for the same content.
- `flow_score` — mean magnitude of dense optical flow (OpenCV Farnebäck) between consecutive frames,
  in pixels per frame: how much the video moves.
- `flow_error` — mean end-point error between the flow fields of a video and of its baseline, in
  pixels per frame: whether the motion itself changed, not just the pixels.
- `compare` — all of the above in one dict, the form the app and the benchmarks report.
"""

from __future__ import annotations

import math

import numpy as np

from sixbit.video import to_float01

__all__ = ["psnr", "ssim", "temporal_flicker", "optical_flow", "flow_score", "flow_error", "compare"]

_LUMA = np.array([0.299, 0.587, 0.114])


def _pair(video, ref) -> tuple[np.ndarray, np.ndarray]:
    a, b = to_float01(video), to_float01(ref)
    if a.shape != b.shape:
        raise ValueError(f"videos differ in shape: {a.shape} vs {b.shape}")
    return a, b


def psnr(video, ref) -> float:
    """PSNR in dB of ``video`` against ``ref`` over the whole clip (peak 1.0); ``inf`` if identical."""
    a, b = _pair(video, ref)
    mse = float(np.mean((a - b) ** 2))
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(1.0 / mse)


def ssim(video, ref) -> float:
    """Mean over frames of the colour SSIM (scikit-image) of ``video`` against ``ref``."""
    from skimage.metrics import structural_similarity

    a, b = _pair(video, ref)
    side = min(a.shape[1], a.shape[2])
    win = min(7, side if side % 2 == 1 else side - 1)
    if win < 3:
        raise ValueError(f"frames of {a.shape[1]}x{a.shape[2]} are too small for SSIM (need >= 3 px)")
    vals = [
        structural_similarity(a[t], b[t], data_range=1.0, channel_axis=-1, win_size=win)
        for t in range(a.shape[0])
    ]
    return float(np.mean(vals))


def _luma(video) -> np.ndarray:
    return to_float01(video) @ _LUMA  # [T, H, W]


def temporal_flicker(video) -> float:
    """Mean |Y[t+1] − Y[t]| over frames and pixels (luma in [0, 1]); 0.0 for a single frame."""
    y = _luma(video)
    if y.shape[0] < 2:
        return 0.0
    return float(np.mean(np.abs(np.diff(y, axis=0))))


def optical_flow(video) -> np.ndarray:
    """Farnebäck dense flow between consecutive frames: ``[T-1, H, W, 2]`` float32 (dx, dy in px)."""
    import cv2

    y = np.clip(np.rint(_luma(video) * 255.0), 0, 255).astype(np.uint8)
    t, h, w = y.shape
    if t < 2:
        return np.zeros((0, h, w, 2), np.float32)
    # Pyramid depth: stop while the coarsest level is still >= 16 px on its short side.
    levels = max(1, min(4, int(math.log2(max(min(h, w), 16) / 16)) + 1))
    winsize = max(5, min(15, (min(h, w) // 4) | 1))
    flows = [
        cv2.calcOpticalFlowFarneback(
            y[i], y[i + 1], None, pyr_scale=0.5, levels=levels, winsize=winsize,
            iterations=3, poly_n=5, poly_sigma=1.1, flags=0,
        )
        for i in range(t - 1)
    ]
    return np.stack(flows).astype(np.float32)


def flow_score(video) -> float:
    """Mean optical-flow magnitude (pixels per frame); 0.0 for a single frame."""
    flow = optical_flow(video)
    if flow.shape[0] == 0:
        return 0.0
    return float(np.mean(np.linalg.norm(flow, axis=-1)))


def flow_error(video, ref) -> float:
    """Mean end-point error (px/frame) between the optical flows of ``video`` and ``ref``."""
    a, b = _pair(video, ref)
    fa, fb = optical_flow(a), optical_flow(b)
    if fa.shape[0] == 0:
        return 0.0
    return float(np.mean(np.linalg.norm(fa - fb, axis=-1)))


def compare(video, ref) -> dict[str, float]:
    """Every metric of ``video`` against the baseline ``ref`` (keys are stable: reports rely on them)."""
    a, b = _pair(video, ref)
    fa, fb = optical_flow(a), optical_flow(b)
    has_flow = fa.shape[0] > 0
    return {
        "psnr_db": psnr(a, b),
        "ssim": ssim(a, b),
        "flicker": temporal_flicker(a),
        "flicker_ref": temporal_flicker(b),
        "flow_score": float(np.mean(np.linalg.norm(fa, axis=-1))) if has_flow else 0.0,
        "flow_score_ref": float(np.mean(np.linalg.norm(fb, axis=-1))) if has_flow else 0.0,
        "flow_error": float(np.mean(np.linalg.norm(fa - fb, axis=-1))) if has_flow else 0.0,
    }
