"""The app as an operator runs it: ``python app.py`` in its own process, stopped with SIGTERM (issue 16,
items 11 and 12). Its log holds no third-party start-up noise, a refused input is one line without a
traceback, and the app's temporary folder is gone after SIGTERM (docker stop, a Space restart)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOISE = ("Failed to load", "register_constant", "Unable to import `torchao`", "Loading pipeline components",
         "Loading weights", "Traceback")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_clean_log_and_no_temp_files_after_sigterm(tmp_path):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    port = _free_port()
    env = {**os.environ, "TMPDIR": str(tmp_path), "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
           "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)  # as an operator starts it
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, err_path.read_text()
            time.sleep(1)
        else:
            pytest.fail("the app did not come up:\n" + err_path.read_text())
        assert [p.name for p in tmp_path.glob("sixbit-app-*")], "the app's temp folder should exist while it runs"
        client = Client(url, verbose=False)
        with pytest.raises(AppError, match="Steps must be between 1 and 100"):
            client.predict(model_text="", prompt="a red circle", negative_prompt="", seed=1, steps=0, frames=9,
                           resolution="32x32", guidance=3.0, preset="balanced", api_name="/generate")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = err_path.read_text()
    assert not [n for n in NOISE if n in log], log
    lines = log.strip().splitlines()  # the whole log: the one refused input
    assert len(lines) == 1 and "sixbit.app INFO refused input: Steps must be between 1 and 100" in lines[0], log
    assert not list(tmp_path.glob("sixbit-app-*")), "the app's temp folder survived SIGTERM"
