"""Tensor-parallel ranks 1..N-1: `python -m radixkv.tp.worker` (started by rank 0, or on
another machine by that node's `radixkv serve --node-rank R`: `radixkv.tp.node`).

A rank loads its shard of the model, builds a KV memory for its KV heads with the page count
rank 0 chose, then serves rank 0's messages until `TPStop`: for each `TPForward` it replays rank
0's KV journal on its own memory and runs the same forward, taking part in every all-reduce.
It keeps no scheduler and no cache of its own: rank 0 decides, every rank computes.

A rank dies with rank 0 (a watchdog thread notices the parent process is gone: not a
parent-death signal, which would fire when the *thread* that started the rank ends), ignores
Ctrl-C (rank 0 stops it), and reports a failure through the store (`error/<rank>`) before
exiting, so rank 0 can say what went wrong.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist


def serve_rank(rank: int, store: dist.Store, config, model_dir: Path, logger: logging.Logger,
               gloo_host: str = "127.0.0.1") -> None:
    from radixkv.mem.kv_memory import KVMemory
    from radixkv.model.config import ModelConfig
    from radixkv.model import mkl_dispatch
    from radixkv.model.cpu_runtime import choose_num_threads
    from radixkv.model.runner import ModelRunner, kv_layout, load_rank_model, rank_threads
    from radixkv.parallel.devices import rank_device, use_rank_device
    from radixkv.parallel.group import TPGroup
    from radixkv.parallel.shard import TPShard
    from radixkv.tp.journal import replay
    from radixkv.tp.messages import TP_CODEC, TPForward, TPStart, TPStop, batch_from_message

    mkl_dispatch.enable()  # before this rank's first MKL call
    choose_num_threads(rank_threads(config))
    device = rank_device(config, rank)
    use_rank_device(device)
    store.set(f"alive/{rank}", "1")
    group = TPGroup(store, rank, config.runtime.tp_size, device, gloo_host)
    shard = TPShard(rank, config.runtime.tp_size)
    model, _ = load_rank_model(config, model_dir, shard, group, device, progress=False)
    store.set(f"loaded/{rank}", "1")

    start = TP_CODEC.decode(group.broadcast_bytes())
    if isinstance(start, TPStop):
        return
    assert isinstance(start, TPStart), f"expected TPStart, got {type(start).__name__}"
    mc: ModelConfig = model.config
    host_tokens = start.host_pages * config.cache.page_size if start.host_pages else None
    memory = KVMemory(kv_layout(config, mc, shard), start.num_pages, start.max_reqs, start.context_length,
                      device, host_tokens, start.host_write_policy)
    runner = ModelRunner(config, model, memory, model_dir, start.context_length)  # this rank's part only
    store.set(f"ready/{rank}", "1")
    logger.info("rank %d of %d ready: %d/%d heads, %d/%d KV heads, %d KV pages", rank, config.runtime.tp_size,
                shard.local(mc.num_heads), mc.num_heads, shard.local(mc.num_kv_heads), mc.num_kv_heads,
                start.num_pages)
    while True:
        msg = TP_CODEC.decode(group.broadcast_bytes())
        if isinstance(msg, TPStop):
            return
        assert isinstance(msg, TPForward), f"expected TPForward, got {type(msg).__name__}"
        replay(memory, msg.table_writes, msg.page_ops)
        runner.forward(batch_from_message(msg, device))  # the logits are rank 0's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixkv.tp.worker",
                                     description="A tensor-parallel rank > 0 (started by rank 0, not by hand).")
    parser.add_argument("--rank", type=int, required=True, help="this process's rank (1..tp_size-1)")
    parser.add_argument("--store-host", default="127.0.0.1", help="where rank 0's TCPStore is")
    parser.add_argument("--store-port", type=int, required=True, help="rank 0's TCPStore port")
    parser.add_argument("--gloo-host", default="127.0.0.1", help="the address this rank's gloo connections use")
    parser.add_argument("--parent-pid", type=int, required=True,
                        help="the pid of the process that started it (rank 0, or its node's): this rank dies with it")
    parser.add_argument("--model-dir", required=True, help="the resolved model directory")
    parser.add_argument("--config", required=True, help="the EngineConfig as JSON")
    args = parser.parse_args(argv)

    from radixkv.config import EngineConfig
    from radixkv.procs import become_child, watch_parent

    config = EngineConfig.from_kwargs(**json.loads(args.config))
    logger = become_child(args.parent_pid, config.telemetry.log_level, f"tp-rank{args.rank}", death_signal=False)
    watch_parent(args.parent_pid)
    store = dist.TCPStore(args.store_host, args.store_port, None, False, timeout=timedelta(seconds=60))
    try:
        serve_rank(args.rank, store, config, Path(args.model_dir), logger, args.gloo_host)
    except Exception as e:
        logger.exception("tensor-parallel rank %d failed", args.rank)
        try:
            store.set(f"error/{args.rank}", f"{type(e).__name__}: {e}")
        except Exception:
            pass  # rank 0 is gone
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
