"""sixbit: 6Bit-Diffusion — training-free inference-time mixed-precision quantization for video DiTs."""

__version__ = "0.1.0"
