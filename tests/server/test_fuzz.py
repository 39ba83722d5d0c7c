"""Schema-driven fuzzing of the real server with schemathesis: thousands of requests generated
from /openapi.json (which publishes the bodies the routes really take), none answered 5xx.

Slow (about 3 minutes: generating 60 bodies an operation is most of it); needs the `fuzz` extra: pip install -e '.[test,fuzz]'; python -m pytest -m slow
tests/server/test_fuzz.py"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_helpers import start_server, stop_server
from tests.tiny_models import tiny_chat_model_dir

pytestmark = pytest.mark.slow


def test_no_generated_request_gets_a_server_error(tmp_path, tmp_path_factory):
    pytest.importorskip("schemathesis")
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    # The fuzz is about the API, not the answers: a tiny model with the default one's tokenizer
    # and chat template runs each generated request in milliseconds, and a short context keeps
    # every request the fuzzer makes valid a short one.
    model = tiny_chat_model_dir(tmp_path_factory)
    server = start_server("--model", str(model), "--max-total-tokens", "4096", "--context-length", "128",
                          api_key="fuzz-key")
    try:
        done = subprocess.run([cli, "run", f"{server.url}/openapi.json", "-H", "Authorization: Bearer fuzz-key",
                               "--checks", "not_a_server_error", "-n", "60", "--workers", "1", "--seed", "7",
                               # a loaded 2-core machine may take seconds on one request (the default is 10 s)
                               "--request-timeout", "60", "--no-color"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=1500)
        (tmp_path / "schemathesis.txt").write_text(done.stdout + done.stderr)  # the whole report, kept
        starts = [i for i in (done.stdout.find(" ERRORS "), done.stdout.find(" FAILURES ")) if i >= 0]
        details = done.stdout[min(starts):][:6000] if starts else ""  # what failed, before the summary
        assert done.returncode == 0, details + "\n...\n" + done.stdout[-3000:]
        assert " passed" in done.stdout and "failed" not in done.stdout.split("Test cases:")[-1], done.stdout[-3000:]
        with server.client() as c:
            assert c.get("/health").status_code == 200
        server.wait_idle(timeout=60)
    finally:
        stop_server(server)
    assert not [line for line in server.log if "Traceback" in line], "".join(server.log[-50:])
