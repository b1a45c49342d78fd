"""Server-side state of the demo: the baseline cache, running jobs (for Stop), and generated files.

Nothing here knows about models; it holds plain arrays, numbers and paths.

- `BaselineCache` — the full-precision result of a (model, prompt, negative prompt, seed, steps,
  frames, resolution, guidance) tuple, so that re-running 6Bit with other thresholds compares
  against the same baseline without recomputing it. Bounded (LRU); evicted entries delete their mp4.
- `JobRegistry` — one stop flag per browser session; the Stop button sets it and the running job's
  step callback interrupts the pipeline at the next step.
- `FileStore` — a private temporary folder for the mp4/JSON files the app writes. Gradio copies
  returned files into its own cache (cleaned by ``delete_cache``); this store removes our copies
  once they are old, and the whole folder at exit. Nothing a user types ever becomes a path here.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class RunResult:
    """One finished pipeline run, as the UI needs it."""

    frames: np.ndarray  # [T, H, W, 3] uint8
    time_s: float  # wall time of the pipeline call (text encoding + denoising + VAE decode)
    step_time_s: float | None  # mean time per denoising step, steps 2..N (None if fewer than 2 steps)
    peak_mem_bytes: int | None  # peak accelerator memory of the call; None on CPU
    act_bits: float  # average activation bits (baseline: the pipeline dtype's width)
    video_path: str | None = None
    trace: dict | None = None
    extra: dict = field(default_factory=dict)


def baseline_key(model_id: str, params: dict) -> tuple:
    """Cache key of a baseline: the model and every generation setting that changes its pixels."""
    keys = ("prompt", "negative_prompt", "seed", "steps", "frames", "width", "height", "guidance")
    return (model_id,) + tuple((k, params[k]) for k in keys)


class BaselineCache:
    """A small thread-safe LRU of baseline `RunResult`s."""

    def __init__(self, max_entries: int = 8):
        self.max_entries = max(1, int(max_entries))
        self._data: OrderedDict[tuple, RunResult] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> RunResult | None:
        with self._lock:
            res = self._data.get(key)
            if res is not None:
                self._data.move_to_end(key)
            return res

    def put(self, key: tuple, result: RunResult) -> None:
        with self._lock:
            self._data[key] = result
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                _, old = self._data.popitem(last=False)
                if old.video_path:
                    Path(old.video_path).unlink(missing_ok=True)

    def paths(self) -> set[str]:
        with self._lock:
            return {r.video_path for r in self._data.values() if r.video_path}

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


class JobRegistry:
    """Stop flags of running jobs, one per session (a session runs at most one job)."""

    def __init__(self):
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def start(self, session: str) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            self._events[session] = ev
        return ev

    def get(self, session: str) -> threading.Event | None:
        with self._lock:
            return self._events.get(session)

    def stop(self, session: str) -> bool:
        """Ask the session's job to stop; False if it has none running."""
        with self._lock:
            ev = self._events.get(session)
        if ev is None:
            return False
        ev.set()
        return True

    def finish(self, session: str, event: threading.Event) -> None:
        with self._lock:
            if self._events.get(session) is event:
                del self._events[session]

    def running(self) -> int:
        with self._lock:
            return len(self._events)


class FileStore:
    """Generated files in one private temporary folder, pruned by age and removed at exit."""

    def __init__(self, root: str | os.PathLike | None = None, max_age_s: float = 3600.0):
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="sixbit-app-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_age_s = float(max_age_s)
        atexit.register(self.cleanup)

    def new_path(self, stem: str, suffix: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in stem)[:40] or "file"
        return self.root / f"{safe}-{uuid.uuid4().hex[:10]}{suffix}"

    def prune(self, keep: set[str] | None = None, now: float | None = None) -> int:
        """Delete files older than ``max_age_s`` except those in ``keep``; return how many."""
        keep = {str(Path(p)) for p in (keep or set())}
        now = time.time() if now is None else now
        n = 0
        for p in self.root.iterdir():
            if p.is_file() and str(p) not in keep and now - p.stat().st_mtime > self.max_age_s:
                p.unlink(missing_ok=True)
                n += 1
        return n

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
