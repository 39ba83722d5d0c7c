"""Synthetic multi-turn chat traces, in the Mooncake JSONL format plus token ids.

Conversations belong to groups that share a system prompt; every turn's prompt is the
conversation so far (system prompt, then user turn, answer, user turn, answer, ...) ending in a
new user turn, so turn k+1 extends turn k's prompt and answer. Conversation popularity is
Zipf-like (a few conversations get many turns, most get few) and arrivals are Poisson.

Each record: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (ids of each
`block_size`-token prefix block, equal ids meaning equal prefixes, as in Mooncake traces),
`input_ids`, `session_id`, `turn`, `group`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from radixkv.errors import ConfigError
from radixkv.mem.block_hash import block_ids


@dataclass(frozen=True, slots=True)
class ChatTraceConfig:
    """Shape of a synthetic chat workload; lengths in tokens, rate in requests per second."""

    num_requests: int = 256
    num_conversations: int = 48
    num_groups: int = 4  # distinct system prompts
    system_tokens: int = 256
    user_tokens: tuple[int, int] = (16, 96)  # uniform range, inclusive
    answer_tokens: tuple[int, int] = (16, 96)
    max_turns: int = 12  # a conversation ends after this many turns
    zipf_alpha: float = 1.0  # popularity of conversation of rank r ~ 1 / r**alpha
    request_rate: float = 4.0
    vocab_low: int = 100  # token ids drawn from [vocab_low, vocab_high)
    vocab_high: int = 32000
    block_size: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("num_requests", "num_conversations", "num_groups", "max_turns", "block_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"ChatTraceConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.system_tokens < 0:
            raise ConfigError(f"ChatTraceConfig.system_tokens must be >= 0, got {self.system_tokens}")
        for name in ("user_tokens", "answer_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ConfigError(f"ChatTraceConfig.{name} must be a range 1 <= lo <= hi, got {(lo, hi)}")
        if self.zipf_alpha < 0 or self.request_rate <= 0:
            raise ConfigError("ChatTraceConfig.zipf_alpha must be >= 0 and request_rate > 0")
        if not 0 <= self.vocab_low < self.vocab_high:
            raise ConfigError(f"bad token id range [{self.vocab_low}, {self.vocab_high})")
        if self.num_conversations * self.max_turns < self.num_requests:
            raise ConfigError(
                f"{self.num_conversations} conversations of at most {self.max_turns} turns "
                f"cannot make {self.num_requests} requests"
            )


def generate_chat_trace(config: ChatTraceConfig) -> list[dict]:
    """The trace records, in arrival order."""
    rng = np.random.default_rng(config.seed)

    def tokens(n: int) -> list[int]:
        return rng.integers(config.vocab_low, config.vocab_high, size=n).tolist()

    def length(bounds: tuple[int, int]) -> int:
        return int(rng.integers(bounds[0], bounds[1] + 1))

    systems = [tokens(config.system_tokens) for _ in range(config.num_groups)]
    history = [list(systems[c % config.num_groups]) for c in range(config.num_conversations)]
    turns = [0] * config.num_conversations
    weights = 1.0 / np.arange(1, config.num_conversations + 1) ** config.zipf_alpha
    clock_ms = 0.0
    records = []
    for _ in range(config.num_requests):
        open_convs = [c for c in range(config.num_conversations) if turns[c] < config.max_turns]
        w = weights[open_convs]
        conv = int(open_convs[rng.choice(len(open_convs), p=w / w.sum())])
        prompt = history[conv] + tokens(length(config.user_tokens))
        answer = tokens(length(config.answer_tokens))
        records.append({
            "timestamp": round(clock_ms, 3),
            "input_length": len(prompt),
            "output_length": len(answer),
            "hash_ids": block_ids(None, prompt, config.block_size, partial=True),
            "input_ids": prompt,
            "session_id": conv,
            "turn": turns[conv],
            "group": conv % config.num_groups,
        })
        history[conv] = prompt + answer
        turns[conv] += 1
        clock_ms += float(rng.exponential(1000.0 / config.request_rate))
    return records


def write_trace(records: list[dict], path: str | Path, config: ChatTraceConfig | None = None) -> None:
    """Write records as JSONL (and the config beside it as `<path>.config.json`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    if config is not None:
        Path(str(path) + ".config.json").write_text(json.dumps(asdict(config), indent=1))
