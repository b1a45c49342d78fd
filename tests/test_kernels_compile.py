"""Every kernel launch sixbit dispatches compiles for sm_80, 86, 89, 90, 100 and 120 — without the GPUs.

``sixbit_kernels.aot`` (run in a subprocess: the compiler needs ``TRITON_INTERPRET`` unset, which this
suite sets) drives the real wrappers with each target's dispatch, records every launch and compiles it
with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))``; Hopper-only launches (TMA
descriptors) only for sm_90. Fails on any compile error, and on any dispatched config whose shared memory
(``metadata.shared``) exceeds the target's opt-in budget (``targets.SMEM_OPTIN``).

Cost: ~240 launches; ~2 min cold on the 2-core CI machine (two worker processes), a few seconds once
triton's on-disk cache (``~/.triton/cache``, or ``TRITON_CACHE_DIR``) holds them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CAPS = (80, 86, 89, 90, 100, 120)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="cross-compile check for CPU CI machines")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9's default, stated to silence its warning
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from sixbit_kernels import aot; "
         f"sys.exit(aot.main(['--caps', '{','.join(map(str, CAPS))}', '--json', {str(out)!r}]))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("cap", CAPS)
def test_every_dispatched_launch_compiles_and_fits_shared_memory(results, cap):
    mine = [r for r in results if r["cap"] == cap]
    assert len(mine) >= 30, f"sm_{cap}: only {len(mine)} launches recorded"
    errors = [f"{r['variant']} {r['kernel']} {r['constexprs']}: {r['error']}" for r in mine if "error" in r]
    assert not errors, "\n".join(errors)
    over = [f"{r['variant']} {r['kernel']} {r['constexprs']}: {r['shared']} > {r['budget']} B"
            for r in mine if r["over_budget"]]
    assert not over, "\n".join(over)


def test_hopper_variant_only_on_sm90_and_covers_the_tma_kernels(results):
    hopper = {r["cap"] for r in results if r["variant"] == "hopper"}
    assert hopper == {90}
    tma = [r for r in results if r["constexprs"].get("TMA")]
    assert tma and all(r["variant"] == "hopper" for r in tma)
    kernels = {r["kernel"] for r in results}
    assert all(r["variant"] == "hopper" for r in results if r["kernel"] == "_gemm_dense_w_persistent_kernel")
    acts = {(r["kernel"], r["constexprs"].get("ACT")) for r in results}  # the GELU epilogue of the large-M GEMMs
    assert {(k, 1) for k in ("_gemm_w8a8_kernel", "_gemm_dense_w_kernel", "_gemm_dense_w_persistent_kernel")} <= acts
    assert {"_gemm_w8a8_kernel", "_gemm_w4_kernel", "_gemm_dense_w_kernel", "_gemm_dense_w_persistent_kernel",
            "_decode_w_kernel", "_requant_kernel", "_rows_kernel",
            "_nvfp4_kernel", "_delta_stats_kernel", "_gated_residual_kernel", "_finite_l1_kernel", "_ln_rows_kernel"} <= kernels


def test_token_count_arguments_are_not_specialised():
    """The kernels whose row / token counts vary with the video (and with PDR's per-stream calls: 2 × 226 text
    rows at 2B) do not specialise on them, so the warm-up's small problem compiles the variant a run meets
    (session 12: the rows kernel's M specialisation put a 0.5 s compile inside step 8 of a timed run)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("from sixbit_kernels import hadamard_quant as h, norm_quant as n, gated_residual as g; "
            "print({f.fn.__name__: sorted(p.name for p in f.params if p.do_not_specialize) "
            "for f in (h._rows_kernel, n._norm_mod_kernel, g._gated_residual_kernel)})")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == str({"_rows_kernel": ["M"], "_norm_mod_kernel": ["OFF", "S", "S_OUT"],
                                                          "_gated_residual_kernel": ["S"]})
