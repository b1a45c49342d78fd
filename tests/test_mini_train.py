"""The sixbit-mini training script on the CPU at toy size: it runs end to end, exports a pipeline that
loads with ``from_pretrained``, and a run split by ``--resume`` (with the cached pool) ends with exactly the
weights of the same run done in one go."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from sixbit.mini import train as T

TINY = [
    "--device",
    "cpu",
    "--seed",
    "3",
    "--vae-steps",
    "2",
    "--vae-batch",
    "1",
    "--vae-video-every",
    "2",
    "--vae-image-batch",
    "4",
    "--pool",
    "4",
    "--pool-batch",
    "2",
    "--batch",
    "2",
    "--object-weight",
    "4",
    "--warmup",
    "2",
    "--minutes",
    "30",
    "--reserve-seconds",
    "0",
    "--export-every",
    "0",
    "--log-every",
    "1",
    "--pool-cache",
]


def _weights(out):
    return load_file(str(out / "pipeline" / "transformer" / "diffusion_pytorch_model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(2)
    straight = tmp_path_factory.mktemp("straight")
    T.main(["--out", str(straight), "--dit-steps", "4", *TINY])
    split = tmp_path_factory.mktemp("split")
    T.main(["--out", str(split), "--dit-steps", "4", "--stop-after", "2", *TINY])
    first_meta = json.loads((split / "pipeline" / "training.json").read_text())
    T.main(["--out", str(split), "--dit-steps", "4", "--resume", *TINY])
    return straight, split, first_meta


def test_resumed_run_equals_the_straight_run(runs):
    straight, split, first_meta = runs
    assert first_meta["dit_steps"] == 2
    a, b = _weights(straight), _weights(split)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    log = json.loads((split / "train_log.json").read_text())
    assert any("loaded from" in e for e in log["events"]), "the resumed run should reuse the cached pool"
    assert [r["step"] for r in log["dit"]] == [0, 1, 2, 3]
    meta = json.loads((split / "pipeline" / "training.json").read_text())
    assert meta["dit_steps"] == 4 and meta["vae_steps"] == 2
    assert meta["wall_seconds"] > first_meta["wall_seconds"]  # both runs' time is counted


def test_export_loads_as_a_pipeline(runs):
    from diffusers import CogVideoXPipeline

    pipe = CogVideoXPipeline.from_pretrained(str(runs[0] / "pipeline"))
    assert pipe.transformer.dtype == torch.float32
    assert pipe.vae.config.scaling_factor != 1.0  # set from the encoded pool
    assert (runs[0] / "loss.png").exists()


def test_pool_cache_for_another_configuration_is_rebuilt(runs, tmp_path):
    straight = runs[0]
    c = torch.load(straight / "pool.pt", weights_only=False)
    c["key"] = {**c["key"], "seed": 99}
    torch.save(c, straight / "pool.pt")
    T.main(["--out", str(straight), "--dit-steps", "5", "--resume", *TINY])
    log = json.loads((straight / "train_log.json").read_text())
    assert any("rebuilding the pool" in e for e in log["events"])
