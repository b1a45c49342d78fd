"""Video arrays and browser-playable H.264 mp4 files.

A *video array* throughout sixbit is a numpy array of shape ``[T, H, W, 3]`` (RGB), either ``uint8``
(0..255) or floating point in ``[0, 1]`` — what a diffusers pipeline returns with ``output_type="np"``
(after taking one batch element).

`write_mp4` encodes with the ffmpeg binary that ships with ``imageio-ffmpeg`` (no system ffmpeg needed)
using the settings every current browser plays:

- codec H.264 (``libx264``), pixel format ``yuv420p`` (4:2:0 chroma needs even width and height, so an
  odd-sized frame is padded by repeating its last row/column — never resized);
- ``-movflags +faststart``: the ``moov`` index is written before the media data, so playback can
  start before the download ends;
- an optional integer nearest-neighbour ``upscale`` for display (tiny videos of the embedded model
  would otherwise be blurred by the browser's bilinear scaling). Metrics are never computed on the
  upscaled file, only on the arrays.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

__all__ = ["check_video", "to_uint8", "to_float01", "digest", "pad_even", "write_mp4", "read_mp4", "mp4_top_level_atoms"]


def check_video(video) -> np.ndarray:
    """Return ``video`` as a numpy array after checking it is ``[T, H, W, 3]`` uint8 or float."""
    arr = np.asarray(video)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"expected a video array [T, H, W, 3], got shape {arr.shape}")
    if min(arr.shape[:3]) < 1:
        raise ValueError(f"empty video array, shape {arr.shape}")
    if arr.dtype != np.uint8 and not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"expected uint8 or floating point video, got {arr.dtype}")
    return arr


def to_uint8(video) -> np.ndarray:
    """``[T,H,W,3]`` uint8; floats are taken as ``[0, 1]``, clipped, and rounded to nearest."""
    arr = check_video(video)
    if arr.dtype == np.uint8:
        return arr
    if not np.all(np.isfinite(arr)):
        raise ValueError("video contains NaN or infinite values")
    return np.clip(np.rint(arr.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)


def to_float01(video) -> np.ndarray:
    """``[T,H,W,3]`` float64 in ``[0, 1]`` (uint8 divided by 255; floats clipped to ``[0, 1]``)."""
    arr = check_video(video)
    if arr.dtype == np.uint8:
        return arr.astype(np.float64) / 255.0
    if not np.all(np.isfinite(arr)):
        raise ValueError("video contains NaN or infinite values")
    return np.clip(arr.astype(np.float64), 0.0, 1.0)


def digest(video) -> str:
    """``"sha256:<hex>"`` of a video as ``uint8 [T, H, W, 3]`` (shape included): equal digests mean equal
    pixels, bit for bit (the app stores them in trace.json so that a replay can be compared)."""
    import hashlib

    arr = np.ascontiguousarray(to_uint8(video))
    h = hashlib.sha256(str(arr.shape).encode())
    h.update(arr.tobytes())
    return "sha256:" + h.hexdigest()


def pad_even(video: np.ndarray) -> np.ndarray:
    """Pad height and width up to even numbers by repeating the last row/column (edge mode)."""
    _, h, w, _ = video.shape
    ph, pw = h % 2, w % 2
    if ph == 0 and pw == 0:
        return video
    return np.pad(video, ((0, 0), (0, ph), (0, pw), (0, 0)), mode="edge")


def write_mp4(video, path: str | os.PathLike, fps: float = 8.0, *, upscale: int = 1, crf: int = 18) -> Path:
    """Encode a video array to a browser-playable H.264 mp4 at ``path`` and return the path.

    ``upscale`` repeats every pixel ``upscale × upscale`` times (display only); ``crf`` is x264's
    constant-rate factor (lower = better quality; 18 is visually lossless for most content).
    """
    import imageio_ffmpeg

    frames = to_uint8(video)
    upscale = int(upscale)
    if upscale < 1:
        raise ValueError(f"upscale must be >= 1, got {upscale}")
    if not (fps > 0):
        raise ValueError(f"fps must be > 0, got {fps}")
    if upscale > 1:
        frames = frames.repeat(upscale, axis=1).repeat(upscale, axis=2)
    frames = np.ascontiguousarray(pad_even(frames))
    t, h, w, _ = frames.shape
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (w, h),
        fps=float(fps),
        codec="libx264",
        pix_fmt_in="rgb24",
        pix_fmt_out="yuv420p",
        macro_block_size=1,  # we pad to even sizes ourselves; never let ffmpeg resize
        ffmpeg_log_level="error",
        output_params=["-crf", str(int(crf)), "-preset", "medium", "-movflags", "+faststart"],
    )
    writer.send(None)  # start the generator
    try:
        for i in range(t):
            writer.send(frames[i])
    finally:
        writer.close()
    return path


def read_mp4(path: str | os.PathLike) -> np.ndarray:
    """Decode an mp4 back to a ``[T, H, W, 3]`` uint8 array (used by tests and benchmarks)."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
    meta = next(reader)
    w, h = meta["size"]
    frames = [np.frombuffer(buf, dtype=np.uint8).reshape(h, w, 3) for buf in reader]
    if not frames:
        raise ValueError(f"no frames decoded from {path}")
    return np.stack(frames)


def mp4_top_level_atoms(path: str | os.PathLike) -> list[str]:
    """Names of the top-level ISO-BMFF boxes of an mp4, in file order (e.g. ftyp, moov, mdat)."""
    names = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        header = 8
        if size == 1:  # 64-bit size follows
            (size,) = struct.unpack(">Q", data[pos + 8 : pos + 16])
            header = 16
        elif size == 0:  # box extends to end of file
            size = len(data) - pos
        if size < header:
            break
        names.append(kind.decode("latin-1"))
        pos += size
    return names
