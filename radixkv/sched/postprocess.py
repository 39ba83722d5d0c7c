"""After a forward, on the scheduler's side: append each sampled request's tokens under the stop
rules, accept them into its grammar (and jump forward over text it forces), keep the drafts
verification kept. Decides each sampled request's next tokens and whether it finished;
releasing what a finished request holds is the scheduler's. The tokens themselves come sampled
(`radixkv.core.sampling`): nothing here sees a logit.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from radixkv.sched.kv import BatchRow
from radixkv.sched.records import ModelOutput, Sample, ScheduleOutput
from radixkv.sched.request import Req
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.stop import Decoder, finish_reason

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Sampled:
    """A request this forward sampled for, and why it finished (None: it goes on).
    `rejected`: trailing KV slots of this forward holding drafts it did not keep (to roll back)."""

    req: Req
    finish: dict[str, Any] | None
    rejected: int = 0


class PostProcessor:
    """Turns a forward's sampled tokens into each request's output and finish decision."""

    def __init__(self, eos_ids: frozenset[int], context_length: int, decoder: Decoder | None,
                 stats: SchedulerStats):
        self.eos_ids, self.context_length, self.decoder, self.stats = eos_ids, context_length, decoder, stats

    def process(self, out: ScheduleOutput, result: ModelOutput) -> list[Sampled]:
        """Record the prompt log-probs, append each sampled request's tokens (and any its
        grammar forces) and return the sampled requests: those that verified drafts first, then
        the others, each in batch order."""
        for row, prompt in zip(out.rows, result.prompt_logprobs):
            if prompt:
                row.req.logprobs.prompt.update(prompt)
        verified, plain = [], []
        for row, sample in zip(out.rows, result.samples):
            if sample is not None:
                (verified if row.draft else plain).append((row, sample))
        return [self._verify(row, sample) for row, sample in verified] + [
            self._sampled(row.req, sample) for row, sample in plain]

    def _sampled(self, req: Req, sample: Sample) -> Sampled:
        if sample.logprobs is not None:
            self._record_logprobs(req, sample, 0)
        return self._take(req, sample.tokens[0])

    def _verify(self, row: BatchRow, sample: Sample) -> Sampled:
        """Append the kept drafts and the target's own token one by one under the stop rules."""
        req, draft, kept = row.req, row.draft, sample.tokens
        accepted = len(kept) - 1  # drafts the target agreed with
        taken = 0
        for token in kept:
            before = len(req.output_ids)
            sampled = self._take(req, token)
            if sample.logprobs is not None:
                self._record_logprobs(req, sample, taken)
            taken += 1
            # finished, or the grammar forced text after it (jump-forward): what the target scored
            # after this token no longer follows it
            if sampled.finish is not None or len(req.output_ids) > before + 1:
                break
        req.spec.update(len(draft), accepted)
        req.spec_verify_ct += 1
        req.spec_accepted_tokens += taken - 1
        self.stats.record_verify(len(draft), taken - 1)
        # KV holds the pending token and every draft; keep the drafts now in the output
        sampled.rejected = len(draft) - (taken - 1)
        return sampled

    def _take(self, req: Req, token: int) -> Sampled:
        """Append `token` to `req` (and what its grammar forces after it); why it stops, if it does."""
        if req.params.max_new_tokens == 0:  # a prefill-only request: its prompt is cached
            return Sampled(req, {"type": "length", "length": 0})
        req.output_ids.append(token)
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
            self.stats.record_first_token(req.arrival_time, req.admit_time or req.arrival_time, req.first_token_time)
        self.stats.generated_tokens += 1
        reason = finish_reason(req, self.eos_ids, self.context_length, self.decoder)
        if req.grammar is not None:
            reason = self._advance_grammar(req, token, reason)
        return Sampled(req, reason)

    @staticmethod
    def _record_logprobs(req: Req, sample: Sample, i: int) -> None:
        req.logprobs.output.append(sample.logprobs[i])
        if req.logprob.top_n:
            req.logprobs.output_top.append(sample.top_logprobs[i])

    def _advance_grammar(self, req: Req, token: int, reason: dict[str, Any] | None) -> dict[str, Any] | None:
        """Accept the sampled token; then append whatever text the grammar forces (jump-forward),
        checking the stop rules after each forced token. Returns why the request ends, if it does."""
        if not req.grammar.accept(token):  # cannot happen under the mask; never crash the batch
            logger.error("request %s: token %d rejected by its grammar", req.rid, token)
            return {"type": "abort", "message": "the output left its grammar"}
        if req.grammar.terminated and reason is None:  # it took its stop token: done, min_new_tokens or not
            return {"type": "stop", "matched": token}
        if reason is not None or not req.params.jump_forward or req.logprob.return_logprob:
            return reason
        limit = min(req.remaining_new_tokens, self.context_length - req.seq_len)
        for forced in req.grammar.jump_forward(token, limit):
            req.output_ids.append(forced)
            self.stats.jump_forward_tokens += 1
            reason = finish_reason(req, self.eos_ids, self.context_length, self.decoder)
            if reason is not None:
                return reason
        return None
