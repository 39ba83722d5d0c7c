"""SchedulerStats: the scheduler's running counters (`get_stats`, `/metrics`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SchedulerStats:
    """Counters since start (or the last `reset`); times in seconds."""

    admitted_requests: int = 0
    finished_requests: int = 0
    prompt_tokens: int = 0  # of admitted requests
    cached_prompt_tokens: int = 0  # of those, served from the prefix cache (either tier)
    host_hit_tokens: int = 0  # of those, copied back from the host tier (and there before the request came)
    storage_hit_tokens: int = 0  # of those, read from the storage tier by the request's prefetch
    generated_tokens: int = 0
    retractions: int = 0
    extend_steps: int = 0  # forwards with prefill tokens (mixed ones included)
    decode_steps: int = 0  # forwards of decode tokens only
    mixed_steps: int = 0  # forwards with both prefill and decode tokens
    decode_batch_tokens: int = 0  # decode tokens of pure decode steps
    prefill_tokens: int = 0  # prompt tokens computed (cache hits excluded)
    decode_tokens: int = 0  # decode tokens computed, in any step
    grammar_mask_seconds: float = 0.0  # filling and applying grammar masks
    jump_forward_tokens: int = 0  # output tokens a grammar forced, appended without decoding
    # speculative decoding
    spec_verify_ct: int = 0  # request-forwards that verified drafts (one per request and forward)
    spec_draft_tokens: int = 0  # draft tokens proposed and verified
    spec_accepted_tokens: int = 0  # of those, kept in the output
    spec_recent_rate: float = 0.6  # running share of drafts kept, over the last verifies of every request
    # where time to first token goes, summed over requests (divide by first_tokens for means):
    first_tokens: int = 0  # requests that produced their first token
    queue_seconds: float = 0.0  # arrival at the scheduler -> first scheduled into a forward
    prefill_seconds: float = 0.0  # first scheduled -> first token sampled (every chunk of the prompt)
    cache_causes: dict[str, int] = field(default_factory=dict)  # prompt tokens by why they hit or missed
    step_seconds: dict[str, float] = field(default_factory=lambda: {"extend": 0.0, "decode": 0.0})
    forward_seconds: dict[str, float] = field(default_factory=lambda: {"extend": 0.0, "decode": 0.0})

    def record_admission(self, prompt_tokens: int, cached_tokens: int, host_tokens: int = 0,
                         storage_tokens: int = 0) -> None:
        self.admitted_requests += 1
        self.prompt_tokens += prompt_tokens
        self.cached_prompt_tokens += cached_tokens
        self.host_hit_tokens += host_tokens
        self.storage_hit_tokens += storage_tokens

    def prefill_rate(self) -> float | None:
        """Prompt tokens computed per second of extend steps (a mixed step's decode rows
        included, so it errs low); None before any."""
        seconds = self.step_seconds["extend"]
        return self.prefill_tokens / seconds if self.prefill_tokens and seconds > 0 else None

    def record_causes(self, causes: dict[str, int]) -> None:
        """One admitted prompt's tokens by cause (`radixkv.mem.miss_causes`)."""
        for cause, n in causes.items():
            self.cache_causes[cause] = self.cache_causes.get(cause, 0) + n

    def record_first_token(self, arrival: float, admitted: float, first_token: float) -> None:
        """A request's first token: how long it queued, and how long its prefill took."""
        self.first_tokens += 1
        self.queue_seconds += admitted - arrival
        self.prefill_seconds += first_token - admitted

    def record_verify(self, drafts: int, accepted: int) -> None:
        """One request's drafts verified in a forward: `accepted` of `drafts` were kept."""
        self.spec_verify_ct += 1
        self.spec_draft_tokens += drafts
        self.spec_accepted_tokens += accepted
        self.spec_recent_rate = 0.9 * self.spec_recent_rate + 0.1 * accepted / max(drafts, 1)

    def record_step(self, num_decode: int, prefill_tokens: int, seconds: float, forward: float) -> None:
        """One forward of `num_decode` decode rows and `prefill_tokens` prompt tokens."""
        self.decode_tokens += num_decode
        self.prefill_tokens += prefill_tokens
        if prefill_tokens:
            key = "extend"
            self.extend_steps += 1
            self.mixed_steps += num_decode > 0
        else:
            key = "decode"
            self.decode_steps += 1
            self.decode_batch_tokens += num_decode
        self.step_seconds[key] += seconds
        self.forward_seconds[key] += forward

    @property
    def cache_hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens, over admitted requests."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cache_hit_rate"] = self.cache_hit_rate
        # served from the KV pool as it was
        d["device_hit_tokens"] = self.cached_prompt_tokens - self.host_hit_tokens - self.storage_hit_tokens
        d["recomputed_prompt_tokens"] = self.prompt_tokens - self.cached_prompt_tokens
        d["spec_accept_rate"] = self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0
        # tokens a verifying forward produced for its request: kept drafts + the target's own
        d["spec_tokens_per_verify"] = ((self.spec_accepted_tokens + self.spec_verify_ct) / self.spec_verify_ct
                                       if self.spec_verify_ct else 0.0)
        n = max(self.first_tokens, 1)
        d["mean_queue_seconds"], d["mean_prefill_seconds"] = self.queue_seconds / n, self.prefill_seconds / n
        return d
