"""Scheduling policies: the order in which waiting requests are admitted.

- `fcfs`: arrival order (a retracted request goes back to the front).
- `lpm`: longest cached prefix first, so requests that share what is cached run while it is;
  a request passed over `starvation_limit` times goes first regardless.
- `dfs-weight`: walk the radix tree depth first, heaviest subtree (most waiting requests) first,
  so requests under one shared prefix are admitted together (SGLang's order: post-order).

Cache-aware policies also defer a request whose *uncached* prefix overlaps a request already
admitted to the same batch by `IN_BATCH_SHARE_TOKENS` or more: the first computes the shared
part and caches it after its forward, and the deferred one then hits it (in-batch sharing).
"""

from __future__ import annotations

from collections.abc import Sequence

from radixkv.mem.base import PrefixCache
from radixkv.sched.request import Req

IN_BATCH_SHARE_TOKENS = 32


def match_key(req: Req) -> list[int]:
    """The tokens a cached prefix may cover: all but the last, which must run for logits, and
    none past `logprob_start_len - 1` while the request still needs its prompt log-probs."""
    length = req.seq_len - 1
    if req.logprob.wants_prompt and not req.logprobs.prompt_sent:
        length = min(length, max(0, req.logprob.start - 1))
    return req.seq_ids[:length]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SchedulePolicy:
    def __init__(self, name: str, cache: PrefixCache, starvation_limit: int = 32):
        self.name = name
        self.cache = cache
        self.starvation_limit = starvation_limit

    @property
    def cache_aware(self) -> bool:
        """Prefix-aware ordering needs a real cache; without one every policy is FCFS."""
        from radixkv.mem.no_cache import NoCache

        return self.name in ("lpm", "dfs-weight") and not isinstance(self.cache, NoCache)

    def order(self, waiting: Sequence[Req]) -> list[Req]:
        """Waiting requests in admission order. When cache-aware it peeks at each request's
        cached prefix, once: `req.peeked` (which admission uses this step) and `req.match_len`."""
        if not self.cache_aware:
            return list(waiting)
        matches = {}
        for req in waiting:
            m = self.cache.peek(match_key(req), req.namespace)
            req.peeked, req.match_len = m, m.num_tokens
            matches[req.rid] = m.last_node
        starved = [r for r in waiting if r.passed_over >= self.starvation_limit]
        rest = [r for r in waiting if r.passed_over < self.starvation_limit]
        if self.name == "lpm":
            rest.sort(key=lambda r: -r.match_len)  # stable: arrival order among equals
        else:
            rest = self._dfs_weight(rest, matches)
        return starved + rest

    def _dfs_weight(self, reqs: list[Req], last_node: dict) -> list[Req]:
        by_node: dict[int, list[Req]] = {}
        weight: dict[int, int] = {}
        nodes = {}
        for req in reqs:
            node = last_node[req.rid]
            by_node.setdefault(id(node), []).append(req)
            while node is not None:  # every ancestor gains the request's weight
                nodes[id(node)] = node
                weight[id(node)] = weight.get(id(node), 0) + 1
                node = getattr(node, "parent", None)
        roots = [n for n in nodes.values() if getattr(n, "parent", None) is None]
        # post-order: a node's heavier subtrees first, then the requests that stop at the node,
        # so requests with the deepest shared prefixes lead and root-level ones come last
        out: list[Req] = []
        stack = [(n, False) for n in sorted(roots, key=lambda n: weight[id(n)])]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                out.extend(by_node.get(id(node), ()))
                continue
            stack.append((node, True))
            children = [c for c in getattr(node, "children", {}).values() if id(c) in weight]
            stack.extend((c, False) for c in sorted(children, key=lambda n: weight[id(n)]))
        return out


class InBatchPrefixes:
    """Uncached token spans admitted to the batch being built, to spot in-batch sharing."""

    def __init__(self) -> None:
        self._keys: list[list[int]] = []

    def shares(self, key: list[int], cached: int) -> bool:
        """Whether `key` beyond its `cached` prefix overlaps an admitted key by the threshold."""
        return any(common_prefix_len(key, k) - cached >= IN_BATCH_SHARE_TOKENS for k in self._keys)

    def add(self, key: list[int]) -> None:
        self._keys.append(key)
