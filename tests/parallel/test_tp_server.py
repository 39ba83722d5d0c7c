"""`radixkv serve --tp 2`: the real server with two ranks answers (plain and streaming) exactly
as one process does, shows its tensor-parallel figures, and Ctrl-C stops every process, ranks
included."""

import signal

import openai
import psutil
import pytest

from tests.server_helpers import API_KEY, start_server
from tests.tiny_models import tiny_chat_model_dir

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(the reply of one in-process rank, the --tp 2 server)"""
    path = tiny_chat_model_dir(tmp_path_factory)
    from radixkv.engine import Engine

    with Engine(str(path), max_total_tokens=4096, progress=False, log_level="warning") as engine:
        expected = engine.chat(MESSAGES, {"max_new_tokens": 12, "temperature": 0})["text"]
    two = start_server("--model", str(path), "--max-total-tokens", "4096", "--served-model-name", "m",
                       "--tp", "2")
    yield expected, two
    if two.proc.poll() is None:
        two.proc.kill()


def chat(server, stream: bool = False) -> str:
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, timeout=60, max_retries=0)
    ask = dict(model="m", messages=MESSAGES, max_tokens=12, temperature=0)
    if stream:
        return "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(**ask, stream=True)
                       if ch.choices)
    return c.chat.completions.create(**ask).choices[0].message.content


def test_tp2_server_answers_like_one_process(servers):
    expected, two = servers
    assert expected and chat(two) == expected
    assert chat(two, stream=True) == expected


def test_tp2_server_reports_its_ranks_and_all_reduce_cost(servers):
    _, two = servers
    chat(two)
    stats = two.info()["stats"]
    assert stats["tp_size"] == 2 and stats["tp_all_reduces"] > 0
    with two.client() as c:
        metrics = c.get("/metrics").text
    assert "radixkv_tp_size 2.0" in metrics and "radixkv_tp_all_reduce_ms_per_forward" in metrics


def test_ctrl_c_stops_the_server_and_every_rank(servers):
    _, two = servers
    processes = psutil.Process(two.proc.pid).children(recursive=True)
    ranks = [p for p in processes if "radixkv.tp.worker" in " ".join(p.cmdline())]
    assert len(ranks) == 1
    two.proc.send_signal(signal.SIGINT)
    assert two.proc.wait(30) == 130  # the exit code of a Ctrl-C
    gone, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_the_scheduler_process_stops_once_a_rank_is_lost():
    """Its inbox answers Stop (in-flight requests end with an error, the process exits 1 and the
    server with it, so a router takes it out) instead of failing every later request."""
    import logging
    import os

    import zmq

    from radixkv.core.loop import Stop
    from radixkv.server.runtime.scheduler_process import ZmqInbox

    ctx = zmq.Context()
    pull, reply = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind("inproc://scheduler")
    healthy = [True]
    inbox = ZmqInbox(pull, reply, os.getppid(), lambda rid, msg: None, logging.getLogger("test"),
                     healthy=lambda: healthy[0])
    try:
        assert inbox.receive(block=False) == []
        healthy[0] = False
        assert inbox.receive(block=True) == [Stop()]
    finally:
        pull.close(0)
        reply.close(0)
        ctx.term()
