"""`--tp 2 --nnodes 2`: two `radixkv serve` processes as two "machines" on loopback (node ranks 0
and 1, one rank each, joined at `--dist-init-addr`). Greedy output equals one process's; node 1
serves no HTTP; stopping either side stops both, with no process left behind."""

import signal
import socket
import time

import psutil
import pytest

from tests.parallel.test_tp_server import MESSAGES, chat
from tests.server_helpers import free_port, start_server, wait_ready
from tests.tiny_models import tiny_chat_model_dir

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model_and_expected(tmp_path_factory):
    path = tiny_chat_model_dir(tmp_path_factory)
    from radixkv.engine import Engine

    with Engine(str(path), max_total_tokens=4096, progress=False, log_level="warning") as engine:
        expected = engine.chat(MESSAGES, {"max_new_tokens": 12, "temperature": 0})["text"]
    return path, expected


def two_nodes(path):
    addr = f"127.0.0.1:{free_port()}"
    common = ("--model", str(path), "--max-total-tokens", "4096", "--served-model-name", "m", "--tp", "2",
              "--nnodes", "2", "--dist-init-addr", addr, "--log-level", "info")
    node0 = start_server(*common, "--node-rank", "0", wait=False)
    node1 = start_server(*common, "--node-rank", "1", wait=False)
    wait_ready(node0)
    deadline = time.monotonic() + 60
    while not any(line.startswith("radixkv node 1 ready:") for line in node1.log):
        assert node1.proc.poll() is None and time.monotonic() < deadline, "".join(node1.log)
        time.sleep(0.1)
    return node0, node1


def family(*servers):
    procs = []
    for s in servers:
        root = psutil.Process(s.proc.pid)
        procs += [root, *root.children(recursive=True)]
    return procs


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_nodes_answer_like_one_process_and_node_1_serves_no_http(model_and_expected):
    path, expected = model_and_expected
    node0, node1 = two_nodes(path)
    procs = family(node0, node1)
    try:
        assert expected and chat(node0) == expected
        assert chat(node0, stream=True) == expected
        assert node0.info()["stats"]["tp_size"] == 2
        assert not listening(node1.port)  # no HTTP on node 1
        workers = [p for p in procs if "radixkv.tp.worker" in " ".join(p.cmdline())]
        assert [w.ppid() for w in workers] == [node1.proc.pid]  # rank 1 on node 1 (rank 0 is node 0's scheduler)
        node1.proc.send_signal(signal.SIGTERM)  # node 1 goes: node 0 follows, as with a lost rank
        assert node1.proc.wait(30) == 0
        assert node0.proc.wait(60) != 0
        gone, alive = psutil.wait_procs(procs, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        for s in (node0, node1):
            if s.proc.poll() is None:
                s.proc.kill()


def test_ctrl_c_on_node_0_stops_node_1(model_and_expected):
    path, _ = model_and_expected
    node0, node1 = two_nodes(path)
    procs = family(node0, node1)
    try:
        node0.proc.send_signal(signal.SIGINT)
        assert node0.proc.wait(30) == 130
        assert node1.proc.wait(30) == 0  # its rank was stopped by node 0 (TPStop)
        gone, alive = psutil.wait_procs(procs, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        for s in (node0, node1):
            if s.proc.poll() is None:
                s.proc.kill()


def test_flags_are_checked_at_start_up():
    from radixkv.config import EngineConfig
    from radixkv.errors import ConfigError

    with pytest.raises(ConfigError, match="dist_init_addr"):
        EngineConfig.from_kwargs(tp_size=2, nnodes=2)
    with pytest.raises(ConfigError, match="node_rank"):
        EngineConfig.from_kwargs(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1")
    with pytest.raises(ConfigError, match="nnodes"):
        EngineConfig.from_kwargs(tp_size=3, nnodes=2, dist_init_addr="h:1")
    assert EngineConfig.from_kwargs(tp_size=4, nnodes=2, dist_init_addr="h:1").runtime.ranks_per_node == 2


def test_node_1_killed_outright_stops_node_0(model_and_expected):
    """SIGKILL: node 1 cannot say it goes; its rank dies with it, and node 0 notices the silence."""
    path, _ = model_and_expected
    node0, node1 = two_nodes(path)
    procs = family(node0, node1)
    try:
        node1.proc.kill()
        assert node0.proc.wait(60) != 0
        assert any("node 1 stopped answering" in line or "node 1" in line for line in node0.log), "".join(node0.log)
        gone, alive = psutil.wait_procs(procs, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        for s in (node0, node1):
            if s.proc.poll() is None:
                s.proc.kill()
