"""The docs' picture of `/dashboard`: a server, a small known workload, headless Chromium.

The workload: two system prompts with a few conversations each (three turns, every turn
extending the last), one tenant under its own `cache_salt`, and unrelated one-off prompts, in
a pool small enough (`--max-total-tokens`) that early prefixes are evicted; then the page is
opened, left to refresh a few times, and shot.

    python benchmarks/dashboard_screenshot.py            # -> benchmarks/results/dashboard.png

Needs Debian's chromium and chromium-driver, and selenium (the test extra).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

from _report import RESULTS
from _servers import start_radixkv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.browser import missing, open_browser, wait_for  # noqa: E402

SYSTEMS = ["You are the harbour master's assistant. Answer briefly, in plain words, about tides, ships and berths. ",
           "You are a patient cooking teacher. Explain each step of a recipe simply and say why it matters. "]
QUESTIONS = [["When is high tide today?", "And the next one?", "Can a large ship enter then?"],
             ["How do I cook rice?", "What if it is sticky?", "How much water for two cups?"],
             ["Which berth is free?", "For how long?", "Who do I call?"],
             ["How do I knead bread?", "For how long?", "How do I know it is ready?"]]


def chat(client: httpx.Client, system: str, turns: list[str], salt: str | None = None) -> None:
    messages = [{"role": "system", "content": system}]
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        body = {"model": "model", "messages": messages, "max_tokens": 24, "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        r = client.post("/v1/chat/completions", json=body)
        r.raise_for_status()
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS / "dashboard.png", help="the screenshot (PNG)")
    p.add_argument("--max-total-tokens", type=int, default=640, help="the server's KV pool (default 640)")
    args = p.parse_args(argv)
    why = missing()
    if why:
        p.error(why)
    server = start_radixkv("--max-total-tokens", str(args.max_total_tokens), "--page-size", "16",
                           "--host-kv-size", "2048")
    browser = None
    try:
        browser = open_browser(1280, 1120)
        browser.get(f"{server.url}/dashboard?interval=0.5")  # open first: it draws the workload as it runs
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for i, turns in enumerate(QUESTIONS):
                chat(client, SYSTEMS[i % 2], turns)
            chat(client, SYSTEMS[0], QUESTIONS[0][:2], salt="tenant-b")
            for i in range(4):
                client.post("/generate", json={"text": f"One-off note {i}: list three uses of copper wire.",
                                               "sampling_params": {"max_new_tokens": 16}}).raise_for_status()
            chat(client, SYSTEMS[0], QUESTIONS[0])  # asked again: hits, some of it from the host tier
        seen = int(browser.find_element("id", "updated").get_attribute("data-refreshes"))
        wait_for(lambda: int(browser.find_element("id", "updated").get_attribute("data-refreshes")) >= seen + 2)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(args.out))
    finally:
        if browser is not None:
            browser.quit()
        server.stop()
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
