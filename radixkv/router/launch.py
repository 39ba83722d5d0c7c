"""`radixkv router`: validate the flags, then run the router app under uvicorn until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from urllib.parse import urlparse

from radixkv.logs import setup_logging
from radixkv.router.app import create_router_app
from radixkv.router.workers import RouterSettings


def check_worker_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"--worker {url!r}: give a base URL such as http://127.0.0.1:30001")
    return url.rstrip("/")


def serve_router(args: argparse.Namespace) -> int:
    import uvicorn

    try:
        workers = tuple(check_worker_url(u) for u in args.worker)
        if len(set(workers)) != len(workers):
            raise ValueError("--worker: the same URL is given twice")
        if not 0 < args.port < 65536:
            raise ValueError(f"--port {args.port}: must be in 1..65535")
        if args.health_interval <= 0:
            raise ValueError(f"--health-interval {args.health_interval}: must be > 0")
    except ValueError as e:
        print(f"radixkv router: error: {e}", file=sys.stderr)
        return 2
    setup_logging(args.log_level)
    settings = RouterSettings(workers, args.policy, args.api_key, args.health_interval)
    app = create_router_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           access_log=args.log_level == "debug", timeout_graceful_shutdown=5))

    async def run() -> None:
        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.05)
            print(f"radixkv router ready: http://{args.host}:{args.port} over {len(workers)} worker(s), "
                  f"policy {args.policy}", flush=True)
        task = asyncio.create_task(announce())
        await server.serve()
        task.cancel()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    logging.getLogger(__name__).info("router stopped")
    return 0


MAX_DP = 16
WORKER_READY_TIMEOUT = 600


def _worker_argv(argv: list[str], port: int) -> list[str]:
    """The `serve` command line without --dp/--port/--host, for a worker on 127.0.0.1:`port`."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in ("--dp", "--port", "--host"):
            skip = "=" not in a
            continue
        out.append(a)
    return [sys.executable, "-m", "radixkv", *out, "--port", str(port), "--host", "127.0.0.1"]


def serve_data_parallel(args: argparse.Namespace) -> int:
    """`radixkv serve --dp N`: N workers on PORT+1..PORT+N and a cache-aware router on PORT;
    Ctrl-C or SIGTERM stops them all."""
    import os
    import signal
    import subprocess
    import threading
    import time

    if not 1 < args.dp <= MAX_DP:
        print(f"radixkv: error: --dp {args.dp}: must be in 1..{MAX_DP}", file=sys.stderr)
        return 2
    keys = args.api_key or []
    if len(keys) > 1:
        print("radixkv: error: --dp takes one --api-key (the router's clients share it)", file=sys.stderr)
        return 2
    if not (0 < args.port and args.port + args.dp < 65536):
        print(f"radixkv: error: --port {args.port}: PORT..PORT+{args.dp} must be valid ports", file=sys.stderr)
        return 2
    procs: list[subprocess.Popen] = []
    ready = [threading.Event() for _ in range(args.dp)]

    def relay(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("radixkv ready:"):
                ready[i].set()
            else:
                sys.stderr.write(f"[worker {i}] {line}")

    def stop_all() -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)  # while workers load; uvicorn takes over after
    try:
        for i in range(args.dp):
            cmd = _worker_argv(args.argv, args.port + 1 + i)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            procs.append(proc)
            threading.Thread(target=relay, args=(i, proc), daemon=True).start()
        deadline = time.monotonic() + WORKER_READY_TIMEOUT
        for i, proc in enumerate(procs):
            while not ready[i].wait(0.2):
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(f"radixkv: error: worker {i} (port {args.port + 1 + i}) did not start "
                          f"(exit {proc.poll()})", file=sys.stderr)
                    return 1
        router_args = argparse.Namespace(
            worker=[f"http://127.0.0.1:{args.port + 1 + i}" for i in range(args.dp)], policy="cache_aware",
            host=args.host, port=args.port, api_key=keys[0] if keys else None, health_interval=2.0,
            log_level=args.log_level)
        return serve_router(router_args)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_all()
