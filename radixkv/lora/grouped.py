"""The LoRA delta on CPU (and wherever the Triton kernels do not run): rows grouped by adapter,
two batched matmuls for the whole batch.

A forward's adapted rows are gathered into one (n, L, K) block per adapter in the batch (n
adapters, L the most rows any has; shorter groups padded with row 0, masked to zero), then
`bmm` with their A (n, K, R') and B (n, R', N), scaled, and added back by index: seven torch
calls per linear whatever the adapters' mix, where one product per run of rows costs three
calls per run (a batch alternating adapters row by row has as many runs as rows).
`radixkv.kernels.reference.lora_sgmv_reference` is the per-run twin the tests compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Groups:
    """A batch's adapted rows by slot: `slots` (n,), `index` (n * L,) row ids (pads: row 0),
    `mask` (n, L, 1) 1 for a real row, 0 for a pad."""

    slots: torch.Tensor
    index: torch.Tensor
    mask: torch.Tensor
    length: int

    @classmethod
    def of(cls, segments: list[tuple[int, int, int]], device: torch.device, dtype: torch.dtype) -> Groups | None:
        rows: dict[int, list[int]] = {}
        for start, n, slot in segments:
            if slot >= 0:
                rows.setdefault(slot, []).extend(range(start, start + n))
        if not rows:
            return None
        length = max(len(r) for r in rows.values())
        index, mask = [], []
        for r in rows.values():
            index += r + [0] * (length - len(r))
            mask += [1.0] * len(r) + [0.0] * (length - len(r))
        return cls(torch.tensor(list(rows), dtype=torch.int64, device=device),
                   torch.tensor(index, dtype=torch.int64, device=device),
                   torch.tensor(mask, dtype=dtype, device=device).view(len(rows), length, 1), length)


def lora_grouped(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: torch.Tensor,
                 groups: Groups) -> torch.Tensor:
    """y (T, N) += each adapted row's `scaling * (x @ A.T) @ B.T` (a (S, R, K), b (S, N, R)), in place."""
    n, length = groups.slots.shape[0], groups.length
    xg = x.index_select(0, groups.index).view(n, length, x.shape[1])  # (n, L, K)
    h = torch.bmm(xg, a.index_select(0, groups.slots).transpose(1, 2))  # (n, L, R)
    delta = torch.bmm(h, b.index_select(0, groups.slots).transpose(1, 2))  # (n, L, N)
    delta = delta * (scaling.index_select(0, groups.slots).to(delta.dtype).view(n, 1, 1) * groups.mask)
    return y.index_add_(0, groups.index, delta.view(n * length, -1))
