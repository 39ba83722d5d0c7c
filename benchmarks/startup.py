"""Time from `radixkv serve` to its first answer: eager, compiled on a machine's first start
(an empty graph cache: the forward is traced, compiled and saved), and compiled on the next
start (the saved forward loaded, `radixkv.model.compiled`); and vLLM's OpenAI server on the same
model, for comparison.

Each start is a fresh server process measured until `/health` answers and then until its first
completion comes back; the compiled graph cache of the first compiled start is a new temporary
directory (`TORCHINDUCTOR_CACHE_DIR`, which holds the saved forward too), which the next starts
reuse.

    python benchmarks/startup.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx

from _report import RESULTS, machine, save_json
from _servers import start_radixkv, start_vllm


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=RESULTS / "startup.json", help="results file")
    p.add_argument("--skip-vllm", action="store_true", help="leave out vLLM's start (about 100 s)")
    return p.parse_args(argv)


def one_start(label: str, *flags: str, vllm_model: str | None = None) -> dict | None:
    start = time.perf_counter()
    if vllm_model is not None:
        server, why = start_vllm(vllm_model, block_size=32)
        if server is None:
            print(f"{label}: not run: {why[:300]}")
            return None
    else:
        server = start_radixkv(*flags)
    ready = time.perf_counter() - start
    try:
        r = httpx.post(server.url + "/v1/completions", timeout=120,
                       json={"model": server.model, "prompt": "The capital of France is", "max_tokens": 4,
                             "temperature": 0})
        r.raise_for_status()
        first = time.perf_counter() - start
    finally:
        server.stop()
    row = {"start": label, "ready_s": ready, "first_answer_s": first}
    print(f"{label:<34} ready in {ready:5.1f} s, first answer at {first:5.1f} s", flush=True)
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = [one_start("eager (--compile off)", "--compile", "off")]
    with tempfile.TemporaryDirectory(prefix="radixkv-graphs-") as graphs:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = graphs  # the servers inherit it: a machine's first start
        rows.append(one_start("compiled, first start (no cache)", "--compile", "on"))
        rows.append(one_start("compiled, second start (saved)", "--compile", "on"))
        rows.append(one_start("compiled, third start (saved)", "--compile", "on"))
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]
    if not args.skip_vllm:
        from radixkv.model.loader import resolve_model_dir

        vllm = one_start("vllm-b32", vllm_model=str(resolve_model_dir(None)))
        rows += [vllm] if vllm else []
    save_json(args.json, {**machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
