"""Where programs run: `Runtime` (an Engine in this process) or `RuntimeEndpoint` (a server).

Both give the same results for the same program: a state sends token ids (never re-tokenised
text), so what the runtime caches for one request is a token prefix of the next.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from radixkv.errors import BackendUnreachable, EngineError, InvalidRequestError
from radixkv.tokenizer import ChatRoles


@dataclass
class GenResult:
    text: str  # cut before the stop string that ended it
    output_ids: list[int]  # every generated token
    meta: dict[str, Any]  # the runtime's meta_info: prompt / cached / completion tokens, finish_reason


class Backend(ABC):
    """What a program state needs from a runtime."""

    @abstractmethod
    def chat_roles(self) -> ChatRoles: ...

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` alone (no BOS; special tokens written in it are parsed)."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str: ...

    @abstractmethod
    def generate(self, input_ids: list[int], sampling_params: dict[str, Any],
                 on_text: Callable[[str], None] | None = None) -> GenResult:
        """Generate after `input_ids`; with `on_text`, call it with each piece of text as it
        decodes."""

    @abstractmethod
    def prompt_logprobs(self, prompts: list[list[int]], start: int) -> list[tuple[list[float], dict]]:
        """For each prompt: the log-probs of its tokens from position `start`, and its meta_info."""

    def prefill(self, input_ids: list[int]) -> dict[str, Any]:
        """Compute and cache `input_ids`' KV without generating (before a fork or a select)."""
        return self.generate(input_ids, {"max_new_tokens": 0}).meta

    def wait_until(self, done: Callable[[], bool]) -> None:
        """Block until `done()`; a backend that computes in this process computes meanwhile."""
        while not done():
            time.sleep(0.002)


class Runtime(Backend):
    """An in-process `radixkv.Engine` (`Runtime(model=..., **engine_options)` or
    `Runtime(engine=...)`). A thread that waits on a program drives the engine itself."""

    def __init__(self, model: str | None = None, *, engine=None, **options: Any):
        if engine is None:
            from radixkv.engine import Engine

            engine = Engine(model, **options)
        self.engine = engine
        if engine.tokenizer is None:
            raise InvalidRequestError(f"{engine.runner.model_dir} has no tokenizer: programs send text")
        self._roles = None

    def chat_roles(self) -> ChatRoles:
        if self._roles is None:
            self._roles = self.engine.tokenizer.chat_roles()
        return self._roles

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode_segment(text)

    def decode(self, ids: list[int]) -> str:
        return self.engine.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, input_ids, sampling_params, on_text=None) -> GenResult:
        if on_text is None:
            out = self.engine.generate(input_ids=input_ids, sampling_params=sampling_params)
            return GenResult(out["text"], out["output_ids"], out["meta_info"])
        text, ids, meta = [], [], {}
        for chunk in self.engine.generate_stream(input_ids=input_ids, sampling_params=sampling_params):
            if chunk["text"]:
                on_text(chunk["text"])
            text.append(chunk["text"])
            ids.extend(chunk["output_ids"])
            meta = chunk["meta_info"]
        return GenResult("".join(text), ids, meta)

    def prompt_logprobs(self, prompts, start):
        outs = self.engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 0},
                                    return_logprob=True, logprob_start_len=start)
        return [([lp for lp, _ in o["meta_info"]["input_token_logprobs"]], o["meta_info"]) for o in outs]

    def wait_until(self, done) -> None:
        self.engine.run_until(done)

    def shutdown(self) -> None:
        self.engine.shutdown()


class RuntimeEndpoint(Backend):
    """A `radixkv serve` server, over its HTTP API (tokenising through /tokenize)."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0):
        import httpx

        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        info = self._request("GET", "/server_info")
        if info.get("chat_roles") is None:
            raise InvalidRequestError(f"the model served at {self.url} has no chat template")
        self._roles = ChatRoles(**info["chat_roles"])
        self.model_name = info.get("model_name")
        self.encode = lru_cache(maxsize=4096)(self._encode)  # segments repeat (role markup, few-shot text)

    def chat_roles(self) -> ChatRoles:
        return self._roles

    def _encode(self, text: str) -> list[int]:
        return self._request("POST", "/tokenize", {"text": text})["input_ids"]

    def encode(self, text: str) -> list[int]:  # replaced by a cached version in __init__
        return self._encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._request("POST", "/detokenize", {"input_ids": ids, "skip_special_tokens": True})["text"]

    def generate(self, input_ids, sampling_params, on_text=None) -> GenResult:
        body = {"input_ids": input_ids, "sampling_params": sampling_params}
        if on_text is None:
            out = self._request("POST", "/generate", body)
            return GenResult(out["text"], out["output_ids"], out["meta_info"])
        text, ids, meta = "", [], {}
        for event in self._stream("/generate", {**body, "stream": True}):  # each: the text and ids so far
            if len(event["text"]) > len(text):
                on_text(event["text"][len(text):])
            text, ids, meta = event["text"], event["output_ids"], event["meta_info"]
        return GenResult(text, ids, meta)

    def prompt_logprobs(self, prompts, start):
        outs = self._request("POST", "/generate", {"input_ids": prompts, "sampling_params": {"max_new_tokens": 0},
                                                   "return_logprob": True, "logprob_start_len": start})
        return [([lp for lp, _ in o["meta_info"]["input_token_logprobs"]], o["meta_info"]) for o in outs]

    # -- HTTP --------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        import httpx

        try:
            r = self.client.request(method, path, json=body)
        except httpx.TransportError as e:
            raise BackendUnreachable(f"cannot reach the runtime at {self.url} ({type(e).__name__}: {e})") from None
        return self._check(r).json()

    def _stream(self, path: str, body: Any):
        import httpx

        try:
            with self.client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    self._check(r)
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise _error(event["error"]["code"], event["error"]["message"])
                    yield event
        except httpx.TransportError as e:
            raise BackendUnreachable(f"cannot reach the runtime at {self.url} ({type(e).__name__}: {e})") from None

    def _check(self, r):
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text
            raise _error(r.status_code, message)
        return r


def _error(status: int, message: str) -> Exception:
    if status in (400, 404, 413):
        return InvalidRequestError(message)
    if status == 503:
        return BackendUnreachable(message)
    return EngineError(f"HTTP {status}: {message}")
