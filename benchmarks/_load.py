"""The one HTTP client every server benchmark uses, for radixkv and its peers alike:
OpenAI `/v1/completions` with the prompt as token ids, streamed, so time to first token is
measured the same way everywhere."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

import httpx


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    cached_tokens: int | None  # what the server says its prefix cache served (None: not reported)
    completion_tokens: int
    ttft: float  # seconds from sending to the first generated text
    latency: float  # seconds from sending to the last byte
    sent: float  # perf_counter when sent


async def complete(client: httpx.AsyncClient, model: str, prompt_ids: list[int], max_tokens: int) -> Reply:
    body = {"model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft, text, usage = None, [], {}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"])
            for choice in event.get("choices") or ():
                if choice.get("text"):
                    ttft = ttft or time.perf_counter() - sent
                    text.append(choice["text"])
            usage = event.get("usage") or usage
    latency = time.perf_counter() - sent
    details = usage.get("prompt_tokens_details") or {}
    return Reply("".join(text), usage.get("prompt_tokens", len(prompt_ids)), details.get("cached_tokens"),
                 usage.get("completion_tokens", 0), ttft if ttft is not None else latency, latency, sent)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summary(replies: list[Reply], wall: float) -> dict:
    """Throughput and latency figures of a set of replies that took `wall` seconds."""
    ttfts = [r.ttft for r in replies]
    cached = [r.cached_tokens for r in replies if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in replies)
    return {"requests": len(replies), "seconds": wall, "requests_per_s": len(replies) / wall,
            "output_tok_s": sum(r.completion_tokens for r in replies) / wall,
            "ttft_p50": percentile(ttfts, 0.5), "ttft_p90": percentile(ttfts, 0.9),
            "ttft_p99": percentile(ttfts, 0.99), "ttft_mean": statistics.mean(ttfts),
            "hit_rate": sum(cached) / prompt if len(cached) == len(replies) and prompt else None}
