"""Prometheus metrics of the server (`GET /metrics`).

Counters and histograms are fed by every finished request as its last chunk passes through the
tokenizer manager; gauges (queues, KV usage, hit rate) are read from the scheduler on scrape.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("radixkv_requests", "Finished requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("radixkv_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_tokens = Counter("radixkv_cached_tokens",
                                     "Prompt tokens served from the prefix cache", registry=r)
        self.generation_tokens = Counter("radixkv_generation_tokens", "Generated tokens", registry=r)
        self.cause_tokens = Counter("radixkv_prompt_tokens_by_cause", "Prompt tokens of finished requests by "
                                    "why they hit or missed: device, host, storage (served from that tier); "
                                    "page_tail, evicted, namespace, retokenized, new (computed)", ["cause"],
                                    registry=r)
        self.ttft = Histogram("radixkv_time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("radixkv_e2e_request_latency_seconds", "Arrival to finish",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.gauges = {
            name: Gauge(f"radixkv_{name}", help_text, registry=r) for name, help_text in (
                ("running_requests", "Requests being prefilled or decoded"),
                ("waiting_requests", "Requests queued for admission"),
                ("token_usage", "Share of the KV pool in use (0-1)"),
                ("free_tokens", "Free KV pool tokens"),
                ("evictable_tokens", "Cached tokens no running request reads"),
                ("protected_tokens", "Cached tokens locked by running requests"),
                ("retained_tokens", "Cached tokens a retention hint (cache_control ttl, prompt_cache_retention) "
                 "still keeps: evicted only when nothing unretained is left"),
                ("total_tokens", "KV pool capacity in tokens"),
                ("cache_hit_rate", "Prompt tokens served from the cache / prompt tokens, since start"),
                ("device_hit_tokens", "Prompt tokens served from the KV pool, since start"),
                ("host_hit_tokens", "Prompt tokens copied back from the host tier, since start"),
                ("recomputed_prompt_tokens", "Prompt tokens computed (not served by any tier), since start"),
                ("host_total_tokens", "Host tier capacity in tokens (0: no host tier)"),
                ("host_used_tokens", "Host tier tokens in use"),
                ("storage_hit_tokens", "Prompt tokens read from the storage tier (--kv-storage-dir), since start"),
                ("storage_total_tokens", "Storage tier capacity in tokens (0: no storage tier)"),
                ("storage_used_tokens", "Storage tier tokens stored"),
                ("storage_bytes_read", "Bytes read from the storage tier, since start"),
                ("storage_bytes_written", "Bytes written to the storage tier, since start"),
                ("storage_prefetches_complete", "Storage prefetches installed whole, since start"),
                ("storage_prefetches_partial", "Storage prefetches installed in part (the request went on "
                 "before all pages arrived, or the tree already held some), since start"),
                ("storage_prefetches_failed", "Storage prefetches cut short by a page that failed its check "
                 "or was evicted, since start"),
                ("disagg_transfers", "Prefill/decode: prompts whose KV pages travelled (sent by a prefill "
                 "server, received by a decode server), since start"),
                ("disagg_transferred_tokens", "Prefill/decode: prompt tokens whose KV travelled, since start"),
                ("disagg_transferred_bytes", "Prefill/decode: KV bytes that travelled, since start"),
                ("disagg_transfer_seconds", "Prefill/decode: seconds spent writing KV pages, since start"),
                ("disagg_local_prefix_tokens", "Decode server: prompt tokens of paired requests its own cache "
                 "held (not pulled), since start"),
                ("disagg_failed", "Prefill/decode: paired requests that ended without their pages, since start"),
                ("tp_size", "Tensor-parallel ranks the model runs on"),
                ("tp_all_reduce_ms_per_forward", "Tensor parallel: milliseconds per forward inside "
                 "all-reduces on rank 0 (waiting for the other ranks included), since start"),
                ("tp_comm_share_of_forward", "Tensor parallel: share of forward time inside collectives, since start"),
                ("compiled", "1 when the model's forward runs as a compiled graph (--compile), 0 when eager"),
                ("recompilations", "Compiled graphs built after warm-up (a batch shape the graph missed; should be 0)"),
                ("mean_queue_seconds", "Mean time from reaching the scheduler to the first forward, since start"),
                ("mean_prefill_seconds", "Mean time from the first forward to the first token, since start"),
                ("spec_verify_ct", "Speculative decoding: request-forwards that verified draft tokens, since start"),
                ("spec_accepted_tokens", "Speculative decoding: draft tokens kept in outputs, since start"),
                ("spec_accept_rate", "Speculative decoding: kept / proposed draft tokens, since start"),
                ("spec_tokens_per_verify", "Speculative decoding: tokens a verifying forward yields per request "
                 "(kept drafts + one), since start"),
                ("expert_load_imbalance", "Mixture of experts: the busiest expert's tokens over the mean, "
                 "averaged over layers, since start (1 = even; 0 for a dense model)"),
            )}
        self.lora_hit_rate = Gauge("radixkv_lora_hit_rate", "LoRA: cached / prompt tokens of each adapter's "
                                   "requests, since start (each adapter caches apart)", ["adapter"], registry=r)
        self.expert_tokens = Gauge("radixkv_expert_tokens", "Mixture of experts: tokens routed to each "
                                   "expert of each layer, since start", ["layer", "expert"], registry=r)

    def observe_finished(self, chunk) -> None:
        """Count one finished request (its last chunk)."""
        if chunk.error is not None:
            outcome = "error"
        else:
            outcome = (chunk.finish_reason or {}).get("type", "unknown")
        self.requests.labels(outcome=outcome).inc()
        self.prompt_tokens.inc(chunk.prompt_tokens)
        self.cached_tokens.inc(chunk.cached_tokens)
        self.generation_tokens.inc(chunk.completion_tokens)
        for cause, n in (chunk.cache_causes or {}).items():
            self.cause_tokens.labels(cause=cause).inc(n)
        if chunk.ttft is not None:
            self.ttft.observe(chunk.ttft)
        if chunk.latency is not None:
            self.latency.observe(chunk.latency)

    def render(self, stats: dict[str, Any]) -> bytes:
        """Prometheus text exposition, with gauges set from the scheduler's `stats`."""
        for name, gauge in self.gauges.items():
            gauge.set(float(stats.get(name) or 0))
        for row in stats.get("lora_adapters") or []:
            self.lora_hit_rate.labels(adapter=row["name"]).set(row["hit_rate"])
        for layer, counts in (stats.get("expert_tokens") or {}).items():
            for expert, n in enumerate(counts):
                self.expert_tokens.labels(layer=str(layer), expert=str(expert)).set(n)
        return generate_latest(self.registry)
