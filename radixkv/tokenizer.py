"""Tokenizer: text <-> token ids, chat templates, and incremental detokenization."""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from radixkv.errors import InvalidRequestError, ModelLoadError

logger = logging.getLogger(__name__)


class Tokenizer:
    """A Hugging Face tokenizer loaded from the model directory (never from a hub)."""

    def __init__(self, model_dir: str | Path):
        from radixkv.tokenizer_load import load_hf_tokenizer

        try:
            self.hf = load_hf_tokenizer(model_dir)
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{model_dir}: cannot load the tokenizer ({e})") from e
        eos = {self.hf.eos_token_id} if self.hf.eos_token_id is not None else set()
        # chat models end a turn with their template's end token (ChatML: <|im_end|>; Gemma: <end_of_turn>)
        for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            tid = self.hf.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != self.hf.unk_token_id and tid >= 0:
                eos.add(tid)
        self.eos_token_ids = frozenset(eos)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> Tokenizer | None:
        """The model's tokenizer, or None for a bare checkpoint that ships none."""
        names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
        if not any((Path(model_dir) / n).is_file() for n in names):
            logger.warning("%s has no tokenizer files: only input_ids prompts will work", model_dir)
            return None
        return cls(model_dir)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InvalidRequestError(f"prompt must be a string, got {type(text).__name__}")
        return self.hf.encode(text, add_special_tokens=True)

    def decode(self, ids: list[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True) -> str:
        if spaces_between_special_tokens:  # the default: no keyword, as every tokenizer takes it
            return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens, spaces_between_special_tokens=False)

    def encode_segment(self, text: str) -> list[int]:
        """Token ids of `text` alone, no BOS added (special tokens written in it are parsed)."""
        if not isinstance(text, str):
            raise InvalidRequestError(f"text must be a string, got {type(text).__name__}")
        return self.hf.encode(text, add_special_tokens=False)

    def chat_roles(self) -> ChatRoles:
        """The model's chat template, split into role segments (see `ChatRoles`)."""
        if getattr(self.hf, "chat_template", None) is None:
            raise InvalidRequestError("this model's tokenizer has no chat template")
        return derive_chat_roles(lambda m, gen: self.hf.apply_chat_template(
            m, tokenize=False, add_generation_prompt=gen))

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template renders a `tools` list itself (its source reads the variable);
        for one that does not, the server writes a fallback prompt (`radixkv.server.api.tools`)."""
        template = getattr(self.hf, "chat_template", None)
        return isinstance(template, str) and re.search(r"\btools\b", template) is not None

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            template_kwargs: dict[str, Any] | None = None,
                            tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a conversation rendered by the model's chat template.

        `continue_final_message`: the last message (an assistant's) is left open, so generation
        continues its text instead of starting a new turn. `template_kwargs` are the template's
        own variables (e.g. Qwen3's `enable_thinking`). `tools`: function descriptions for a
        template that renders them (`takes_tools`)."""
        return self._render(messages, add_generation_prompt, continue_final_message, template_kwargs, tools, True)

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        """The text `apply_chat_template` tokenizes."""
        return self._render(messages, add_generation_prompt, continue_final_message, template_kwargs, tools, False)

    def _render(self, messages, add_generation_prompt, continue_final_message, template_kwargs, tools, tokenize):
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages must be a non-empty list of {role, content} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise InvalidRequestError(f"messages[{i}] needs 'role' and 'content'")
            if m["role"] not in ("system", "user", "assistant", "tool"):
                raise InvalidRequestError(f"messages[{i}].role={m['role']!r} is not system/user/assistant/tool")
        if getattr(self.hf, "chat_template", None) is None:
            raise InvalidRequestError("this model's tokenizer has no chat template")
        if continue_final_message and messages[-1]["role"] != "assistant":
            raise InvalidRequestError("continue_final_message: the last message must be the assistant's")
        reserved = {"add_generation_prompt", "continue_final_message", "tokenize", "return_dict", "messages",
                    "conversation", "tools", "documents"} & set(template_kwargs or ())
        if reserved:
            raise InvalidRequestError(f"chat_template_kwargs: {sorted(reserved)} cannot be set there")
        extra = {"tools": tools} if tools else {}
        try:
            out = self.hf.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message, tokenize=tokenize, return_dict=tokenize,
                **extra, **(template_kwargs or {}))
        except (ValueError, TypeError, TemplateError) as e:  # e.g. a template raising on its kwargs
            raise InvalidRequestError(f"the chat template cannot render these messages: {e}") from None
        return list(out["input_ids"]) if tokenize else out


_SENTINEL = "\x00radixkv-content\x00"


@dataclass(frozen=True)
class ChatRoles:
    """The text a chat template puts around each message, so a program can render a
    conversation segment by segment (and keep what it already sent as a token prefix).

    `prefixes[role] + content + suffixes[role]` is a message after the first one; a
    conversation's first message starts with `first_system_prefix` if it is a system message,
    else with `implicit_system` (the default system block some templates insert, may be "")
    followed by its role's prefix. `generation_prefix` opens the assistant's reply.
    """

    prefixes: dict[str, str]
    suffixes: dict[str, str]
    first_system_prefix: str
    implicit_system: str
    generation_prefix: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def derive_chat_roles(render) -> ChatRoles:
    """`render(messages, add_generation_prompt) -> str` is a chat template; returns its roles."""
    s = _SENTINEL
    first = render([{"role": "system", "content": s}], False)
    first_system_prefix, system_suffix = first.split(s)
    base = render([{"role": "system", "content": "X"}], False)
    prefixes, suffixes = {"system": None, "user": None, "assistant": None}, {"system": system_suffix}
    for role in ("system", "user", "assistant"):
        full = render([{"role": "system", "content": "X"}, {"role": "user", "content": "Y"}][: 2 if role == "assistant" else 1]
                      + [{"role": role, "content": s}], False)
        head = base if role != "assistant" else render([{"role": "system", "content": "X"},
                                                         {"role": "user", "content": "Y"}], False)
        if not full.startswith(head):
            raise ModelLoadError("the chat template renders a conversation differently from its start; "
                                 "cannot split it into role segments")
        prefixes[role], suffixes[role] = full[len(head):].split(s)
    user_only = render([{"role": "user", "content": s}], False)
    implicit_system = user_only.split(s)[0][: -len(prefixes["user"])] if prefixes["user"] else ""
    convo = [{"role": "system", "content": "X"}, {"role": "user", "content": "Y"}]
    generation_prefix = render(convo, True)[len(render(convo, False)):]
    return ChatRoles(prefixes, suffixes, first_system_prefix, implicit_system, generation_prefix)


class IncrementalDetokenizer:
    """Text deltas for a growing list of token ids, never splitting a multi-byte character.

    Decodes a short window (`prefix_offset` .. end) rather than the whole output each time;
    a delta is released only once it no longer ends in a partial UTF-8 sequence.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.spaces = spaces_between_special_tokens
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def step(self, ids: list[int]) -> str:
        """The new text since the last call, given all output ids so far."""
        prefix = self.tokenizer.decode(ids[self.prefix_offset : self.read_offset], self.skip, self.spaces)
        full = self.tokenizer.decode(ids[self.prefix_offset :], self.skip, self.spaces)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(ids)
            self.text += delta
            return delta
        return ""

    def finish(self, ids: list[int]) -> str:
        """The rest of the text once `ids` is final, held-back partial characters included."""
        prefix = self.tokenizer.decode(ids[self.prefix_offset : self.read_offset], self.skip, self.spaces)
        full = self.tokenizer.decode(ids[self.prefix_offset :], self.skip, self.spaces)
        delta = full[len(prefix):] if full.startswith(prefix) else ""
        self.prefix_offset = self.read_offset = len(ids)
        self.text += delta
        return delta


class TextStream:
    """The text of one request's output as its tokens arrive, safe to show piece by piece.

    `push(new_ids)` returns the text to emit now: never a partial UTF-8 character, and never
    the last `len(longest stop string) - 1` characters, which could be the start of a stop
    string; `finish(last_ids, finish_reason)` takes the final tokens and returns the rest, cut
    before the stop string (or `stop_regex` match) that ended generation, which may sit in those
    very tokens, unless `trim_stop` is false (SGLang's `no_stop_trim`). The Engine's streams and
    the server's detokenizer process both use it. A `stop_regex` match has no length bound to
    hold back, so text streamed before it ended stays sent; only the unsent part is trimmed.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, stop: tuple[str, ...] = (),
                 trim_stop: bool = True, spaces_between_special_tokens: bool = True):
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self._trim = trim_stop
        self._holdback = max((len(x) for x in stop), default=1) - 1 if trim_stop else 0
        self.ids: list[int] = []
        self.text = ""  # emitted so far

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        self._detok.step(self.ids)
        full = self._detok.text
        return self._emit(full[: len(full) - self._holdback] if self._holdback else full)

    def finish(self, last_ids: list[int], finish_reason: dict[str, Any] | None) -> str:
        self.ids.extend(last_ids)
        self._detok.finish(self.ids)
        return self._emit(trim_stop_string(self._detok.text, finish_reason) if self._trim else self._detok.text)

    def _emit(self, visible: str) -> str:
        delta = visible[len(self.text):] if len(visible) > len(self.text) else ""
        self.text += delta
        return delta


def trim_stop_string(text: str, reason: dict[str, Any] | None) -> str:
    """Cut the output text before the stop string that ended it (SGLang's default).

    The string that ended generation is the last occurrence: any earlier one did not count.
    """
    if reason and reason.get("type") == "stop" and isinstance(reason.get("matched"), str):
        cut = text.rfind(reason["matched"])
        if cut >= 0:
            return text[:cut]
    return text
