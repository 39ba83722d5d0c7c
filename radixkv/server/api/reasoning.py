"""Reasoning parsers (`--reasoning-parser`, SGLang's names): a thinking model's output split into
its reasoning and its answer, whole or as it streams.

    qwen3, glm45, deepseek-v3   the answer may begin with `<think>` ... `</think>`: what is
                                between is reasoning; output without the block is all answer
                                (`enable_thinking: false` renders the empty block in the prompt)
    qwen3-thinking, deepseek-r1 the template opens the block in the prompt: the output is
                                reasoning until `</think>` (all of it, if that never comes)

`ReasoningStream.push(text)` returns (reasoning, answer) pieces as they are sure: a piece that
may be the start of a marker is held back until the next text settles it, and so is whitespace
at the reasoning's end (the newlines around the block are not the reasoning's, so the streamed
reasoning is the finished output's, character for character).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixkv.errors import InvalidRequestError
from radixkv.server.api.markers import partial_suffix as _partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONING_PARSERS = {"qwen3": False, "glm45": False, "deepseek-v3": False, "qwen3-thinking": True,
                     "deepseek-r1": True}
"""Each parser's name -> whether the output starts inside the reasoning (the prompt opened it)."""


@dataclass(frozen=True)
class ReasoningParser:
    name: str

    def __post_init__(self) -> None:
        if self.name not in REASONING_PARSERS:
            raise InvalidRequestError(f"reasoning parser {self.name!r}: one of {sorted(REASONING_PARSERS)}")

    @property
    def starts_inside(self) -> bool:
        return REASONING_PARSERS[self.name]

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.starts_inside)

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, answer) of a finished output."""
        s = self.stream()
        r1, a1 = s.push(text)
        r2, a2 = s.finish()
        reasoning = r1 + r2
        return (reasoning.strip() or None) if s.saw_reasoning else None, (a1 + a2).lstrip("\n") if s.saw_reasoning else a1 + a2


class ReasoningStream:
    """The split of one output as it streams (see the module docstring)."""

    def __init__(self, starts_inside: bool):
        self.state = "reasoning" if starts_inside else "start"  # start: the block may still open
        self.saw_reasoning = starts_inside
        self.began = False  # whether the reasoning's first non-whitespace arrived
        self.held = ""

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, answer) text that is settled after `text` arrived."""
        self.held += text
        reasoning = answer = ""
        while self.held:
            if self.state == "start":
                stripped = self.held.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self.held = stripped[len(THINK_OPEN):]
                    self.state, self.saw_reasoning = "reasoning", True
                    continue
                if THINK_OPEN.startswith(stripped):  # (whitespace, or a prefix of the marker: wait)
                    break
                self.state = "answer"
                continue
            if self.state == "reasoning":
                if not self.began:
                    self.held = self.held.lstrip()
                    if not self.held:
                        break
                    self.began = True
                at = self.held.find(THINK_CLOSE)
                if at >= 0:
                    reasoning += self.held[:at].rstrip()
                    self.held = self.held[at + len(THINK_CLOSE):]
                    self.state = "after"
                    continue
                keep = _partial_suffix(self.held, THINK_CLOSE)
                settled = self.held[:len(self.held) - keep].rstrip()  # (trailing whitespace waits)
                reasoning += settled
                self.held = self.held[len(settled):]
                break
            if self.state == "after":  # the newlines between the block and the answer are not the answer's
                stripped = self.held.lstrip("\n")
                if not stripped:
                    self.held = ""
                    break
                self.held, self.state = stripped, "answer"
                continue
            answer += self.held
            self.held = ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """What is still held once the output ended."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return held.rstrip(), ""
        return "", held if self.state != "after" else held.lstrip("\n")
