"""Import the Triton kernels package (top-level folder ``kernels/``) under the name ``sixbit_kernels``.

``pip install -e .`` maps ``kernels/`` to ``sixbit_kernels``. When the project runs from a checkout that
is not installed (a Hugging Face Space runs ``app.py`` from the repo root), the folder is loaded by path
under the same name. It is never imported as a bare ``kernels``: that name belongs to a PyPI package that
diffusers probes for optional attention backends.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def _load():
    try:
        return importlib.import_module("sixbit_kernels")
    except ModuleNotFoundError:
        pass
    root = Path(__file__).resolve().parent.parent / "kernels"
    spec = importlib.util.spec_from_file_location(
        "sixbit_kernels", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - broken checkout
        raise ImportError(f"cannot find the sixbit kernels package at {root}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sixbit_kernels"] = module
    spec.loader.exec_module(module)
    return module


kernels = _load()
