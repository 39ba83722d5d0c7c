"""After a forward: prompt log-probs, grammar masks, sampling, output log-probs, the stop rules,
and jump-forward over text a grammar forces. Decides each sampled request's next token and
whether it finished; releasing what a finished request holds is the scheduler's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from radixkv.model.sampler import Sampler, SamplingRow
from radixkv.sched.batch import ScheduledBatch
from radixkv.sched.logprobs import token_logprobs
from radixkv.sched.request import Req
from radixkv.sched.stats import SchedulerStats
from radixkv.sched.stop import Decoder, finish_reason, suppressed_ids

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Sampled:
    """A request this forward sampled for, and why it finished (None: it goes on).
    `rejected`: trailing KV slots of this forward holding drafts it did not keep (to roll back)."""

    req: Req
    finish: dict[str, Any] | None
    rejected: int = 0


class PostProcessor:
    """Turns a forward's logits into tokens, log-probs and finish decisions."""

    def __init__(self, sampler: Sampler, eos_ids: frozenset[int], context_length: int, decoder: Decoder | None,
                 vocab_size: int, stats: SchedulerStats):
        self.sampler, self.eos_ids, self.context_length = sampler, eos_ids, context_length
        self.decoder, self.vocab_size, self.stats = decoder, vocab_size, stats

    def process(self, batch: ScheduledBatch, logits: torch.Tensor) -> list[Sampled]:
        """logits (N, V): the rows `batch.layout` names. Appends each sampled request's token
        (and any tokens its grammar forces) and returns the sampled requests."""
        sampling, sample_rows, verified = [], [], []
        for row, lay in zip(batch.rows, batch.layout):
            if lay.prompt:
                self._record_prompt_logprobs(row.req, logits[lay.prompt[0]: lay.prompt[-1] + 1], lay.positions)
            if lay.sample is not None and lay.drafts:
                verified.append(self._verify(row.req, row.draft, logits[lay.sample: lay.sample + lay.drafts + 1]))
            elif lay.sample is not None:
                sampling.append(row.req)
                sample_rows.append(lay.sample)
        if not sampling:
            return verified
        if not batch.all_samples:  # some rows were prompt log-probs or drafts: keep the sampling rows
            logits = logits[torch.tensor(sample_rows, dtype=torch.int64, device=logits.device)]
        wants = [i for i, r in enumerate(sampling) if r.logprob.return_logprob and r.params.max_new_tokens]
        raw = logits[wants].clone() if wants else None  # the model's own distribution, before sampling edits it
        self._apply_grammars(sampling, logits)
        rows = [SamplingRow(r.params, r.generator, r.output_ids, r.prompt_ids, suppressed_ids(r, self.eos_ids))
                for r in sampling]
        tokens = self.sampler.sample(logits, rows)
        if wants:
            self._record_output_logprobs([sampling[i] for i in wants], raw, [tokens[i] for i in wants])
        return verified + [self._take(req, token) for req, token in zip(sampling, tokens)]

    def _verify(self, req: Req, draft: list[int], logits: torch.Tensor) -> Sampled:
        """Keep the drafts the target agrees with, plus its own next token (`Sampler.verify`);
        append them one by one under the stop rules. logits (k + 1, V)."""
        base = list(req.output_ids)

        def row_at(i: int) -> SamplingRow:
            return SamplingRow(req.params, req.generator, base + draft[:i], req.prompt_ids,
                               suppressed_ids(req, self.eos_ids, ahead=i))

        raw = logits.clone() if req.logprob.return_logprob else None  # before masks edit it
        grammar, advanced = req.grammar, [0]

        def mask_at(i: int, lg: torch.Tensor) -> None:  # the grammar's state after draft[:i]
            from radixkv.constrained import allocate_mask, apply_mask

            while advanced[0] < i and grammar.accept(draft[advanced[0]]):  # drafts were cut to what it allows
                advanced[0] += 1
            mask = allocate_mask(1, self.vocab_size)
            grammar.fill_mask(mask, 0)
            apply_mask(lg, mask, [0])

        kept = self.sampler.verify(logits, draft, row_at, mask_at if grammar is not None else None)
        if grammar is not None:
            grammar.rollback(advanced[0])  # `_take` accepts what was kept, as decoding would
        accepted = len(kept) - 1  # drafts the target agreed with
        taken = 0
        for token in kept:
            before = len(req.output_ids)
            sampled = self._take(req, token)
            if raw is not None and req.params.max_new_tokens:
                self._record_output_logprobs([req], raw[taken: taken + 1], [token])
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

    def _record_output_logprobs(self, reqs: list[Req], raw: torch.Tensor, tokens: list[int]) -> None:
        top_n = max(r.logprob.top_n for r in reqs)
        lps, tops = token_logprobs(raw, tokens, top_n)
        for k, req in enumerate(reqs):
            req.logprobs.output.append(lps[k])
            if req.logprob.top_n:
                req.logprobs.output_top.append(tops[k][: req.logprob.top_n])

    def _record_prompt_logprobs(self, req: Req, logits: torch.Tensor, positions: list[int]) -> None:
        """logits (n, V) at `positions` score the prompt tokens one position later."""
        lps, tops = token_logprobs(logits, [req.prompt_ids[p + 1] for p in positions], req.logprob.top_n)
        for k, p in enumerate(positions):
            req.logprobs.prompt[p + 1] = (lps[k], tops[k] if tops else None)

    def _apply_grammars(self, sampling: list[Req], logits: torch.Tensor) -> None:
        """Mask the logits (N, V) of constrained rows to the tokens their grammar allows next.

        Masks are filled on this thread after the forward: at about 3-20 µs a row they cost
        well under 1 % of a CPU forward, so overlapping them with it would not pay here."""
        rows = [i for i, r in enumerate(sampling) if r.grammar is not None and r.params.max_new_tokens]
        if not rows:
            return
        from radixkv.constrained import allocate_mask, apply_mask

        start = time.perf_counter()
        mask = allocate_mask(len(sampling), self.vocab_size)  # (N, ceil(V / 32)) int32 bits
        for i in rows:
            sampling[i].grammar.fill_mask(mask, i)
        apply_mask(logits, mask, rows)
        self.stats.grammar_mask_seconds += time.perf_counter() - start

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
