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
    prompt_rows: list[list[int]]  # per request, offsets of its new tokens scoring prompt log-probs
    starts: list[int]  # per request, the position of its first new token

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
        prompt_rows: list[list[int]] | None = None,
    ) -> ScheduledBatch:
        """`starts[b]`: position of request b's first new token (its KV length before).

        Logits come back for, per request in order, its `prompt_rows` then (if it samples) its
        last new token; mid-prefill chunks that need neither get none."""
        prompt_rows = prompt_rows or [[] for _ in reqs]
        fb = ForwardBatch.build(mode, new_tokens, [r.row for r in reqs], starts, slots,
                                device=device, logits="last")
        index, offset = [], 0
        for toks, rows, sample in zip(new_tokens, prompt_rows, samples):
            index.extend(offset + r for r in rows)
            if sample:
                index.append(offset + len(toks) - 1)
            offset += len(toks)
        if index != fb.logits_index.tolist():
            fb = replace(fb, logits_index=torch.tensor(index, dtype=torch.int64).to(fb.logits_index.device))
        return cls(mode, reqs, new_tokens, samples, num_decode, fb, prompt_rows, list(starts))
