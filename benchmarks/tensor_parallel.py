"""Tensor parallelism on this machine: identical greedy tokens, and what the all-reduces cost.

In one run, on a random-initialised Llama-shaped model built offline (hidden 1024, 16 heads,
4 KV heads, 8 layers, vocabulary 32,000: 0.16B parameters, fp32), `Engine(tp_size=1)` and
`Engine(tp_size=2)` side by side, in alternating order:
1. greedy tokens of both, compared token for token;
2. prefill (4 prompts of 256 tokens) and decode (8 requests x 64 tokens): wall time, the
   tp2 / tp1 ratio, and per forward the all-reduces rank 0 ran, their milliseconds (waiting for
   the other rank included) and the share of forward time spent in collectives;
3. a raw all-reduce: two processes alone, (T, 1024) fp32 tensors for T = 1, 8, 1024 rows, with no
   forward around them: the cost of the transfer alone, without waiting for a slower rank.

On a CPU the ranks share the machine's cores (tp1 runs 2 threads, each tp2 rank 1), so TP adds
communication without adding compute: it is run here for correctness and to measure that
communication. On GPUs each rank has its own device and memory bandwidth.

    python benchmarks/tensor_parallel.py
    python benchmarks/tensor_parallel.py --repeats 1 --layers 4
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from tqdm import tqdm

from _report import RESULTS, bar_plot, machine, save_json


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8, help="decoder layers of the model (default 8)")
    p.add_argument("--prefill-tokens", type=int, default=256, help="tokens per prompt, 4 prompts (default 256)")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens per request, 8 requests (default 64)")
    p.add_argument("--repeats", type=int, default=3, help="alternating repeats, medians reported (default 3)")
    p.add_argument("--json", type=Path, default=RESULTS / "tensor_parallel.json", help="results file")
    args = p.parse_args(argv)
    if args.layers < 1 or args.prefill_tokens < 8 or args.decode_tokens < 2 or args.repeats < 1:
        p.error("--layers >= 1, --prefill-tokens >= 8, --decode-tokens >= 2, --repeats >= 1")
    return args


def build_model(path: Path, layers: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=None)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # random init leaves near-uniform logits: sharpen so greedy is meaningful
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    model.save_pretrained(path)


def phase(engine, prompts, params) -> dict:
    """Wall time, forwards and collective figures of one generate call."""
    import torch

    # torch's thread count is per process, and both engines' rank 0 live in this one: give
    # each the count it chose at load (tp1: every core; tp2: its share)
    torch.set_num_threads(engine.runner.num_threads)
    before = engine.get_stats()
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    wall = time.perf_counter() - start
    after = engine.get_stats()
    out = {"wall_s": wall, "outputs": [o["output_ids"] for o in outs]}
    if after["tp_size"] > 1:
        forwards = after["tp_forwards"] - before["tp_forwards"]
        comm = sum(after[k] - before[k] for k in ("tp_all_reduce_seconds", "tp_all_gather_seconds"))
        out.update(forwards=forwards,
                   all_reduces_per_forward=(after["tp_all_reduces"] - before["tp_all_reduces"]) / forwards,
                   all_reduce_ms_per_forward=1e3 * (after["tp_all_reduce_seconds"]
                                                     - before["tp_all_reduce_seconds"]) / forwards,
                   comm_ms_per_forward=1e3 * comm / forwards, wall_ms_per_forward=1e3 * wall / forwards)
    return out


def _allreduce_rank(rank: int, port: int, rows: list[int], iters: int) -> dict[int, float]:
    import torch
    import torch.distributed as dist

    from radixkv.parallel.group import TPGroup

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=60))
    group = TPGroup(store, rank, 2, torch.device("cpu"))
    result = {}
    for t in rows:
        x = torch.ones(t, 1024)
        for _ in range(5):
            group.all_reduce(x)
        group.broadcast_bytes(b"go" if rank == 0 else None)  # start together
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            group.all_reduce(x)
            times.append(time.perf_counter() - start)
        result[t] = statistics.median(times) * 1e3
    return result


def raw_all_reduce(rows: list[int], iters: int = 200) -> dict[int, float]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        r0, _ = pool.starmap(_allreduce_rank, [(0, store.port, rows, iters), (1, store.port, rows, iters)])
    return r0


def main(argv=None) -> int:
    args = parse_args(argv)
    from radixkv import Engine

    workdir = tempfile.TemporaryDirectory(prefix="radixkv-tp-bench-")
    model = Path(workdir.name) / "model"
    print("building the model ...", flush=True)
    build_model(model, args.layers)
    rows = [1, 8, 1024]
    print("raw all-reduce between two processes ...", flush=True)
    raw = raw_all_reduce(rows)

    prompts = [[1 + (7 * i + 13 * j) % 31990 for j in range(args.prefill_tokens)] for i in range(4)]
    decode_prompts = [[1, 100 + i, 200 + i, 300 + i] for i in range(8)]
    prefill_params = {"max_new_tokens": 1, "temperature": 0}
    decode_params = {"max_new_tokens": args.decode_tokens, "temperature": 0, "ignore_eos": True}
    opts = dict(max_total_tokens=16384, progress=False, log_level="warning")
    engines = {tp: Engine(str(model), tp_size=tp, **opts) for tp in (1, 2)}
    threads = {tp: e.runner.num_threads for tp, e in engines.items()}
    runs = {tp: {"prefill": [], "decode": []} for tp in engines}
    try:
        with tqdm(total=args.repeats * 4, desc="tensor parallel", unit="run") as bar:
            for rep in range(args.repeats):
                for tp in ((1, 2) if rep % 2 == 0 else (2, 1)):
                    engine = engines[tp]
                    engine.flush_cache()  # every prefill computes every token
                    runs[tp]["prefill"].append(phase(engine, prompts, prefill_params))
                    bar.update(1)
                    runs[tp]["decode"].append(phase(engine, decode_prompts, decode_params))
                    bar.update(1)
    finally:
        for engine in engines.values():
            engine.shutdown()
        workdir.cleanup()

    identical = all(a["outputs"] == b["outputs"] for kind in ("prefill", "decode")
                    for a, b in zip(runs[1][kind], runs[2][kind]))
    report = {}
    for kind in ("prefill", "decode"):
        t1 = statistics.median(r["wall_s"] for r in runs[1][kind])
        t2 = statistics.median(r["wall_s"] for r in runs[2][kind])
        tp2 = runs[2][kind]
        report[kind] = {
            "tp1_wall_s": t1, "tp2_wall_s": t2, "tp2_over_tp1": t2 / t1,
            "forwards": tp2[0]["forwards"], "all_reduces_per_forward": tp2[0]["all_reduces_per_forward"],
            **{k: statistics.median(r[k] for r in tp2)
               for k in ("all_reduce_ms_per_forward", "comm_ms_per_forward", "wall_ms_per_forward")}}
        report[kind]["comm_share_of_wall"] = report[kind]["comm_ms_per_forward"] / report[kind]["wall_ms_per_forward"]
    print(f"\ngreedy tokens, tp2 vs tp1 (fp32): {'identical' if identical else 'DIFFERENT'}")
    for kind, r in report.items():
        print(f"{kind}: tp1 {r['tp1_wall_s']:.2f} s, tp2 {r['tp2_wall_s']:.2f} s ({r['tp2_over_tp1']:.2f}x the time); "
              f"per forward {r['all_reduces_per_forward']:.0f} all-reduces, {r['all_reduce_ms_per_forward']:.2f} ms in "
              f"them, collectives {100 * r['comm_share_of_wall']:.0f}% of the forward's wall time")
    print("raw all-reduce of (T, 1024) fp32, two idle processes: "
          + ", ".join(f"T={t}: {ms:.3f} ms" for t, ms in raw.items()))
    save_json(args.json, {**machine(), "threads": f"{threads[1]} (tp 1) and {threads[2]} per rank (tp 2)", "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
                          "identical_greedy_tokens": identical, "phases": report,
                          "raw_all_reduce_ms": {str(t): ms for t, ms in raw.items()}})
    bar_plot(args.json.with_suffix(".png"), "tensor parallel on CPU: ms per decode forward",
             "ms", {"tp2 forward (wall)": report["decode"]["wall_ms_per_forward"],
                    "tp2 all-reduces": report["decode"]["all_reduce_ms_per_forward"],
                    f"{report['decode']['all_reduces_per_forward']:.0f} raw all-reduces (T=8)":
                        report["decode"]["all_reduces_per_forward"] * raw[8]})
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
