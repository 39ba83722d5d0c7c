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
    """Three servers for the three tests, loading at the same time (each test ends its own)."""
    started = [start_server(api_key=None, wait=False) for _ in range(3)]
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


@pytest.mark.parametrize("child", ["scheduler", "detokenizer"])
def test_killing_a_child_answers_503_or_exits_never_hangs(servers, child):
    server = servers[1 if child == "scheduler" else 2]
    ipc = server.info()["ipc_directory"]
    victim = server.info()["processes"][child]
    kids = children_of(server.proc.pid)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # dead: a zombie until its parent reaps it
            try:
                if psutil.Process(victim).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.005)
        # found from outside: /health said 200 for ~0.6 s after the scheduler died (until the watcher looked)
        try:
            assert c.get("/health").status_code == 503
        except httpx.TransportError:  # it exited already: no 200 either
            assert server.proc.wait(5) is not None
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
    assert not os.path.exists(ipc)  # no socket left
