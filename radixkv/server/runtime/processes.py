"""The processes of the runtime: the scheduler and detokenizer children, and what stops them.

    HTTP process (the parent): FastAPI + uvicorn + TokenizerManager (`radixkv.server.launch`)
    scheduler process:         model runner + scheduler (the Engine's loop, fed by ZMQ)
    detokenizer process:       token ids -> text

Children die with the parent (a kernel signal on Linux, and they poll for it). A signal asks
to stop (`Shutdown`): SIGTERM drains (`drain`), SIGINT does not wait, a second one stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import sys
import time

from radixkv.config import EngineConfig
from radixkv.procs import run_then_exit
from radixkv.server.runtime.sockets import Endpoints

WATCH_SECONDS = 0.5
CHILD_EXIT_SECONDS = 5.0
EXIT_CODES = {signal.SIGTERM: 0, signal.SIGINT: 130}
logger = logging.getLogger(__name__)


def _scheduler_main(config: EngineConfig, endpoints: Endpoints, parent_pid: int) -> None:
    from radixkv.server.runtime.scheduler_process import (
        run_scheduler_process,  # the model code, in that process only
    )

    run_then_exit(run_scheduler_process, config, endpoints, parent_pid)


def _detokenizer_main(model_dir: str, endpoints: Endpoints, parent_pid: int, log_level: str) -> None:
    from radixkv.server.runtime.detokenizer import run_detokenizer_process

    run_then_exit(run_detokenizer_process, model_dir, endpoints, parent_pid, log_level)


def exiting(pid: int | None) -> bool:
    """Whether process `pid` has died but cannot be reaped yet (Linux: state Z, while its
    other threads finish exiting); False where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] in (b"Z", b"X")


class Children:
    """The scheduler and detokenizer processes."""

    def __init__(self, config: EngineConfig, endpoints: Endpoints):
        ctx = multiprocessing.get_context("spawn")  # no inherited threads or torch state
        # a clean stop lets the scheduler write its tiers to storage (bounded) before it is signalled
        self.persist_seconds = (config.storage.kv_storage_persist_timeout + CHILD_EXIT_SECONDS
                                if config.storage.enabled else 0.0)
        me = os.getpid()
        self.procs = {
            "scheduler": ctx.Process(target=_scheduler_main, args=(config, endpoints, me),
                                     name="radixkv-scheduler", daemon=True),
            "detokenizer": ctx.Process(target=_detokenizer_main, args=(config.runtime.model, endpoints, me, config.telemetry.log_level),
                                       name="radixkv-detokenizer", daemon=True),
        }

    def start(self) -> None:
        for proc in self.procs.values():
            proc.start()

    def dead(self) -> str | None:
        """Why the runtime cannot serve, if a child has exited or is exiting (a killed process
        with threads is a zombie for a while before it can be reaped: `exiting`)."""
        for name, proc in self.procs.items():
            if not proc.is_alive() or exiting(proc.pid):
                code = proc.exitcode if proc.exitcode is not None else "not known yet: it is exiting"
                return f"the {name} process exited (code {code}); the server is shutting down"
        return None

    def stop(self) -> None:
        """After the scheduler was asked to stop: give it a moment (and the time to persist its
        tiers to storage, if it has one), then SIGTERM, then SIGKILL."""
        started = [p for p in self.procs.values() if p.pid is not None]
        if self.procs["scheduler"] in started:
            self.procs["scheduler"].join(1.0 + self.persist_seconds)
        for proc in started:
            if proc.is_alive():
                proc.terminate()
        for proc in started:
            proc.join(CHILD_EXIT_SECONDS)
            if proc.is_alive():
                proc.kill()
                proc.join()


class Shutdown:
    """What stops the server: a signal (SIGTERM drains, SIGINT does not wait) or a dead child.
    A second signal stops at once, wherever shutting down has got to (`on_force`)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.requested = asyncio.Event()
        self.forced = False
        self.on_force = lambda: None

    def on_signal(self, sig: int) -> None:
        if self.signal is not None:  # a second signal: stop now
            self.forced = True
            self.on_force()
        self.signal = self.signal or sig
        self.requested.set()

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signal, 0)


async def drain(manager, shutdown: Shutdown, timeout: float, dead=lambda: None) -> None:
    """Refuse new requests, give those in flight `timeout` seconds (none after Ctrl-C, nor once
    a child process has died: `dead()`), then end what is left with an error."""
    manager.start_draining("the server is shutting down")
    wait = timeout if shutdown.signal == signal.SIGTERM else 0.0
    deadline = time.monotonic() + wait
    if manager.in_flight:
        logger.info("shutting down: %d request(s) in flight, waiting up to %.0f s", manager.in_flight, wait)
    while manager.in_flight and time.monotonic() < deadline and not shutdown.forced and not dead():
        await asyncio.sleep(0.05)
    if manager.in_flight:
        logger.warning("shutting down: ending %d request(s) that did not finish", manager.in_flight)
    manager.fail_all("the server is shutting down" + (" (--shutdown-timeout passed)" if wait else ""))


async def wait_ready(manager, children: Children, shutdown: Shutdown) -> dict | int:
    """The scheduler's info once the model is loaded, or the exit code when it never will be
    (a child died while loading, or a signal came first)."""
    from radixkv.server.runtime.tokenizer_manager import ServiceUnavailable

    ready = asyncio.ensure_future(manager.wait_ready())
    while not ready.done():  # a child that dies while loading must not leave us waiting
        await asyncio.wait([ready], timeout=WATCH_SECONDS)
        if shutdown.requested.is_set():
            ready.cancel()
            return shutdown.exit_code
        reason = children.dead()
        if reason and not ready.done():
            await asyncio.sleep(WATCH_SECONDS)  # its last message may still be in flight
            if not ready.done():
                manager.fail_all(reason)
    try:
        return ready.result()
    except ServiceUnavailable as e:
        print(f"radixkv: error: {e}", file=sys.stderr, flush=True)
        return 2
