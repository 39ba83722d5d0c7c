"""SchedulerLoop: the one loop that drives an `EngineCore`.

Whoever uses the runtime -- the in-process `Engine`, or the server's scheduler process -- talks
to the engine core through one loop body, run by one thread at a time:

    apply every command in the inbox: add a request, abort one, or call a function on the
        engine core (flush the cache, read stats)
    if there is work: step once and hand every output to `deliver`
    publish the iteration's KV cache events, if the engine core publishes them

The scheduler process runs it forever (`run`), blocking on its ZMQ socket while idle. The
Engine runs it one iteration at a time (`run_once`) on whichever calling thread is waiting for
an output and finds nobody else driving, so a single-threaded user drives it from its own
(main) thread. The delivery routes each output to the caller waiting for that request (a
per-request queue, or the detokenizer's socket). A request the scheduler refuses comes back as
an error output, not an exception, since its caller may be another thread or process.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from radixkv.errors import ErrorKind, RadixKVError, kind_of_error
from radixkv.outputs import ReqOutput
from radixkv.core.engine_core import EngineCore
from radixkv.sched.request import Req

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AddRequest:
    req: Req


@dataclass(frozen=True, slots=True)
class AbortRequest:
    rid: str


@dataclass(frozen=True, slots=True)
class CallCore:
    """Run `fn(core)` on the loop's thread; its result (or exception) lands in `future`."""

    fn: Callable[[EngineCore], Any]
    future: Future = field(default_factory=Future)


@dataclass(frozen=True, slots=True)
class Stop:
    """End the loop (after aborting whatever is in flight)."""


Command = AddRequest | AbortRequest | CallCore | Stop


class Inbox(Protocol):
    def receive(self, block: bool) -> list[Command]:
        """Commands that arrived; with `block`, wait until there is at least one."""


class QueueInbox:
    """A thread-safe inbox for callers in the same process."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Command] = queue.SimpleQueue()

    def put(self, command: Command) -> None:
        self._queue.put(command)

    def receive(self, block: bool) -> list[Command]:
        commands = []
        try:
            if block:
                commands.append(self._queue.get())
            while True:
                commands.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return commands


class SchedulerLoop:
    """Applies commands to `core`, steps it while it has work, delivers every output."""

    def __init__(self, core: EngineCore, deliver: Callable[[list[ReqOutput]], None]):
        self.core = core
        self.deliver = deliver

    def run(self, inbox: Inbox) -> None:
        """Serve until a `Stop` command; in-flight requests are then aborted (and delivered)."""
        while self.run_once(inbox, block=True) is not None:
            pass

    def apply_pending(self, inbox: Inbox) -> None:
        """Apply the commands waiting in the inbox, without stepping."""
        for command in inbox.receive(block=False):
            if isinstance(command, Stop):
                raise RuntimeError("Stop must go through run_once")
            self.apply(command)
        self.core.publish_kv_events()

    def run_once(self, inbox: Inbox, block: bool = False) -> bool | None:
        """One iteration: apply the inbox's commands (waiting for one if `block` and idle), then
        step if there is work. Whether anything happened; None after a `Stop`."""
        commands = inbox.receive(block=block and not self.core.has_work)
        for command in commands:
            if isinstance(command, Stop):
                self.abort_all("the runtime is shutting down")
                self.core.publish_kv_events()
                return None
            self.apply(command)
        stepped = self.core.has_work
        if stepped:
            self.deliver(self.core.step())
        self.core.publish_kv_events()  # what the commands and the step changed, one batch
        return stepped or bool(commands)

    def apply(self, command: Command) -> None:
        core = self.core
        if isinstance(command, AddRequest):
            try:
                core.add_request(command.req)
            except RadixKVError as e:
                self.deliver([ReqOutput.failed(command.req.rid, str(e), kind_of_error(e))])
        elif isinstance(command, AbortRequest):
            out = core.abort(command.rid)
            if out is not None:
                self.deliver([out])
        elif isinstance(command, CallCore):
            if command.future.set_running_or_notify_cancel():
                try:
                    command.future.set_result(command.fn(core))
                except Exception as e:  # the caller gets the exception, the loop goes on
                    command.future.set_exception(e)
        else:
            raise TypeError(f"unknown loop command {command!r}")

    def abort_all(self, message: str) -> None:
        """End every request in flight with an error output (unavailable: try again elsewhere)."""
        outputs = [self.core.abort(rid, message, ErrorKind.UNAVAILABLE) for rid in list(self.core.scheduler.reqs)]
        if outputs:
            self.deliver([o for o in outputs if o is not None])
