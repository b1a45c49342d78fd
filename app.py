"""sixbit demo: prompt → video, 6Bit vs full precision side by side, every decision shown live.

Run it with ``make demo`` (offline, embedded sixbit-mini) or ``python app.py``. Environment:

    SIXBIT_MODEL             model to serve: a diffusers CogVideoX Hub id or local folder
                             (default: the embedded sixbit-mini). Set by the operator only.
    SIXBIT_ALLOW_HUB_MODELS  "1" / "0" / "auto" (default): show a model field that accepts Hub ids
                             typed by users; "auto" = only where huggingface.co is reachable and
                             HF_HUB_OFFLINE is unset. Typed local paths are always refused.
    SIXBIT_QUEUE_SIZE        waiting requests beyond the one running (default 8)
    SIXBIT_CACHE_TTL_S       age after which generated files are deleted (default 3600)
    SIXBIT_TEXT_ENCODER_4BIT "1": store every loaded model's text encoder weights in 4 bits
                             (sixbit.quantize_text_encoder; T5-XXL 8.87 -> 4.02 GiB) — for GPUs that
                             cannot hold CogVideoX in 16 bits; baseline and 6Bit runs then share it
    GRADIO_SERVER_NAME/PORT  as usual (Docker/Spaces: 0.0.0.0:7860)

This file is the only part of the app that runs a pipeline (`gpu_job`); ui/ renders and validates.
One job runs at a time: Gradio's queue admits one `generate` event (concurrency id "gpu") and a
lock around the pipeline keeps a stopped job's last step from overlapping the next job. On ZeroGPU
Spaces `gpu_job` is wrapped by ``spaces.GPU`` with a duration estimated from the request; elsewhere
the wrapper is a no-op.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from pathlib import Path

# Third-party start-up noise that says nothing about this app (torchao's optional CUDA libraries on a CPU
# host, a torch deprecation inside torchao, diffusers' note about torchao checkpoints): silenced before
# those packages are imported. Real warnings of those packages at ERROR level still show.
for _name in ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer"):
    logging.getLogger(_name).setLevel(logging.ERROR)



def triton_cache_dir(env=os.environ, data: Path = Path("/data")) -> str | None:
    """Point Triton's kernel cache at a folder that survives app restarts, unless the user set
    ``TRITON_CACHE_DIR``: ``/data/sixbit/triton`` where ``/data`` is writable (Hugging Face Spaces'
    persistent storage), else ``~/.cache/sixbit/triton``. Returns the folder set (None: left alone)."""
    if env.get("TRITON_CACHE_DIR"):
        return None
    base = data if data.is_dir() and os.access(data, os.W_OK) else Path.home() / ".cache"
    folder = base / "sixbit" / "triton"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    env["TRITON_CACHE_DIR"] = str(folder)
    return str(folder)


triton_cache_dir()  # before anything imports triton

import gradio as gr  # noqa: E402
import numpy as np  # noqa: E402

from ui.handlers import DemoController, ModelInfo  # noqa: E402
from ui.layout import CSS_PATH, build_demo, theme  # noqa: E402
from ui.state import BaselineCache, FileStore, JobRegistry  # noqa: E402
from ui.validate import LOG, ModelLimits  # noqa: E402

try:  # ZeroGPU (Hugging Face Spaces); `spaces.GPU` is itself a no-op off ZeroGPU.
    import spaces  # noqa: E402
except ImportError:  # pragma: no cover - depends on the host
    spaces = None

ROOT = Path(__file__).resolve().parent
GPU_LOCK = threading.Lock()
JOBS = JobRegistry()
#: the largest file Gradio's upload route accepts: the app takes no uploads (docs/DEPLOY.md)
MAX_UPLOAD = "1mb"


def setup_logging() -> None:
    """One line per event on stderr for the app's own logger ("sixbit.app": refused inputs, load failures)."""
    if not LOG.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s sixbit.app %(levelname)s %(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
        LOG.propagate = False


def gpu(duration):
    """``spaces.GPU(duration=...)`` where the ``spaces`` package exists, else the identity."""
    if spaces is None:
        return lambda fn: fn
    return spaces.GPU(duration=duration)


# ------------------------------------------------------------------------------------------ models
def default_model_id() -> str:
    env = os.environ.get("SIXBIT_MODEL", "").strip()
    if env:
        return env
    from sixbit.mini import MINI_PATH

    return str(MINI_PATH)


def _is_mini(model_id: str) -> bool:
    try:
        from sixbit.mini import MINI_PATH
    except ImportError:  # pragma: no cover
        return False
    return Path(model_id).resolve() == Path(MINI_PATH).resolve() if os.path.exists(model_id) else False


def host_has_network(timeout: float = 1.5) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _env_flag(name: str, default: str) -> bool | None:
    """``True`` / ``False`` for the usual spellings of an environment switch, ``None`` for anything else."""
    v = os.environ.get(name, default).strip().lower()
    return True if v in ("1", "true", "yes") else False if v in ("0", "false", "no") else None


def text_encoder_4bit() -> bool:
    return bool(_env_flag("SIXBIT_TEXT_ENCODER_4BIT", "0"))


def allow_hub_models() -> bool:
    flag = _env_flag("SIXBIT_ALLOW_HUB_MODELS", "auto")
    return host_has_network() if flag is None else flag


class ModelStore:
    """Loaded pipelines: the served model, plus at most one Hub model a user picked."""

    def __init__(self, default_id: str, device: str | None = None):
        self.default_id = default_id
        self.device = device
        self._pipes: dict[str, object] = {}
        self._ids: dict[str, dict] = {}
        self._lock = threading.Lock()

    def loaded(self, model_id: str):
        """The pipeline if it is loaded already, else None (never loads)."""
        return self._pipes.get(model_id)

    def pipeline(self, model_id: str):
        with self._lock:
            if model_id not in self._pipes:
                from sixbit import load_pipeline

                for k in [k for k in self._pipes if k != self.default_id]:
                    del self._pipes[k]  # keep one extra model at most
                from diffusers.utils import logging as diffusers_logging
                from transformers.utils import logging as transformers_logging

                diffusers_logging.disable_progress_bar()  # no progress bars in the server log
                transformers_logging.disable_progress_bar()
                pipe = load_pipeline(model_id, device=self.device, text_encoder_4bit=text_encoder_4bit())
                if not type(pipe).__name__.startswith("CogVideoX"):
                    raise TypeError(f"{type(pipe).__name__} is not a CogVideoX pipeline")
                pipe.set_progress_bar_config(disable=True)
                self._pipes[model_id] = pipe
            return self._pipes[model_id]

    def generation_defaults(self, model_id: str) -> dict:
        """Pipeline kwargs the model wants by default (the embedded model ships its own)."""
        if _is_mini(model_id):
            from sixbit.mini import DEFAULT_GENERATION

            return dict(DEFAULT_GENERATION)
        return {}

    def info(self, model_id: str) -> ModelInfo:
        pipe = self.pipeline(model_id)
        gen = self.generation_defaults(model_id)
        limits = ModelLimits.from_pipeline(pipe, gen.get("max_sequence_length"))
        import torch

        dtype = pipe.transformer.dtype
        bits = torch.finfo(dtype).bits if dtype.is_floating_point else 16
        name = model_name(model_id)
        if getattr(pipe, "sixbit_text_encoder", None) is not None:
            name += " · text encoder in 4-bit weights (both runs)"
        from sixbit import costs

        return ModelInfo(model_id=model_id, display_name=name, limits=limits, dtype_bits=bits,
                         device=str(pipe.device), device_class=hardware_class(pipe.device),
                         shape=costs.TransformerShape.of(pipe.transformer))

    def identity(self, model_id: str) -> dict:
        """The model as a trace records it: a display id (never a path on the server) and its revision —
        the Hub commit of a cached Hub model, else a SHA-256 over the folder's weights and configs."""
        with self._lock:
            if model_id not in self._ids:
                self._ids[model_id] = {"id": model_name(model_id), "revision": model_revision(model_id),
                                       "text_encoder_4bit": text_encoder_4bit()}
            return dict(self._ids[model_id])


def model_name(model_id: str) -> str:
    """How the app names a model to users: the embedded model, a Hub id, or a local folder's name."""
    if _is_mini(model_id):
        return "sixbit-mini (embedded)"
    return Path(model_id).name if os.path.isdir(model_id) else model_id


def model_revision(model_id: str) -> str | None:
    if os.path.isdir(model_id):
        import hashlib

        h = hashlib.sha256()
        root = Path(model_id)
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".model", ".txt") \
                    and f.parent.name != "logs":
                h.update(f.relative_to(root).as_posix().encode())
                h.update(f.read_bytes())
        return "sha256:" + h.hexdigest()
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(model_id, "model_index.json")
    except Exception:  # noqa: BLE001 - not a Hub id, no cache: no revision to state
        return None
    return Path(hit).parent.name if isinstance(hit, str) else None


_STORE: ModelStore | None = None


def store(default_id: str | None = None) -> ModelStore:
    """The process-wide model store (created on first use; ``default_id`` re-points the served model)."""
    global _STORE
    if _STORE is None:
        # On ZeroGPU the model is placed on "cuda" outside the GPU function (spaces emulates it there).
        device = "cuda" if spaces is not None and os.environ.get("SPACES_ZERO_GPU") else None
        _STORE = ModelStore(default_id or default_model_id(), device=device)
    elif default_id:
        _STORE.default_id = default_id
    return _STORE


# --------------------------------------------------------------------------------------- the job
class _Stopped(Exception):
    pass


def pipeline_kwargs(gen_defaults: dict, params: dict) -> dict:
    """What a run passes to the pipeline, less the generator (seeded from ``params["seed"]`` on the CPU),
    the step callback and the output type: plain data, recorded in trace.json for a replay."""
    kwargs = {k: v for k, v in gen_defaults.items() if k != "generator"}
    kwargs.update(prompt=params["prompt"], negative_prompt=params["negative_prompt"] or None,
                  num_inference_steps=params["steps"], num_frames=params["frames"], height=params["height"],
                  width=params["width"], guidance_scale=params["guidance"], num_videos_per_prompt=1)
    return kwargs


def _run_pipeline(pipe, gen_defaults: dict, params: dict, phase: str, handle, emit, stop) -> dict:
    """One pipeline call with a per-step callback: streams the trace, honours the stop flag."""
    import torch

    n = params["steps"]
    times: list[float] = []

    def on_step_end(p, i, t, kwargs):
        times.append(time.perf_counter())
        tr = handle.trace.to_dict() if handle is not None else None
        emit(("step", {"phase": phase, "step": i + 1, "steps": n, "trace": tr}))
        if stop.is_set():
            # Raise instead of setting `p._interrupt`: the pipeline would still VAE-decode the
            # half-denoised latents, and the flag would stay set on the shared pipeline.
            raise _Stopped(i + 1)
        return {}

    kwargs = pipeline_kwargs(gen_defaults, params)
    kwargs.update(generator=torch.Generator("cpu").manual_seed(params["seed"]), output_type="np",
                  callback_on_step_end=on_step_end)
    cuda = pipe.device.type == "cuda"
    peak_hook = None
    if cuda:
        # Peak memory from the first transformer call to the end of the call (denoising + VAE decode),
        # the same window for both runs (the engine also resets the peak when its run starts).
        def reset_peak(module, args):
            torch.cuda.reset_peak_memory_stats()
            peak_hook.remove()

        peak_hook = pipe.transformer.register_forward_pre_hook(reset_peak)
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            frames = pipe(**kwargs).frames[0]
    finally:
        if peak_hook is not None:
            peak_hook.remove()
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    from sixbit.video import to_uint8

    step_time = (times[-1] - times[0]) / (len(times) - 1) if len(times) >= 2 else None
    dtype = pipe.transformer.dtype
    return {"phase": phase, "frames": to_uint8(np.asarray(frames)), "time_s": wall, "step_time_s": step_time,
            "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "act_bits": float(torch.finfo(dtype).bits), "device": str(pipe.device),
            "trace": handle.trace.to_dict() if handle is not None else None}


def gpu_duration(job_id=None, model_id=None, params=None, preset=None, overrides=None, need_baseline=True):
    """ZeroGPU time to reserve (s): ``sixbit.costs``' bf16 step time for this request's size, model and GPU
    (measured on the H200, scaled by the GPU's bf16 rate; ZeroGPU's RTX Pro 6000 Blackwell ≈ half an
    H200), ×1.5 margin, for one or two runs (6Bit is budgeted at bf16 cost: on Hopper/Blackwell it is no
    slower, skipped blocks only shorten it), plus 30 s for loading, text encoding and the VAE decode;
    between 30 and 300 s."""
    from sixbit import costs

    p = params or {}
    tokens = ((p.get("frames", 49) - 1) // 4 + 1) * (p.get("height", 480) // 16) * (p.get("width", 720) // 16) + 226
    pipe = _STORE.loaded(model_id) if _STORE is not None and model_id else None
    shape = costs.TransformerShape.of(pipe.transformer) if pipe is not None else costs.COGVIDEOX_5B
    per_step = costs.step_seconds(shape, tokens, gpu_name())
    runs = 2 if need_baseline else 1
    return int(min(300, max(30, 30 + 1.5 * runs * p.get("steps", 50) * per_step)))


def hardware_class(device) -> str:
    """``sixbit.costs.device_class`` of the device jobs run on (on ZeroGPU: its GPU, known by name only)."""
    import torch

    from sixbit import costs

    dev = torch.device(device)
    cap = None
    if dev.type == "cuda" and not (spaces is not None and os.environ.get("SPACES_ZERO_GPU")):
        try:  # ZeroGPU: no GPU outside the GPU function; the class then comes from the name
            cap = torch.cuda.get_device_capability(dev)
        except (RuntimeError, AssertionError):
            cap = None
    return costs.device_class(str(dev), cap, gpu_name() if dev.type == "cuda" else None)


def self_check_seconds(device) -> float:
    """Seconds the kernels' load-time self-checks have taken on ``device`` so far (compiles included)."""
    import sixbit_kernels as kernels

    return sum(v["seconds"] for v in kernels.ops.self_check_status(device).values())


def gpu_name() -> str | None:
    """The GPU the job will run on: ``SIXBIT_GPU_NAME`` if set; on ZeroGPU its current hardware (RTX Pro
    6000 Blackwell since May 2026: the GPU is not visible outside the GPU function); else CUDA's name."""
    if os.environ.get("SIXBIT_GPU_NAME"):
        return os.environ["SIXBIT_GPU_NAME"]
    if spaces is not None and os.environ.get("SPACES_ZERO_GPU"):
        return "NVIDIA RTX PRO 6000 Blackwell"
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


@gpu(duration=gpu_duration)
def gpu_job(job_id: str, model_id: str, params: dict, preset: str, overrides: dict, need_baseline: bool):
    """Baseline (unless cached) then 6Bit, as a generator of events (protocol: ui/handlers.py)."""
    import sixbit

    stop = JOBS.get(job_id) or threading.Event()
    models = store()
    pipe = models.pipeline(model_id)
    gen_defaults = models.generation_defaults(model_id)
    events: queue.Queue = queue.Queue()

    def work():
        phase = "baseline" if need_baseline else "sixbit"
        step = 0
        try:
            with GPU_LOCK:
                if need_baseline:
                    events.put(("phase", {"phase": "baseline", "steps": params["steps"]}))
                    events.put(("done", _run_pipeline(pipe, gen_defaults, params, "baseline", None,
                                                      events.put, stop)))
                if stop.is_set():
                    raise _Stopped(0)
                phase = "sixbit"
                cfg = sixbit.SixBitConfig.preset(preset, **overrides)
                checked = self_check_seconds(pipe.device)
                t0 = time.perf_counter()
                handle = sixbit.apply(pipe, cfg)
                setup = time.perf_counter() - t0
                try:
                    events.put(("phase", {"phase": "sixbit", "steps": params["steps"]}))
                    res = _run_pipeline(pipe, gen_defaults, params, "sixbit", handle, events.put, stop)
                finally:
                    handle.remove()
                res["setup_s"] = setup
                res["self_check_s"] = self_check_seconds(pipe.device) - checked
                import torch

                from sixbit.trace import run_record

                tr = res["trace"] or {}
                res["run"] = run_record(model=models.identity(model_id), pipeline_kwargs=pipeline_kwargs(
                    gen_defaults, params), seed=params["seed"], config=cfg, policy=handle.policy,
                    device=tr.get("device", str(pipe.device)), compute_path=tr.get("compute_path", "unknown"),
                    threads=torch.get_num_threads())
                events.put(("done", res))
        except _Stopped as e:
            step = e.args[0] if e.args else 0
            events.put(("stopped", {"phase": phase, "step": step}))
        except BaseException as e:  # handed to the consumer, which re-raises it
            events.put(("error", e))
        finally:
            events.put(("end", None))

    worker = threading.Thread(target=work, name=f"sixbit-job-{job_id}", daemon=True)
    worker.start()
    finished = False
    try:
        while True:
            try:
                kind, ev = events.get(timeout=0.5)
            except queue.Empty:
                yield ("tick", {})
                continue
            if kind == "end":
                finished = True
                return
            if kind == "error":
                raise ev
            yield (kind, ev)
    finally:
        if not finished:  # closed early (Stop, disconnect): interrupt at the next step, don't block
            stop.set()


# ------------------------------------------------------------------------------------------- app
def example_prompts(model_id: str) -> list[str]:
    if _is_mini(model_id):
        from sixbit.mini import EXAMPLE_PROMPTS

        return [p if isinstance(p, str) else p[0] for p in EXAMPLE_PROMPTS]
    path = ROOT / "assets" / "cogvideox_prompts.txt"
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def create_app(model_id: str | None = None, *, allow_hub: bool | None = None, queue_size: int | None = None,
               cache_ttl_s: float | None = None) -> tuple[gr.Blocks, DemoController]:
    """Build the Blocks app (model loaded now, so the form knows the model's sizes) and its controller."""
    from sixbit import SixBitConfig

    models = store(model_id)
    model_id = models.default_id
    allow_hub = allow_hub_models() if allow_hub is None else allow_hub
    ttl = float(cache_ttl_s if cache_ttl_s is not None else os.environ.get("SIXBIT_CACHE_TTL_S", 3600))
    fps = 8.0  # CogVideoX's frame rate
    if _is_mini(model_id):
        from sixbit.mini import FPS as fps
    setup_logging()
    controller = DemoController(default_model=model_id, model_info=models.info, job_fn=gpu_job,
                                config_cls=SixBitConfig, allow_hub=allow_hub, jobs=JOBS,
                                baselines=BaselineCache(8), files=FileStore(max_age_s=ttl), fps=float(fps),
                                available_choices=host_choices())
    info = models.info(model_id)
    compile_kernels(models.pipeline(model_id))
    defaults = models.generation_defaults(model_id)
    demo = build_demo(controller, info, defaults, example_prompts(model_id), delete_cache=(int(ttl), int(ttl)))
    size = int(queue_size if queue_size is not None else os.environ.get("SIXBIT_QUEUE_SIZE", 8))
    demo.queue(max_size=size, default_concurrency_limit=1)
    return demo, controller


def compile_kernels(pipe) -> float | None:
    """On a GPU, compile every kernel configuration the default preset can use before the first request
    (``sixbit.apply`` does it: sixbit/warmup.py; Triton's cache folder keeps them across restarts) and log
    the time; None on a CPU host."""
    import torch

    if not torch.cuda.is_available() or torch.device(pipe.device).type != "cuda":
        return None
    import sixbit

    handle = sixbit.apply(pipe, sixbit.SixBitConfig.preset("balanced"))
    handle.remove()
    LOG.info("kernels compiled in %.1f s (%d configurations; Triton cache %s)", handle.kernels_compiled_s or 0.0,
             len(handle.kernels_compiled), os.environ.get("TRITON_CACHE_DIR", "Triton's default"))
    return handle.kernels_compiled_s


def host_choices() -> dict:
    """Config choices this host can run (the Advanced form offers only these): the Triton backend needs a
    CUDA GPU (on a CPU only Triton's test interpreter runs them, far too slowly for a demo)."""
    import torch

    if torch.cuda.is_available():
        return {}
    return {"backend": (("auto", "torch"), "('triton' is not offered: its kernels need a CUDA GPU, and this "
                                           "host has none.)")}


def launch_kwargs() -> dict:
    """What `launch` needs besides host/port: theme and css go here in Gradio 6, not in Blocks; uploads are
    capped at `MAX_UPLOAD` (the app takes none, but Gradio's upload route exists on every app)."""
    return dict(theme=theme(), css_paths=[CSS_PATH], show_error=True, footer_links=["api"],
                max_file_size=MAX_UPLOAD)


def _terminate(signum, frame):
    raise SystemExit(0)  # unwinds `launch` in the main thread: the finally below and atexit handlers run


def main():
    signal.signal(signal.SIGTERM, _terminate)  # docker stop, Spaces restarts: leave no temp files behind
    demo, controller = create_app()
    try:
        demo.launch(**launch_kwargs())
    finally:
        demo.close()
        controller.files.cleanup()


if __name__ == "__main__":
    main()
