"""What every child process of the server does first: die with its parent, stay off the cores.

The tokenizer manager (HTTP process), the scheduler and the detokenizer share the machine's
cores with the model's compute threads, so only the scheduler process computes: the others
start no thread pools and block on their sockets.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading

from radixkv.logs import setup_logging

_PR_SET_PDEATHSIG = 1
PARENT_POLL_MS = 1000  # how often a blocked child checks that its parent is still there


def quiet_compute_threads() -> None:
    """No thread pools in processes that only tokenize, detokenize or route requests."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def become_child(parent_pid: int, log_level: str, name: str, death_signal: bool = True) -> logging.Logger:
    """Die with the parent (Linux: a signal when it exits, however it exits), leave Ctrl-C to
    the parent (which shuts everything down in order), and log under `name`.

    `death_signal=False` for a child whose parent may start it from a thread other than its
    main one: the signal fires when that *thread* exits, so such a child polls instead."""
    if death_signal:
        try:
            ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # not Linux: children poll `parent_alive` instead
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwind: sockets closed, locks released
    setup_logging(log_level)
    _progress_bars_use_a_thread_lock()
    return logging.getLogger(f"radixkv.server.{name}")


def _progress_bars_use_a_thread_lock() -> None:
    """tqdm's default lock holds a multiprocessing RLock: a named semaphore, registered with the
    parent's resource tracker and never unregistered when this child exits, so every Ctrl-C ended
    with 'There appear to be 1 leaked semaphore objects'. A child's bars need a thread lock only."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def die_with_parent(parent_pid: int) -> None:
    """Linux sends this process SIGTERM when `parent_pid` exits, however it exits (SIGKILL too),
    so no process outlives the command that started it; exits at once if it already has."""
    try:
        ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: stopped by the parent's own shutdown only
    if os.getppid() != parent_pid:
        os._exit(1)


def orphanless(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args` as a child that dies with this
    process (`die_with_parent`, set in the child itself: no `preexec_fn` in a threaded parent)."""
    code = ("import runpy, sys; from radixkv.procs import die_with_parent; "
            f"die_with_parent({os.getpid()}); runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", code, module, *args]


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def exit_now(code: int) -> None:
    """End the process without the interpreter's teardown of its modules (with torch and
    transformers loaded, about 2 s of CPU per process, on every stop). Call it only once the
    process has closed its sockets and joined what writes on its behalf: nothing runs after."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_then_exit(main, *args) -> None:
    """Run a child process's `main(*args)` and leave with its exit code through `exit_now`:
    0 when it returns, `SystemExit`'s code, or 1 after printing an unexpected exception's
    traceback (what multiprocessing would do, without its slow interpreter shutdown)."""
    import traceback

    try:
        main(*args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_now(code)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def watch_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """Exit this process at once when `parent_pid` is no longer its parent (it died)."""
    import threading
    import time

    def watch() -> None:
        while parent_alive(parent_pid):
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
