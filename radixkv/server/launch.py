"""`radixkv serve`: start the processes, wait for the model, serve HTTP, shut down cleanly.

    HTTP process (this one): FastAPI + uvicorn + TokenizerManager
    scheduler process:       model runner + scheduler (the Engine's loop, fed by ZMQ)
    detokenizer process:     token ids -> text

Children die with this process (a kernel signal on Linux, and they poll for it). Shutting down:

- SIGTERM drains: new requests get 503 (and /health, so a router takes the server out), those
  in flight get `--shutdown-timeout` seconds to finish; any left then end with an error (a
  stream with an error event and `[DONE]`), then the children stop, the socket directory goes,
  and the process exits 0.
- Ctrl-C (SIGINT) does the same without waiting, and exits 130; a second one stops at once.
- A child that dies makes every request in flight and every new one answer 503, and the server
  exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from pathlib import Path

from radixkv.config import EngineConfig, ServerConfig
from radixkv.errors import ConfigError
from radixkv.server.runtime.processes import (
    EXIT_CODES,
    WATCH_SECONDS,
    Children,
    Shutdown,
    drain,
    wait_ready,
)
from radixkv.server.runtime.sockets import Endpoints

logger = logging.getLogger(__name__)
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def check_port_free(host: str, port: int) -> None:
    """Fail before loading anything if the address is taken (the message names the flag)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None


def exposure_warning(host: str, api_keys: tuple[str, ...] | str | None) -> str | None:
    """What to warn about when `host` lets other machines in and nothing asks for a key."""
    if api_keys:
        return None
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    return (f"--host {host} without --api-key: anyone who can reach this machine's port can use the model "
            f"and read /server_info; pass --api-key KEY (clients send 'Authorization: Bearer KEY')")


class QuietServer:
    """uvicorn's server without its own signal handling: `_serve` installs the handlers that
    drain, and decides when uvicorn stops (`should_exit`)."""

    def __new__(cls, config):
        import uvicorn

        class _Server(uvicorn.Server):
            def capture_signals(self):
                return contextlib.nullcontext()

        return _Server(config)


async def watch(server, manager, children: Children, shutdown: Shutdown, settings, ready_line: str) -> int | None:
    """Print the ready line once uvicorn listens; then, until a signal or a dead child, keep
    serving; then drain and stop uvicorn. The exit code a dead child sets, else None."""
    while not server.started:
        await asyncio.sleep(0.05)
    print(ready_line, flush=True)
    exit_code = None
    while not shutdown.requested.is_set():
        reason = children.dead()
        if reason:
            logger.error(reason)
            manager.fail_all(reason)
            exit_code = 1
            break
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(shutdown.requested.wait(), WATCH_SECONDS)
    if exit_code is None:
        await drain(manager, shutdown, settings.shutdown_timeout, children.dead)
    server.should_exit = True
    return exit_code


async def _serve(config: EngineConfig, host: str, port: int, settings) -> int:
    shutdown = Shutdown()
    loop = asyncio.get_running_loop()
    for sig in EXIT_CODES:
        loop.add_signal_handler(sig, shutdown.on_signal, sig)
    endpoints = Endpoints.create()
    children = Children(config, endpoints)
    manager = None
    try:
        from radixkv.server.http.metrics import ServerMetrics
        from radixkv.server.runtime.tokenizer_manager import TokenizerManager

        # The tokenizer manager's socket is bound before the children start (a scheduler that
        # fails at once must find it), then the children: their imports and the model load
        # overlap this process's own (the HTTP stack, the tokenizer).
        metrics = ServerMetrics()
        manager = TokenizerManager(None, endpoints, on_finished=metrics.observe_finished,
                                   max_queued=settings.max_queued_requests)
        children.start()
        import uvicorn

        from radixkv.server.api import APIS
        from radixkv.server.http.app import create_app
        from radixkv.tokenizer import Tokenizer

        manager.tokenizer = Tokenizer(config.runtime.model)
        manager.start()
        info = await wait_ready(manager, children, shutdown)
        if isinstance(info, int):
            return info
        app = create_app(manager, settings, metrics, APIS)
        app.state.child_pids = {name: proc.pid for name, proc in children.procs.items()}
        app.state.child_died = children.dead
        app.state.ipc_directory = endpoints.directory
        server = QuietServer(uvicorn.Config(app, host=host, port=port, log_level=config.telemetry.log_level,
                                            access_log=config.telemetry.log_level == "debug", lifespan="off",
                                            timeout_graceful_shutdown=5))
        shutdown.on_force = lambda: setattr(server, "force_exit", True)  # uvicorn's own "stop now"
        shown = f"[{host}]" if ":" in host else host
        ready_line = (f"radixkv ready: http://{shown}:{port} serving {settings.model_name} "
                      f"({info['max_total_tokens']} KV tokens; OpenAI API at http://{shown}:{port}/v1)")
        watcher = asyncio.create_task(watch(server, manager, children, shutdown, settings, ready_line))
        await server.serve()
        if not server.started:
            watcher.cancel()
            return 2
        exit_code = await watcher if watcher.done() else None
        watcher.cancel()
        return exit_code if exit_code is not None else shutdown.exit_code
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
            for sig in EXIT_CODES:
                loop.remove_signal_handler(sig)


def serve(config: EngineConfig, server: ServerConfig) -> int:
    """Run the server until SIGTERM (drains) or SIGINT; returns the process exit code. Both
    configs validated themselves (each check names the flag at fault); the address is checked
    free here, before anything loads."""
    from radixkv.logs import setup_logging
    from radixkv.model.model_dir import resolve_model_dir
    from radixkv.procs import exit_now, quiet_compute_threads
    from radixkv.server.http.common import DEFAULT_MAX_BODY_BYTES, ServerSettings

    setup_logging(config.telemetry.log_level)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # until the server's own handlers drain instead
    check_port_free(server.host, server.port)
    warning = exposure_warning(server.host, server.api_keys)
    if warning:
        logger.warning(warning)
    model_dir = resolve_model_dir(config.runtime.model, config.runtime.cache_dir)  # converts a GGUF once, with progress
    name = server.served_model_name or (DEFAULT_MODEL_NAME if config.runtime.model is None else Path(config.runtime.model).stem)
    config = config.with_options(model=str(model_dir))
    settings = ServerSettings(name, server.api_keys, server.admin_key, server.cache_sharing,
                              server.max_body_bytes or DEFAULT_MAX_BODY_BYTES, server.shutdown_timeout,
                              server.responses_store_size, server.responses_store_ttl,
                              server.responses_store_bytes, server.max_queued_requests, server.reasoning_parser,
                              server.tool_call_parser)
    quiet_compute_threads()  # the HTTP process only tokenizes and routes; children set their own
    if "torch" in sys.modules:  # (the tokenizer may bring it in later; quiet_compute_threads covers that)
        sys.modules["torch"].set_num_threads(1)
    code = asyncio.run(_serve(config, server.host, server.port, settings))
    exit_now(code)  # every child is stopped and the socket directory gone: skip the slow teardown
    return code  # (not reached)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)
