"""Static-batch greedy generation straight on a ModelRunner (no scheduler, no prefix cache).

All prompts are prefilled in one extend forward, then decoded together, one token per step,
until each has `max_new_tokens`. This is the runner's own speed and correctness path, used by
tests and the runner benchmark; serving goes through the scheduler instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixkv.attention import ForwardMode
from radixkv.model.runner import ModelRunner


@dataclass
class StaticBatchResult:
    output_ids: list[list[int]]
    prefill_logits: torch.Tensor | None  # (sum of prompt lengths, V) when asked for
    step_logits: list[torch.Tensor]  # per generated token: (B, V)


def generate_static(
    runner: ModelRunner,
    prompts: list[list[int]],
    max_new_tokens: int,
    return_prefill_logits: bool = False,
    keep_step_logits: bool = False,
) -> StaticBatchResult:
    """Greedy-decode `max_new_tokens` for each prompt; frees everything it allocated."""
    rows = [runner.memory.req_table.alloc() for _ in prompts]
    seqs = [runner.memory.new_sequence() for _ in prompts]
    try:
        slots = []
        for row, seq, prompt in zip(rows, seqs, prompts):
            s = seq.extend(len(prompt))
            runner.memory.req_table.write(row, 0, s)
            slots.extend(s)
        fb = runner.build_batch(ForwardMode.EXTEND, prompts, rows, [0] * len(prompts), slots,
                                logits="all" if return_prefill_logits else "last")
        logits = runner.forward(fb)  # (N, V)
        prefill = logits if return_prefill_logits else None
        last = logits[fb.logits_index.new_tensor(
            [int(fb.extend_start_loc[b]) + len(p) - 1 for b, p in enumerate(prompts)])] \
            if return_prefill_logits else logits  # (B, V)
        outputs = [[int(t)] for t in last.argmax(-1).tolist()]
        steps = [last] if keep_step_logits else []
        for _ in range(max_new_tokens - 1):
            slots = []
            for row, seq in zip(rows, seqs):
                s = seq.extend(1)
                runner.memory.req_table.write(row, seq.num_tokens - 1, s)
                slots.extend(s)
            fb = runner.build_batch(ForwardMode.DECODE, [[o[-1]] for o in outputs], rows,
                                    [s.num_tokens - 1 for s in seqs], slots)
            logits = runner.forward(fb)  # (B, V)
            if keep_step_logits:
                steps.append(logits)
            for out, tok in zip(outputs, logits.argmax(-1).tolist()):
                out.append(int(tok))
        return StaticBatchResult(outputs, prefill, steps)
    finally:
        for row, seq in zip(rows, seqs):
            seq.release()
            runner.memory.req_table.free(row)
