"""`radixkv router`: validate the flags, then run the router app under uvicorn until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from radixkv.config import RouterConfig
from radixkv.errors import RadixKVError
from radixkv.logs import setup_logging
from radixkv.procs import orphanless
from radixkv.router.app import create_router_app
from radixkv.router.supervisor import Supervisor
from radixkv.router.workers import RouterSettings


def serve_router(config: RouterConfig) -> int:
    """Run the router (flags validated by `RouterConfig`) until Ctrl-C or SIGTERM."""
    import uvicorn

    setup_logging(config.log_level)
    router = None
    if config.pd_disaggregation:
        from radixkv.router.pd import PDRouter

        workers = (*[url for url, _ in config.prefill_servers], *config.decode_servers)
        settings = RouterSettings(workers, config.policy, config.api_key, config.health_interval)
        router = PDRouter(settings, config.prefill_servers, config.decode_servers)
    else:
        workers = config.workers
        settings = RouterSettings(workers, config.policy, config.api_key, config.health_interval)
    app = create_router_app(settings, router)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           access_log=config.log_level == "debug", timeout_graceful_shutdown=5))

    async def run() -> None:
        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.05)
            what = (f"{len(config.prefill_servers)} prefill + {len(config.decode_servers)} decode server(s)"
                    if config.pd_disaggregation else f"{len(workers)} worker(s)")
            print(f"radixkv router ready: http://{config.host}:{config.port} over {what}, "
                  f"policy {config.policy}", flush=True)
        task = asyncio.create_task(announce())
        await server.serve()
        task.cancel()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    logging.getLogger(__name__).info("router stopped")
    return 0


WORKER_READY_TIMEOUT = 600


PER_WORKER_FILES = ("--record-trace",)
"""File flags each worker gets its own copy of (`worker_file`): N workers would clobber one."""


def worker_file(path: str, rank: int) -> str:
    """Worker `rank`'s copy of a file flag's path: `served.jsonl` -> `served.worker0.jsonl`."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.worker{rank}{p.suffix}"))


def _worker_argv(argv: list[str], port: int, kv_events: str | None = None, rank: int = 0) -> list[str]:
    """The `serve` command line without --dp/--port/--host/--router (and --kv-events-config,
    given per worker as `kv_events`), for worker `rank` on 127.0.0.1:`port`; the paths of
    `PER_WORKER_FILES` flags become the worker's own (`worker_file`)."""
    out, skip, own = [], False, False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if own:
            out.append(worker_file(a, rank))
            own = False
            continue
        name, eq, value = a.partition("=")
        if name in ("--dp", "--port", "--host", "--router", "--kv-events-config", "--dp-max-restarts"):
            skip = not eq
            continue
        if name in PER_WORKER_FILES:
            if eq:
                out.append(f"{name}={worker_file(value, rank)}")
            else:
                out.append(a)
                own = True
            continue
        out.append(a)
    events = ["--kv-events-config", kv_events] if kv_events is not None else []
    return orphanless("radixkv", *out, *events, "--port", str(port), "--host", "127.0.0.1")


def worker_kv_events(text: str | None, dp: int) -> list[str | None]:
    """Each worker's `--kv-events-config`: its own ports (rank r: + r, or + 2r when the replay
    port is the endpoint's + 1), so N caches publish on N sockets. Raises ValueError when two
    workers' ports would collide."""
    from radixkv.config import KVEventsConfig

    config = KVEventsConfig.parse(text)
    if text is None or config.publisher == "null":
        return [text] * dp

    def port(address: str | None) -> int | None:
        tail = (address or "").rpartition(":")[2]
        return int(tail) if (address or "").startswith("tcp://") and tail.isdigit() else None

    e, r = port(config.endpoint), port(config.replay_endpoint)
    step = 2 if e is not None and r is not None and abs(e - r) == 1 else 1
    ranks = [config.for_rank(i, step) for i in range(dp)]
    used = [p for c in ranks for p in (port(c.endpoint), port(c.replay_endpoint)) if p is not None]
    if len(used) != len(set(used)):
        raise ValueError(f"--kv-events-config: the {dp} workers' ports would collide ({sorted(used)}); "
                         f"space endpoint and replay_endpoint at least {dp} apart")
    return [c.to_json() for c in ranks]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sglang_router_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang_router") is not None


def sglang_router_argv(workers: list[str], host: str, port: int, api_key: str | None, log_level: str) -> list[str]:
    """SGLang's router (the `sglang-router` package) over `workers`, cache-aware."""
    level = {"debug": "debug", "info": "info", "warning": "warn"}.get(log_level, "error")
    argv = orphanless("sglang_router.launch_router", "--worker-urls", *workers, "--host", host,
                      "--port", str(port), "--policy", "cache_aware", "--log-level", level,
                      # its Prometheus exporter listens on 29000 by default: one free port each
                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()))
    return argv + (["--api-key", api_key] if api_key else [])


def wait_until_serving(url: str, proc, timeout: float, headers: dict[str, str]) -> bool:
    """Whether `url`/health answers 200 before `proc` exits or `timeout` seconds pass."""
    import time

    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", headers=headers, timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return False


def serve_data_parallel(args: argparse.Namespace) -> int:
    """`radixkv serve --dp N`: N workers on PORT+1..PORT+N and a cache-aware router on PORT
    (ours, or SGLang's with `--router sglang`); Ctrl-C or SIGTERM stops them all."""
    import os
    import signal
    import subprocess
    import threading
    import time

    keys = args.api_key or []  # (ServerConfig checked --dp, its one --api-key and its ports)
    try:
        kv_events = worker_kv_events(args.kv_events_config, args.dp)
    except (ValueError, RadixKVError) as e:
        print(f"radixkv: error: {e}", file=sys.stderr)
        return 2
    procs: list[subprocess.Popen] = []
    ready = [threading.Event() for _ in range(args.dp)]
    supervisor: Supervisor | None = None
    router: subprocess.Popen | None = None

    def relay(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("radixkv ready:"):
                ready[i].set()
            else:
                sys.stderr.write(f"[worker {i}] {line}")

    def start_worker(i: int) -> subprocess.Popen:
        cmd = _worker_argv(args.argv, args.port + 1 + i, kv_events[i], rank=i)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=relay, args=(i, proc), daemon=True).start()
        return proc

    def all_dead() -> None:  # the router stops as on SIGTERM; the command exits 1
        if router is not None:
            router.terminate()
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    def stop_all() -> None:
        if supervisor is not None:
            supervisor.stop()
        everyone = ([router] if router is not None else []) + procs  # the router first
        for p in everyone:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in everyone:
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
            procs.append(start_worker(i))
        deadline = time.monotonic() + WORKER_READY_TIMEOUT
        for i, proc in enumerate(procs):
            while not ready[i].wait(0.2):
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(f"radixkv: error: worker {i} (port {args.port + 1 + i}) did not start "
                          f"(exit {proc.poll()})", file=sys.stderr)
                    return 1
        workers = [f"http://127.0.0.1:{args.port + 1 + i}" for i in range(args.dp)]
        key = keys[0] if keys else None
        supervisor = Supervisor(procs, start_worker, all_dead, max_restarts=args.dp_max_restarts)
        if args.router == "sglang" and not sglang_router_installed():
            logging.getLogger(__name__).warning(
                "--router sglang: sglang-router is not installed (pip install 'radixkv[router]'); "
                "using the embedded router")
        elif args.router == "sglang":
            router = subprocess.Popen(sglang_router_argv(workers, args.host, args.port, key, args.log_level),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            threading.Thread(target=lambda: [sys.stderr.write(f"[sglang-router] {line}") for line in router.stdout],
                             daemon=True).start()
            url = f"http://{args.host}:{args.port}"
            if not wait_until_serving(url, router, WORKER_READY_TIMEOUT,
                                      {"Authorization": f"Bearer {key}"} if key else {}):
                print(f"radixkv: error: sglang-router did not start on port {args.port} (exit {router.poll()})",
                      file=sys.stderr)
                return 1
            print(f"radixkv ready: {url} (sglang-router, cache_aware, over {args.dp} workers)", flush=True)
            supervisor.begin()
            code = router.wait()
            return 1 if supervisor.all_dead else code
        supervisor.begin()
        code = serve_router(RouterConfig(worker=tuple(workers), host=args.host, port=args.port, api_key=key,
                                         log_level=args.log_level))
        return 1 if supervisor.all_dead else code
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_all()
