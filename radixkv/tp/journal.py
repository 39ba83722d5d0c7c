"""KVJournal: rank 0's record of the changes to its KV memory that other ranks must mirror.

Outside a forward, the scheduler changes KV state in three ways: it writes request-table rows
(a request's prefix slots, its new chunk's slots), copies a page (copy-on-write of a shared
partial page), and moves pages to and from the host tier. Each rank holds different KV heads of
the same slots, so each must make the same changes to its own memory before the next forward
reads them. `KVMemory.attach_journal` makes rank 0's memory record them here; `replay` applies
a drained record to another rank's memory, in the order they happened.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from radixkv.mem.kv_memory import KVMemory


class KVJournal:
    """Request-table writes and page operations since the last `drain`."""

    def __init__(self) -> None:
        self.table_writes: list = []  # [row, start, int32 slot bytes]
        self.page_ops: list = []  # [op, pages_a, pages_b]

    def table_write(self, row: int, start: int, slots: Sequence[int] | torch.Tensor) -> None:
        data = torch.as_tensor(slots, dtype=torch.int32).cpu().numpy().tobytes()
        self.table_writes.append([row, start, data])

    def page_copy(self, src: int, dst: int) -> None:
        self.page_ops.append(["copy", [src], [dst]])

    def host_save(self, device_pages: Sequence[int], host_pages: Sequence[int]) -> None:
        self.page_ops.append(["save", list(device_pages), list(host_pages)])

    def host_load(self, host_pages: Sequence[int], device_pages: Sequence[int]) -> None:
        self.page_ops.append(["load", list(host_pages), list(device_pages)])

    def drain(self) -> tuple[list, list]:
        """Everything recorded so far (and forget it)."""
        out = (self.table_writes, self.page_ops)
        self.table_writes, self.page_ops = [], []
        return out


def replay(memory: KVMemory, table_writes: list, page_ops: list) -> None:
    """Apply rank 0's drained journal to this rank's `memory`."""
    for row, start, data in table_writes:
        memory.req_table.write(row, start, torch.from_numpy(np.frombuffer(data, dtype=np.int32).copy()))
    for op, a, b in page_ops:
        if op == "copy":
            memory.pool.copy_page(a[0], b[0])
        elif op == "save":
            memory.host.save(a, b)
        elif op == "load":
            memory.host.load(a, b)
        else:
            raise ValueError(f"unknown page operation {op!r} in the KV journal")
