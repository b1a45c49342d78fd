"""sixbit: 6Bit-Diffusion — training-free inference-time mixed-precision quantization for video DiTs.

    import sixbit
    pipe = sixbit.load_pipeline()                      # embedded sixbit-mini, or a hub id / folder
    handle = sixbit.apply(pipe, sixbit.SixBitConfig.preset("balanced"))
    video = pipe("a red circle moving left", callback_on_step_end=handle.step_callback(on_step)).frames
    handle.trace.to_dict()                             # every decision of the last call
    handle.remove()                                    # the original model, bit for bit

Calibration: ``python -m sixbit.calibrate --model PATH_OR_ID --prompts FILE --out policy.json``.
Design notes: docs/ENGINE.md. The names below are imported lazily, so ``import sixbit.video`` (or any
other light submodule) does not pull in diffusers.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "apply": "sixbit.engine",
    "SixBitHandle": "sixbit.engine",
    "SixBitConfig": "sixbit.config",
    "load_pipeline": "sixbit.pipeline",
    "Policy": "sixbit.policy",
    "PolicyError": "sixbit.policy",
    "SkipSchedule": "sixbit.tdc",
    "Trace": "sixbit.trace",
    "quantize_text_encoder": "sixbit.text_encoder",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sixbit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
