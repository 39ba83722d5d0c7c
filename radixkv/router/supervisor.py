"""Keeps `radixkv serve --dp N`'s workers running.

A worker that fails while the command serves (killed by a signal, or exiting with an error
code: its scheduler died) is started again, its port, flags and rank unchanged (the router
takes it back once its /health answers), at most `max_restarts` times each. A worker that was
stopped (exit 0 after a SIGTERM's drain, 130 after Ctrl-C) is not. Once no worker is running
and one of them failed, the router has nothing to route to: `on_all_dead` stops the command,
which exits 1, rather than answering 503 until someone notices.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)
MAX_RESTARTS = 3
POLL_SECONDS = 0.5
STOPPED = (0, 130)
"""Exit codes of a worker that was stopped, not one that failed."""


class Supervisor:
    def __init__(self, procs: list[subprocess.Popen], start: Callable[[int], subprocess.Popen],
                 on_all_dead: Callable[[], None], max_restarts: int = MAX_RESTARTS,
                 poll_seconds: float = POLL_SECONDS):
        self.procs, self.start, self.on_all_dead = procs, start, on_all_dead
        self.max_restarts, self.poll_seconds = max_restarts, poll_seconds
        self.restarts = [0] * len(procs)
        self.failed = False  # some worker failed (not stopped)
        self.all_dead = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dp-supervisor", daemon=True)

    def begin(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the command stops the workers itself)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def check(self) -> None:
        """One look at every worker: restart those that exited and may; `on_all_dead` when none is left."""
        for i, proc in enumerate(self.procs):
            code = proc.poll()
            if code is None or code in STOPPED:
                continue
            self.failed = True
            if self.restarts[i] < self.max_restarts:
                self.restarts[i] += 1
                logger.error("worker %d exited (code %s); starting it again (restart %d of %d)", i, code,
                             self.restarts[i], self.max_restarts)
                self.procs[i] = self.start(i)
            elif self.restarts[i] == self.max_restarts:
                self.restarts[i] += 1  # said once
                logger.error("worker %d exited (code %s) after %d restarts; not starting it again", i, code,
                             self.max_restarts)
        if self.failed and all(p.poll() is not None for p in self.procs) and not self.all_dead:
            self.all_dead = True
            logger.error("every worker has exited and none may restart; stopping")
            self.on_all_dead()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds) and not self.all_dead:
            self.check()
