"""SchedulerConfig (what is admitted and when), SpeculativeConfig (draft tokens verified in one
forward) and GrammarConfig (the budget of one constrained-decoding grammar's compile)."""

from __future__ import annotations

from dataclasses import dataclass

from radixkv.config.fields import SCHEDULE_POLICIES, SPECULATIVE_ALGORITHMS, opt, require
from radixkv.errors import ConfigError
from radixkv.kv_bytes import parse_size


@dataclass(frozen=True)
class SchedulerConfig:
    """Admission and batching. Sizes are in tokens. That a prefill chunk holds at least one page is
    checked by `EngineConfig`, which also sees the page size."""

    max_running_requests: int = opt(64, "requests decoded together at most")
    context_length: int | None = opt(None, "prompt + output tokens per request at most "
                                     "(default: the model's maximum)")
    chunked_prefill_size: int = opt(2048, "new prompt tokens of one request per forward at most; "
                                    "0 turns chunking off")
    max_prefill_tokens: int = opt(8192, "new prompt tokens of one prefill batch at most")
    schedule_policy: str = opt("lpm", "admission order: lpm (longest cached prefix first), fcfs, "
                               "dfs-weight")
    starvation_limit: int = opt(32, "lpm: a request passed over this many times is admitted first")
    retract_decode_steps: int = opt(32, "decode steps of KV headroom kept per running request "
                                    "when admitting new ones")
    hold_finished_seconds: float = opt(1.0, "lpm/dfs-weight: a finished request's cached sequence is held "
                                       "from new admissions this long, for its next turn, while held "
                                       "sequences keep coming back (0: off)")
    random_seed: int = opt(0, "seed of the shared sampling generator (requests may carry their own)")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(self.max_running_requests >= 1, "max_running_requests", "must be >= 1")
        check(self.context_length is None or self.context_length >= 2, "context_length", "must be >= 2")
        check(self.chunked_prefill_size >= 0, "chunked_prefill_size", "must be 0 (off) or at least one page")
        check(self.max_prefill_tokens >= 1, "max_prefill_tokens", "must be >= 1")
        check(self.schedule_policy in SCHEDULE_POLICIES, "schedule_policy", f"must be one of {SCHEDULE_POLICIES}")
        check(self.starvation_limit >= 1, "starvation_limit", "must be >= 1")
        check(self.retract_decode_steps >= 1, "retract_decode_steps", "must be >= 1")
        check(isinstance(self.hold_finished_seconds, (int, float)) and 0 <= self.hold_finished_seconds <= 3600,
              "hold_finished_seconds", "must be between 0 (off) and 3600")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding. That it runs on one rank only is checked by `EngineConfig`."""

    speculative_algorithm: str | None = opt(None, "speculative decoding: propose draft tokens cheaply, verify "
                                            "them in one forward: ngram (the request's own earlier text), "
                                            "radix (what followed the same sequence in the prefix cache), "
                                            "draft (a smaller model with the same tokenizer); default: off")
    speculative_num_draft_tokens: int = opt(4, "draft tokens proposed per request and step at most (each "
                                            "request's own count follows its acceptance, down to 0)")
    speculative_draft_model_path: str | None = opt(None, "the draft model (a directory or .gguf) for "
                                                   "speculative_algorithm=draft")

    def __post_init__(self) -> None:
        def check(ok: bool, name: str, why: str) -> None:
            require(self, ok, name, why)

        check(self.speculative_algorithm in (None, *SPECULATIVE_ALGORITHMS), "speculative_algorithm",
              f"must be one of {SPECULATIVE_ALGORITHMS} (or unset: off)")
        check(isinstance(self.speculative_num_draft_tokens, int) and 1 <= self.speculative_num_draft_tokens <= 16,
              "speculative_num_draft_tokens", "must be an integer in 1..16")
        check((self.speculative_algorithm == "draft") == (self.speculative_draft_model_path is not None),
              "speculative_draft_model_path", "is needed by speculative_algorithm=draft, and only by it")


@dataclass(frozen=True)
class GrammarConfig:
    """The budget of one grammar's compile, run in a process apart from the scheduler."""

    grammar_compile_timeout: float = opt(10.0, "seconds one grammar (regex, JSON schema, EBNF) may take to "
                                         "compile, in a process apart from the scheduler; over it the "
                                         "request is refused (HTTP 400)")
    grammar_compile_memory: str = opt("2GiB", "memory one grammar's compile may take beyond the compiler "
                                      "process's own (e.g. 2GiB, 512MB; 0: no limit); over it the request "
                                      "is refused (HTTP 400)")

    def __post_init__(self) -> None:
        require(self, isinstance(self.grammar_compile_timeout, (int, float)) and
                0 < self.grammar_compile_timeout <= 3600, "grammar_compile_timeout", "must be in (0, 3600] seconds")
        try:
            parse_size(str(self.grammar_compile_memory))
        except ConfigError:
            raise ConfigError(f"grammar_compile_memory={self.grammar_compile_memory!r}: give bytes with a unit "
                              f"(e.g. 2GiB, 512MB), or 0 for no limit") from None

    @property
    def grammar_compile_memory_bytes(self) -> int:
        return parse_size(str(self.grammar_compile_memory))
