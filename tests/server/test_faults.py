"""Processes that die, and SIGTERM: no hang, no orphan process, no socket file left."""

import os
import signal
import time

import httpx
import psutil
import pytest

from tests.server_helpers import start_server, stop_server, wait_ready


@pytest.fixture(scope="module")
def servers():
    """Two servers for the two tests, loading at the same time (each test ends its own)."""
    started = [start_server(api_key=None, wait=False) for _ in range(2)]
    yield [wait_ready(s) for s in started]
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()


def children_of(pid):
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def still_running(procs, grace=5.0):
    """Processes alive after `grace` seconds (multiprocessing's resource tracker, also a child,
    exits only once its parent has)."""
    _, alive = psutil.wait_procs(procs, timeout=grace)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_sigterm_stops_every_process_and_removes_the_sockets(servers):
    server = servers[0]
    info = server.info()
    kids = children_of(server.proc.pid)
    assert {info["processes"]["scheduler"], info["processes"]["detokenizer"]} <= {k.pid for k in kids}
    assert sorted(os.listdir(info["ipc_directory"])) == ["detokenizer", "scheduler", "tokenizer"]
    assert stop_server(server) == 0
    assert still_running(kids) == []
    assert not os.path.exists(info["ipc_directory"])


def test_killing_the_scheduler_answers_503_or_exits_never_hangs(servers):
    server = servers[1]
    scheduler = server.info()["processes"]["scheduler"]
    kids = children_of(server.proc.pid)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        os.kill(scheduler, signal.SIGKILL)
        deadline = time.monotonic() + 20
        statuses = set()
        while time.monotonic() < deadline and server.proc.poll() is None:
            try:
                r = c.post("/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 2}})
                statuses.add(r.status_code)
            except httpx.TransportError:
                break
            time.sleep(0.1)
    code = server.proc.wait(30)
    assert code != 0  # a dead child is a failure
    assert statuses <= {200, 503}  # before the watchdog noticed, or after: never a hang
    assert still_running(kids) == []
