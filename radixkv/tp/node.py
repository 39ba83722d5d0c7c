"""A node > 0 of a tensor-parallel group across machines: `radixkv serve --tp N --nnodes M
--node-rank R --dist-init-addr HOST:PORT` on machine R (SGLang's flags).

It serves no HTTP and runs no scheduler. It joins node 0's rendezvous (the TCPStore rank 0
hosts at `--dist-init-addr`, waited for as long as a start may take), takes the configuration
node 0 serves with (so every rank runs the same model the same way), checks that its own copy
of the checkpoint is the same one (`model_fingerprint`), and starts its ranks `R*k .. R*k+k-1`
(`radixkv.tp.worker`, k = N / M), which join the process groups with the rest.

While they run it beats (`beat/R`), so node 0 notices a node that vanished. It ends:
- with its ranks, when node 0 stops them (`TPStop`: exit 0);
- when a rank fails or node 0 is gone (a rank's collective fails, or the store stops
  answering): it says so in the store if it can (`node-down/R`), stops its other ranks, exit 1;
- on SIGTERM or Ctrl-C: it reports itself down, stops its ranks, exit 0; node 0 then fails the
  requests in flight and exits, as it does when a local rank dies.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
from datetime import timedelta

import torch.distributed as dist

from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.tp.ranks import START_TIMEOUT_S, _kill, split_addr, worker_command

logger = logging.getLogger("radixkv.tp.node")
BEAT_S = 1.0


def _down(store: dist.TCPStore, node: int, why: str) -> None:
    try:
        store.set(f"node-down/{node}", why)
    except Exception:
        pass  # node 0 is gone already


def _join(config: EngineConfig) -> tuple[dist.TCPStore, str]:
    """Connect to node 0's store; node 0's configuration (checked against ours) as JSON."""
    from radixkv.mem.storage_identity import model_fingerprint
    from radixkv.model.model_dir import resolve_model_dir

    rt = config.runtime
    host, port = split_addr(rt.dist_init_addr)
    model_dir = resolve_model_dir(rt.model, rt.cache_dir)
    logger.info("node %d of %d: joining node 0 at %s", rt.node_rank, rt.nnodes, rt.dist_init_addr)
    try:
        store = dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=START_TIMEOUT_S))
        spec = store.get("config").decode()
        model = store.get("model").decode()
    except Exception as e:
        raise ConfigError(f"dist_init_addr={rt.dist_init_addr!r}: node 0 did not answer there ({e})") from None
    theirs = EngineConfig.from_kwargs(**json.loads(spec)).runtime
    if (theirs.tp_size, theirs.nnodes) != (rt.tp_size, rt.nnodes):
        why = f"node 0 runs --tp {theirs.tp_size} --nnodes {theirs.nnodes}, this node --tp {rt.tp_size} --nnodes {rt.nnodes}"
        _down(store, rt.node_rank, why)
        raise ConfigError(f"tp_size: {why}")
    if json.dumps(model_fingerprint(model_dir), sort_keys=True) != model:
        why = f"this node's checkpoint ({model_dir}) is not the one node 0 serves"
        _down(store, rt.node_rank, why)
        raise ConfigError(f"model: {why}")
    return store, json.dumps({**json.loads(spec), "model": str(model_dir)})


def serve_node(config: EngineConfig) -> int:
    """Run this node's ranks until they end (see the module docstring); the exit code."""
    from radixkv.logs import setup_logging
    from radixkv.parallel.group import gloo_host

    setup_logging(config.telemetry.log_level)
    rt = config.runtime
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    store, spec = _join(config)
    k, node = rt.ranks_per_node, rt.node_rank
    ranks = list(range(node * k, (node + 1) * k))
    host, port = split_addr(rt.dist_init_addr)
    model_dir = json.loads(spec)["model"]
    procs = [subprocess.Popen(worker_command(r, host, port, model_dir, spec, gloo_host(rt.dist_init_addr)))
             for r in ranks]
    announced, beat = False, 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                logger.info("node %d: its ranks were stopped by node 0", node)
                return 0
            failed = [(r, c) for r, c in zip(ranks, codes) if c not in (None, 0)]
            if failed:
                why = ", ".join(f"rank {r} exited with code {c}" for r, c in failed)
                _down(store, node, why)
                logger.error("node %d: %s; stopping its other ranks", node, why)
                return 1
            if stop.is_set():
                _down(store, node, f"node {node} was stopped")
                logger.info("node %d: stopped; its ranks go too", node)
                return 0
            try:
                store.set(f"beat/{node}", str(beat))
                beat += 1
                if not announced and all(store.check([f"ready/{r}"]) for r in ranks):
                    print(f"radixkv node {node} ready: ranks {ranks[0]}..{ranks[-1]} of {rt.tp_size} joined "
                          f"{rt.dist_init_addr}", flush=True)
                    announced = True
            except Exception as e:
                logger.error("node %d: node 0 at %s is gone (%s); stopping its ranks", node, rt.dist_init_addr, e)
                return 1
            stop.wait(BEAT_S)
    finally:
        _kill(procs)  # (those still running; each is reaped)
