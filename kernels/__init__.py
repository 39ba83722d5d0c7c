"""Triton kernels of radixkv (installed as `radixkv.kernels`)."""
