"""Transformer (and text-encoder) weight bytes at real sizes: ``python -m benchmarks weights``.

Measured by applying sixbit to a random-weight model on the CPU: the byte count of packed weights does not
depend on the device or on the weights' values. ``--sizes t5xxl`` measures CogVideoX's text encoder (the
T5-XXL encoder) under ``sixbit.quantize_text_encoder``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import (
    RESULTS,
    SIZES,
    env_md,
    environment,
    module_bytes,
    parse,
    resident_weight_bytes,
    write_results,
)


def weights(args) -> dict:
    """Transformer weight bytes at real sizes, measured by applying sixbit to a random-weight model on the
    CPU (the byte count of packed weights does not depend on the device or on the weights' values)."""
    from diffusers import CogVideoXTransformer3DModel

    import sixbit
    from sixbit.linear import param_bytes

    rows = {}
    variants = {
        "full": ("full", {}),
        "full, 4-bit modulation weights": ("full", {"modulation_weights": "nvfp4"}),
        "w8a8": ("w8a8", {}),
        "full, 4-bit modulation + embedder weights": ("full", {"modulation_weights": "nvfp4",
                                                               "embedder_weights": "nvfp4"}),
        "full, INT8 route on W8A8": ("full", {"int8_route": "w8a8", "modulation_weights": "nvfp4"}),
    }
    for size in args.sizes:
        torch.manual_seed(0)
        if size == "t5xxl":
            rows[size] = text_encoder_weights()
            write_weights(rows, args)
            continue
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # build in bf16: 5B in fp32 would not fit a 24 GB machine
        try:
            # .to(): the sincos positional table is built in float64 under a bf16 default; cast it as
            # from_pretrained(torch_dtype=bf16) does
            tr = CogVideoXTransformer3DModel(**SIZES[size]).to(torch.bfloat16).eval()
        finally:
            torch.set_default_dtype(prev)
        base = module_bytes(tr)
        base_params = param_bytes(tr)
        rows[size] = {"params": sum(p.numel() for p in tr.parameters()), "bf16_bytes": base,
                      "bf16_param_bytes": base_params, "variants": {}}
        for label, (preset, over) in variants.items():
            t0 = time.perf_counter()
            handle = sixbit.apply(tr, sixbit.SixBitConfig.preset(preset, **over))
            mem = handle.memory()
            handle.remove()
            entry = {"preset": preset, "overrides": over, "memory": mem}
            resident = resident_weight_bytes(entry, {"transformer_weight_bytes_bf16": base})
            params_only = mem["packed_bytes"] + mem["other_transformer_bytes"] + mem["fp_bytes_on_device"]
            entry.update(resident_bytes=resident, reduction=base / resident, param_bytes=params_only,
                         param_reduction=base_params / params_only, pack_seconds=time.perf_counter() - t0)
            rows[size]["variants"][label] = entry
            print(f"[weights {size}] {label}: {resident / 2**30:.2f} GiB ({base / resident:.2f}x smaller; "
                  f"parameters alone {base_params / params_only:.2f}x)", flush=True)
        del tr
        write_weights(rows, args)
    return {"models": rows}


T5XXL_CONFIG = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                    feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)


def text_encoder_weights() -> dict:
    """CogVideoX's T5-XXL encoder (random bf16 weights, built on the CPU) under quantize_text_encoder."""
    from transformers import T5Config, T5EncoderModel

    import sixbit
    from sixbit.linear import param_bytes

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        te = T5EncoderModel(T5Config(**T5XXL_CONFIG)).eval()
    finally:
        torch.set_default_dtype(prev)
    base = module_bytes(te)
    t0 = time.perf_counter()
    h = sixbit.quantize_text_encoder(te)
    mem = h.memory()
    h.remove()
    params_only = mem["packed_bytes"] + mem["other_bytes"]
    resident = params_only + sum(b.numel() * b.element_size() for b in te.buffers())
    base_params = param_bytes(te)
    print(f"[weights t5xxl] 4-bit linears: {resident / 2**30:.2f} GiB ({base / resident:.2f}x smaller)", flush=True)
    return {"model": "T5-XXL text encoder", "params": sum(p.numel() for p in te.parameters()), "bf16_bytes": base,
            "bf16_param_bytes": base_params,
            "variants": {"4-bit linear weights (quantize_text_encoder; wo 16-bit)": {
                "memory": mem, "resident_bytes": resident, "reduction": base / resident, "param_bytes": params_only,
                "param_reduction": base_params / params_only, "pack_seconds": time.perf_counter() - t0}}}


def write_weights(rows: dict, args) -> None:
    env = environment("cpu", args.command)
    md = ["# Weight memory at real CogVideoX sizes", "",
          "Bytes a model keeps on the device after `sixbit.apply` (transformers) or `sixbit.quantize_text_encoder` "
          "(the text encoder): packed weights + the layers left in 16 bits + buffers, against the bf16 model. Measured by packing a random-weight model on the CPU: "
          "the byte count does not depend on the device or the values. *resident* counts parameters and buffers "
          "(CogVideoX-2B has a 68 MB bf16 sin-cos positional table that no weight format changes); "
          "*parameters* counts the weights alone.", "",
          "| model | configuration | resident GiB | × smaller | parameters GiB | × smaller |", "|---|---|---|---|---|---|"]
    for size, r in rows.items():
        bp = r.get("bf16_param_bytes", r["bf16_bytes"])
        model = r.get("model", f"CogVideoX-{size.upper()}")
        md.append(f"| {model} | bf16 | {r['bf16_bytes'] / 2**30:.2f} | 1.00 | {bp / 2**30:.2f} | 1.00 |")
        for label, e in r["variants"].items():
            md.append(f"| {model} | {label} | {e['resident_bytes'] / 2**30:.2f} | {e['reduction']:.2f} | "
                      f"{e['param_bytes'] / 2**30:.2f} | {e['param_reduction']:.2f} |")
    md += ["", env_md(env), ""]
    payload = {"benchmark": "weights", "environment": env, "models": rows}
    write_results(args.name or "weights", payload, "\n".join(md), Path(args.out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks weights", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["2b", "5b"], choices=["2b", "5b", "t5xxl"],
                   help="t5xxl: CogVideoX's text encoder (T5-XXL encoder) under sixbit.quantize_text_encoder")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default=None)
    args = parse(p, argv)
    weights(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
