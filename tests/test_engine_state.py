"""State is per call: interruption, consecutive calls of other shapes, calls that die mid-run."""

from __future__ import annotations

import pytest
import torch

import sixbit
from sixbit import SixBitConfig
from sixbit.testing import generate, tiny_cogvideox_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def pipe():
    return tiny_cogvideox_pipeline(seed=0)


def test_step_callback_streams_and_interrupt_leaves_no_state(pipe):
    cfg = SixBitConfig.preset("aggressive", policy=None, tdc_mode="block", tdc_threshold=10.0, tdc_budget=10.0, tdc_first=1)
    handle = sixbit.apply(pipe, cfg)
    seen = []

    def on_step(trace, step):
        seen.append((step, len(trace["steps"])))
        if step == 2:
            pipe._interrupt = True

    generate(pipe, callback_on_step_end=handle.step_callback(on_step))
    assert seen == [(0, 1), (1, 2), (2, 3)]
    assert len(handle.trace.to_dict()["steps"]) == 3 and handle.trace.finished
    # a full run afterwards equals the same run on a fresh pipeline
    full = generate(pipe)
    fresh = tiny_cogvideox_pipeline(seed=0)
    sixbit.apply(fresh, cfg)
    assert torch.equal(full, generate(fresh))


_FRESH = """
import sys, torch, sixbit
torch.set_num_threads(1)
from sixbit import SixBitConfig
from sixbit.testing import generate, tiny_cogvideox_pipeline
kw = dict(num_frames=int(sys.argv[1]), height=int(sys.argv[2]), width=32, num_inference_steps=int(sys.argv[3]),
          seed=int(sys.argv[4]))
pipe = tiny_cogvideox_pipeline(seed=0)
sixbit.apply(pipe, SixBitConfig.preset("balanced", policy=None, tdc_mode="block", tdc_threshold=10.0, tdc_budget=10.0, tdc_first=1))
torch.save(generate(pipe, **kw), sys.argv[5])
"""


def test_consecutive_calls_of_different_shapes_equal_fresh_process_results(pipe, tmp_path):
    import subprocess
    import sys

    shapes = {"a": (9, 32, 6, 0), "b": (5, 48, 5, 1)}
    procs = {k: subprocess.Popen([sys.executable, "-c", _FRESH, *map(str, v), str(tmp_path / f"{k}.pt")])
             for k, v in shapes.items()}  # the fresh processes run while this one generates
    cfg = SixBitConfig.preset("balanced", policy=None, tdc_mode="block", tdc_threshold=10.0, tdc_budget=10.0, tdc_first=1)
    handle = sixbit.apply(pipe, cfg)

    def gen(k):
        f, h, n, seed = shapes[k]
        return generate(pipe, num_frames=f, height=h, width=32, num_inference_steps=n, seed=seed)

    a = gen("a")
    assert handle.trace.to_dict()["summary"]["skip_fraction"] > 0
    b = gen("b")
    # a call that dies mid-run (no end-of-call reset) must not leak into the next one either
    def explode(p, i, t, kw):
        if i == 2:
            raise RuntimeError("boom")
        return {}

    with pytest.raises(RuntimeError, match="boom"):
        generate(pipe, callback_on_step_end=explode)
    a2 = gen("a")
    assert len(handle.trace.to_dict()["steps"]) == 6
    for p in procs.values():
        assert p.wait(timeout=120) == 0
    assert torch.equal(a, torch.load(tmp_path / "a.pt"))
    assert torch.equal(b, torch.load(tmp_path / "b.pt"))
    assert torch.equal(a2, a)
