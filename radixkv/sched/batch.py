"""ScheduledBatch: the requests of one forward, the new tokens of each, and which sample."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from radixkv.attention import ForwardBatch, ForwardMode
from radixkv.sched.request import Req


@dataclass
class ScheduledBatch:
    """One forward: decode rows (one token each) first, then prefill chunks."""

    mode: ForwardMode
    reqs: list[Req]
    new_tokens: list[list[int]]  # per request, the tokens this forward runs
    samples: list[bool]  # per request, whether its last position yields a new token
    num_decode: int  # reqs[:num_decode] are decode rows, the rest prefill chunks
    forward: ForwardBatch

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(t) for t in self.new_tokens[self.num_decode:])

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        reqs: list[Req],
        starts: list[int],
        new_tokens: list[list[int]],
        slots: list[int],
        samples: list[bool],
        num_decode: int,
        device: torch.device,
    ) -> ScheduledBatch:
        """`starts[b]`: position of request b's first new token (its KV length before)."""
        fb = ForwardBatch.build(mode, new_tokens, [r.row for r in reqs], starts, slots,
                                device=device, logits="last")
        if not all(samples):  # logits only where a token is sampled (skip mid-prefill chunks)
            keep = torch.tensor([i for i, s in enumerate(samples) if s], dtype=torch.int64)
            fb = replace(fb, logits_index=fb.logits_index[keep.to(fb.logits_index.device)])
        return cls(mode, reqs, new_tokens, samples, num_decode, fb)
