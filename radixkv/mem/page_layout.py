"""PageLayout: one stored page's bytes, for the storage backends that keep bytes.

A stored page (a block of device pages) is the rows of every storage tensor of the pool, in the
pool's order, back to back: codes and scales alike, so a quantised pool is stored quantised.
`encode` turns one page of the rows a tier is given into bytes; `decode` reads a page back as
views of a uint8 buffer, one tensor per storage tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def as_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a contiguous CPU tensor (any dtype, bfloat16 and fp8 included)."""
    return memoryview(t.contiguous().view(torch.uint8).numpy()).cast("B")


class PageLayout:
    """`page_shapes`: the pool's (shape per stored page, dtype) of each storage tensor."""

    def __init__(self, page_shapes: Sequence[tuple[tuple[int, ...], torch.dtype]]):
        self.page_shapes = [(tuple(shape), dtype) for shape, dtype in page_shapes]
        self.row_bytes = [int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
                          for shape, dtype in self.page_shapes]
        self.page_bytes = sum(self.row_bytes)

    def encode(self, rows: Sequence[torch.Tensor], j: int) -> bytes:
        """Page `j` of `rows` (one CPU tensor `[n, *shape]` per storage tensor) as bytes."""
        page = b"".join(as_bytes(r[j]) for r in rows)
        assert len(page) == self.page_bytes, (len(page), self.page_bytes)
        return page

    def decode(self, data: torch.Tensor, at: int = 0) -> list[torch.Tensor]:
        """The page starting at byte `at` of `data` (uint8), one view per storage tensor."""
        page = []
        for (shape, dtype), nbytes in zip(self.page_shapes, self.row_bytes):
            page.append(data[at:at + nbytes].view(dtype).reshape(shape))
            at += nbytes
        return page
