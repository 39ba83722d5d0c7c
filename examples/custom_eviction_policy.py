"""Plug a custom eviction policy into the radix cache and replay a synthetic chat trace.

A policy ranks evictable leaves; the smallest rank goes first. This one evicts the largest
leaves first (the most memory back per eviction), breaking ties by recency.

    python examples/custom_eviction_policy.py
"""

from radixkv.mem import EvictionPolicy
from radixkv.workloads.chat import ChatTraceConfig, generate_chat_trace
from radixkv.workloads.replay import replay
from radixkv.workloads.trace import TraceRequest


class LargestFirst(EvictionPolicy):
    name = "largest-first"

    def priority(self, node, end):
        return (-end, node.last_access)


records = generate_chat_trace(ChatTraceConfig(num_requests=400, num_conversations=60, seed=7))
trace = [TraceRequest(r["timestamp"], r["input_length"], r["output_length"], tuple(r["hash_ids"]),
                      tuple(r["input_ids"])) for r in records]
for policy in ("lru", "reuse", LargestFirst(), "belady"):
    result = replay(trace, policy, capacity_tokens=30_000, page_size=16)
    print(f"{result.policy:<14} hit rate {result.hit_rate:6.1%}   "
          f"evicted {result.evicted_tokens:>9,} tokens")
