"""Return holds through the real server: more live conversations than a small KV pool holds,
a closed loop of clients each sending its next turn as soon as its answer is back. With the
defaults, finished turns are held and their next turns come back to them (claimed holds, cached
histories); once the clients stop, no hold and no lock is left."""

import random
import threading

from tests.server_helpers import start_server, stop_server

USERS, TURNS, FIRST, FOLLOW, ANSWER = 8, 3, 150, 20, 16


def test_a_closed_loop_beyond_the_pool_claims_its_holds_and_leaves_nothing_locked():
    server = start_server("--max-total-tokens", "1024", api_key=None)
    try:
        rng = random.Random(5)
        cached = {t: [] for t in range(TURNS)}
        errors = []

        def user(i: int) -> None:
            conv = [rng.randrange(100, 40000) for _ in range(FIRST)]
            with server.client() as c:
                for t in range(TURNS):
                    r = c.post("/generate", json={"input_ids": conv, "sampling_params": {
                        "max_new_tokens": ANSWER, "temperature": 0, "ignore_eos": True}})
                    if r.status_code != 200:
                        errors.append(r.text)
                        return
                    out = r.json()
                    cached[t].append(out["meta_info"]["cached_tokens"])
                    conv = conv + out["output_ids"] + [rng.randrange(100, 40000) for _ in range(FOLLOW)]

        threads = [threading.Thread(target=user, args=(i,)) for i in range(USERS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert not errors, errors[:2]
        stats = server.info()
        stats = stats.get("stats", stats)
        assert stats["holds_taken"] >= USERS and stats["holds_claimed"] >= USERS // 2, stats
        assert sum(cached[1]) + sum(cached[2]) >= USERS * FIRST  # later turns mostly reuse their history
        idle = server.wait_idle()
        assert idle["kv_pool"]["protected_tokens"] == 0
        assert stop_server(server) == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
