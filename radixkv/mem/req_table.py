"""The request table: `req_to_token[req_slot, position] -> kv slot`.

Attention kernels read a request's KV through this one indirection, whatever pages it was
assembled from (cached prefix pages, fresh pages, copy-on-write copies).
"""

from __future__ import annotations

import torch

from radixkv.errors import ConfigError


class ReqToTokenTable:
    """`max_reqs` rows of `max_context_len` int32 KV slot ids, one row per running request."""

    def __init__(self, max_reqs: int, max_context_len: int, device: torch.device | str = "cpu"):
        if max_reqs < 1 or max_context_len < 1:
            raise ConfigError(
                f"request table needs max_reqs >= 1 and max_context_len >= 1, "
                f"got {max_reqs} and {max_context_len}"
            )
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.table = torch.zeros(
            (max_reqs, max_context_len), dtype=torch.int32, device=device
        )  # (R, L)
        self._free_rows = list(range(max_reqs - 1, -1, -1))
        self.journal = None  # a KVJournal that records every write (tensor-parallel rank 0)

    @property
    def free_rows(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int:
        """Take a free row; raises `RuntimeError` if every row is in use."""
        if not self._free_rows:
            raise RuntimeError(f"all {self.max_reqs} request-table rows are in use")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        if not 0 <= row < self.max_reqs or row in self._free_rows:
            raise ValueError(f"request-table row {row} is not in use")
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: list[int] | torch.Tensor) -> None:
        """Set positions `[start, start + len(slots))` of `row` to `slots`."""
        n = len(slots)
        if start < 0 or start + n > self.max_context_len:
            raise ValueError(
                f"positions [{start}, {start + n}) exceed max_context_len={self.max_context_len}"
            )
        if n:
            src = torch.as_tensor(slots, dtype=torch.int32)
            self.table[row, start : start + n] = src.to(self.table.device, non_blocking=True)
            if self.journal is not None:
                self.journal.table_write(row, start, src)

    def read(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]  # (length,)
