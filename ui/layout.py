"""The page: inputs on the left; status, both videos, metrics and the live diagnostics on the right.

`build_demo` only lays out components and wires them to a `DemoController`; Gradio 6 takes the theme
and css at ``launch`` (see `theme` and `CSS_PATH`), not at ``gr.Blocks``.

The generate event shows Gradio's progress indicator on the status element only
(``show_progress_on``), so the plots and videos stay visible and are redrawn in place while a run
streams; the status element itself carries the step counter, a progress bar and the ETA.

The generate event runs with ``preprocess=False``: the handlers receive what the browser or API client
sent, and ui/validate.py and ui/config_form.py are the only checks (Gradio's would round a fraction
silently and refuse a bound without naming the field). On a CPU host a note under the intro says that
quantization is simulated there and where a GPU's speed would come from.
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr

from ui import config_form
from ui.handlers import METRIC_HEADERS, OUTPUTS, DemoController, ModelInfo, status_html
from ui.validate import GUIDANCE_RANGE, MAX_STEPS, SEED_MAX

CSS_PATH = Path(__file__).resolve().parent.parent / "assets" / "app.css"

INTRO = """\
# sixbit · 6Bit-Diffusion
Training-free mixed-precision inference for video diffusion transformers. At every denoising step
and block, a predictor routes each linear layer's activations to **NVFP4** (4-bit) or **INT8**, and a
**Temporal Delta Cache** skips blocks whose output change is stable; **PDR** recomputes a block in
full precision when the delta it is about to cache would be dirty. Generate to see every decision
live, then compare with the full-precision baseline.
"""


CPU_NOTE = """\
**On this CPU, quantization is simulated.** The 6Bit run computes NVFP4 and INT8 in plain torch (the values
are rounded to 4 and 8 bits, then multiplied in 32-bit floats), so a computed layer costs more than the
baseline's; the only saving here is the blocks the Temporal Delta Cache skips. On a GPU the speed comes from
low-bit arithmetic as well: INT8 tensor cores (Hopper, Ada, Ampere), native FP4 tensor cores (Blackwell), and
4-bit weights that move a quarter of the bytes — plus the same skipping.
"""


def theme() -> gr.themes.Base:
    """A quiet theme using system fonts (no web-font download: the demo must work offline)."""
    sys_font = [gr.themes.Font("system-ui"), gr.themes.Font("-apple-system"), gr.themes.Font("Segoe UI"),
                "sans-serif"]
    mono = [gr.themes.Font("ui-monospace"), gr.themes.Font("SFMono-Regular"), "monospace"]
    return gr.themes.Soft(primary_hue="teal", secondary_hue="slate", neutral_hue="slate",
                          font=sys_font, font_mono=mono)


def _default_resolution(info: ModelInfo, defaults: dict) -> tuple[list[str], str]:
    choices = info.limits.resolutions()
    w, h = defaults.get("width"), defaults.get("height")
    value = f"{w}x{h}" if w and h else choices[0]  # the model's default, else its native size
    if value not in choices:
        choices.append(value)
    return choices, value


def build_demo(controller: DemoController, info: ModelInfo, defaults: dict, examples: list[str],
               delete_cache: tuple[int, int] = (3600, 3600)) -> gr.Blocks:
    lim = info.limits
    res_choices, res_value = _default_resolution(info, defaults)
    frames_default = int(defaults.get("num_frames", lim.frame_choices[min(len(lim.frame_choices) - 1, 2)]))
    with gr.Blocks(title="sixbit · 6Bit-Diffusion demo", delete_cache=delete_cache) as demo:
        gr.Markdown(INTRO, elem_id="intro")
        if info.device.startswith("cpu"):
            gr.Markdown(CPU_NOTE, elem_id="cpu-note")
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=320, elem_id="inputs"):
                model = gr.Textbox(label="Model (diffusers CogVideoX Hub id)", value="",
                                   placeholder=f"{info.display_name} (leave empty)", visible=controller.allow_hub,
                                   elem_id="model", max_lines=1)
                prompt = gr.Textbox(label=f"Prompt (at most {lim.max_prompt_tokens} tokens for this model's text "
                                          "encoder)", lines=3, elem_id="prompt",
                                    placeholder="Describe the video, e.g. one of the examples below")
                negative = gr.Textbox(label="Negative prompt", lines=1, elem_id="negative",
                                      value=str(defaults.get("negative_prompt") or ""))
                with gr.Row():
                    # no Gradio precision/bounds: Gradio would round 1.5 silently and refuse -1 without naming
                    # the field; ui/validate.py checks both (the generate event runs with preprocess=False)
                    seed = gr.Number(label=f"Seed (0 to {SEED_MAX})", value=int(defaults.get("seed", 0)),
                                     elem_id="seed")
                    steps = gr.Slider(1, MAX_STEPS, step=1, label="Steps", elem_id="steps",
                                      value=int(defaults.get("num_inference_steps", 50)))
                with gr.Row():
                    frames = gr.Slider(1, lim.max_frames, step=lim.frame_step, value=frames_default,
                                       label=f"Frames ({lim.frame_step}·k+1)", elem_id="frames")
                    resolution = gr.Dropdown(res_choices, value=res_value, label="Resolution (width x height)",
                                             allow_custom_value=True, elem_id="resolution")
                guidance = gr.Slider(*GUIDANCE_RANGE, step=0.5, label="Guidance scale", elem_id="guidance",
                                     value=float(defaults.get("guidance_scale", 6.0)))
                preset = gr.Radio([(config_form.PRESET_LABELS[p], p) for p in config_form.PRESETS],
                                  value="balanced", label="6Bit preset", elem_id="preset")
                expected = gr.Markdown(controller.expected_markdown("balanced"), elem_id="expected-effect")
                form_preset = gr.State("balanced")  # the preset the Advanced fields were filled from
                base_vals = config_form.preset_values(controller.config_cls, "balanced", controller.specs)
                with gr.Accordion("Advanced — every 6Bit threshold", open=False, elem_id="advanced"):
                    adv = [config_form.make_component(s, v) for s, v in zip(controller.specs, base_vals)]
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                if examples:
                    # buttons, not gr.Examples: its text samples are cut at 60 characters. A click fills the
                    # prompt in the browser (no server call, no API endpoint).
                    with gr.Group(elem_id="examples"):
                        gr.Markdown("Example prompts", elem_classes="sb-examples-title")
                        for i, text in enumerate(examples[:8]):
                            btn = gr.Button(text, size="sm", variant="secondary", elem_classes="sb-example",
                                            elem_id=f"example-{i}")
                            btn.click(None, None, [prompt], js=f"() => {json.dumps(text)}", api_visibility="private")
            with gr.Column(scale=7, elem_id="outputs"):
                comps: dict[str, gr.components.Component] = {}
                comps["status"] = gr.HTML(status_html("idle", f"Ready · model {info.display_name} on {info.device}"),
                                          label="Status", show_label=False, elem_id="sb-status-box")
                with gr.Row(equal_height=True):
                    comps["baseline_video"] = gr.Video(label=f"FP{info.dtype_bits} baseline (full precision)",
                                                       autoplay=True, loop=True, interactive=False,
                                                       buttons=["download"], elem_id="video-baseline")
                    comps["sixbit_video"] = gr.Video(label="6Bit", autoplay=True, loop=True, interactive=False,
                                                     buttons=["download"], elem_id="video-sixbit")
                comps["metrics"] = gr.Dataframe(headers=METRIC_HEADERS, interactive=False, wrap=True,
                                                label="Metrics (6Bit vs baseline)", elem_id="metrics",
                                                max_height=2000)  # every row visible, no inner scroll
                comps["path_info"] = gr.Markdown("", label="Compute path", elem_id="path-info")
                comps["precision"] = gr.Plot(label="Precision heatmap", elem_id="plot-precision")
                comps["skips"] = gr.Plot(label="Block-skip heatmap", elem_id="plot-skips")
                comps["curves"] = gr.Plot(label="Γ and accumulated error", elem_id="plot-curves")
                comps["trace_file"] = gr.File(label="trace.json (every decision of the 6Bit run)",
                                              interactive=False, elem_id="trace-file")
        inputs = [model, prompt, negative, seed, steps, frames, resolution, guidance, preset, form_preset, *adv]
        gen = generate_btn.click(
            controller.api_generate(), inputs, [comps[n] for n in OUTPUTS], api_name="generate",
            concurrency_limit=1, concurrency_id="gpu", show_progress="minimal", preprocess=False,
            show_progress_on=[comps["status"]], trigger_mode="once",
        )
        stop_btn.click(controller.stop, None, [comps["status"]], cancels=[gen], api_name="stop",
                       show_progress="hidden")
        preset.change(controller.expected_markdown, [preset], [expected], api_name="expected_effect",
                      show_progress="hidden")
        if adv:
            preset.change(controller.preset_values, [preset], [*adv, form_preset], api_name="preset_values",
                          show_progress="hidden")
    demo.sixbit_components = dict(comps, model=model, prompt=prompt, generate=generate_btn, stop=stop_btn,
                                  expected=expected)
    return demo
