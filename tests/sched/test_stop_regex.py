"""`stop_regex` (SGLang's): a match that ends in the newest token's text stops the request; the
text is cut before it unless `no_stop_trim`. Token t decodes to chr(t) here."""

import pytest

from radixkv.errors import InvalidRequestError
from radixkv.sampling_params import SamplingParams
from radixkv.sched.request import Req
from radixkv.sched.stop import finish_reason
from radixkv.tokenizer import TextStream


class OneCharDecoder:
    def decode(self, ids, skip_special_tokens=True, spaces_between_special_tokens=True):
        return "".join(chr(t) for t in ids)


def run(text, **params):
    req = Req("r", [1], SamplingParams(max_new_tokens=50, **params))
    for ch in text:
        req.output_ids.append(ord(ch))
        reason = finish_reason(req, frozenset(), 1000, OneCharDecoder())
        if reason:
            return "".join(map(chr, req.output_ids)), reason
    return text, None


def test_a_regex_match_stops_when_it_completes():
    out, reason = run("the answer is 42, then more", stop_regex=(r"\d+,",))
    assert out == "the answer is 42," and reason == {"type": "stop", "matched": "42,"}


def test_a_match_must_end_in_the_newest_token_and_respects_min_new_tokens():
    out, reason = run("ab12cd", stop_regex=(r"\d",), min_new_tokens=5)
    assert out == "ab12cd" and reason is None  # both digits came before min_new_tokens
    out, reason = run("ab12cd3", stop_regex=(r"\d",), min_new_tokens=5)
    assert out == "ab12cd3" and reason["matched"] == "3"


def test_the_match_is_trimmed_from_the_text_unless_no_stop_trim():
    tok = OneCharDecoder()
    ids = [ord(c) for c in "see you at 10:30 ok"]
    reason = {"type": "stop", "matched": "10:30"}
    trimmed, kept = TextStream(tok), TextStream(tok, trim_stop=False)
    assert trimmed.push(ids[:5]) + trimmed.finish(ids[5:16], reason) == "see you at "
    assert kept.push(ids[:5]) + kept.finish(ids[5:16], reason) == "see you at 10:30"


@pytest.mark.parametrize("pattern, message", [("(", "not a regular expression"), ("x*", "matches the empty text"),
                                              ("", "non-empty")])
def test_bad_patterns_are_refused_naming_the_field(pattern, message):
    with pytest.raises(InvalidRequestError, match=f"stop_regex.*{message}"):
        SamplingParams.from_dict({"stop_regex": pattern})
