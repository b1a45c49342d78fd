"""Load-time self-check: before a kernel route serves its first call on a device, it runs once on a small
problem and is compared with the torch reference; a route that raises or misses the bound falls back to
the next safe implementation, with a warning that names it.

Ladders (``ladder``), first to last: ``blackwell-native`` (the ``nvfp4`` route on capability ≥ 10, never
run on hardware: unverified), ``hopper-triton`` (capability 9.x), ``portable-triton`` (capability ≥ 8.0),
``torch`` (the reference; always accepted). The bookkeeping kernels (``block_stats``, ``outlier_count``,
``layer_norm``) have ``triton`` → ``torch``.

Checks are keyed per device and per route *and size class* (``small``: the per-tile-decode GEMMs of
short activations; ``large``: ≥ ``gemm_w4.DECODE_ONCE_MIN_M`` rows, the decode-once GEMM), and run on the
first call of that key with the caller's real weights and a deterministic random input of the caller's
width (so the Triton specialisations it compiles are the ones the run needs; the extra cost is one small
GEMM and its torch reference per key). Bound (:data:`BOUND`): relative L2 error of the output ≤ 1e-2
against the torch reference of the same route on the same input — the kernels' documented error is
≤ 1e-3 in fp32 plus one rounding to the output dtype and rare one-step code flips at rounding ties of the
fused rotation (docs/KERNELS.md); a wrong kernel misses by orders of magnitude. Outlier counts must match
within ``max(2, 1 %)`` (elements within an ulp of the threshold may differ).

On a GPU, ``sixbit.apply`` makes these first calls itself (``sixbit/warmup.py``: every route, layer shape,
statistics kernel and attention route the run can reach, once, on a small problem), so the checks — and
the Triton compiles they trigger — happen before the first step instead of inside it.

What ran is visible: :func:`status` (every key's implementation and the failures) and
``ops.compute_path(device)``, which names the variant and any fallback. CPU tensors run the torch
reference unless :func:`interpreter_dispatch` opts them into the checked Triton routes (triton's
interpreter; for tests).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass, field

import torch

from .targets import HOPPER, Target

NATIVE, HOPPER_TRITON, PORTABLE_TRITON, TORCH, TRITON = (
    "blackwell-native", "hopper-triton", "portable-triton", "torch", "triton")
#: relative L2 error bound of a route's output against the torch reference (see module docstring)
BOUND = 1e-2


@dataclass
class Check:
    """The outcome of one key's self-check: the implementation that serves it and what failed before it."""

    impl: str
    failures: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


_CHECKS: dict[tuple[str, tuple], Check] = {}
_CPU_TARGET: list[Target] = []


def device_key(device) -> str:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return str(dev)


def ladder(route: str, target: Target, native_fp4: bool) -> list[str]:
    """Implementations to try for a linear route on ``target``, best first (``torch`` last)."""
    head = [HOPPER_TRITON, PORTABLE_TRITON] if target.variant == HOPPER else [PORTABLE_TRITON]
    if route == "nvfp4" and native_fp4:
        head = [NATIVE] + head
    return head + [TORCH]


def cpu_target() -> Target | None:
    """The target CPU tensors are dispatched to under :func:`interpreter_dispatch` (else ``None``)."""
    return _CPU_TARGET[-1] if _CPU_TARGET else None


@contextlib.contextmanager
def interpreter_dispatch(target: Target):
    """Within the block, ``backend="auto"`` on CPU tensors runs the checked Triton routes for ``target``
    in triton's interpreter (``TRITON_INTERPRET=1``) instead of the torch reference; checks made for the
    CPU inside are dropped on exit."""
    _CPU_TARGET.append(target)
    try:
        yield
    finally:
        _CPU_TARGET.pop()
        for k in [k for k in _CHECKS if k[0] == "cpu"]:
            del _CHECKS[k]


def cached(device, key: tuple) -> str | None:
    c = _CHECKS.get((device_key(device), key))
    return None if c is None else c.impl


def _mismatch(got, ref) -> str | None:
    """Why ``got`` (``(y, count)`` or a tensor / tuple of tensors) misses the reference, or ``None``."""
    gots = got if isinstance(got, (tuple, list)) else (got,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    for g, r in zip(gots, refs):
        if r is None:
            continue
        if g is None:
            return "missing output"
        if tuple(g.shape) != tuple(r.shape):
            return f"shape {tuple(g.shape)} != {tuple(r.shape)}"
        g, r, counts = g.detach().cpu(), r.detach().cpu(), not r.is_floating_point()
        g, r = g.double(), r.double()
        if counts:  # outlier counts: elements within an ulp of the threshold may differ
            if float((g - r).abs().sum()) > max(2.0, 0.01 * float(r.abs().sum())):
                return f"count {g.tolist()} != {r.tolist()}"
            continue
        if not bool(torch.isfinite(g).all()):
            return "non-finite output"
        err = float((g - r).norm() / r.norm().clamp_min(1e-30))
        if err > BOUND:
            return f"relative error {err:.2e} > {BOUND:.0e}"
    return None


def choose(device, key: tuple, candidates: list[tuple[str, object]], reference) -> str:
    """Run ``candidates`` (``[(impl, fn)]``, best first; ``fn()`` → the candidate's output) against
    ``reference()`` until one passes; remember and return its name (``torch`` is accepted unchecked).
    Each failure is a ``RuntimeWarning`` naming the key, the implementation, the reason and the fallback."""
    dk = device_key(device)
    hit = _CHECKS.get((dk, key))
    if hit is not None:
        return hit.impl
    t0 = time.perf_counter()
    check = Check(TORCH)
    ref = None
    for i, (impl, fn) in enumerate(candidates):
        if impl == TORCH:
            break
        try:
            if ref is None:
                ref = reference()
            why = _mismatch(fn(), ref)
        except Exception as e:  # a kernel that fails to compile or launch falls back like a wrong one
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if why is None:
            check.impl = impl
            break
        nxt = candidates[i + 1][0] if i + 1 < len(candidates) else TORCH
        check.failures.append((impl, why))
        warnings.warn(f"sixbit kernels: {'/'.join(map(str, key))} on {dk}: {impl} failed its self-check ({why}); "
                      f"falling back to {nxt}", RuntimeWarning, stacklevel=3)
    check.seconds = time.perf_counter() - t0
    _CHECKS[(dk, key)] = check
    return check.impl


def status(device) -> dict:
    """``{key: {"impl", "failures", "seconds"}}`` of every check made on ``device`` so far."""
    dk = device_key(device)
    return {"/".join(map(str, k)): {"impl": c.impl, "failures": list(c.failures), "seconds": c.seconds}
            for (d, k), c in _CHECKS.items() if d == dk}


def fallbacks(device) -> dict[str, str]:
    """``{key: impl}`` for the keys whose check failed at least once (what replaced the failed kernel)."""
    return {k: v["impl"] for k, v in status(device).items() if v["failures"]}


def reset(device=None) -> None:
    """Forget the checks (of one device, or all): the next call of each key checks again."""
    dk = None if device is None else device_key(device)
    for k in [k for k in _CHECKS if dk is None or k[0] == dk]:
        del _CHECKS[k]
