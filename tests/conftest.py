"""Shared test set-up.

Triton kernels run in interpreter mode on CPU-only hosts: ``TRITON_INTERPRET`` must be set before any
module decorates a ``@triton.jit`` function, i.e. before the first import of ``sixbit_kernels`` — which is
why it is set here, at collection time, and not in the kernel test modules.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


import pytest  # noqa: E402


@pytest.fixture()
def one_thread():
    """Run a test on one intra-op thread. The tiny-model tests are dominated by per-op overhead; with two
    threads on a 2-core machine that is busy elsewhere, OpenMP waiting makes them ~30x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
