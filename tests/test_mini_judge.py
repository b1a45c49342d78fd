"""sixbit-mini data grammar and the classical-CV adherence judge, on ground-truth renders."""

import numpy as np
import pytest
import torch

from sixbit.mini import data as D
from sixbit.mini import judge as J
from sixbit.mini.model import MAX_TEXT_LEN


def test_captions_parse_back_and_fit_the_text_length():
    sc = D.sample_scenes(np.random.default_rng(0), 500, split="any")
    for i, cap in enumerate(sc.captions()):
        p = D.parse_caption(cap)
        assert len(p.objects) == sc.n_obj[i]
        assert p.objects[0] == (D.COLOUR_NAMES[sc.colour[i, 0]], D.SHAPES[sc.shape[i, 0]], D.MOTIONS[sc.motion[i, 0]])
        assert p.background == D.BACKGROUNDS[sc.bg[i]]
        assert len(cap.encode()) + 1 <= MAX_TEXT_LEN  # ByT5 bytes + </s>
    assert D.max_caption_bytes() + 1 <= MAX_TEXT_LEN
    with pytest.raises(ValueError):
        D.parse_caption("a red dragon flying on a blue background")


def test_held_out_pairs_split_cleanly():
    held = set(D.HELD_OUT)
    train = D.sample_scenes(np.random.default_rng(1), 3000, split="train")
    for i in range(len(train)):
        for k in range(train.n_obj[i]):
            assert (D.COLOUR_NAMES[train.colour[i, k]], D.MOTIONS[train.motion[i, k]]) not in held
    ho = D.sample_scenes(np.random.default_rng(2), 200, split="held_out")
    assert all(n == 1 for n in ho.n_obj)
    assert {(D.COLOUR_NAMES[c], D.MOTIONS[m]) for c, m in zip(ho.colour[:, 0], ho.motion[:, 0])} == held


def test_sampling_and_rendering_are_seeded_and_in_range():
    a = D.sample_scenes(np.random.default_rng(3), 16)
    b = D.sample_scenes(np.random.default_rng(3), 16)
    assert a.captions() == b.captions()
    va, alpha = D.render(a, 17, 64, return_alpha=True)
    vb = D.render(b, 17, 64)
    assert va.shape == (16, 3, 17, 64, 64)
    assert torch.equal(va, vb)
    assert va.min() >= -1 and va.max() <= 1
    # objects stay inside the frame: nothing drawn on the outermost pixel ring
    ring = torch.cat([alpha[..., 0, :], alpha[..., -1, :], alpha[..., :, 0], alpha[..., :, -1]], -1)
    assert ring.max() < 0.5
    # two-object scenes never overlap
    two = np.flatnonzero(a.n_obj == 2)
    assert D._separated(a.subset(two)).all()


def test_judge_scores_ground_truth_at_least_95_percent():
    summary, verdicts = J.validate_on_ground_truth(n=100, seed=1)
    assert summary["all_correct"] >= 0.95, [v.prompt for v in verdicts if not v.all_correct]
    assert summary["adherence"] >= 0.98
    held, _ = J.validate_on_ground_truth(n=28, seed=2, split="held_out")
    assert held["all_correct"] >= 0.95


def test_judge_rejects_mismatched_captions():
    """Negative control: each clip judged against another clip's caption scores near chance."""
    summary, _ = J.validate_on_ground_truth(n=50, seed=4, shuffled=True)
    assert summary["all_correct"] <= 0.05
    assert summary["adherence"] < 0.5


def test_judge_attribute_errors_are_detected():
    rng = np.random.default_rng(5)
    sc = D.sample_scenes(rng, 1, split="train", p_two=0.0)
    vid = D.to_uint8(D.render(sc, 17, 64)[0])
    c, s, m = D.parse_caption(sc.captions()[0]).objects[0]
    bg = D.bg_phrase(D.BACKGROUNDS[sc.bg[0]])
    other_c = next(x for x in D.COLOUR_NAMES if x != c)
    other_s = next(x for x in D.SHAPES if x != s)
    other_m = next(x for x in D.MOTIONS if x != m)
    assert J.judge(vid, f"a {c} {s} {m} on a {bg}").all_correct
    assert J.judge(vid, f"a {other_c} {s} {m} on a {bg}").colour == 0
    assert J.judge(vid, f"a {c} {other_s} {m} on a {bg}").shape == 0
    assert J.judge(vid, f"a {c} {s} {other_m} on a {bg}").motion == 0
    # an empty (background-only) video finds no object
    blank = np.repeat(vid[:, :1, :1], 64, 1).repeat(64, 2)
    v = J.judge(blank, f"a {c} {s} {m} on a {bg}")
    assert v.adherence == 0 and not v.all_correct
