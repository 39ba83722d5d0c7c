"""Req: one generation request's state, from arrival to finish.

Token bookkeeping. `seq_ids = prompt_ids + output_ids` is everything the request has; `kv_len`
counts its leading tokens whose K/V sit in the pool (on `seq`, at request-table row `row`).
An extend forward computes K/V for `seq_ids[kv_len:...]`; once all of `seq_ids` has K/V the
last position's logits give the next token. In decode, `kv_len == len(seq_ids) - 1`: only the
last sampled token still needs its K/V, and the decode forward computes it.

Invariants (asserted by `check`): kv_len <= len(seq_ids); cached_tokens <= len(prompt_ids);
kv_len == seq.num_tokens while running, 0 otherwise; len(output_ids) <= max_new_tokens.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from radixkv.errors import ErrorKind
from radixkv.mem import SeqPages
from radixkv.outputs import ReqOutput
from radixkv.retention import Retention
from radixkv.sampling_params import LogprobParams, SamplingParams
from radixkv.sched.logprobs import LogprobState


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no KV
    RUNNING = "running"  # admitted: holds a row, pages and a lock on its cached prefix
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    namespace: Any = None  # isolates cached prefixes (LoRA id, cache salt)
    logprob: LogprobParams = field(default_factory=LogprobParams)  # which log-probs to report
    retention: Retention | None = None  # how long to keep its prefixes cached (capped by the scheduler)
    bootstrap: Any = None  # Bootstrap (radixkv.bootstrap): its prefill/decode pair's room, if any
    lora: str | None = None  # the id of the LoRA adapter it runs under (None: the base model)
    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    finish_reason: dict[str, Any] | None = None
    # KV state, set while RUNNING
    row: int | None = None  # request-table row
    seq: SeqPages | None = None  # pages holding seq_ids[:kv_len]
    last_node: Any = None  # deepest cached node, locked while running
    kv_len: int = 0
    # accounting
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    host_hit_tokens: int = 0  # of those, copied back from the host tier
    storage_hit_tokens: int = 0  # of those, read from the storage tier
    transferred_tokens: int = 0  # prompt tokens a prefill server sent here (disaggregated decode)
    cache_causes: dict[str, int] | None = None  # the prompt split by why it hit or missed, at first admission
    admitted_once: bool = False
    passed_over: int = 0  # admission rounds that admitted others but not it (lpm starvation bound)
    retractions: int = 0
    sent_tokens: int = 0  # output tokens already reported in a ReqOutput
    generator: torch.Generator | None = None  # own sampling generator when params.seed is set
    arrival_time: float = field(default_factory=time.perf_counter)  # reached the scheduler
    admit_time: float | None = None  # first scheduled into a forward
    first_token_time: float | None = None
    finish_time: float | None = None
    match_len: int = 0  # scratch: prefix length found by the scheduling policy this round
    peeked: Any = None  # scratch: the policy's look at the cached prefix (a MatchResult), this step only
    logprobs: LogprobState = field(default_factory=LogprobState)
    grammar: Any = None  # RequestGrammar: where the output stands in its grammar (constrained decoding)
    # speculative decoding
    spec: Any = None  # DraftLength (radixkv.sched.speculative) when this request may speculate
    spec_verify_ct: int = 0  # forwards that verified drafts of this request
    spec_accepted_tokens: int = 0  # draft tokens it kept

    @property
    def seq_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def tokens(self, start: int, end: int) -> list[int]:
        """seq_ids[start:end] without building seq_ids (decode asks for one token per step)."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.prompt_ids[start:end] + (self.output_ids[: end - n] if end > n else [])

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        """Running, but some of seq_ids still lack K/V beyond the last sampled token."""
        return self.status is ReqStatus.RUNNING and self.kv_len < self.seq_len - (1 if self.output_ids else 0)

    @property
    def is_decoding(self) -> bool:
        return self.status is ReqStatus.RUNNING and bool(self.output_ids) and self.kv_len == self.seq_len - 1

    @property
    def remaining_new_tokens(self) -> int:
        return self.params.max_new_tokens - len(self.output_ids)

    def take_output(self, error: str | None = None, error_kind: ErrorKind | None = None) -> ReqOutput:
        """What this request produced since its last output (new tokens only) and where it stands."""
        first = self.sent_tokens
        self.sent_tokens = len(self.output_ids)
        lp, asked = self.logprobs, self.logprob
        out_lp = out_top = in_lp = in_top = None
        if asked.return_logprob:
            out_lp = lp.output[first:]
            out_top = lp.output_top[first:] if asked.top_n else None
            done = bool(self.output_ids) or self.status is ReqStatus.FINISHED
            if asked.wants_prompt and not lp.prompt_sent and done:
                lp.prompt_sent = True
                span = range(asked.start, len(self.prompt_ids))
                in_lp = [[lp.prompt.get(p, (None, None))[0], self.prompt_ids[p]] for p in span]
                if asked.top_n:
                    in_top = [lp.prompt.get(p, (None, None))[1] for p in span]
        return ReqOutput(
            rid=self.rid, new_ids=self.output_ids[first:], finished=self.status is ReqStatus.FINISHED,
            finish_reason=self.finish_reason, prompt_tokens=len(self.prompt_ids), cached_tokens=self.cached_tokens,
            completion_tokens=len(self.output_ids),
            ttft=None if self.first_token_time is None else self.first_token_time - self.arrival_time,
            latency=None if self.finish_time is None else self.finish_time - self.arrival_time,
            error=error, error_kind=error_kind, output_logprobs=out_lp, output_top_logprobs=out_top,
            input_logprobs=in_lp, input_top_logprobs=in_top, spec_verify_ct=self.spec_verify_ct,
            host_hit_tokens=self.host_hit_tokens, storage_hit_tokens=self.storage_hit_tokens,
            cache_causes=self.cache_causes,
            spec_accepted_tokens=self.spec_accepted_tokens)

    def check(self) -> None:
        assert 0 <= self.kv_len <= self.seq_len, (self.rid, self.kv_len, self.seq_len)
        assert self.cached_tokens <= len(self.prompt_ids)
        assert len(self.output_ids) <= self.params.max_new_tokens
        if self.status is ReqStatus.RUNNING:
            assert self.seq is not None and self.row is not None
            assert self.seq.num_tokens == self.kv_len, (self.rid, self.seq.num_tokens, self.kv_len)
        else:
            assert self.seq is None and self.row is None and self.kv_len == 0
