"""Attention backends over the paged KV pool and the forward-batch context they read."""

from radixkv.attention.backend import BACKENDS, AttentionBackend, TorchBackend, TritonBackend, make_backend
from radixkv.attention.forward_batch import ForwardBatch, ForwardMode

__all__ = ["BACKENDS", "AttentionBackend", "ForwardBatch", "ForwardMode", "TorchBackend",
           "TritonBackend", "make_backend"]
