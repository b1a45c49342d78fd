"""``python -m benchmarks NAME [options]``: run the benchmark module ``benchmarks.NAME``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

NOT_BENCHMARKS = {"common", "__main__"}


def names() -> list[str]:
    """The benchmark modules: every module of this package with a ``main``, but the shared ones."""
    found = []
    for m in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if m.name not in NOT_BENCHMARKS and "def main(" in _source(m.name):
            found.append(m.name)
    return sorted(found)


def _source(name: str) -> str:
    root = Path(__file__).resolve().parent
    path = root / f"{name}.py" if (root / f"{name}.py").exists() else root / name / "__main__.py"
    return path.read_text() if path.exists() else ""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__ + "\nbenchmarks: " + ", ".join(names()))
        return 0 if argv else 2
    name, rest = argv[0].replace("-", "_"), argv[1:]
    if name not in names():
        print(f"unknown benchmark {argv[0]!r}; known: {', '.join(names())}", file=sys.stderr)
        return 2
    run = importlib.import_module(f"benchmarks.{name}").main
    if inspect.signature(run).parameters:
        return run(rest) or 0
    sys.argv = [f"python -m benchmarks {name}", *rest]  # a main() that reads sys.argv itself
    return run() or 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
