"""`radixkv serve`: start the processes, wait for the model, serve HTTP, shut down cleanly.

    HTTP process (this one): FastAPI + uvicorn + TokenizerManager
    scheduler process:       model runner + scheduler (the Engine's loop, fed by ZMQ)
    detokenizer process:     token ids -> text

Children die with this process (a kernel signal on Linux, and they poll for it); SIGINT or
SIGTERM stops the HTTP server, then the children, then removes the socket directory. A child
that dies makes every request in flight and every new one answer 503, and the server exit
non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path

from radixkv.config import EngineConfig
from radixkv.errors import ConfigError
from radixkv.server.sockets import Endpoints

logger = logging.getLogger(__name__)
WATCH_SECONDS = 0.5
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
CHILD_EXIT_SECONDS = 5.0


def check_port_free(host: str, port: int) -> None:
    """Fail before loading anything if the address is taken (the message names the flag)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None


class Children:
    """The scheduler and detokenizer processes."""

    def __init__(self, config: EngineConfig, endpoints: Endpoints):
        from radixkv.server.detokenizer import run_detokenizer_process
        from radixkv.server.scheduler_process import run_scheduler_process

        ctx = multiprocessing.get_context("spawn")  # no inherited threads or torch state
        me = os.getpid()
        self.procs = {
            "scheduler": ctx.Process(target=run_scheduler_process, args=(config, endpoints, me),
                                     name="radixkv-scheduler", daemon=True),
            "detokenizer": ctx.Process(target=run_detokenizer_process,
                                       args=(config.model, endpoints, me, config.log_level),
                                       name="radixkv-detokenizer", daemon=True),
        }

    def start(self) -> None:
        for proc in self.procs.values():
            proc.start()

    def dead(self) -> str | None:
        """Why the runtime cannot serve, if a child has exited."""
        for name, proc in self.procs.items():
            if not proc.is_alive():
                return f"the {name} process exited (code {proc.exitcode}); the server is shutting down"
        return None

    def stop(self) -> None:
        """After the scheduler was asked to stop: give it a moment, then SIGTERM, then SIGKILL."""
        started = [p for p in self.procs.values() if p.pid is not None]
        if self.procs["scheduler"] in started:
            self.procs["scheduler"].join(1.0)
        for proc in started:
            if proc.is_alive():
                proc.terminate()
        for proc in started:
            proc.join(CHILD_EXIT_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()


async def _serve(config: EngineConfig, host: str, port: int, settings) -> int:
    import uvicorn

    from radixkv.server.http_app import create_app
    from radixkv.server.metrics import ServerMetrics
    from radixkv.server.tokenizer_manager import ServiceUnavailable, TokenizerManager
    from radixkv.tokenizer import Tokenizer

    endpoints = Endpoints.create()
    children = Children(config, endpoints)
    manager = None
    try:
        metrics = ServerMetrics()
        manager = TokenizerManager(Tokenizer(config.model), endpoints, on_finished=metrics.observe_finished)
        manager.start()
        children.start()
        ready = asyncio.ensure_future(manager.wait_ready())
        while not ready.done():  # a child that dies while loading must not leave us waiting
            await asyncio.wait([ready], timeout=WATCH_SECONDS)
            reason = children.dead()
            if reason and not ready.done():
                await asyncio.sleep(WATCH_SECONDS)  # its last message may still be in flight
                if not ready.done():
                    manager.fail_all(reason)
        try:
            info = ready.result()
        except ServiceUnavailable as e:
            print(f"radixkv: error: {e}", file=sys.stderr, flush=True)
            return 2
        app = create_app(manager, settings, metrics)
        app.state.child_pids = {name: proc.pid for name, proc in children.procs.items()}
        app.state.ipc_directory = endpoints.directory
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=config.log_level,
                                               access_log=config.log_level == "debug", lifespan="off",
                                               timeout_graceful_shutdown=5))
        exit_code = 0

        async def watch() -> None:
            nonlocal exit_code
            while not server.started:
                await asyncio.sleep(0.05)
            shown = f"[{host}]" if ":" in host else host
            print(f"radixkv ready: http://{shown}:{port} serving {settings.model_name} "
                  f"({info['max_total_tokens']} KV tokens; OpenAI API at http://{shown}:{port}/v1)", flush=True)
            while not server.should_exit:
                reason = children.dead()
                if reason:
                    logger.error(reason)
                    manager.fail_all(reason)
                    exit_code = 1
                    server.should_exit = True
                await asyncio.sleep(WATCH_SECONDS)

        watcher = asyncio.create_task(watch())
        await server.serve()
        watcher.cancel()
        if not server.started:
            return 2
        return exit_code
    finally:
        try:
            if manager is not None:
                manager.shutdown_scheduler()
                manager.fail_all("the server is shutting down")
            children.stop()
            if manager is not None:
                manager.close()
        finally:
            endpoints.remove()


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What to warn about when `host` lets other machines in and nothing asks for a key."""
    import ipaddress

    if api_key:
        return None
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    return (f"--host {host} without --api-key: anyone who can reach this machine's port can use the model "
            f"and read /server_info; pass --api-key KEY (clients send 'Authorization: Bearer KEY')")


def serve(config: EngineConfig, host: str = "127.0.0.1", port: int = 30000, api_key: str | None = None,
          served_model_name: str | None = None, max_body_bytes: int | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; returns the process exit code."""
    from radixkv.logs import setup_logging
    from radixkv.model.loader import resolve_model_dir
    from radixkv.server.http_app import DEFAULT_MAX_BODY_BYTES, ServerSettings
    from radixkv.procs import quiet_compute_threads

    setup_logging(config.log_level)
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port}: must be in 1..65535")
    if max_body_bytes is not None and max_body_bytes < 1024:
        raise ConfigError(f"--max-body-bytes {max_body_bytes}: must be at least 1024")
    check_port_free(host, port)
    warning = exposure_warning(host, api_key)
    if warning:
        logger.warning(warning)
    model_dir = resolve_model_dir(config.model, config.cache_dir)  # converts a GGUF once, with progress
    name = served_model_name or (DEFAULT_MODEL_NAME if config.model is None else Path(config.model).stem)
    config = replace(config, model=str(model_dir))
    settings = ServerSettings(name, api_key, max_body_bytes or DEFAULT_MAX_BODY_BYTES)
    quiet_compute_threads()  # the HTTP process only tokenizes and routes; children set their own
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    # SIGTERM unwinds like Ctrl-C (uvicorn re-raises it after its graceful shutdown), so the
    # children are stopped and the socket directory removed whenever it arrives
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return asyncio.run(_serve(config, host, port, settings))
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)
