"""Procedural, seeded synthetic videos and their captions: the training data of sixbit-mini.

A *scene* is one or two coloured shapes over a solid or vertical-gradient background. Every object has
a shape (circle, square, triangle), a colour and one motion:

    moving left | right | up | down | up-left | up-right | down-left | down-right   (straight lines)
    bouncing     falls to a floor at mid-clip and rises back (a parabola in y)
    growing / shrinking   the size changes ~2.3x in radius, the centre stays
    rotating     turns ~70 degrees in place (squares and triangles only: a turning circle is invisible)

Captions follow one grammar, for example

    "a red circle moving left on a blue background"
    "a white square rotating and a yellow triangle bouncing on a black to gray gradient"

``parse_caption`` inverts it exactly (the judge scores videos against the parsed prompt).

Held-out combinations: ``HELD_OUT`` lists colour x motion pairs that the training sampler never emits
(in any object of any scene). ``sample_scenes(..., split="held_out")`` draws scenes whose objects use
only those pairs, to test generalisation.

Everything is vectorised: ``sample_scenes`` draws the discrete choices and continuous parameters for a
whole batch with numpy, ``trajectories`` turns them into per-frame centre/size/angle arrays, and
``render`` draws them with anti-aliased signed distance functions in torch (on any device), so a GPU
can render thousands of clips per second. Pixel values are RGB in [-1, 1], shape (B, 3, F, H, W).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch

SHAPES = ("circle", "square", "triangle")
SHAPE_COLOURS = {
    "red": (220, 40, 40),
    "yellow": (240, 215, 40),
    "green": (40, 190, 70),
    "cyan": (40, 210, 220),
    "blue": (50, 90, 235),
    "purple": (165, 60, 220),
    "white": (245, 245, 245),
}
BG_COLOURS = {
    "black": (12, 12, 16),
    "gray": (120, 120, 120),
    "white": (235, 235, 235),
    "blue": (25, 40, 130),
    "green": (25, 95, 45),
    "red": (130, 25, 30),
    "purple": (75, 30, 105),
}
DIRECTIONS = ("left", "right", "up", "down", "up-left", "up-right", "down-left", "down-right")
MOTIONS = tuple(f"moving {d}" for d in DIRECTIONS) + ("bouncing", "growing", "shrinking", "rotating")
# unit direction vectors in image coordinates (x right, y down)
_DIR_VEC = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
    "up-left": (-0.75, -0.75),
    "up-right": (0.75, -0.75),
    "down-left": (-0.75, 0.75),
    "down-right": (0.75, 0.75),
}
# colour x motion pairs never seen in training (one per colour)
HELD_OUT = (
    ("red", "moving up-left"),
    ("yellow", "moving right"),
    ("green", "moving down"),
    ("cyan", "rotating"),
    ("blue", "growing"),
    ("purple", "bouncing"),
    ("white", "moving left"),
)

COLOUR_NAMES = tuple(SHAPE_COLOURS)
BG_NAMES = tuple(BG_COLOURS)
_SHAPE_RGB = np.array(list(SHAPE_COLOURS.values()), dtype=np.float32)
_BG_RGB = np.array(list(BG_COLOURS.values()), dtype=np.float32)
MIN_CONTRAST = 100.0  # min RGB distance between an object colour and any colour of its background
GRADIENT_MIN_SPAN = 110.0  # min RGB distance between the two ends of a gradient


def _rgb_dist(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float32) - np.asarray(b, np.float32)))


def _bg_ok(colour: str, bg: tuple[str, ...]) -> bool:
    """An object colour may sit on a background if it is not named like it and contrasts with all of it."""
    if colour in bg:
        return False
    rgb = SHAPE_COLOURS[colour]
    if len(bg) == 1:
        return _rgb_dist(rgb, BG_COLOURS[bg[0]]) >= MIN_CONTRAST
    lo, hi = np.array(BG_COLOURS[bg[0]], np.float32), np.array(BG_COLOURS[bg[1]], np.float32)
    return all(_rgb_dist(rgb, lo + (hi - lo) * u) >= MIN_CONTRAST for u in np.linspace(0, 1, 11))


# every background: ("black",) is solid, ("black", "white") a vertical gradient, top to bottom
BACKGROUNDS: tuple[tuple[str, ...], ...] = tuple((b,) for b in BG_NAMES) + tuple(
    (a, b) for a in BG_NAMES for b in BG_NAMES if a != b and _rgb_dist(BG_COLOURS[a], BG_COLOURS[b]) >= GRADIENT_MIN_SPAN
)
_SOLID_IDX = np.array([i for i, b in enumerate(BACKGROUNDS) if len(b) == 1])
_GRAD_IDX = np.array([i for i, b in enumerate(BACKGROUNDS) if len(b) == 2])
# allowed[c, b]: colour c may be drawn on background b
_ALLOWED = np.array([[_bg_ok(c, b) for b in BACKGROUNDS] for c in COLOUR_NAMES])
_HELD = np.zeros((len(COLOUR_NAMES), len(MOTIONS)), dtype=bool)
for _c, _m in HELD_OUT:
    _HELD[COLOUR_NAMES.index(_c), MOTIONS.index(_m)] = True

# sizes as fractions of the frame side; r is the radius of the circle of equal area
R_RANGE = (0.10, 0.15)
R_GROW = (0.07, 0.16)
TRAVEL = (0.34, 0.46)  # straight-line travel over the clip (diagonals: 0.75 of it per axis)
TWO_OBJECT_TRAVEL = 0.75  # travel and bounce height are scaled by this in two-object scenes
BOUNCE = (0.30, 0.42)  # fall height of a bounce
ROTATION_DEG = 70.0
_EXTENT = np.array([1.0, 1.26, 1.56], dtype=np.float32)  # farthest boundary point / r, per shape
SQUARE_HALF = 0.886  # half side / r  (equal area to the circle)
TRIANGLE_CIRCUM = 1.555  # circumradius / r (equal area to the circle)


@dataclass
class Scenes:
    """A batch of scenes: discrete choices and continuous parameters (numpy arrays, object axis = 2)."""

    n_obj: np.ndarray  # (B,) 1 or 2
    colour: np.ndarray  # (B, 2) index into COLOUR_NAMES
    shape: np.ndarray  # (B, 2) index into SHAPES
    motion: np.ndarray  # (B, 2) index into MOTIONS
    bg: np.ndarray  # (B,) index into BACKGROUNDS
    r: np.ndarray  # (B, 2) base radius (fraction of the side)
    start: np.ndarray  # (B, 2, 2) start centre (x, y), fraction of the side
    amount: np.ndarray  # (B, 2) travel / bounce height (fraction), rotation sign
    theta0: np.ndarray  # (B, 2) initial angle, radians

    def __len__(self) -> int:
        return len(self.n_obj)

    def subset(self, idx) -> Scenes:
        return Scenes(**{k: getattr(self, k)[idx] for k in self.__dataclass_fields__})

    def captions(self) -> list[str]:
        return [caption_of(self, i) for i in range(len(self))]


def caption_of(sc: Scenes, i: int) -> str:
    parts = [
        f"a {COLOUR_NAMES[sc.colour[i, k]]} {SHAPES[sc.shape[i, k]]} {MOTIONS[sc.motion[i, k]]}"
        for k in range(int(sc.n_obj[i]))
    ]
    return " and ".join(parts) + " on a " + bg_phrase(BACKGROUNDS[sc.bg[i]])


def bg_phrase(bg: tuple[str, ...]) -> str:
    return f"{bg[0]} background" if len(bg) == 1 else f"{bg[0]} to {bg[1]} gradient"


_OBJ_RE = r"a (" + "|".join(COLOUR_NAMES) + r") (" + "|".join(SHAPES) + r") (" + "|".join(MOTIONS) + r")"
_BG_RE = r"(?:(" + "|".join(BG_NAMES) + r") background|(" + "|".join(BG_NAMES) + r") to (" + "|".join(BG_NAMES) + r") gradient)"
_CAPTION_RE = re.compile(r"^" + _OBJ_RE + r"(?: and " + _OBJ_RE + r")? on a " + _BG_RE + r"$")


@dataclass(frozen=True)
class Prompt:
    """A parsed caption: objects as (colour, shape, motion) triples and the background."""

    objects: tuple[tuple[str, str, str], ...]
    background: tuple[str, ...]


def parse_caption(text: str) -> Prompt:
    m = _CAPTION_RE.match(text.strip().lower())
    if m is None:
        raise ValueError(f"not in the sixbit-mini caption grammar: {text!r}")
    g = m.groups()
    objs = [g[0:3]] + ([g[3:6]] if g[3] else [])
    bg = (g[6],) if g[6] else (g[7], g[8])
    return Prompt(objects=tuple(tuple(o) for o in objs), background=bg)


def max_caption_bytes() -> int:
    """Length in bytes of the longest caption the grammar can produce."""
    obj = max(len(c) for c in COLOUR_NAMES) + max(len(s) for s in SHAPES) + max(len(m) for m in MOTIONS) + 4
    bg = max(len(bg_phrase(b)) for b in BACKGROUNDS)
    return 2 * obj + len(" and ") + len(" on a ") + bg


# ---------------------------------------------------------------------------------------------------
# sampling


def sample_scenes(rng: np.random.Generator, n: int, split: str = "train", p_two: float = 0.3) -> Scenes:
    """Draw n scenes. split: "train" (never a HELD_OUT pair), "held_out" (one object, a HELD_OUT pair),
    or "any" (no restriction)."""
    if split not in ("train", "held_out", "any"):
        raise ValueError(split)
    n_obj = np.where(rng.random(n) < (0.0 if split == "held_out" else p_two), 2, 1)
    colour = np.zeros((n, 2), np.int64)
    shape = np.zeros((n, 2), np.int64)
    motion = np.zeros((n, 2), np.int64)
    bg = np.zeros(n, np.int64)
    r = np.zeros((n, 2), np.float32)
    start = np.zeros((n, 2, 2), np.float32)
    amount = np.zeros((n, 2), np.float32)
    theta0 = np.zeros((n, 2), np.float32)
    todo = np.arange(n)
    for _ in range(5000):
        if len(todo) == 0:
            break
        m = len(todo)
        solid = rng.random(m) < 0.7
        bg_t = np.where(solid, rng.choice(_SOLID_IDX, m), rng.choice(_GRAD_IDX, m))
        col_t = rng.integers(0, len(COLOUR_NAMES), (m, 2))
        shp_t = rng.integers(0, len(SHAPES), (m, 2))
        mot_t = rng.integers(0, len(MOTIONS), (m, 2))
        if split == "held_out":
            pair = rng.integers(0, len(HELD_OUT), m)
            col_t[:, 0] = [COLOUR_NAMES.index(HELD_OUT[p][0]) for p in pair]
            mot_t[:, 0] = [MOTIONS.index(HELD_OUT[p][1]) for p in pair]
        rot = MOTIONS.index("rotating")
        shp_t = np.where((mot_t == rot) & (shp_t == 0), rng.integers(1, 3, (m, 2)), shp_t)
        r_t = rng.uniform(*R_RANGE, (m, 2)).astype(np.float32)
        amt = np.where(
            mot_t < 8,
            rng.uniform(*TRAVEL, (m, 2)) * np.where(n_obj[todo] == 2, TWO_OBJECT_TRAVEL, 1.0)[:, None],
            np.where(mot_t == MOTIONS.index("bouncing"), rng.uniform(*BOUNCE, (m, 2)) * np.where(n_obj[todo] == 2, TWO_OBJECT_TRAVEL, 1.0)[:, None], rng.choice([-1.0, 1.0], (m, 2))),
        ).astype(np.float32)
        th = rng.uniform(0, 2 * np.pi, (m, 2)).astype(np.float32)
        # start positions: uniform over the region that keeps the whole path inside the frame
        lo, hi = _path_box(shp_t, mot_t, r_t, amt)
        u = rng.random((m, 2, 2)).astype(np.float32)
        st = lo + (hi - lo) * u
        sc = Scenes(n_obj[todo], col_t, shp_t, mot_t, bg_t, r_t, st, amt, th)
        two = n_obj[todo] == 2
        box_ok = np.all(hi >= lo, axis=2)  # (m, 2)
        ok = box_ok[:, 0] & (~two | box_ok[:, 1])
        ok &= _ALLOWED[col_t[:, 0], bg_t]
        ok &= ~two | (_ALLOWED[col_t[:, 1], bg_t] & (col_t[:, 0] != col_t[:, 1]))
        if split == "train":
            ok &= ~_HELD[col_t[:, 0], mot_t[:, 0]] & (~two | ~_HELD[col_t[:, 1], mot_t[:, 1]])
        elif split == "held_out":
            ok &= _HELD[col_t[:, 0], mot_t[:, 0]]
        ok &= ~two | _separated(sc)
        done = todo[ok]
        for dst, src in ((colour, col_t), (shape, shp_t), (motion, mot_t), (r, r_t), (start, st),
                         (amount, amt), (theta0, th)):
            dst[done] = src[ok]
        bg[done] = bg_t[ok]
        todo = todo[~ok]
    if len(todo):
        raise RuntimeError("scene sampling did not converge")
    # unused second-object slots: zero them so that captions and renders ignore them deterministically
    one = n_obj == 1
    for a in (colour, shape, motion):
        a[one, 1] = 0
    r[one, 1] = 0
    return Scenes(n_obj, colour, shape, motion, bg, r, start, amount, theta0)


def _path_box(shape, motion, r, amount):
    """Per object, the box (lo, hi) of allowed start centres (fractions) so the path stays in frame."""
    ext = _EXTENT[shape] * r
    grow = (motion == MOTIONS.index("growing")) | (motion == MOTIONS.index("shrinking"))
    ext = np.where(grow, _EXTENT[shape] * R_GROW[1], ext) + 0.02
    lo = np.stack([ext, ext], -1)
    hi = 1.0 - lo
    dx = np.zeros_like(r)
    dy = np.zeros_like(r)
    for j, d in enumerate(DIRECTIONS):
        sel = motion == j
        dx = np.where(sel, _DIR_VEC[d][0] * amount, dx)
        dy = np.where(sel, _DIR_VEC[d][1] * amount, dy)
    bounce = motion == MOTIONS.index("bouncing")
    dy = np.where(bounce, amount, dy)  # the start is the top; the floor is start + amount
    d = np.stack([dx, dy], -1)
    lo = lo - np.minimum(d, 0)
    hi = hi - np.maximum(d, 0)
    return lo.astype(np.float32), hi.astype(np.float32)


def trajectories(sc: Scenes, num_frames: int):
    """Per-frame centre x, y, radius r (fractions of the side) and angle (radians): each (B, 2, F)."""
    u = np.linspace(0.0, 1.0, num_frames, dtype=np.float32)[None, None, :]
    mot = sc.motion[..., None]
    x = np.repeat(sc.start[..., 0:1], num_frames, -1)
    y = np.repeat(sc.start[..., 1:2], num_frames, -1)
    r = np.repeat(sc.r[..., None], num_frames, -1)
    th = np.repeat(sc.theta0[..., None], num_frames, -1)
    amt = sc.amount[..., None]
    for j, d in enumerate(DIRECTIONS):
        sel = mot == j
        x = np.where(sel, x + _DIR_VEC[d][0] * amt * u, x)
        y = np.where(sel, y + _DIR_VEC[d][1] * amt * u, y)
    b = mot == MOTIONS.index("bouncing")
    y = np.where(b, y + amt * (1.0 - (2.0 * u - 1.0) ** 2), y)
    g = mot == MOTIONS.index("growing")
    s = mot == MOTIONS.index("shrinking")
    r = np.where(g, R_GROW[0] + (R_GROW[1] - R_GROW[0]) * u, r)
    r = np.where(s, R_GROW[1] + (R_GROW[0] - R_GROW[1]) * u, r)
    rot = mot == MOTIONS.index("rotating")
    th = np.where(rot, th + np.deg2rad(ROTATION_DEG) * amt * u, th)
    return x.astype(np.float32), y.astype(np.float32), r.astype(np.float32), th.astype(np.float32)


def _separated(sc: Scenes, num_frames: int = 17) -> np.ndarray:
    """True where the two objects never come closer than their extents plus a margin."""
    x, y, r, _ = trajectories(sc, num_frames)
    ext = _EXTENT[sc.shape][..., None] * r
    dist = np.hypot(x[:, 0] - x[:, 1], y[:, 0] - y[:, 1])
    return np.all(dist >= ext[:, 0] + ext[:, 1] + 0.05, axis=-1)


# ---------------------------------------------------------------------------------------------------
# rendering


def render(sc: Scenes, num_frames: int = 17, size: int = 64, device="cpu", return_alpha: bool = False):
    """Draw the scenes: float tensor (B, 3, F, H, W) in [-1, 1] on ``device`` (and the object coverage
    (B, F, H, W) in [0, 1] if return_alpha)."""
    dev = torch.device(device)
    x, y, r, th = (torch.from_numpy(a).to(dev) * (size if i < 3 else 1.0) for i, a in enumerate(trajectories(sc, num_frames)))
    B = len(sc)
    pix = torch.arange(size, device=dev, dtype=torch.float32) + 0.5
    py = pix.view(1, 1, 1, size, 1)
    px = pix.view(1, 1, 1, 1, size)
    dx = px - x[..., None, None]  # (B, 2, F, H, W)
    dy = py - y[..., None, None]
    c, s = torch.cos(th)[..., None, None], torch.sin(th)[..., None, None]
    qx = c * dx + s * dy
    qy = -s * dx + c * dy
    rr = r[..., None, None]
    sdf_circle = torch.sqrt(dx * dx + dy * dy) - rr
    sdf_square = torch.maximum(qx.abs(), qy.abs()) - SQUARE_HALF * rr
    R = TRIANGLE_CIRCUM * rr
    sdf_tri = None
    for k in range(3):  # edge normals of an apex-up triangle at angle 0 (y points down)
        a = np.pi / 2 + k * 2 * np.pi / 3
        e = qx * float(np.cos(a)) + qy * float(np.sin(a))
        sdf_tri = e if sdf_tri is None else torch.maximum(sdf_tri, e)
    sdf_tri = sdf_tri - 0.5 * R
    shp = torch.from_numpy(sc.shape).to(dev).view(B, 2, 1, 1, 1)
    sdf = torch.where(shp == 0, sdf_circle, torch.where(shp == 1, sdf_square, sdf_tri))
    alpha = (0.5 - sdf).clamp(0.0, 1.0)
    present = torch.from_numpy(np.arange(2)[None, :] < sc.n_obj[:, None]).to(dev).view(B, 2, 1, 1, 1)
    alpha = alpha * present
    # background: vertical gradient (solid = both ends equal)
    top = np.stack([_BG_RGB[BG_NAMES.index(BACKGROUNDS[b][0])] for b in sc.bg])
    bot = np.stack([_BG_RGB[BG_NAMES.index(BACKGROUNDS[b][-1])] for b in sc.bg])
    top_t = torch.from_numpy(top).to(dev).view(B, 3, 1, 1, 1)
    bot_t = torch.from_numpy(bot).to(dev).view(B, 3, 1, 1, 1)
    v = ((pix - 0.5) / (size - 1)).view(1, 1, 1, size, 1)
    img = (top_t + (bot_t - top_t) * v).expand(B, 3, num_frames, size, size)
    for k in range(2):
        col = torch.from_numpy(_SHAPE_RGB[sc.colour[:, k]]).to(dev).view(B, 3, 1, 1, 1)
        a = alpha[:, k].unsqueeze(1)
        img = img * (1 - a) + col * a
    img = img / 127.5 - 1.0
    if return_alpha:
        return img, alpha.amax(1)
    return img


def to_uint8(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) in [-1, 1] -> (F, H, W, 3) uint8."""
    v = ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return v.permute(1, 2, 3, 0).cpu().numpy()


def prompt_set(seed: int, n: int, split: str = "train") -> list[str]:
    """n distinct captions drawn with a fixed seed (the evaluation prompt sets)."""
    rng = np.random.default_rng(seed)
    out: list[str] = []
    while len(out) < n:
        for c in sample_scenes(rng, 4 * n, split=split).captions():
            if c not in out and len(out) < n:
                out.append(c)
    return out
