"""Static checks of what deploys the app: the Spaces front matter, the Dockerfile, ZeroGPU wiring.

Docker cannot run on the CI machines, so the Dockerfile is checked as text: CUDA base image, a
non-root user with uid 1000, port 7860 on 0.0.0.0, every COPY source present, the app as command.
"""

import re
import shlex
import sys
from pathlib import Path

import gradio
import pytest
import yaml
from huggingface_hub import SpaceHardware
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    m = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    assert m, "README.md must start with a YAML front matter block"
    return yaml.safe_load(m.group(1))


def test_spaces_front_matter():
    fm = front_matter()
    assert fm["sdk"] == "gradio"
    assert (ROOT / fm["app_file"]).is_file() and fm["app_file"] == "app.py"
    # the Space runs the Gradio version the tests run, and requirements.txt allows it
    assert fm["sdk_version"] == gradio.__version__
    req = next(ln for ln in (ROOT / "requirements.txt").read_text().splitlines() if ln.startswith("gradio"))
    assert Version(fm["sdk_version"]) in SpecifierSet(req[len("gradio"):].split(";")[0].strip())
    py = str(fm["python_version"])
    assert isinstance(fm["python_version"], str), "quote python_version, or YAML reads 3.10 as 3.1"
    requires = re.search(r'^requires-python\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert Version(py + ".0") in SpecifierSet(requires)
    assert fm["suggested_hardware"] in {h.value for h in SpaceHardware}
    assert fm["models"] and all(re.fullmatch(r"[\w.-]+/[\w.-]+", m) for m in fm["models"])
    assert len(fm.get("short_description", "")) <= 60
    assert fm["colorFrom"] in {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}
    assert fm["colorTo"] in {"red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray"}


def dockerfile_instructions() -> list[tuple[str, str]]:
    lines, buf = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        if not buf and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        op, _, rest = buf.strip().partition(" ")
        lines.append((op.upper(), rest.strip()))
        buf = ""
    return lines


def test_dockerfile_static():
    ins = dockerfile_instructions()
    ops = [op for op, _ in ins]
    assert ops[0] == "FROM" and re.match(r"nvidia/cuda:\d+\.\d+(\.\d+)?-\S*ubuntu\S*$", ins[0][1])
    # a uid-1000 user is created and is the user the container runs as (the last USER)
    runs = " ".join(arg for op, arg in ins if op == "RUN")
    m = next((m for op, arg in ins if op == "RUN" for m in [re.search(r"useradd([^&;|)]*)", arg)] if m), None)
    assert m, "a user must be created"
    args = shlex.split(m.group(1))
    assert "-u" in args and args[args.index("-u") + 1] == "1000", args
    user = args[-1]
    users = [arg for op, arg in ins if op == "USER"]
    assert users and users[-1] in (user, "1000") and users[-1] != "root"
    # no package install or pip run as root after switching user would fail silently: pip runs as user
    first_user = ops.index("USER")
    assert not any(op == "RUN" and "pip install" in arg for op, arg in ins[:first_user])
    env = " ".join(arg for op, arg in ins if op == "ENV")
    assert re.search(r"GRADIO_SERVER_NAME=0\.0\.0\.0\b", env)
    assert re.search(r"GRADIO_SERVER_PORT=7860\b", env)
    assert ("EXPOSE", "7860") in ins
    cmd = next(arg for op, arg in reversed(ins) if op == "CMD")
    assert "app.py" in cmd
    for op, arg in ins:
        if op == "COPY":
            parts = [p for p in shlex.split(arg) if not p.startswith("--")]
            for src in parts[:-1]:
                assert (ROOT / src).exists(), f"COPY source {src} missing"
    # Triton JIT-compiles launcher stubs: the runtime image needs a C compiler and Python headers
    assert re.search(r"\bgcc\b", runs) and "python3-dev" in runs
    # the image never gets the large or secret files
    ignored = (ROOT / ".dockerignore").read_text().split()
    for p in (".git", ".venv", ".whl", "test-artifacts"):
        assert p in ignored


def test_gpu_decorator_is_a_noop_without_spaces(monkeypatch):
    import app

    monkeypatch.setattr(app, "spaces", None)

    def f(x):
        return x + 1

    assert app.gpu(app.gpu_duration)(f) is f


def test_gpu_decorator_uses_spaces_with_input_dependent_duration(monkeypatch):
    import app

    seen = {}

    class FakeSpaces:  # records what app.gpu hands to spaces.GPU
        @staticmethod
        def GPU(duration):
            seen["duration"] = duration
            return lambda fn: ("wrapped", fn)

    monkeypatch.setattr(app, "spaces", FakeSpaces)
    monkeypatch.setenv("SIXBIT_GPU_NAME", "NVIDIA H200")  # an unknown GPU is budgeted as the slowest
    assert app.gpu(app.gpu_duration)(len) == ("wrapped", len)
    dur = seen["duration"]
    small = dict(steps=10, frames=9, width=256, height=256)
    big = dict(steps=50, frames=49, width=720, height=480)
    d_small = dur(job_id="s", model_id="m", params=small, preset="balanced", overrides={}, need_baseline=True)
    d_big = dur(job_id="s", model_id="m", params=big, preset="balanced", overrides={}, need_baseline=True)
    d_cached = dur(job_id="s", model_id="m", params=big, preset="balanced", overrides={}, need_baseline=False)
    assert 30 <= d_small < d_cached < d_big <= 300


def test_spaces_package_is_optional():
    """app.py must import when `spaces` is not installed (it is not in requirements.txt)."""
    import subprocess

    code = ("import sys, builtins; real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'spaces': raise ImportError('no spaces')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "import app; assert app.spaces is None; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("value, expect", [("1", True), ("0", False), ("no", False)])
def test_hub_model_field_switch(monkeypatch, value, expect):
    import app

    monkeypatch.setenv("SIXBIT_ALLOW_HUB_MODELS", value)
    assert app.allow_hub_models() is expect


def test_offline_host_has_no_network(monkeypatch):
    import app

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert app.host_has_network() is False


def test_theme_and_css_go_to_launch_not_blocks():
    """Gradio 6 takes theme and css at launch(); the app passes them there (and ships the css file)."""
    import inspect

    import app
    from ui import layout

    kw = app.launch_kwargs()
    assert isinstance(kw["theme"], gradio.themes.Base)
    assert all(Path(p).is_file() for p in kw["css_paths"])
    assert {"theme", "css_paths"} <= set(inspect.signature(gradio.Blocks.launch).parameters)
    src = inspect.getsource(layout.build_demo)
    assert "gr.Blocks(" in src and "theme=" not in src.split("gr.Blocks(")[1].split(")")[0]


def test_triton_cache_persists_where_the_host_allows(tmp_path, monkeypatch):
    """The user's TRITON_CACHE_DIR wins; else /data (Spaces' persistent storage) when writable; else
    ~/.cache/sixbit/triton. The app compiles its kernels at start-up only on a GPU."""
    import app

    env = {"TRITON_CACHE_DIR": "/mine"}
    assert app.triton_cache_dir(env, tmp_path / "data") is None and env["TRITON_CACHE_DIR"] == "/mine"
    (tmp_path / "data").mkdir()
    env = {}
    assert app.triton_cache_dir(env, tmp_path / "data") == str(tmp_path / "data" / "sixbit" / "triton")
    assert (tmp_path / "data" / "sixbit" / "triton").is_dir() and env["TRITON_CACHE_DIR"].endswith("triton")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = {}
    assert app.triton_cache_dir(env, tmp_path / "absent") == str(tmp_path / "home" / ".cache" / "sixbit" / "triton")

    class CpuPipe:
        device = "cpu"

    assert app.compile_kernels(CpuPipe()) is None


def test_no_top_level_folder_shadows_an_installed_package():
    """A Space (and the tests) run from the repo root, so a top-level package folder wins over an installed
    distribution of the same import name. transformers 5.25 installs the PyPI ``kernels`` and imports it
    while loading any model: a folder ``kernels/`` here broke every pipeline (CI, session 20)."""
    import importlib.metadata
    import importlib.util

    owners = importlib.metadata.packages_distributions()
    folders = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    shadowed = {name: owners[name] for name in folders if set(owners.get(name, ())) - {"sixbit"}}
    assert not shadowed, f"repo folders shadow installed packages: {shadowed}"
    assert "sixbit" in folders and "sixbit_kernels" in folders
    spec = importlib.util.find_spec("kernels")  # present once transformers >= 5.25 is installed
    if spec is not None:
        assert Path(spec.origin).resolve().parent.parent != ROOT, spec.origin  # the installed one, not a folder here
