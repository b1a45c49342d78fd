"""The session-12 diagnostic of test_norm_modulate_dense_codes_and_no_affine[3072] on CUDA: the fused norm + modulate
producer's fp16-codes form against its INT8 form and the spec, on the test's own inputs, per width.

    python benchmarks/norm_codes_diag.py      # GPU; writes one JSON line per width (benchmarks/results/norm_modulate_3072_h200.log)
"""
import json
import sys

import torch

sys.path.insert(0, "tests")
import test_kernels_fused as t

from sixbit import formats as spec
from sixbit_kernels import norm_quant as nq  # noqa

out = {}
for k in (384, 1920, 3072, 4096):
    parts = t._parts(2, 4, 19, k, seed=5, dtype=torch.bfloat16)
    q8, _ = nq.norm_modulate(t._to(parts, "cuda"), None, None, 1e-6, 128)
    q16, _ = nq.norm_modulate(t._to(parts, "cuda"), None, None, 1e-6, 128, dense=True)
    ref = spec.norm_modulate_int8(parts, None, None, 1e-6, 128)
    a, b = q8.data.float().cpu(), q16.data.float().cpu()
    d = (a - b).abs()
    rowdiff = (d > 0).any(dim=1)
    r = {"codes_differ": int((d > 0).sum()), "max_code_diff": float(d.max()), "rows_differ": int(rowdiff.sum()),
         "rows": int(a.shape[0]), "scales_equal": bool(torch.equal(q8.scale.cpu(), q16.scale.cpu())),
         "scale_max_rel": float(((q8.scale.cpu() - q16.scale.cpu()).abs() / q8.scale.cpu().abs().clamp_min(1e-30)).max()),
         "q16_not_integer": int((b != b.round()).sum()), "q16_absmax": float(b.abs().max()),
         "q8_vs_ref_differ": int(((a - ref.data.float()).abs() > 0).sum()),
         "q16_vs_ref_differ": int(((b - ref.data.float()).abs() > 0).sum()),
         "q8_vs_ref_max": float((a - ref.data.float()).abs().max()),
         "q16_vs_ref_max": float((b - ref.data.float()).abs().max()),
         "warps": nq.default_warps(k, 128)}
    if r["codes_differ"]:
        idx = (d > 0).nonzero()[:8].tolist()
        r["examples"] = [(i, j, a[i, j].item(), b[i, j].item(), ref.data[i, j].item()) for i, j in idx]
        r["differing_rows"] = rowdiff.nonzero().flatten()[:20].tolist()
    out[k] = r
    print(k, json.dumps(r), flush=True)
