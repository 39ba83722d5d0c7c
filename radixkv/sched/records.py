"""The two records one step passes between deciding and doing (vLLM v1's `SchedulerOutput` and
`ModelRunnerOutput`):

    ScheduleOutput  the scheduler's decision: which requests run, how many tokens each, at which
                    positions and KV slots (pages already reserved, request-table rows written)
    ModelOutput     what the forward and the sampler made of it: per row, the tokens sampled
                    (and their log-probs), the prompt log-probs asked for, or why it failed

The scheduler makes the first (`Scheduler.schedule`) and takes the second back
(`Scheduler.update`); the engine core's executor turns one into the other. Neither holds a
tensor: the scheduler never sees logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixkv.outputs import ReqOutput
from radixkv.sched.kv import BatchRow
from radixkv.sched.request import Req


@dataclass(slots=True)
class ScheduleOutput:
    """One forward as the scheduler decided it: `rows[:num_decode]` decode one token each (plus
    any drafts), the rest are prefill chunks. `finished`: requests the scheduler ended without
    running them (one that cannot fit even in an idle pool); no rows then."""

    rows: list[BatchRow]
    num_decode: int
    finished: list[ReqOutput] = field(default_factory=list)

    @property
    def reqs(self) -> list[Req]:
        return [row.req for row in self.rows]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(len(row.tokens) for row in self.rows[self.num_decode:])


@dataclass(slots=True)
class Sample:
    """What the sampler chose for one row: `tokens` is one token, or for a speculating row the
    drafts the target agreed with followed by its own next token. `logprobs` / `top_logprobs`:
    per token of `tokens` (the model's own distribution), when the request asked for them."""

    tokens: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[list]] | None = None  # per token: [[logprob, token_id], ...]


@dataclass(slots=True)
class ModelOutput:
    """The executor's answer to one `ScheduleOutput`, row by row in its order.

    `samples[i]`: row i's sample, None when the forward did not end its pending tokens (a
    prefill chunk before the last). `prompt_logprobs[i]`: prompt position -> (logprob, top)
    for the prompt tokens row i scored, None when it scored none. `error`: the forward failed
    (nothing else is set; the scheduler rolls the batch back and ends its requests)."""

    samples: list[Sample | None] = field(default_factory=list)
    prompt_logprobs: list[dict[int, tuple[float, list | None]] | None] = field(default_factory=list)
    forward_seconds: float = 0.0
    forward_start: float = 0.0  # time.perf_counter() when the forward began
    error: str | None = None
