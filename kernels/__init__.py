"""Paged-attention kernels: Triton fast paths and their torch references (same signatures).

`store_kv`, `extend_attention`, `decode_attention` and `mla_decode_attention` (latent attention,
absorbed) are the Triton kernels (CUDA, or the CPU interpreter under `TRITON_INTERPRET=1`);
`reference` holds the torch versions that the `torch` attention backend calls and the tests
compare against.
"""

from . import reference
from .decode_attention import decode_attention
from .extend_attention import extend_attention
from .mla_decode import mla_decode_attention
from .store_kv import store_kv

__all__ = ["decode_attention", "extend_attention", "mla_decode_attention", "reference", "store_kv"]
