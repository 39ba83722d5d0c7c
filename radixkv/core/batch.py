"""ScheduledBatch: a `ScheduleOutput`'s rows laid out as one forward, and which logits rows
belong to which request.

The layout is computed once, here: per request in order, the rows scoring its prompt tokens
(when it asked for prompt log-probs) and then, if this forward ends its pending tokens, the row
it samples from. The forward returns exactly those rows; sampling (`radixkv.core.sampling`)
reads them by this layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.attention import ForwardBatch, ForwardMode
from radixkv.sched.kv import BatchRow
from radixkv.sched.logprobs import prompt_rows
from radixkv.sched.records import ScheduleOutput


@dataclass(slots=True)
class RowLayout:
    """Where one request's logits are: `prompt` rows (scoring prompt tokens `positions`), and
    its `sample` row (None when this forward does not end its pending tokens)."""

    prompt: list[int]
    positions: list[int]  # prompt positions whose logits `prompt` holds (they score position + 1)
    sample: int | None
    drafts: int = 0  # draft tokens: rows sample .. sample + drafts score the token after each


@dataclass(slots=True)
class ScheduledBatch:
    """One forward of a `ScheduleOutput` (decode rows first, then prefill chunks): its
    `forward` batch and, per row in order, where its logits are."""

    schedule: ScheduleOutput
    forward: ForwardBatch
    layout: list[RowLayout]  # per row, in order

    @property
    def rows(self) -> list[BatchRow]:
        return self.schedule.rows

    @property
    def all_samples(self) -> bool:
        """Every logits row is a request's one sample row (no prompt log-probs, no drafts)."""
        return all(not lay.prompt and not lay.drafts for lay in self.layout)

    @classmethod
    def build(cls, schedule: ScheduleOutput, device: torch.device) -> ScheduledBatch:
        rows, num_decode = schedule.rows, schedule.num_decode
        layout, index, offset, n = [], [], 0, 0
        for b, row in enumerate(rows):
            req = row.req
            scored = [] if b < num_decode else prompt_rows(req.logprob, len(req.prompt_ids), row.start, len(row.tokens))
            index.extend(offset + r for r in scored)
            prompt = list(range(n, n + len(scored)))
            n += len(scored)
            sample, k = None, len(row.draft)
            if row.samples:
                index.extend(offset + len(row.tokens) - 1 - k + i for i in range(k + 1))
                sample, n = n, n + k + 1
            layout.append(RowLayout(prompt, [row.start + r for r in scored], sample, k))
            offset += len(row.tokens)
        mode = ForwardMode.DECODE if all(len(row.tokens) == 1 for row in rows) else ForwardMode.EXTEND
        forward = ForwardBatch.build(mode, [row.tokens for row in rows], [row.req.row for row in rows],
                                     [row.start for row in rows], [s for row in rows for s in row.slots],
                                     device=device, logits=index)
        return cls(schedule, forward, layout)
