"""GrammarService: grammars compiled off the scheduler's loop, in a process of their own, under a
time and a memory budget, cached by source.

The scheduler submits a request's grammar and goes on stepping the others; the request waits
(apart from the queue) until `poll` hands back its grammar compiled, or refused. A compile that
runs past the time budget is killed, one that needs more memory than the budget fails in the
compiler process; either way the request gets an error naming its field and the compiler
process is replaced. Results, refusals included, are cached by source: a grammar sent again is
answered at once, and a hostile one costs its budget once.

Used from one thread at a time (the scheduler loop's).
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixkv.constrained.matcher import RequestGrammar
from radixkv.constrained.frames import split_frames, write_frame
from radixkv.errors import ErrorKind
from radixkv.grammar_spec import GrammarSpec

logger = logging.getLogger(__name__)
CACHE_SIZE = 256  # grammars (compiled or refused) kept per model
START_TIMEOUT_S = 120.0  # loading the tokenizer in the compiler process
TRANSFER_TIMEOUT_S = 60.0  # a compiled grammar whose first bytes came in time must arrive within this
MAX_START_FAILURES = 3


@dataclass(frozen=True, slots=True)
class GrammarBudget:
    """What one compile may take: `seconds` of wall time, `memory_bytes` beyond the compiler
    process's own (0: no limit)."""

    seconds: float
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class Compiled:
    grammar: Any  # xgrammar.CompiledGrammar
    jump_forward_safe: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a grammar cannot be served: `message` names the field; `kind` is whose fault."""

    message: str
    kind: ErrorKind = ErrorKind.INVALID_REQUEST


class GrammarService:
    """Compiles grammars for one model's vocabulary (see the module docstring)."""

    def __init__(self, model_dir: str | Path, hf_tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int],
                 budget: GrammarBudget):
        self.model_dir, self.hf, self.vocab_size = str(model_dir), hf_tokenizer, vocab_size
        self.stop_ids = sorted(stop_token_ids)
        self.budget = budget
        self._results: OrderedDict[GrammarSpec, Compiled | Refused] = OrderedDict()
        self._queue: deque[GrammarSpec] = deque()
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self._started_at = 0.0
        self._buffer = bytearray()
        self._job = 0
        self._inflight: tuple[int, GrammarSpec, float] | None = None  # (job, spec, deadline)
        self._info = None  # xgrammar TokenizerInfo, to deserialize with
        self._failed: list[tuple[GrammarSpec, Refused]] = []  # refusals to hand out at the next poll
        self._receiving_since: float | None = None  # when the in-flight job's result began to arrive
        self._start_failures = 0
        self.hits = self.misses = self.refusals = 0

    # -- what the scheduler calls --------------------------------------------------------------
    def result(self, spec: GrammarSpec) -> Compiled | Refused | None:
        """`spec`'s compiled grammar or refusal, if known (a cache hit), else None."""
        found = self._results.get(spec)
        if found is not None:
            self._results.move_to_end(spec)
            self.hits += 1
        return found

    def submit(self, spec: GrammarSpec) -> None:
        """Compile `spec` (once, however many requests wait for it)."""
        if spec in self._results or spec in self._queue or (self._inflight and self._inflight[1] == spec):
            return
        self._queue.append(spec)
        self._advance()

    @property
    def pending(self) -> bool:
        return bool(self._queue or self._inflight)

    def poll(self, timeout: float = 0.0) -> list[tuple[GrammarSpec, Compiled | Refused]]:
        """The grammars whose result became known, waiting up to `timeout` seconds for one."""
        done = self._read(timeout) if self._proc is not None else []
        if self._proc is not None:
            now = time.monotonic()
            receiving = self._receiving_since
            if self._inflight is not None and receiving is None and now > self._inflight[2]:
                done += self._lost(f"compiling it took longer than the budget of {self.budget.seconds:g} s "
                                   f"(grammar_compile_timeout)")
            elif self._inflight is not None and receiving is not None and now > receiving + TRANSFER_TIMEOUT_S:
                done += self._lost("the grammar compiler stopped sending the compiled grammar")
            elif not self._ready and now - self._started_at > START_TIMEOUT_S:
                done += self._fail_start(f"the grammar compiler did not start within {START_TIMEOUT_S:.0f} s")
        self._advance()
        done, self._failed = done + self._failed, []  # with what failed to start since the last poll
        return done

    def _read(self, timeout: float) -> list[tuple[GrammarSpec, Compiled | Refused]]:
        """Frames the process has sent, reading until its pipe is empty (a large compiled grammar
        spans many reads; once its first bytes are in, the compile's clock stops)."""
        fd = self._proc.stdout.fileno()
        readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
        while readable:
            data = os.read(fd, 1 << 20)
            if not data:  # it exited: what it sent first still counts
                done = self._take_frames()
                if self._proc is None:  # those frames settled it (a compile over the memory budget)
                    return done
                return done + self._lost("the grammar compiler process died while compiling it (a server "
                                         "error; the request may be retried)", ErrorKind.INTERNAL)
            self._buffer += data
            readable, _, _ = select.select([fd], [], [], 0)
        done = self._take_frames()
        if self._inflight is not None and self._buffer and self._receiving_since is None:
            self._receiving_since = time.monotonic()  # its result is on its way: the compile is done
        return done

    def matcher(self, compiled: Compiled) -> RequestGrammar:
        import xgrammar as xgr

        return RequestGrammar(xgr.GrammarMatcher(compiled.grammar), self.hf, compiled.jump_forward_safe)

    def close(self) -> None:
        if self._proc is not None:
            self._stop_process()

    # -- the compiler process ------------------------------------------------------------------
    def _advance(self) -> None:
        """Start the process if work waits, and hand it the next job when it is free. A process
        that cannot be started or written to is not the grammar's fault: its jobs wait for a
        fresh one (and fail, not cached, when none will start)."""
        if not self._queue:
            return
        if self._proc is None:
            self._start()
            return
        if self._ready and self._inflight is None:
            spec = self._queue.popleft()
            self._job += 1
            self._inflight = (self._job, spec, time.monotonic() + self.budget.seconds)
            try:
                write_frame(self._proc.stdin, [self._job, spec.kind, spec.source])
            except OSError as e:  # it died while idle
                logger.warning("the grammar compiler went away (%s); starting another", e)
                self._queue.appendleft(spec)
                self._stop_process()
                self._start()

    def _start(self) -> None:
        if self._start_failures >= MAX_START_FAILURES:
            self._start_failures = 0
            self._failed += self._fail_start("the grammar compiler could not be started "
                                             f"{MAX_START_FAILURES} times in a row")
            return
        cmd = [sys.executable, "-m", "radixkv.constrained.worker", "--model-dir", self.model_dir,
               "--vocab-size", str(self.vocab_size), "--stop-ids", ",".join(map(str, self.stop_ids)),
               "--memory-bytes", str(self.budget.memory_bytes), "--parent-pid", str(os.getpid())]
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as e:
            self._failed += self._fail_start(f"the grammar compiler could not start: {e}")
            return
        self._ready, self._buffer, self._started_at = False, bytearray(), time.monotonic()
        self._start_failures += 1  # until it says it is ready

    def _take_frames(self) -> list[tuple[GrammarSpec, Compiled | Refused]]:
        done = []
        for job, status, *rest in split_frames(self._buffer):
            if status == "ready":
                self._ready, self._start_failures = True, 0
                continue
            if self._inflight is None or self._inflight[0] != job:
                continue
            spec = self._inflight[1]
            self._inflight, self._receiving_since = None, None
            if status == "ok":
                self.misses += 1
                done.append(self._record(spec, Compiled(self._deserialize(rest[0]), bool(rest[1]))))
            else:
                done.append(self._record(spec, Refused(f"sampling_params.{spec.kind}: {rest[0]}")))
                if status == "memory":  # its heap may be broken: the next job gets a fresh process
                    self._stop_process()
        return done

    def _lost(self, why: str,
              kind: ErrorKind = ErrorKind.INVALID_REQUEST) -> list[tuple[GrammarSpec, Compiled | Refused]]:
        """The process died or overran: the job it had is refused, the process replaced. Only
        a measured overrun of the budget is the grammar's fault (cached: it costs its budget
        once); a process that died is the server's (`ErrorKind.INTERNAL`, not cached: the same
        grammar sent again is compiled again)."""
        if not self._ready:
            return self._fail_start(f"the grammar compiler could not start (exit code {self._proc.poll()})")
        done = []
        if self._inflight is not None:
            spec = self._inflight[1]
            refused = Refused(f"sampling_params.{spec.kind}: {why}", kind)
            if kind == ErrorKind.INVALID_REQUEST:
                logger.warning("grammar refused: %s", why)
                done.append(self._record(spec, refused))
            else:
                logger.error("grammar compile failed: %s (exit code %s)", why, self._proc.poll())
                done.append((spec, refused))
        self._stop_process()
        return done

    def _fail_start(self, why: str) -> list[tuple[GrammarSpec, Compiled | Refused]]:
        """Nothing waiting can be compiled now: not the grammars' fault, so not cached (the next
        request tries again)."""
        logger.error(why)
        failed = [(spec, Refused(why, ErrorKind.INTERNAL)) for spec in self._queue]
        self._queue.clear()
        self._stop_process()
        return failed

    def _stop_process(self) -> None:
        proc, self._proc, self._ready, self._inflight, self._buffer = self._proc, None, False, None, bytearray()
        self._receiving_since = None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _record(self, spec: GrammarSpec, result: Compiled | Refused) -> tuple[GrammarSpec, Compiled | Refused]:
        if isinstance(result, Refused):
            self.refusals += 1
        self._results[spec] = result
        while len(self._results) > CACHE_SIZE:
            self._results.popitem(last=False)
        return spec, result

    def _deserialize(self, text: str):
        import xgrammar as xgr

        if self._info is None:
            self._info = xgr.TokenizerInfo.from_huggingface(self.hf, vocab_size=self.vocab_size,
                                                            stop_token_ids=self.stop_ids or None)
        return xgr.CompiledGrammar.deserialize_json(text, self._info)
