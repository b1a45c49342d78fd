"""Kernel benchmark, tuning section: a few tile configs per kernel, the fastest handed on as explicit
``Target`` overrides (``--tune``), and the inline-PTX decode check."""

from __future__ import annotations

from dataclasses import replace

import torch

from benchmarks.kernels_common import Run, g4, g8, hq, rel, spec, targets

TUNE = {
    "w4_dense": (g4.A_DENSE, [(256, 128, 64, 8, 8, 4, True), (256, 128, 128, 8, 8, 2, True),
                              (256, 128, 64, 8, 8, 5, True)]),
    "w4_decoded_once": (None, [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (256, 128, 64, 8, 8, 3),
                               (256, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4), (128, 256, 128, 8, 8, 2)]),
    "w8a8": (None, [(128, 256, 128, 8, 8, 3), (256, 128, 128, 8, 8, 3), (128, 128, 128, 8, 4, 3),
                    (128, 128, 128, 8, 4, 2)]),
    "w8a8_tma": (None, [(128, 256, 128, 8, 8, 3), (256, 128, 128, 8, 8, 3), (128, 128, 64, 8, 4, 5),
                        (128, 128, 128, 4, 4, 3), (128, 128, 128, 8, 4, 3), (128, 128, 128, 16, 4, 3)]),
    # token-resident quantize: short rows (K 1920) and long rows (3072, 7680, 12288)
    "rows": (None, [(64, 8, 4), (128, 8, 2), (64, 4, 4), (128, 4, 4), (64, 4, 8), (32, 4, 8)]),
    "rows_long": (None, [(256, 4, 2), (256, 4, 4), (256, 8, 2), (256, 8, 4), (128, 4, 4), (128, 4, 8)]),
    "nvfp4_tiles": (None, [(64, 4, 4), (64, 8, 4), (128, 8, 2), (32, 4, 8), (32, 2, 8), (64, 2, 8), (64, 4, 8),
                           (128, 4, 4), (128, 4, 2), (256, 8, 2)]),
}
#: the ``Target`` override key each tuned kernel feeds (the w4 tile configs: ``w4_tile_<mode>``)
OVERRIDE_KEY = {"w4_decoded_once": "w4_once", "w8a8": "w8a8", "w8a8_tma": "w8a8", "rows": "rows",
                "rows_long": "rows_long", "nvfp4_tiles": "nvfp4_tiles"}
CONFIG_TYPE = {"w4_decoded_once": targets.GemmConfig, "w8a8": targets.GemmConfig, "w8a8_tma": targets.GemmConfig,
               "rows": targets.RowsConfig, "rows_long": targets.RowsConfig, "nvfp4_tiles": targets.RowsConfig}


def tune(run: Run, results) -> None:
    """Time each candidate config and hand the fastest to ``run.target`` as an explicit override (every
    later section, ``ops.linear`` included, then runs it); candidates and picks go into ``results``."""
    M, rep, hb = run.M, max(40, run.rep // 2), run.hb
    hopper, portable = run.variant("hopper"), run.variant("portable")
    out = {}
    for name, (mode, cands) in (run.tune_lists or TUNE).items():
        rows = []
        for cfg in cands:
            tot = 0.0
            per = {}
            try:
                for _, _, K, N in run.row_shapes.get(name, run.tune_shapes):
                    x, w, b = run.gemm_case(M, K, max(N, 16))
                    if name in run.row_shapes:
                        fn = lambda x=x, cfg=cfg: hq.quantize_int8_act(x, hb, config=cfg)  # noqa: E731
                    elif name == "nvfp4_tiles":
                        fn = lambda x=x, cfg=cfg: hq.quantize_nvfp4_act(x, hb, config=cfg)  # noqa: E731
                    elif name == "w4_decoded_once":
                        (v, bs, ts), _ = hq.quantize_nvfp4_act(x, hb, dense=True)
                        a = g4.DenseAct(v, "nvfp4", tensor_scale=ts)
                        w4 = spec.quantize_nvfp4(w)
                        fn = lambda a=a, w4=w4, b=b, cfg=cfg: g4.gemm_w4(a, w4, b, config=cfg, decode="once")  # noqa: E731
                    elif name in ("w8a8", "w8a8_tma"):
                        q8, _ = hq.quantize_int8_act(x, hb)
                        w8 = spec.quantize_int8(w)
                        tg = hopper if name == "w8a8_tma" else portable
                        fn = lambda q8=q8, w8=w8, b=b, cfg=cfg, tg=tg: g8.gemm_w8a8(  # noqa: E731
                            q8, w8, b, config=cfg, target=tg)
                    else:
                        w4 = spec.quantize_nvfp4(w)
                        if mode == g4.A_DENSE:
                            (v, bs, ts), _ = hq.quantize_nvfp4_act(x, hb, dense=True)
                            a = g4.DenseAct(v, "nvfp4", tensor_scale=ts)
                        elif mode == g4.A_NVFP4:
                            a, _ = hq.quantize_nvfp4_act(x, hb)
                        elif mode == g4.A_INT8:
                            a, _ = hq.quantize_int8_act(x, hb)
                        else:
                            a, _ = hq.rotate_split(x, hb)
                        fn = lambda a=a, w4=w4, b=b, cfg=cfg: g4.gemm_w4(a, w4, b, config=cfg, decode="tile")  # noqa: E731
                    t = run.bench(fn, rep)
                    per[f"{K}->{N}"] = t
                    tot += t
                    del x, w, b
                rows.append({"config": list(cfg), "ms": per, "total_ms": tot})
                run.log(f"tune {name} {cfg}: {per}")
            except Exception as e:  # a config that fails to compile or run is skipped
                rows.append({"config": list(cfg), "error": f"{type(e).__name__}: {str(e)[:300]}"})
                run.log(f"tune {name} {cfg}: FAILED {type(e).__name__}: {str(e)[:200]}")
            run.empty_cache()
        ok = [r for r in rows if "total_ms" in r]
        if ok:
            best = tuple(min(ok, key=lambda r: r["total_ms"])["config"])
            key = OVERRIDE_KEY.get(name) or f"w4_tile_{mode}"
            if name in ("w8a8", "w8a8_tma") and (name == "w8a8_tma") != (run.target.variant == "hopper"):
                key = None  # the other variant's pick: recorded, not dispatched on this device
            if key:
                nt = CONFIG_TYPE.get(name, targets.W4Config)
                run.target = run.target.with_configs(**{key: nt(*best)})
            if name == "w8a8_tma":
                plain = out.get("w8a8", {}).get("best_total_ms")
                results["w8a8_tma_faster"] = plain is None or min(r["total_ms"] for r in ok) < plain
                run.log(f"tune w8a8: TMA variant {'faster' if results['w8a8_tma_faster'] else 'slower'} than pointer loads")
            out[name] = {"best": list(best), "best_total_ms": min(r["total_ms"] for r in ok), "candidates": rows}
            run.log(f"tune {name}: best {best}")
        else:
            out[name] = {"best": None, "candidates": rows}
    results["tuning"] = out


def validate_ptx(run: Run, results) -> None:
    """Check the inline-PTX decode on this GPU; the run uses the element-wise decode if it is wrong."""
    x, w, b = run.gemm_case(77, 256, 192, seed=5)
    w4 = spec.quantize_nvfp4(w)
    ref = x.float() @ w4.dequantize(torch.float32).T + b
    errs = {}
    for ptx in (True, False):
        errs[ptx] = rel(g4.gemm_w4(x, w4, b, torch.float32, target=replace(run.target, ptx_decode=ptx)), ref)
    ok = errs[True] <= 1e-3
    run.target = replace(run.target, ptx_decode=run.target.ptx_decode and ok)
    results["ptx_decode"] = {"ok": ok, "rel_err_ptx": errs[True], "rel_err_portable": errs[False]}
    run.log(f"PTX decode check: {results['ptx_decode']}")
