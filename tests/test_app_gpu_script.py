"""``python -m benchmarks app_gpu`` end to end at tiny size on the CPU: a saved random-weight folder,
``python app.py`` in its own process, two generations through gradio_client, the self-check measured alone.
Its numbers mean nothing here; the test keeps the GPU command runnable."""

from __future__ import annotations

import json

import pytest

from benchmarks import app_gpu

pytestmark = pytest.mark.slow


def test_the_script_drives_the_app_and_records_before_and_after(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as an operator starts the app
    out = tmp_path / "app_tiny"
    assert app_gpu.main(["--size", "tiny", "--folder", str(tmp_path / "folder"), "--out", str(out)]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    assert "Expected on this CPU" in res["page_expected"]
    assert [r["seed"] for r in res["runs"]] == [1, 2]
    for r in res["runs"]:
        assert r["before_run"].startswith("**Before the run**")
        assert 'data-state="done"' in r["status"] and r["compute_path"] == "cpu-reference"
        assert r["metrics"]["measured per-step speed-up"][1].endswith("×")
        assert "**Expected before the run:**" in r["path_info"]
    assert set(res["self_check"]) == {"first use (checks + compiles)", "checks only (kernels compiled)"}
    md = out.with_suffix(".md").read_text()
    assert "The page before any run" in md and "Self-check alone" in md
    assert (tmp_path / "app_tiny_server.log").exists()
