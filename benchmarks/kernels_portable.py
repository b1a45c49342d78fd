"""Portable vs Hopper kernel variants vs cuBLAS bf16, end to end through ``ops.linear``.

Run on a CUDA GPU from the repository root::

    python -m benchmarks.kernels_portable --out benchmarks/results/kernels_portable_h200

At the CogVideoX-2B block linear shapes (M = 35,552 rows: 49 frames 480x720, CFG batched; Hadamard block
64) it times, with ``triton.testing.do_bench`` medians after warm-up (L2 flushed), each route
(``w8a8``, ``int8`` = W4A8, ``nvfp4`` = W4A4, ``w4a16``) through ``ops.linear(..., backend="triton",
options=KernelOptions(target=...))`` — quantize + GEMM, what the engine calls — for three targets of this
device: the Hopper variant (TMA descriptors), the portable variant with the configs this device's shared
memory allows, and the portable variant restricted to the 99 KB configs that sm_86/89/120 get — next to
``F.linear`` in bf16 (cuBLAS). Each timed call is first checked against the torch reference
(``backend="torch"``) on its first 512 rows. Writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch
import triton
from triton.testing import do_bench

import sixbit_kernels as sk
from sixbit import formats as spec

ops, targets = sk.ops, sk.targets

SHAPES = [("qkv (fused)", 1920, 5760), ("attn out", 1920, 1920), ("ff in", 1920, 7680), ("ff out", 7680, 1920)]
ROUTES = ("w8a8", "int8", "nvfp4", "w4a16")
M = 35552


def bench(fn, rep: int) -> float:
    fn()
    torch.cuda.synchronize()
    return float(do_bench(fn, warmup=max(10, rep // 4), rep=rep, return_mode="median"))


def variant_targets(device) -> dict[str, targets.Target]:
    cap = torch.cuda.get_device_capability(device)
    smem = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)
    out = {"portable": targets.target_for(cap, smem, "portable"),
           "portable (99 KB configs)": targets.target_for(cap, 99 * targets.KB, "portable")}
    if cap[0] == 9:
        out = {"hopper": targets.target_for(cap, smem, "hopper"), **out}
    return out


def run(rep: int, hb: int) -> dict:
    dev = torch.device("cuda")
    tg = variant_targets(dev)
    rows = []
    for layer, k, n in SHAPES:
        g = torch.Generator(device=dev).manual_seed(k + n)
        x = torch.randn(M, k, generator=g, device=dev).to(torch.bfloat16)
        x[:, 7] *= 30.0
        w = torch.randn(n, k, generator=g, device=dev) / k**0.5
        b = torch.randn(n, generator=g, device=dev)
        wb, bb = w.to(torch.bfloat16), b.to(torch.bfloat16)
        p = ops.pack_linear(w, bb, formats=("nvfp4", "int8"), hadamard_block=hb)
        if not rows:  # the load-time self-check, as the engine meets it: first auto call of each route
            t0 = time.perf_counter()
            for route in ROUTES:
                ops.linear(x, p, route)
            torch.cuda.synchronize()
            check = {"first_auto_calls_s": time.perf_counter() - t0, "compute_path": ops.compute_path(dev),
                     "status": ops.self_check_status(dev)}
            print(json.dumps(check), flush=True)
        t_bf16 = bench(lambda x=x, wb=wb, bb=bb: torch.nn.functional.linear(x, wb, bb), rep)
        rows.append({"layer": layer, "K": k, "N": n, "route": "bf16", "variant": "cuBLAS F.linear", "ms": t_bf16,
                     "speed_vs_bf16": 1.0})
        for route in ROUTES:
            ref, _ = ops.linear(x[:512], p, route, backend="torch")
            for name, t in tg.items():
                opts = ops.KernelOptions(target=t)
                r = {"layer": layer, "K": k, "N": n, "route": route, "variant": name}
                try:
                    y, _ = ops.linear(x[:512], p, route, backend="triton", options=opts)
                    r["rel_err_vs_torch"] = float(spec.relative_error(y.float(), ref.float()))
                    r["ms"] = bench(lambda x=x, p=p, route=route, opts=opts: ops.linear(
                        x, p, route, backend="triton", options=opts), rep)
                    r["speed_vs_bf16"] = t_bf16 / r["ms"]
                except Exception as e:  # recorded, not fatal
                    r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(r)
                print(json.dumps(r), flush=True)
        del x, w, p
        torch.cuda.empty_cache()
    return {"rows": rows, "self_check": check, "targets": {k: {"capability": v.capability, "smem": v.smem, "variant": v.variant,
                                          "ptx_decode": v.ptx_decode} for k, v in tg.items()}}


#: portable launch-config candidates (GEMM alone, inputs already quantized): the decode-once W4 GEMM and W8A8
SWEEP = {
    "w4_decoded_once": [(256, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4),
                        (256, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4), (128, 128, 64, 8, 4, 3),
                        (128, 128, 32, 8, 4, 5), (128, 256, 32, 8, 8, 4)],
    "w8a8": [(128, 128, 128, 8, 4, 3), (128, 256, 128, 8, 8, 3), (256, 128, 128, 8, 8, 3), (128, 128, 64, 8, 4, 4),
             (128, 128, 128, 8, 8, 3)],
}


def sweep(rep: int, hb: int) -> list[dict]:
    """Each :data:`SWEEP` config of the portable variant at the 2B shapes (GEMM alone, ms)."""
    dev = torch.device("cuda")
    tgt = variant_targets(dev)["portable"]
    g4, g8, hq = sk.gemm_w4, sk.gemm_w8a8, sk.hadamard_quant
    out = []
    for layer, k, n in SHAPES:
        g = torch.Generator(device=dev).manual_seed(k + n)
        x = torch.randn(M, k, generator=g, device=dev).to(torch.bfloat16)
        w = torch.randn(n, k, generator=g, device=dev) / k**0.5
        a16, _ = hq.scale16_act(x, hb)
        q8, _ = hq.quantize_int8_act(x, hb)
        w4, w8 = spec.quantize_nvfp4(w), spec.quantize_int8(w)
        for name, cands in SWEEP.items():
            for cfg in cands:
                c = targets.GemmConfig(*cfg)
                r = {"layer": layer, "K": k, "N": n, "kernel": name, "config": list(cfg)}
                try:
                    if name == "w8a8":
                        fn = lambda c=c, q8=q8, w8=w8: g8.gemm_w8a8(q8, w8, None, config=c, target=tgt)  # noqa: E731
                    else:
                        fn = lambda c=c, a=a16, w4=w4: g4.gemm_w4(  # noqa: E731
                            a, w4, None, decode="once", config=c, target=tgt)
                    r["ms"] = bench(fn, rep)
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                out.append(r)
                print(json.dumps(r), flush=True)
        del x, a16, q8
        torch.cuda.empty_cache()
    return out


def summary(rows) -> list[dict]:
    """Per route and shape: portable / hopper speed (both from the same run)."""
    out = []
    by = {(r["layer"], r["route"], r["variant"]): r.get("ms") for r in rows}
    for layer, _, _ in SHAPES:
        for route in ROUTES:
            h, p = by.get((layer, route, "hopper")), by.get((layer, route, "portable"))
            if h and p:
                out.append({"layer": layer, "route": route, "portable_over_hopper_speed": h / p})
    return out


def markdown(res) -> str:
    env = res["env"]
    lines = [f"# Portable vs Hopper kernel variants vs cuBLAS bf16 ({env['device']})", "",
             f"`{env['command']}` — {env['date']}; torch {env['torch']}, triton {env['triton']}, "
             f"CUDA {env['cuda']}, capability {env['capability']}, python {env['python']}.", "",
             f"M = {M} rows, Hadamard block {res['hb']}, `ops.linear` end to end (quantize + GEMM), do_bench "
             f"medians (rep {res['rep']} ms, L2 flushed). rel err: vs `backend=\"torch\"` on the first 512 rows.",
             "", "| layer (K→N) | route | variant | ms | × bf16 | rel err |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['layer']} ({r['K']}→{r['N']}) | {r['route']} | {r['variant']} | FAILED: "
                         f"{r['error'][:80]} | | |")
            continue
        err = f"{r['rel_err_vs_torch']:.1e}" if "rel_err_vs_torch" in r else ""
        lines.append(f"| {r['layer']} ({r['K']}→{r['N']}) | {r['route']} | {r['variant']} | {r['ms']:.3f} | "
                     f"{r['speed_vs_bf16']:.2f} | {err} |")
    sc = res["self_check"]
    lines += ["", f"Self-check (first `backend=\"auto\"` call of each route at {SHAPES[0][1]}→{SHAPES[0][2]}, "
              f"compiles included: {sc['first_auto_calls_s']:.1f} s): compute_path `{sc['compute_path']}`; "
              + ", ".join(f"{k} {v['impl']} ({v['seconds']:.2f} s)" for k, v in sc["status"].items())]
    lines += ["", "Portable speed as a fraction of the Hopper variant's (same run):", "",
              "| layer | route | portable / hopper |", "|---|---|---|"]
    lines += [f"| {s['layer']} | {s['route']} | {s['portable_over_hopper_speed']:.2f} |" for s in res["summary"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/kernels_portable")
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--hb", type=int, default=64)
    ap.add_argument("--sweep", action="store_true", help="only the portable config sweep (GEMM alone)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if a.sweep:
        rows = sweep(a.rep, a.hb)
        with open(a.out + "_sweep.json", "w") as f:
            json.dump({"rows": rows, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "command": "python -m benchmarks.kernels_portable --sweep "
                       + " ".join(argv or sys.argv[1:])}, f, indent=1)
        return 0
    res = run(a.rep, a.hb)
    res.update(rep=a.rep, hb=a.hb, summary=summary(res["rows"]))
    res["env"] = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
                  "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
                  "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                  "command": "python -m benchmarks.kernels_portable " + " ".join(argv or sys.argv[1:])}
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
