"""Two real replicas sharing a Mooncake Store (`--kv-storage-backend mooncake`, a real
`mooncake_master` on loopback): a long prompt replica A served is, on replica B's first request,
>= 90% cached from the store, with the same greedy tokens; and a master that is gone fails no
request (serving goes on from the local tiers)."""

import time

import pytest

from tests.mooncake_helpers import start_master
from tests.server_helpers import start_server, stop_server, wait_ready

pytestmark = pytest.mark.timeout(400)
GREEDY = {"max_new_tokens": 8, "temperature": 0.0}
TIERS = ("--host-kv-size", "4096")
OTHER_KEY = "second-tenant-key"
DOC = ("The harbour master kept a ledger of every ship that came in on the tide, its cargo, its crew "
       "and the weather it brought with it; ") * 40  # about 1,000 tokens


def replica(master, *extra):
    return start_server(*TIERS, "--kv-storage-backend", "mooncake", "--kv-storage-config", master.config(),
                        *extra, extra_keys=(OTHER_KEY,), wait=False)


def generate(server, text, key=None):
    with server.client() as c:
        if key is not None:
            c.headers["Authorization"] = f"Bearer {key}"
        r = c.post("/generate", json={"text": text, "sampling_params": GREEDY})
        assert r.status_code == 200, r.text
        return r.json()


def written(server):
    storage = server.info()["kv_storage"]
    return storage["storage_written_pages"] if storage["storage_pending_pages"] == 0 else 0


def test_a_second_replica_hits_what_the_first_served(tmp_path):
    master = start_master(tmp_path)
    a, b = replica(master), replica(master)
    try:
        wait_ready(a), wait_ready(b)
        first = generate(a, DOC)
        prompt_tokens = first["meta_info"]["prompt_tokens"]
        assert prompt_tokens >= 900 and first["meta_info"]["cached_tokens"] == 0
        deadline = time.monotonic() + 30
        while written(a) * 64 < prompt_tokens * 0.9:  # A writes through; its writer may still be at it
            assert time.monotonic() < deadline, a.info()["kv_storage"]
            time.sleep(0.1)
        second = generate(b, DOC)  # B never saw the prompt
        details = second["meta_info"]["cached_tokens_details"]
        assert details["storage"] >= 0.9 * prompt_tokens, (details, b.info()["kv_storage"], "".join(b.log[-30:]))
        assert second["output_ids"] == first["output_ids"]
        info = b.info()["kv_storage"]
        assert info["storage_backend"] == "mooncake" and info["storage_available"]
        assert info["storage_hit_tokens"] == details["storage"]
        other = generate(b, DOC, key=OTHER_KEY)  # another tenant: its namespace seeds other keys
        assert other["meta_info"]["cached_tokens"] == 0, other["meta_info"]
        assert other["output_ids"] == first["output_ids"]
    finally:
        for s in (a, b):
            stop_server(s)
        master.stop()


def test_no_master_fails_no_request(tmp_path):
    from tests.mooncake_helpers import Master, _free_port

    master = Master(_free_port(), _free_port(), tmp_path / "master.log")  # never started
    a = wait_ready(replica(master))
    try:
        out = [generate(a, DOC)["output_ids"] for _ in range(2)]
        assert out[0] == out[1]
        info = a.info()["kv_storage"]
        assert not info["storage_available"] and info["storage_skipped_pages"] > 0
        assert sum("is unavailable" in line for line in a.log) == 1, "".join(a.log)
    finally:
        assert stop_server(a) == 0
