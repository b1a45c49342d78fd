"""H.264 mp4 writing: codec, pixel format, even sizes, faststart, and a faithful round trip."""

import json
import subprocess

import imageio_ffmpeg
import numpy as np
import pytest

from sixbit import metrics, video


def _clip(t=9, h=33, w=47, seed=0):
    """A smooth moving gradient with a little texture (odd sizes on purpose)."""
    yy, xx = np.mgrid[0:h, 0:w]
    frames = [0.5 + 0.4 * np.sin((xx + 2 * i) / 6.0)[..., None] * np.array([1.0, 0.6, 0.3]) for i in range(t)]
    rng = np.random.default_rng(seed)
    return np.clip(np.stack(frames) + rng.normal(0, 0.01, (t, h, w, 3)), 0, 1)


def _stream_info(path):
    """Codec, pixel format and size from ffmpeg's own stream line (no ffprobe in imageio-ffmpeg)."""
    proc = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", str(path)],
                          capture_output=True, text=True)
    line = next(ln for ln in proc.stderr.splitlines() if "Video:" in ln)
    return line


def test_mp4_is_browser_playable(tmp_path):
    clip = _clip()
    path = video.write_mp4(clip, tmp_path / "out.mp4", fps=8)
    info = _stream_info(path)
    assert "h264" in info and "yuv420p" in info, info
    assert "48x34" in info, info  # padded up to even sizes, not resized
    atoms = video.mp4_top_level_atoms(path)
    assert "moov" in atoms and "mdat" in atoms
    assert atoms.index("moov") < atoms.index("mdat"), atoms  # faststart


def test_round_trip_fidelity(tmp_path):
    clip = _clip()
    back = video.read_mp4(video.write_mp4(clip, tmp_path / "a.mp4"))
    assert back.shape == (9, 34, 48, 3)
    assert metrics.psnr(back[:, :33, :47], video.to_uint8(clip)) > 30.0
    # padding repeats the edge instead of inventing content
    assert np.abs(back[:, 33].astype(int) - back[:, 32].astype(int)).mean() < 6


def test_upscale_is_nearest_neighbour(tmp_path):
    clip = _clip(t=3, h=16, w=16)
    back = video.read_mp4(video.write_mp4(clip, tmp_path / "u.mp4", upscale=4))
    assert back.shape == (3, 64, 64, 3)
    down = back[:, 1::4, 1::4]  # centre-ish pixel of each 4x4 block
    assert metrics.psnr(down, video.to_uint8(clip)) > 28.0


def test_uint8_input_and_single_frame(tmp_path):
    clip = video.to_uint8(_clip(t=1, h=20, w=20))
    back = video.read_mp4(video.write_mp4(clip, tmp_path / "one.mp4"))
    assert back.shape == (1, 20, 20, 3)


def test_conversions():
    f = np.array([[[[0.0, 0.5, 1.0]]]])
    assert video.to_uint8(f).tolist() == [[[[0, 128, 255]]]]
    assert json.dumps(video.to_float01(np.array([[[[0, 255, 51]]]], np.uint8)).tolist()) == "[[[[0.0, 1.0, 0.2]]]]"
    assert video.to_uint8(np.array([[[[-1.0, 2.0, 0.0]]]])).tolist() == [[[[0, 255, 0]]]]


@pytest.mark.parametrize("bad", [np.zeros((4, 4, 3)), np.zeros((1, 4, 4, 4)), np.zeros((0, 4, 4, 3))])
def test_rejects_non_video(bad, tmp_path):
    with pytest.raises(ValueError):
        video.write_mp4(bad, tmp_path / "x.mp4")


def test_rejects_bad_params(tmp_path):
    with pytest.raises(ValueError):
        video.write_mp4(_clip(t=2), tmp_path / "x.mp4", upscale=0)
    with pytest.raises(ValueError):
        video.write_mp4(_clip(t=2), tmp_path / "x.mp4", fps=0)
