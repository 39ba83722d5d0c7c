"""The model forward compiled against eager, and cascade extend against per-request attention,
side by side in one process on the same runner and the same batches.

Each case is one forward shape (decode rows, or extends of new tokens on a cached context);
the two variants alternate for `--repeats` rounds and the medians are compared, so machine
noise hits both alike. The last case is the shared-prefix batch of `customer_service.py`:
16 requests of 112 new tokens on one 2,032-token cached document, with the cascade extend (the
document attended once for all 16) against one attention pass per request.

    python benchmarks/compile_forward.py
    python benchmarks/compile_forward.py --repeats 20 --cases decode
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _report import RESULTS, machine, save_json
from tqdm import tqdm

DECODE = [(1, 100), (1, 2000), (8, 100), (8, 2000), (16, 300), (32, 300)]  # (rows, context)
EXTEND = [(1, 0, 512), (1, 350, 90), (4, 500, 100), (1, 0, 2048)]  # (requests, cached, new)
SHARED = (16, 2032, 112)  # requests, shared cached prefix, new tokens each


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10, help="alternating rounds per case (default 10)")
    p.add_argument("--cases", default="decode,extend,shared", help="which groups to run (default all)")
    p.add_argument("--json", type=Path, default=RESULTS / "compile_forward.json", help="results file")
    return p.parse_args(argv)


class Batch:
    """A forward's worth of requests on the runner's memory: prefixes stored, slots reserved."""

    def __init__(self, runner, rows: int, cached: int, new: int):
        from radixkv.attention import ForwardMode

        mem = self.mem = runner.memory
        self.rows = [mem.req_table.alloc() for _ in range(rows)]
        self.seqs = [mem.new_sequence() for _ in range(rows)]
        slots = []
        for row, seq in zip(self.rows, self.seqs):
            s = seq.extend(cached + new)
            mem.req_table.write(row, 0, s)
            slots.extend(s[cached:])
        mode = ForwardMode.DECODE if new == 1 else ForwardMode.EXTEND
        self.fb = runner.build_batch(mode, [[7] * new for _ in self.rows], self.rows, [cached] * rows, slots)

    def release(self):
        for row, seq in zip(self.rows, self.seqs):
            seq.release()
            self.mem.req_table.free(row)


def alternate(a, b, repeats: int) -> tuple[float, float]:
    a(), b()  # warm
    ta, tb = [], []
    for _ in range(repeats):
        for f, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            f()
            out.append(time.perf_counter() - start)
    return statistics.median(ta), statistics.median(tb)


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv.attention import sdpa_plan
    from radixkv.config import EngineConfig
    from radixkv.model.runner import ModelRunner

    groups = set(args.cases.split(","))
    start = time.perf_counter()
    runner = ModelRunner.load(EngineConfig.from_kwargs(compile="on", max_total_tokens=64 * 2400, max_running_requests=64))
    print(f"loaded and compiled in {time.perf_counter() - start:.1f} s: {runner.compile_stats()}")
    compiled = runner.compiled

    def eager(fb):
        runner.compiled = None
        try:
            runner.forward(fb)
        finally:
            runner.compiled = compiled

    cases = ([("decode", b, c, 1) for b, c in DECODE] if "decode" in groups else []) + \
            ([("extend", r, c, n) for r, c, n in EXTEND] if "extend" in groups else [])
    rows = []
    for kind, b, cached, new in tqdm(cases, desc="compiled vs eager", unit="case"):
        batch = Batch(runner, b, cached, new)
        tc, te = alternate(lambda b=batch: runner.forward(b.fb), lambda b=batch: eager(b.fb), args.repeats)
        batch.release()
        rows.append({"case": kind, "rows": b, "cached": cached, "new": new, "compiled_s": tc, "eager_s": te,
                     "speedup": te / tc})
        print(f"{kind:<7} rows={b:<3} cached={cached:<5} new={new:<5} compiled {tc * 1e3:8.1f} ms  "
              f"eager {te * 1e3:8.1f} ms  compiled speedup {te / tc:.3f}x", flush=True)
    shared = None
    if "shared" in groups:
        n, cached, new = SHARED
        batch = SharedPrefixBatch(runner, n, cached, new)
        limit = sdpa_plan.SHARED_MIN_SAVED_TOKENS

        def per_request():
            sdpa_plan.SHARED_MIN_SAVED_TOKENS = 1 << 62
            try:
                runner.forward(batch.fb)
            finally:
                sdpa_plan.SHARED_MIN_SAVED_TOKENS = limit

        tc, tp = alternate(lambda: runner.forward(batch.fb), per_request, max(3, args.repeats // 3))
        batch.release()
        shared = {"requests": n, "shared_cached": cached, "new": new, "cascade_s": tc, "per_request_s": tp,
                  "speedup": tp / tc}
        print(f"shared-prefix extend {n} x {new} on {cached}: cascade {tc:.3f} s  per request {tp:.3f} s  "
              f"cascade speedup {tp / tc:.3f}x")
    print(f"recompilations after warm-up: {runner.compile_stats()['recompilations']}")
    save_json(args.json, {**machine(), "args": vars(args) | {"json": str(args.json)}, "rows": rows,
                          "shared_prefix_extend": shared, "compile": runner.compile_stats()})
    return 0


class SharedPrefixBatch:
    """`n` requests whose first `cached` tokens are the same pages (as the radix cache hands
    them out), each extending them by `new` tokens."""

    def __init__(self, runner, n: int, cached: int, new: int):
        from radixkv.attention import ForwardMode

        mem = self.mem = runner.memory
        self.pages = mem.allocator.alloc(-(-cached // mem.allocator.page_size))
        trunk = [s for p in self.pages for s in range(p * mem.allocator.page_size, (p + 1) * mem.allocator.page_size)]
        trunk = trunk[:cached]
        self.rows = [mem.req_table.alloc() for _ in range(n)]
        self.seqs = [mem.new_sequence() for _ in range(n)]
        slots = []
        for row, seq in zip(self.rows, self.seqs):
            mem.req_table.write(row, 0, trunk)
            own = seq.extend(new)
            mem.req_table.write(row, cached, own)
            slots.extend(own)
        self.fb = runner.build_batch(ForwardMode.EXTEND, [[7] * new] * n, self.rows, [cached] * n, slots)

    def release(self):
        for row, seq in zip(self.rows, self.seqs):
            seq.release()
            self.mem.req_table.free(row)
        self.mem.allocator.decref(self.pages)


if __name__ == "__main__":
    raise SystemExit(main())
