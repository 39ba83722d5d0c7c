"""`radixkv serve --dp 2`: two workers behind a router from one command, and all of them gone
after SIGTERM."""

import time

import psutil
import pytest

from tests.server_helpers import start_server, stop_server


@pytest.mark.slow  # starts two model servers and a router (about 40 s)
def test_serve_dp_starts_workers_behind_a_router_and_stops_them_all():
    server = start_server("--dp", "2", "--max-total-tokens", "2048")
    try:
        with server.client() as c:
            r = c.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
            info = c.get("/server_info").json()
        assert len(info["router"]["workers"]) == 2 and all(w["healthy"] for w in info["router"]["workers"])
        children = psutil.Process(server.proc.pid).children(recursive=True)
        assert len(children) >= 2
    finally:
        assert stop_server(server) == 0
    deadline = time.monotonic() + 30
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        assert time.monotonic() < deadline, "a worker outlived the router"
        time.sleep(0.2)


def test_serve_dp_refuses_a_bad_count():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "radixkv", "serve", "--dp", "99"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--dp" in proc.stderr


def test_each_worker_publishes_kv_events_on_its_own_ports():
    from radixkv.config import KVEventsConfig
    from radixkv.router.launch import _worker_argv, worker_kv_events

    given = '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
    per = [KVEventsConfig.parse(t) for t in worker_kv_events(given, 3)]
    assert [(c.endpoint, c.replay_endpoint) for c in per] == [
        ("tcp://*:5557", "tcp://*:5558"), ("tcp://*:5559", "tcp://*:5560"), ("tcp://*:5561", "tcp://*:5562")]
    assert worker_kv_events(None, 2) == [None, None]
    with pytest.raises(ValueError, match="collide"):
        worker_kv_events('{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5559"}', 3)
    argv = _worker_argv(["serve", "--dp", "2", "--router", "sglang", "--kv-events-config", given, "--port", "9"],
                        30001, per[1].to_json())
    assert argv[3:] == ["radixkv", "serve", "--kv-events-config", per[1].to_json(), "--port", "30001", "--host", "127.0.0.1"]


def test_each_worker_records_its_own_trace():
    from radixkv.router.launch import _worker_argv

    for flag in (["--record-trace", "/tmp/served.jsonl"], ["--record-trace=/tmp/served.jsonl"]):
        argv = _worker_argv(["serve", "--dp", "2", *flag, "--port", "9"], 30002, rank=1)
        assert "/tmp/served.worker1.jsonl" in " ".join(argv) and "/tmp/served.jsonl" not in " ".join(argv)


def test_router_without_dp_is_refused(run_cli):
    out = run_cli("serve", "--router", "sglang")
    assert out.returncode == 2 and "--dp" in out.stderr


def dp_workers(server) -> dict[int, psutil.Process]:
    """The command's worker processes by port."""
    out = {}
    for child in psutil.Process(server.proc.pid).children():
        try:
            cmd = child.cmdline()
        except psutil.Error:  # a worker that died and is not reaped yet
            continue
        if "--port" in cmd:
            out[int(cmd[cmd.index("--port") + 1])] = child
    return out


@pytest.mark.slow  # two workers, one started again (about 60 s)
def test_a_killed_worker_ends_its_stream_with_done_and_is_started_again(tmp_path_factory):
    """Found from outside: a worker killed mid-stream ended its streams with an error event but no
    `[DONE]` (a single server sends it), and dead workers were neither restarted nor the command
    stopped."""
    import threading

    from tests.tiny_models import tiny_chat_model_dir

    model = tiny_chat_model_dir(tmp_path_factory)
    server = start_server("--dp", "2", "--model", str(model), "--max-total-tokens", "2048")
    try:
        workers = dp_workers(server)
        assert len(workers) == 2
        lines: list[str] = []
        with server.client() as c:
            model_name = c.get("/v1/models").json()["data"][0]["id"]

        def stream_named() -> None:
            with server.client() as c, c.stream("POST", "/v1/completions", json={
                    "model": model_name, "prompt": "Once", "max_tokens": 500, "ignore_eos": True,
                    "stream": True}) as r:
                lines.extend(line for line in r.iter_lines() if line.startswith("data: "))

        reader = threading.Thread(target=stream_named)
        reader.start()
        deadline = time.monotonic() + 30
        busy = None
        while busy is None and time.monotonic() < deadline:
            with server.client() as c:
                router = c.get("/server_info").json()["router"]
            busy = next((w for w in router["workers"] if w["inflight"]), None)
            time.sleep(0.05)
        assert busy is not None, "the stream never reached a worker"
        port = int(busy["url"].rsplit(":", 1)[1])
        victim = workers[port]
        victim.kill()
        reader.join(60)
        assert len(lines) >= 2 and lines[-1] == "data: [DONE]" and '"error"' in lines[-2], lines[-3:]
        deadline = time.monotonic() + 120
        while True:  # started again on its port, and served again
            again = dp_workers(server).get(port)
            if again is not None and again.pid != victim.pid:
                with server.client() as c:
                    router = c.get("/server_info").json()["router"]
                if all(w["healthy"] for w in router["workers"]):
                    break
            assert time.monotonic() < deadline, "the killed worker was not started again"
            time.sleep(0.5)
        with server.client() as c:
            r = c.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200
    finally:
        assert stop_server(server) == 0


@pytest.mark.slow  # two workers (about 30 s)
def test_with_every_worker_gone_for_good_the_command_exits_1(tmp_path_factory):
    from tests.tiny_models import tiny_chat_model_dir

    model = tiny_chat_model_dir(tmp_path_factory)
    server = start_server("--dp", "2", "--model", str(model), "--max-total-tokens", "2048", "--dp-max-restarts", "0")
    for worker in dp_workers(server).values():
        worker.kill()
    assert server.proc.wait(60) == 1
