"""`radixkv router`: validate the flags, then run the router app under uvicorn until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from urllib.parse import urlparse

from radixkv.logs import setup_logging
from radixkv.router.app import RouterSettings, create_router_app


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
