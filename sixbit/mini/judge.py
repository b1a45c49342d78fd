"""Prompt-adherence judge for sixbit-mini videos: classical computer vision, no learned parts.

``judge(video, prompt)`` reads a video (F, H, W, 3; uint8 or float in [0, 1]) and scores it against a
caption of the grammar in ``sixbit.mini.data``:

1. **Background model.** Per row y, the median colour over all frames and columns (objects cover a
   minority of any row over the clip), lightly smoothed in y: this models solid and vertical-gradient
   backgrounds alike. Its top and bottom rows name the background (nearest ``BG_COLOURS`` entry; a
   gradient when the two ends differ by more than ``GRADIENT_SPLIT``).
2. **Colour segmentation.** Foreground = pixels farther than ``FG_THRESHOLD`` (RGB distance, 0-255)
   from the background model of their row. Per frame, connected components of at least ``MIN_AREA``
   of the frame; each component's colour is the median of its interior (the mask eroded once, so that
   anti-aliased edges, which blend object and background, do not vote), mapped to the nearest
   ``SHAPE_COLOURS`` entry.
3. **Tracks.** Components are grouped across frames by colour name (the grammar never gives two
   objects one colour); per colour the largest component of each frame is kept. Tracks present in
   fewer than half of the frames are dropped.
4. **Shape.** Per frame, the contour's radius r(theta) around the centroid is expanded in angular
   harmonics; A_n = |sum (r - mean r) e^{i n theta}| / sum r. A sharp square has A_4 ~ 0.073 and
   A_3 ~ 0, an equilateral triangle A_3 ~ 0.141 and A_4 ~ 0, a circle neither. Medians over frames;
   triangle if A_3 >= ``MIN_A3`` and A_3 > A_4, else square if A_4 >= ``MIN_A4``, else circle. The
   thresholds are a third of a sharp shape's amplitude, so rounded (blurred) corners still count, as
   they would for a human viewer.
5. **Motion**, from the centroid, area and orientation tracks (fractions of the frame side):
   growing/shrinking when the area of the last frames over the first exceeds ``SCALE_RATIO`` (or its
   inverse); bouncing when the mid-clip centre lies ``BOUNCE_DROP`` below both ends; a direction of
   eight when the net displacement (a least-squares line through the track) exceeds ``MIN_TRAVEL``;
   rotating when the orientation (the 4th or 3rd angular harmonic of the contour radius, for squares
   and triangles) turns by more than ``MIN_ROTATION_DEG``; otherwise static.
6. **Scoring.** Prompt objects are matched to the n+1 largest tracks (n = objects in the prompt) by
   the assignment that agrees on the most attributes (a missing object scores 0 on every attribute).
   Each object earns colour, shape and motion points (0/1); ``adherence`` is their mean over objects.
   The background is scored separately, and ``all_correct`` requires every object attribute, the
   background, and no unprompted track of at least ``EXTRA_MASS`` of the matched tracks' mean mass.

Validated on ground-truth renders in tests/test_mini_judge.py and by ``python -m sixbit.mini.judge``.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

import cv2
import numpy as np

from .data import BG_COLOURS, DIRECTIONS, SHAPE_COLOURS, Prompt, parse_caption

FG_THRESHOLD = 55.0
GRADIENT_SPLIT = 55.0
MIN_AREA = 0.004
MIN_PRESENCE = 0.5
MIN_A3 = 0.141 / 3  # a third of a sharp triangle's 3rd harmonic
MIN_A4 = 0.073 / 3  # a third of a sharp square's 4th harmonic
SCALE_RATIO = 1.6
BOUNCE_DROP = 0.12
MIN_TRAVEL = 0.15
MIN_ROTATION_DEG = 20.0
EXTRA_MASS = 0.25
_SHAPE_RGB = np.array(list(SHAPE_COLOURS.values()), np.float32)
_BG_RGB = np.array(list(BG_COLOURS.values()), np.float32)
_SHAPE_NAMES = list(SHAPE_COLOURS)
_BG_NAMES = list(BG_COLOURS)


@dataclass
class Track:
    colour: str
    frames: list[int] = field(default_factory=list)
    cx: list[float] = field(default_factory=list)
    cy: list[float] = field(default_factory=list)
    area: list[float] = field(default_factory=list)
    a3: list[float] = field(default_factory=list)  # 3rd angular harmonic amplitude of the contour
    a4: list[float] = field(default_factory=list)  # 4th
    angle4: list[float] = field(default_factory=list)  # 4 x orientation (square harmonic), radians
    angle3: list[float] = field(default_factory=list)  # 3 x orientation (triangle harmonic), radians
    shape: str = ""
    motion: str = ""

    @property
    def mass(self) -> float:
        return float(sum(self.area))


def _as_float(video) -> np.ndarray:
    v = np.asarray(video)
    if v.dtype == np.uint8:
        return v.astype(np.float32)
    return np.clip(v.astype(np.float32), 0.0, 1.0) * 255.0


def background_model(v: np.ndarray) -> np.ndarray:
    """(H, 3) background colour per row: median over frames and columns, smoothed over 3 rows."""
    rows = np.median(v.transpose(1, 0, 2, 3).reshape(v.shape[1], -1, 3), axis=1)
    pad = np.concatenate([rows[:1], rows, rows[-1:]], 0)
    return (pad[:-2] + pad[1:-1] + pad[2:]) / 3.0


def classify_background(rows: np.ndarray) -> tuple[str, ...]:
    k = max(2, len(rows) // 16)
    top, bot = rows[:k].mean(0), rows[-k:].mean(0)

    def name(c):
        return _BG_NAMES[int(np.argmin(np.linalg.norm(_BG_RGB - c, axis=1)))]

    if np.linalg.norm(top - bot) > GRADIENT_SPLIT:
        return (name(top), name(bot))
    return (name(rows.mean(0)),)


def _harmonics(contour: np.ndarray, cx: float, cy: float) -> dict[int, complex]:
    """Normalised 3rd and 4th angular harmonics of the contour's radius around (cx, cy)."""
    p = contour.reshape(-1, 2).astype(np.float64)
    d = p - np.array([cx, cy], np.float64)
    rad = np.hypot(d[:, 0], d[:, 1])
    ang = np.arctan2(d[:, 1], d[:, 0])
    w = rad - rad.mean()
    tot = max(rad.sum(), 1e-9)
    return {n: complex(np.sum(w * np.exp(1j * n * ang)) / tot) for n in (3, 4)}


def extract_tracks(video) -> tuple[list[Track], tuple[str, ...]]:
    v = _as_float(video)
    F, H, W, _ = v.shape
    bg_rows = background_model(v)
    background = classify_background(bg_rows)
    dist = np.linalg.norm(v - bg_rows[None, :, None, :], axis=-1)
    fg = (dist > FG_THRESHOLD).astype(np.uint8)
    min_area = MIN_AREA * H * W
    kernel = np.ones((3, 3), np.uint8)
    tracks: dict[str, Track] = {}
    for f in range(F):
        n, labels, stats, cents = cv2.connectedComponentsWithStats(fg[f], connectivity=8)
        best: dict[str, tuple] = {}
        for i in range(1, n):
            area = stats[i, cv2.CC_STAT_AREA]
            if area < min_area:
                continue
            comp = (labels == i).astype(np.uint8)
            inner = cv2.erode(comp, kernel)
            sel = inner.astype(bool) if inner.sum() >= 4 else comp.astype(bool)
            col = np.median(v[f][sel], axis=0)
            cname = _SHAPE_NAMES[int(np.argmin(np.linalg.norm(_SHAPE_RGB - col, axis=1)))]
            if cname in best and best[cname][0] >= area:
                continue
            best[cname] = (area, comp, cents[i])
        for cname, (area, comp, cen) in best.items():
            contours, _ = cv2.findContours(comp, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
            cnt = max(contours, key=cv2.contourArea)
            h = _harmonics(cnt, cen[0], cen[1])
            t = tracks.setdefault(cname, Track(cname))
            t.frames.append(f)
            t.cx.append(float(cen[0]) / W)
            t.cy.append(float(cen[1]) / H)
            t.area.append(float(area) / (H * W))
            t.a3.append(abs(h[3]))
            t.a4.append(abs(h[4]))
            t.angle4.append(float(np.angle(h[4])))
            t.angle3.append(float(np.angle(h[3])))
    kept = [t for t in tracks.values() if len(t.frames) >= MIN_PRESENCE * F]
    for t in kept:
        t.shape = classify_shape(t)
        t.motion = classify_motion(t, F)
    kept.sort(key=lambda t: -t.mass)
    return kept, background


def classify_shape(t: Track) -> str:
    a3, a4 = float(np.median(t.a3)), float(np.median(t.a4))
    if a3 >= MIN_A3 and a3 > a4:
        return "triangle"
    if a4 >= MIN_A4:
        return "square"
    return "circle"


def _turn_deg(angles: list[float], n: int) -> float:
    un = np.unwrap(np.asarray(angles, np.float64))
    return float(np.rad2deg(un[-1] - un[0]) / n) if len(un) > 1 else 0.0


def classify_motion(t: Track, num_frames: int) -> str:
    fr = np.asarray(t.frames, np.float64)
    cx, cy, area = (np.asarray(a, np.float64) for a in (t.cx, t.cy, t.area))
    k = max(2, len(fr) // 5)
    a0, a1 = area[:k].mean(), area[-k:].mean()
    if a1 > SCALE_RATIO * a0:
        return "growing"
    if a0 > SCALE_RATIO * a1:
        return "shrinking"
    u = fr / max(num_frames - 1, 1)
    mid = np.abs(u - 0.5) <= 0.15
    if mid.any():
        ends = (cy[:k].mean() + cy[-k:].mean()) / 2
        drop = cy[mid].mean() - ends
        if (drop > BOUNCE_DROP and abs(cy[:k].mean() - cy[-k:].mean()) < BOUNCE_DROP
                and abs(cx[-k:].mean() - cx[:k].mean()) < MIN_TRAVEL):
            return "bouncing"
    if len(u) >= 2 and np.ptp(u) > 0:
        dx = np.polyfit(u, cx, 1)[0]
        dy = np.polyfit(u, cy, 1)[0]
        if np.hypot(dx, dy) > MIN_TRAVEL:
            ang = np.rad2deg(np.arctan2(-dy, dx)) % 360.0
            sector = int(((ang + 22.5) % 360.0) // 45.0)
            name = ("right", "up-right", "up", "up-left", "left", "down-left", "down", "down-right")[sector]
            assert name in DIRECTIONS
            return f"moving {name}"
    if t.shape in ("square", "triangle"):
        n = 4 if t.shape == "square" else 3
        turn = _turn_deg(t.angle4 if n == 4 else t.angle3, n)
        if abs(turn) > MIN_ROTATION_DEG:
            return "rotating"
    return "static"


@dataclass
class Verdict:
    prompt: str
    adherence: float  # mean over prompt objects of (colour, shape, motion) points
    colour: float
    shape: float
    motion: float
    background: float
    all_correct: bool
    extra_objects: int  # unprompted tracks with >= EXTRA_MASS of the matched tracks' mean mass
    objects: list[dict]
    detected: list[dict]
    detected_background: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _score(obj, track) -> tuple[int, int, int]:
    if track is None:
        return (0, 0, 0)
    c, s, m = obj
    return (int(track.colour == c), int(track.shape == s), int(track.motion == m))


def judge(video, prompt: str | Prompt) -> Verdict:
    """Score one video against its caption."""
    p = parse_caption(prompt) if isinstance(prompt, str) else prompt
    tracks, background = extract_tracks(video)
    n = len(p.objects)
    cands = tracks[: n + 1]
    best, best_assign = None, None
    slots = cands + [None] * n
    for assign in itertools.permutations(range(len(slots)), n):
        chosen = [slots[i] for i in assign]
        if any(a is not None and chosen.count(a) > 1 for a in chosen):
            continue
        pts = [_score(o, t) for o, t in zip(p.objects, chosen)]
        tot = sum(map(sum, pts))
        if best is None or tot > sum(map(sum, best)):
            best, best_assign = pts, chosen
    pts = np.array(best, np.float64)
    per_obj = [
        dict(prompt=dict(colour=o[0], shape=o[1], motion=o[2]),
             found=None if t is None else dict(colour=t.colour, shape=t.shape, motion=t.motion),
             points=list(map(int, pt)))
        for o, t, pt in zip(p.objects, best_assign, best)
    ]
    bg_ok = float(tuple(background) == tuple(p.background))
    matched = [t for t in best_assign if t is not None]
    ref = np.mean([t.mass for t in matched]) if matched else 0.0
    extra = [t for t in tracks if all(t is not m for m in matched) and t.mass >= EXTRA_MASS * ref]
    col, shp, mot = pts.mean(0)
    return Verdict(
        prompt=prompt if isinstance(prompt, str) else "",
        adherence=float(pts.mean()),
        colour=float(col), shape=float(shp), motion=float(mot), background=bg_ok,
        all_correct=bool(pts.all() and bg_ok and not extra),
        extra_objects=len(extra),
        objects=per_obj,
        detected=[dict(colour=t.colour, shape=t.shape, motion=t.motion, frames=len(t.frames)) for t in tracks],
        detected_background=tuple(background),
    )


def summarize(verdicts: list[Verdict]) -> dict:
    """Mean scores over a list of verdicts."""
    if not verdicts:
        return {}
    return {
        "n": len(verdicts),
        "adherence": float(np.mean([v.adherence for v in verdicts])),
        "colour": float(np.mean([v.colour for v in verdicts])),
        "shape": float(np.mean([v.shape for v in verdicts])),
        "motion": float(np.mean([v.motion for v in verdicts])),
        "background": float(np.mean([v.background for v in verdicts])),
        "all_correct": float(np.mean([v.all_correct for v in verdicts])),
    }


def validate_on_ground_truth(n: int = 400, seed: int = 0, num_frames: int = 17, size: int = 64,
                             split: str = "any", shuffled: bool = False, blur: float = 0.0) -> tuple[dict, list[Verdict]]:
    """Judge n ground-truth renders against their own captions (or, with shuffled=True, against the
    caption of another clip: a negative control that should score low). blur > 0: Gaussian-blur every
    frame with that sigma (pixels) first, a robustness check for soft generated edges."""
    from .data import render, sample_scenes, to_uint8

    rng = np.random.default_rng(seed)
    sc = sample_scenes(rng, n, split=split)
    caps = sc.captions()
    if shuffled:
        caps = caps[1:] + caps[:1]
    verdicts = []
    for i0 in range(0, n, 64):
        vids = render(sc.subset(np.arange(i0, min(n, i0 + 64))), num_frames, size)
        for j in range(vids.shape[0]):
            v = to_uint8(vids[j])
            if blur > 0:
                v = np.stack([cv2.GaussianBlur(f, (0, 0), blur) for f in v])
            verdicts.append(judge(v, caps[i0 + j]))
    return summarize(verdicts), verdicts


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description="validate the judge on ground-truth synthetic videos")
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    summary, vs = validate_on_ground_truth(a.n, a.seed, a.frames, a.size)
    neg, _ = validate_on_ground_truth(a.n, a.seed, a.frames, a.size, shuffled=True)
    soft, _ = validate_on_ground_truth(a.n, a.seed, a.frames, a.size, blur=1.2)
    held, _ = validate_on_ground_truth(a.n // 4, a.seed, a.frames, a.size, split="held_out")
    print(json.dumps({"matching_captions": summary, "held_out_captions": held, "blurred_sigma_1.2": soft,
                      "shuffled_captions": neg}, indent=1))
    for v in vs:
        if not v.all_correct:
            print(v.prompt, "->", v.detected, v.detected_background)
