"""End to end in a real browser: Playwright drives Debian's Chromium against the app served in-process.

Checks the page a new user meets (the CPU note near the top, the prompt's token limit, whole example
prompts, an Advanced panel whose empty τ/ρ stay empty and which offers no Triton backend on a CPU), types a
prompt, clicks Generate with the Advanced panel open, waits until both videos play, checks the heatmaps
(one label per block, layer names in the hover) and that the metrics table shows every row, then submits a
round of invalid inputs and sees each refused with its field named, user text shown as text. Screenshots go to test-artifacts/; the one of the
finished run is copied to docs/screenshot.png (shown in the README) when that file is missing or
``SIXBIT_UPDATE_SCREENSHOT=1`` — so an ordinary test run does not rewrite a tracked file.

No browser is ever downloaded: the test uses /usr/bin/chromium (``apt-get install chromium``; .ci/run
installs it). It skips only where that binary is absent and CI is not "true"; under CI=true it runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import app

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("one_thread")]  # see conftest

if not Path(CHROMIUM).exists() and os.environ.get("CI") != "true":
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium); runs under CI=true",
                allow_module_level=True)


@pytest.fixture(scope="module")
def url():
    demo, controller = app.create_app(allow_hub=False, queue_size=4)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=None, quiet=True,
                **app.launch_kwargs())
    try:
        yield demo.local_url
    finally:
        demo.close()
        controller.files.cleanup()


@pytest.fixture(scope="module")
def page(url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--autoplay-policy=no-user-gesture-required"],
        )
        ctx = browser.new_context(viewport={"width": 1440, "height": 1400})
        pg = ctx.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(url, wait_until="domcontentloaded")
        pg.wait_for_selector("#generate", timeout=60_000)
        pg.js_errors = errors
        yield pg
        ctx.close()
        browser.close()


def _set_small(page):
    """Fewer steps and frames than the demo's defaults so the run is quick on 2 CPU cores (~15 s),
    at the model's native 64x64 so the screenshot shows a real sixbit-mini video."""
    for elem_id, value in (("steps", 8), ("frames", 9)):
        page.locator(f"#{elem_id} input[type=number]").fill(str(value))
        page.locator(f"#{elem_id} input[type=number]").press("Enter")


def test_page_before_any_run(page):
    """Issue 16, items 1, 5, 9, 10, 14: what a new user sees before generating anything."""
    # the CPU note sits near the top, above the results (not under the metrics table)
    note = page.locator("#cpu-note")
    assert note.is_visible() and "quantization is simulated" in note.inner_text()
    assert "tensor cores" in note.inner_text()
    assert note.bounding_box()["y"] < page.locator("#sb-status-box").bounding_box()["y"] < 900
    # the prompt's token limit is in its label
    assert "at most 112 tokens" in page.locator("#prompt").inner_text()
    # every example prompt is shown whole, and a click fills the prompt
    prompts = app.example_prompts(app.store().default_id)[:8]
    shown = [page.locator(f"#example-{i}").inner_text().strip() for i in range(len(prompts))]
    assert shown == prompts
    page.locator("#example-2").click()
    page.wait_for_function("(want) => document.querySelector('#prompt textarea').value === want", arg=prompts[2])
    # opening Advanced shows τ and ρ empty ("empty = from the policy") and offers no triton backend on a CPU
    page.locator("#advanced").get_by_text("Advanced").first.click()
    for name in ("tau", "pdr_rho"):
        box = page.locator(f"#adv-{name} input, #adv-{name} textarea").first
        box.wait_for(state="visible", timeout=30_000)
        assert box.input_value() == "", name
    assert "'triton' is not offered" in page.locator("#adv-backend").inner_text()
    page.locator("#adv-backend input").click()
    options = page.locator("ul[role=listbox] li").all_inner_texts()
    assert [o.replace("✓", "").strip() for o in options] == ["auto", "torch"], options
    page.keyboard.press("Escape")


def _generate(page):
    """Type the first example prompt, click Generate with a small size, and wait until the run is done."""
    page.locator("#prompt textarea").fill(app.example_prompts(app.store().default_id)[0])
    _set_small(page)
    page.locator("#generate").click()
    # live: the status shows step and ETA while running
    page.wait_for_function("() => (document.querySelector('#sb-status-box')?.innerText || '').includes('step')",
                           timeout=120_000)
    page.wait_for_function("() => document.querySelector('.sb-status[data-state=\"done\"]') !== null"
                           " || document.querySelector('.sb-status[data-state=\"error\"]') !== null",
                           timeout=300_000)
    assert page.locator(".sb-status[data-state=done]").count() == 1, page.locator("#sb-status-box").inner_text()


def _open_advanced(page, field: str):
    """Open the Advanced panel unless an earlier test did, and wait until ``field`` shows."""
    box = page.locator(field).first
    if not box.is_visible():
        page.locator("#advanced").get_by_text("Advanced").first.click()
    box.wait_for(state="visible", timeout=30_000)
    return box


def test_generate_in_browser(page):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ARTIFACTS.mkdir(exist_ok=True)
    _generate(page)
    for vid in ("video-baseline", "video-sixbit"):
        # one condition, polled until it holds: a decoded frame, time advancing and not paused (a paused element
        # is nudged with play(); Gradio may swap the <video> element while later outputs render, so a separate
        # check after the wait could race with the swap)
        try:
            page.wait_for_function(
                """(id) => { const v = document.querySelector('#' + id + ' video');
                             if (v && v.paused) { v.muted = true; v.play().catch(() => {}); }
                             return !!v && v.readyState >= 2 && v.videoWidth > 0 && !v.paused && v.currentTime > 0; }""",
                arg=vid, timeout=60_000)
        except PlaywrightTimeout:
            pytest.fail(f"{vid} is not playing")
    # the heatmaps were rendered by plotly (heatmap layers and legend entries in the DOM)
    for plot in ("plot-precision", "plot-skips", "plot-curves"):
        page.wait_for_selector(f"#{plot} .js-plotly-plot .main-svg", timeout=30_000)
    for plot in ("plot-precision", "plot-skips"):
        assert page.locator(f"#{plot} .heatmaplayer image, #{plot} .heatmaplayer .hm").count() >= 1
    legend = page.locator("#plot-precision .legendtext").all_text_contents()
    assert any("NVFP4" in t for t in legend) and any("INT8" in t for t in legend)
    table = page.locator("#metrics").inner_text()
    assert "PSNR vs baseline" in table and "speed-up" in table
    # the Advanced panel was opened before this run (previous test) and changed nothing: ρ came from the policy
    pdr_row = next(ln for ln in table.splitlines() if "PDR refreshes" in ln or "from the" in ln)
    assert "from the policy" in table and "from the config" not in table, pdr_row
    # the metrics table shows every row: no scroll area inside it hides the last one
    cut = page.evaluate("""() => [...document.querySelectorAll('#metrics *')].filter(e =>
        /(auto|scroll)/.test(getComputedStyle(e).overflowY) && e.scrollHeight > e.clientHeight)
        .map(e => [e.className, e.scrollHeight, e.clientHeight])""")
    assert not cut, f"the metrics table scrolls (its last row is cut off): {cut}"
    # the precision heatmap: one label per block, the layer's full name in the hover
    ticks = page.locator("#plot-precision .ytick text").all_text_contents()
    assert ticks == [f"block {i}" for i in range(12)], ticks
    hover = page.evaluate("() => document.querySelector('#plot-precision .js-plotly-plot').data[0].customdata[0][0][0]")
    assert hover == "transformer_blocks.0.attn1.to_q"
    assert "cpu-reference" in page.locator("#path-info").inner_text()
    page.locator("#outputs").scroll_into_view_if_needed()
    page.evaluate("() => window.scrollTo(0, 0)")
    shot = ARTIFACTS / "app-generated.png"
    page.screenshot(path=str(shot), full_page=True)
    readme_shot = ROOT / "docs" / "screenshot.png"
    if os.environ.get("SIXBIT_UPDATE_SCREENSHOT") == "1" or not readme_shot.exists():
        readme_shot.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, readme_shot)
    assert not page.js_errors, page.js_errors


def _refused(page, message: str):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator("#generate").click()
    try:
        page.locator("[data-testid=toast-text]", has_text=message).first.wait_for(state="visible", timeout=30_000)
    except PlaywrightTimeout:
        page.screenshot(path=str(ARTIFACTS / "app-refused-missing.png"), full_page=True)
        pytest.fail(f"no toast {message!r}; toasts: {page.locator('[data-testid=toast-text]').all_inner_texts()}; "
                    f"status: {page.locator('#sb-status-box').inner_text()}")


def test_invalid_input_shows_error_and_app_keeps_working(page):
    page.locator("#prompt textarea").fill("")
    page.locator("#generate").click()
    toast = page.locator("[data-testid=toast-text]", has_text="Prompt is empty: please enter a prompt.")
    toast.first.wait_for(state="visible", timeout=30_000)
    page.wait_for_timeout(800)  # let the toast finish sliding in before the screenshot
    page.screenshot(path=str(ARTIFACTS / "app-error.png"))
    # an impossible size typed into the resolution box is refused with the model's rule
    page.locator("#prompt textarea").fill(app.example_prompts(app.store().default_id)[0])
    res = page.locator("#resolution input")
    res.fill("30x30")
    res.press("Enter")
    page.locator("#generate").click()
    page.locator("[data-testid=toast-text]", has_text="multiples of 8").first.wait_for(state="visible",
                                                                                     timeout=30_000)
    assert 'data-state="done"' in page.locator("#sb-status-box").inner_html()  # the last good run stays
    res.fill("64x64")
    res.press("Enter")


BAD = [  # (input selector, typed value, message): every case names its field
    ("#seed input", "1.5", "Seed must be a whole number between 0 and 4294967295, got 1.5"),
    ("#seed input", "-1", "Seed must be between 0 and 4294967295, got -1"),
    ("#resolution input", "100000x100000", "the largest size this model takes is 64x64"),
    ("#resolution input", "<img src=x onerror=window.__xss=1>", "not of the form width x height"),
    ("#adv-tau input", "abc", "τ (error threshold) must be a number ≥ 0, or empty; got 'abc'"),
    ("#adv-tau input", "<b>bold</b>", "got '<b>bold</b>'"),
    ("#adv-pdr_rho input", "2", "PDR ρ (outlier ratio) must be a number from 0 to 1"),
    ("#adv-warmup_steps input", "1.5", "must be a whole number from 0 to 1000; got 1.5"),
]


def test_a_round_of_bad_inputs_in_the_browser(page):
    """Issue 16's target through Chromium: each bad value is refused with its field named, shown as text
    (never rendered as HTML), and the page keeps its last good run."""
    # what the round needs whether or not the module's earlier tests ran (``-k bad_inputs`` alone): a
    # finished run to keep, a prompt in the box (an empty one is refused first), the Advanced fields shown
    if page.locator(".sb-status[data-state=done]").count() == 0:
        _generate(page)
    _open_advanced(page, "#adv-tau input")
    good = {}
    for sel, value, message in BAD:
        box = page.locator(sel).first
        good.setdefault(sel, box.input_value())
        box.fill(value)
        box.press("Tab")
        _refused(page, message)
        if "<" in value:  # the typed markup is in the toast as text, never as elements (read while it is shown:
            # an error toast closes by itself, and on a loaded 2-core host restoring the field took longer)
            toast = page.locator("[data-testid=toast-text]", has_text=value).first
            assert toast.locator("img, b").count() == 0 and value in toast.inner_text()
        box.fill(good[sel])
        box.press("Tab")
    assert page.evaluate("() => window.__xss") is None
    assert 'data-state="done"' in page.locator("#sb-status-box").inner_html()
    assert not page.js_errors, page.js_errors


def test_preset_fills_the_advanced_fields(page):
    from sixbit import SixBitConfig

    page.get_by_text("Aggressive", exact=True).click()
    _open_advanced(page, "#adv-tdc_threshold input[type=number]")
    want = SixBitConfig.preset("aggressive").tdc_threshold
    page.wait_for_function("([sel, want]) => Math.abs(parseFloat(document.querySelector(sel).value) - want) < 1e-9",
                           arg=["#adv-tdc_threshold input[type=number]", want], timeout=30_000)
    page.get_by_text("Balanced", exact=True).click()
    want = SixBitConfig.preset("balanced").tdc_threshold
    page.wait_for_function("([sel, want]) => Math.abs(parseFloat(document.querySelector(sel).value) - want) < 1e-9",
                           arg=["#adv-tdc_threshold input[type=number]", want], timeout=30_000)
