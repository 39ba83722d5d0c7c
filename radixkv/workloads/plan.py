"""How much KV memory a workload needs: hit rate and prefill saved as a function of capacity.

`plan` replays a trace (`radixkv.workloads.replay`, the real cache and allocator) at a series of
device capacities and reports, per capacity, the hit rate, the prefill compute it saved
(attention-weighted, `token_cost_prefix_sum`), what the host and storage tiers served, and the
memory that capacity takes in each KV format (`bytes_per_token`, from `radixkv.kv_size`). It
also gives:

- the *working set*: the tokens a cache with room for everything ends up holding, and the hit
  rate there (the ceiling no capacity passes);
- the *knee*: the point of the curve farthest above the chord from its first point to its last,
  on a log-capacity axis (Kneedle), past which memory buys little;
- per LoRA adapter, when the trace names adapters (a recorded trace of a `--enable-lora` server
  does): each one's hit rate at every capacity and at the working set;
- for each target hit rate, the least capacity reaching it, found by bisection with replays
  (to within `tolerance` of the capacity), or None if even the working set does not.

Without capacities given, the sweep spans the working set geometrically, from 1/256 of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from radixkv.workloads.replay import ReplayResult, replay
from radixkv.workloads.trace import BLOCK_SIZE, TraceRequest

SWEEP_POINTS = 12
SWEEP_SPAN = 256  # the sweep starts at working set / this


@dataclass(frozen=True, slots=True)
class PlanPoint:
    """One replay of the plan: a device capacity and what it served."""

    capacity_tokens: int
    hit_rate: float
    prefill_saved: float  # share of the prefill compute served from the cache
    hit_tokens: int
    host_hit_tokens: int
    storage_hit_tokens: int
    evicted_tokens: int
    memory_bytes: dict[str, int] = field(default_factory=dict)  # the capacity's KV, per KV format
    adapter_hit_rates: dict[str, float] = field(default_factory=dict)  # per LoRA adapter, when the trace has any

    @classmethod
    def of(cls, result: ReplayResult, bytes_per_token: dict[str, int]) -> PlanPoint:
        return cls(result.capacity_tokens, result.hit_rate,
                   result.prefill_work_saved / max(result.prefill_work, 1e-9), result.hit_tokens,
                   result.host_hit_tokens, result.storage_hit_tokens, result.evicted_tokens,
                   {name: result.capacity_tokens * b for name, b in bytes_per_token.items()},
                   adapter_hit_rates(result))


def adapter_hit_rates(result: ReplayResult) -> dict[str, float]:
    """Each LoRA adapter's hit rate in `result` (base model as `BASE`), sorted by name."""
    return {name: use["hit_tokens"] / max(1, use["prompt_tokens"]) for name, use in sorted(result.adapters.items())}


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """What to replay: the cache's page size and eviction policy, the tiers under the device
    pool (0: none), and the trace's block size."""

    page_size: int = BLOCK_SIZE
    policy: str = "lru"
    host_capacity_tokens: int = 0
    storage_capacity_tokens: int = 0
    block_size: int = BLOCK_SIZE
    tolerance: float = 0.02  # a target's capacity is found to within this share

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size={self.page_size}: must be >= 1")
        if self.host_capacity_tokens < 0 or self.storage_capacity_tokens < 0:
            raise ValueError("host and storage capacities must be >= 0 tokens")
        if self.storage_capacity_tokens and not self.host_capacity_tokens:
            raise ValueError("a storage tier needs a host tier above it (host capacity)")
        if not 0 < self.tolerance < 1:
            raise ValueError(f"tolerance={self.tolerance}: must be in (0, 1)")


class Planner:
    """Replays `trace` under `config`, memoised by capacity (pages)."""

    def __init__(self, trace: Sequence[TraceRequest], config: PlanConfig,
                 bytes_per_token: dict[str, int] | None = None, progress: Callable[[], None] | None = None):
        if not trace:
            raise ValueError("the trace has no requests")
        self.trace, self.config = trace, config
        self.bytes_per_token = dict(bytes_per_token or {})
        self.progress = progress
        self._points: dict[int, PlanPoint] = {}
        self._ceiling: ReplayResult | None = None

    def _replay(self, policy: str, capacity_tokens: int) -> ReplayResult:
        c = self.config
        result = replay(self.trace, policy, capacity_tokens, page_size=c.page_size, block_size=c.block_size,
                        host_capacity_tokens=c.host_capacity_tokens,
                        storage_capacity_tokens=c.storage_capacity_tokens)
        if self.progress is not None:
            self.progress()
        return result

    def ceiling(self) -> ReplayResult:
        """The replay with room for the whole trace."""
        if self._ceiling is None:
            self._ceiling = self._replay("inf", 0)
        return self._ceiling

    @property
    def working_set_tokens(self) -> int:
        """What the cache holds when nothing is evicted: every prompt token it missed."""
        top = self.ceiling()
        return top.prompt_tokens - top.hit_tokens

    def point(self, capacity_tokens: int) -> PlanPoint:
        """The replay at `capacity_tokens` of device pool (rounded down to pages, one at least)."""
        pages = max(1, capacity_tokens // self.config.page_size)
        if pages not in self._points:
            self._points[pages] = PlanPoint.of(self._replay(self.config.policy, pages * self.config.page_size),
                                               self.bytes_per_token)
        return self._points[pages]

    def sweep(self, points: int = SWEEP_POINTS) -> list[int]:
        """Capacities spanning the working set geometrically (distinct pages, ascending)."""
        top = max(self.working_set_tokens, self.config.page_size)
        low = max(self.config.page_size, top // SWEEP_SPAN)
        if points < 2 or low >= top:
            return [top]
        ratio = (top / low) ** (1 / (points - 1))
        size = self.config.page_size
        return sorted({max(size, round(low * ratio**i) // size * size) for i in range(points)} | {top // size * size})

    def capacity_for(self, target: float) -> PlanPoint | None:
        """The least capacity whose hit rate reaches `target` (bisection, to `tolerance`), or
        None if even room for the whole trace does not."""
        if target > self.ceiling().hit_rate + 1e-12:
            return None
        size = self.config.page_size
        hi = max(self.working_set_tokens, size) // size * size
        if self.point(hi).hit_rate < target:  # (a policy that needs more room than the working set)
            hi = self.ceiling().capacity_tokens // size * size
            if self.point(hi).hit_rate < target:
                return None
        lo = size
        if self.point(lo).hit_rate >= target:
            return self.point(lo)
        for pages, p in self._points.items():  # the replays already run (the sweep) bracket it closer
            tokens = pages * size
            if p.hit_rate >= target and tokens < hi:
                hi = tokens
            elif p.hit_rate < target and lo < tokens < hi:
                lo = tokens
        while hi - lo > max(size, self.config.tolerance * hi):  # lo misses the target, hi reaches it
            mid = round(math.sqrt(lo * hi)) // size * size  # (halving on a log scale: capacities span decades)
            if mid <= lo:
                break
            if self.point(mid).hit_rate >= target:
                hi = mid
            else:
                lo = mid
        return self.point(hi)


def knee(points: Sequence[PlanPoint]) -> int | None:
    """The index of the knee of a curve (ascending capacity): the point farthest above the chord
    from the first to the last, on log capacity and hit rate each scaled to [0, 1]; None when
    the curve has fewer than three points or is flat."""
    if len(points) < 3:
        return None
    xs = [math.log(p.capacity_tokens) for p in points]
    ys = [p.hit_rate for p in points]
    dx, dy = xs[-1] - xs[0], ys[-1] - ys[0]
    if dx <= 0 or dy <= 0:
        return None
    gaps = [(y - ys[0]) / dy - (x - xs[0]) / dx for x, y in zip(xs, ys)]
    best = max(range(len(points)), key=gaps.__getitem__)
    return best if gaps[best] > 0 else None


def plan(trace: Sequence[TraceRequest], config: PlanConfig, capacities: Sequence[int] | None = None,
         targets: Sequence[float] = (), bytes_per_token: dict[str, int] | None = None, points: int = SWEEP_POINTS,
         progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """The plan as a JSON-ready dict: `curve` (one `PlanPoint` per capacity), `knee`,
    `working_set`, `targets` and the settings (see the module docstring)."""
    for t in targets:
        if not 0 <= t <= 1:
            raise ValueError(f"target hit rate {t}: must be in [0, 1]")
    planner = Planner(trace, config, bytes_per_token, progress)
    top = planner.ceiling()
    ceilings = adapter_hit_rates(top)
    caps = sorted({max(1, c // config.page_size) * config.page_size for c in capacities}) if capacities else \
        planner.sweep(points)
    curve = [planner.point(c) for c in caps]
    at = knee(curve)
    found = []
    for t in targets:
        p = planner.capacity_for(t)
        found.append({"hit_rate": t, "capacity_tokens": p.capacity_tokens if p else None,
                      "reached_hit_rate": p.hit_rate if p else None,
                      "memory_bytes": p.memory_bytes if p else None})
    return {
        "requests": len(trace), "prompt_tokens": top.prompt_tokens, "page_size": config.page_size,
        "block_size": config.block_size, "policy": config.policy,
        "host_capacity_tokens": config.host_capacity_tokens,
        "storage_capacity_tokens": config.storage_capacity_tokens,
        "bytes_per_token": dict(bytes_per_token or {}),
        "tokens_per_gb": {name: int(1e9 // b) for name, b in (bytes_per_token or {}).items()},
        "adapters": {name: {"requests": top.adapters[name]["requests"],
                            "prompt_tokens": top.adapters[name]["prompt_tokens"], "working_set_hit_rate": rate}
                     for name, rate in ceilings.items()},
        "working_set": {"capacity_tokens": planner.working_set_tokens, "hit_rate": top.hit_rate,
                        "prefill_saved": top.prefill_work_saved / max(top.prefill_work, 1e-9),
                        "memory_bytes": {n: planner.working_set_tokens * b for n, b in (bytes_per_token or {}).items()}},
        "curve": [asdict(p) for p in curve],
        "knee": asdict(curve[at]) if at is not None else None,
        "targets": found,
    }
