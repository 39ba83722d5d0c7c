"""What rank 0 sends the other tensor-parallel ranks, and their msgpack codec.

    rank 0 --TPStart (once), TPForward (every forward), TPStop--> ranks 1..N-1

A `TPForward` carries the batch (its index tensors as raw little-endian bytes) and every change
rank 0 made to its KV memory since the previous forward outside a forward: request-table writes
and page copies (copy-on-write, host-tier saves and loads), in order (`KVJournal`). Replaying
them keeps every rank's pool and request table slot-for-slot identical to rank 0's, so one
scheduler's radix-cache decisions hold on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixkv.attention.forward_batch import ForwardBatch, ForwardMode
from radixkv.ipc.codec import MessageCodec

# the ForwardBatch index tensors, in wire order, with their dtypes
_BATCH_TENSORS = (("input_ids", np.int64), ("positions", np.int64), ("req_pool_indices", np.int64),
                  ("seq_lens", np.int32), ("prefix_lens", np.int32), ("extend_start_loc", np.int32),
                  ("out_cache_loc", np.int64), ("logits_index", np.int64))


@dataclass(frozen=True, slots=True)
class TPStart:
    """Rank 0 -> all, once: the KV memory every rank builds (same pages, same table shape)."""

    num_pages: int
    max_reqs: int
    context_length: int
    host_pages: int  # 0: no host tier
    host_write_policy: str


@dataclass(frozen=True, slots=True)
class TPForward:
    """Rank 0 -> all: replay `table_writes` and `page_ops`, then run the forward of the batch."""

    table_writes: list  # [row, start, int32 slot bytes]
    page_ops: list  # [op, pages_a, pages_b]: ["copy", [src], [dst]], ["save", device, host], ["load", host, device]
    mode: str
    tensors: list[bytes]  # _BATCH_TENSORS, in order
    max_extend_len: int
    max_seq_len: int


@dataclass(frozen=True, slots=True)
class TPStop:
    """Rank 0 -> all: leave the loop and exit."""


TP_CODEC = MessageCodec((TPStart, TPForward, TPStop), "tensor-parallel")


def forward_message(fb: ForwardBatch, table_writes: list, page_ops: list) -> TPForward:
    tensors = [getattr(fb, name).cpu().numpy().astype(dtype, copy=False).tobytes() for name, dtype in _BATCH_TENSORS]
    return TPForward(table_writes, page_ops, fb.mode.value, tensors, fb.max_extend_len, fb.max_seq_len)


def batch_from_message(msg: TPForward, device: torch.device) -> ForwardBatch:
    """The `ForwardBatch` rank 0 built, on this rank's `device`."""
    arrays = {name: torch.from_numpy(np.frombuffer(data, dtype=dtype).copy()).to(device)
              for (name, dtype), data in zip(_BATCH_TENSORS, msg.tensors, strict=True)}
    return ForwardBatch(mode=ForwardMode(msg.mode), max_extend_len=msg.max_extend_len,
                        max_seq_len=msg.max_seq_len, **arrays)
