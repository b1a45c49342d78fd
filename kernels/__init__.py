"""sixbit's Triton kernels (imported as ``sixbit_kernels``; see ``sixbit/_kernels.py``)."""
