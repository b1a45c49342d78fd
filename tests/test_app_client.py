"""The app served in-process and driven over HTTP with gradio_client, as any API user would.

One short generation on the embedded sixbit-mini with the real engine: both videos arrive as mp4 files,
the heatmaps as plotly figures, the metrics table; an invalid request gets Gradio's error, and the
server keeps serving afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gradio_client import Client

import app
from sixbit.video import read_mp4

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # one_thread: see conftest


@pytest.fixture(scope="module")
def served():
    demo, controller = app.create_app(allow_hub=False, queue_size=4)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                **app.launch_kwargs())
    try:
        client = Client(demo.local_url, verbose=False, download_files=True)
        yield demo, controller, client
    finally:
        demo.close()
        controller.files.cleanup()


def _args(prompt, **kw):
    a = dict(model_text="", prompt=prompt, negative_prompt="", seed=3, steps=3, frames=9, resolution="32x32",
             guidance=5.0, preset="balanced")
    a.update(kw)
    return a


def test_api_lists_generate_with_every_input(served):
    _, controller, client = served
    info = client.view_api(print_info=False, return_format="dict")
    params = [p["parameter_name"] for p in info["named_endpoints"]["/generate"]["parameters"]]
    assert params[:9] == ["model_text", "prompt", "negative_prompt", "seed", "steps", "frames", "resolution",
                          "guidance", "preset"]
    assert params[9:] == [s.name for s in controller.specs]  # every Advanced field is a named API input


def test_generate_over_http(served):
    _, controller, client = served
    prompt = app.example_prompts(app.store().default_id)[0]
    job = client.submit(**_args(prompt), api_name="/generate")
    result = job.result(timeout=600)
    status, precision, skips, curves, base_video, six_video, table, path_info, trace_file = result
    assert 'data-state="done"' in status
    for v in (base_video, six_video):
        path = Path(v["video"] if isinstance(v, dict) else v)
        assert path.suffix == ".mp4" and read_mp4(path).shape[0] == 9
    for fig in (precision, skips, curves):
        assert fig["type"] == "plotly"
        plot = json.loads(fig["plot"])
        assert plot["data"], "figure has no traces"
    heat = json.loads(precision["plot"])["data"][0]
    assert heat["type"] == "heatmap" and len(heat["z"][0]) == 3
    rows = {r[0]: r[1:] for r in table["data"]}
    assert "PSNR vs baseline" in rows and "SSIM vs baseline" in rows and "speed-up (wall time)" in rows
    assert "cpu-reference" in path_info
    trace = json.loads(Path(trace_file).read_text())
    assert trace["version"] == 1 and len(trace["steps"]) == 3
    # streaming: the client saw intermediate updates before the final one
    assert len(job.outputs()) > 3


def test_invalid_request_errors_and_server_keeps_serving(served):
    from gradio_client.exceptions import AppError

    _, _, client = served
    prompt = app.example_prompts(app.store().default_id)[0]
    with pytest.raises(AppError, match="Please enter a prompt"):
        client.predict(**_args("   "), api_name="/generate")
    with pytest.raises(AppError, match="multiples of 8"):
        client.predict(**_args(prompt, resolution="30x30"), api_name="/generate")
    with pytest.raises(AppError, match="Unknown model"):
        client.predict(**_args(prompt, model_text="../../etc"), api_name="/generate")
    # still serving: a valid request succeeds, reusing the cached baseline of the earlier test
    status = client.predict(**_args(prompt, preset="aggressive"), api_name="/generate")[0]
    assert 'data-state="done"' in status and "(cached)" in status
