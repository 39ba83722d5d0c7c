"""Prefill/decode disaggregation between two real engine cores in one process (the tiny llama,
the real Mooncake transfer engine over loopback TCP, the real ZMQ bootstrap port): the decode
side's greedy tokens equal a whole engine's, only the pages it lacks travel, and every fault
ends the request with an error and leaves both pools whole."""

import time

import pytest

pytest.importorskip("mooncake.engine", reason="the Mooncake extra: pip install 'radixkv[mooncake]'")

from radixkv.bootstrap import Bootstrap  # noqa: E402
from radixkv.config import EngineConfig  # noqa: E402
from radixkv.core.engine_core import EngineCore  # noqa: E402
from radixkv.disagg.sides import transferable  # noqa: E402
from radixkv.errors import ConfigError, ErrorKind, InvalidRequestError  # noqa: E402
from radixkv.sampling_params import SamplingParams  # noqa: E402
from radixkv.sched.request import Req  # noqa: E402
from tests.server_helpers import free_port  # noqa: E402

pytestmark = pytest.mark.timeout(300)
GREEDY = dict(max_new_tokens=8, temperature=0.0)


def load(model, **options):
    opts = dict(model=str(model), max_total_tokens=2048, log_level="debug", page_size=4)  # debug: invariants every step
    return EngineCore.load(EngineConfig.from_kwargs(**{**opts, **options}), progress=False)


@pytest.fixture(scope="module")
def trio(tiny_model_dir):
    model = tiny_model_dir("llama")
    port = free_port()
    prefill = load(model, disaggregation_mode="prefill", disaggregation_bootstrap_port=port,
                   disaggregation_transfer_timeout=2.0)
    decode = load(model, disaggregation_mode="decode", disaggregation_bootstrap_port=port,
                  disaggregation_transfer_timeout=2.0)
    whole = load(model)
    yield prefill, decode, whole, port
    for core in (prefill, decode, whole):
        core.close()


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 250 + 3 for i in range(n)]


def run_whole(core, ids, **params):
    core.add_request(Req(f"w{time.monotonic_ns()}", list(ids), SamplingParams(**{**GREEDY, **params})))
    outs = []
    while core.has_work:
        outs += core.step()
    return outs


def run_pair(prefill, decode, ids, room, port, *, to_prefill=True, to_decode=True, params=None, timeout=30,
             decode_ids=None, prefill_namespace=None):
    b = Bootstrap("127.0.0.1", port, room)
    p = SamplingParams(**(params or GREEDY))
    if to_prefill:
        prefill.add_request(Req(f"p{room}", list(ids), p, bootstrap=b, namespace=prefill_namespace))
    if to_decode:
        decode.add_request(Req(f"d{room}", list(decode_ids or ids), p, bootstrap=b))
    outs, deadline = [], time.monotonic() + timeout
    while (prefill.has_work or decode.has_work) and time.monotonic() < deadline:
        prefill.step()
        outs += decode.step()
    assert not prefill.has_work and not decode.has_work, "the pair did not settle"
    return outs


def tokens(outs):
    return [t for o in outs for t in o.new_ids]


def stat(core, name):
    return core.get_stats()[name]


def whole_pools(*cores):
    for core in cores:
        core.check_invariants()  # idle: no lock outlived its request; every page free or evictable
        s = core.get_stats()
        assert s["protected_tokens"] == 0 and s["free_tokens"] + s["evictable_tokens"] == s["total_tokens"], s


def test_decoded_tokens_equal_a_whole_engines_and_only_missing_pages_travel(trio):
    prefill, decode, whole, port = trio
    first = prompt(1, 61)
    sent = stat(decode, "disagg_transferred_tokens")
    outs = run_pair(prefill, decode, first, 101, port)
    assert outs[-1].error is None and tokens(outs) == tokens(run_whole(whole, first))
    assert stat(decode, "disagg_transferred_tokens") - sent == transferable(61, 4) == 60
    assert stat(prefill, "disagg_transferred_tokens") >= 60
    # the next turn: the decode server holds the first turn (prompt + output); only the new pages move
    second = first + tokens(outs) + prompt(2, 30)
    sent, local = stat(decode, "disagg_transferred_tokens"), stat(decode, "disagg_local_prefix_tokens")
    outs = run_pair(prefill, decode, second, 102, port)
    assert outs[-1].error is None and tokens(outs) == tokens(run_whole(whole, second))
    moved = stat(decode, "disagg_transferred_tokens") - sent
    held = stat(decode, "disagg_local_prefix_tokens") - local
    assert held >= 64 and moved == transferable(len(second), 4) - held and moved <= 36, (held, moved)
    whole_pools(prefill, decode)


def test_several_rooms_at_once_some_sharing_a_prefix(trio):
    prefill, decode, whole, port = trio
    shared = prompt(3, 40)
    prompts = [shared + prompt(10 + i, 9 + 5 * i) for i in range(3)] + [prompt(20, 33)]
    b = [Bootstrap("127.0.0.1", port, 200 + i) for i in range(len(prompts))]
    for i, ids in enumerate(prompts):  # the decode side asks before the prefill side has computed
        decode.add_request(Req(f"d-many{i}", list(ids), SamplingParams(**GREEDY), bootstrap=b[i]))
    for i, ids in enumerate(prompts):
        prefill.add_request(Req(f"p-many{i}", list(ids), SamplingParams(**GREEDY), bootstrap=b[i]))
    got: dict[str, list[int]] = {}
    deadline = time.monotonic() + 60
    while (prefill.has_work or decode.has_work) and time.monotonic() < deadline:
        prefill.step()
        for o in decode.step():
            assert o.error is None, o.error
            got.setdefault(o.rid, []).extend(o.new_ids)
    for i, ids in enumerate(prompts):
        assert got[f"d-many{i}"] == tokens(run_whole(whole, ids)), i
    whole_pools(prefill, decode)


def test_no_prefill_for_the_room_ends_with_an_error_and_frees_the_pages(trio):
    prefill, decode, _, port = trio
    start = time.monotonic()
    outs = run_pair(prefill, decode, prompt(4, 50), 301, port, to_prefill=False)
    assert outs[-1].error_kind is ErrorKind.UNAVAILABLE and "prefill" in outs[-1].error, outs[-1].error
    assert time.monotonic() - start < 10
    whole_pools(prefill, decode)


def test_a_prefill_that_ends_early_tells_the_decode_side(trio):
    prefill, decode, _, port = trio
    b = Bootstrap("127.0.0.1", port, 302)
    decode.add_request(Req("d302", prompt(5, 40), SamplingParams(**GREEDY), bootstrap=b))
    prefill.add_request(Req("p302", prompt(5, 40), SamplingParams(**GREEDY), bootstrap=b))
    prefill.abort("p302")
    outs, start = [], time.monotonic()
    while decode.has_work and time.monotonic() - start < 10:
        outs += decode.step()
    assert outs[-1].error is not None and "prefill server ended the request" in outs[-1].error
    assert time.monotonic() - start < 1.5  # told, not timed out
    whole_pools(prefill, decode)


def test_another_prompt_or_tenant_under_the_same_room_is_refused(trio):
    prefill, decode, _, port = trio
    ids = prompt(6, 40)
    outs = run_pair(prefill, decode, ids, 303, port, decode_ids=ids[:-5] + [7, 7, 7, 7, 7])
    assert outs[-1].error is not None and "prompt or cache namespace differs" in outs[-1].error
    outs = run_pair(prefill, decode, ids, 304, port, prefill_namespace="tenant-a")
    assert outs[-1].error is not None and "prompt or cache namespace differs" in outs[-1].error
    whole_pools(prefill, decode)


def test_a_decode_request_aborted_mid_pull_frees_its_pages_once_settled(trio):
    prefill, decode, _, port = trio
    b = Bootstrap("127.0.0.1", port, 305)
    decode.add_request(Req("d305", prompt(7, 60), SamplingParams(**GREEDY), bootstrap=b))
    decode.step()  # the pull is out
    assert decode.abort("d305") is not None
    deadline = time.monotonic() + 15
    while decode.has_work and time.monotonic() < deadline:
        decode.step()
        prefill.step()
    whole_pools(prefill, decode)


def test_a_decode_side_without_room_ends_the_request_and_keeps_running_the_others(trio, tiny_model_dir):
    prefill, _, _, port = trio
    small = load(tiny_model_dir("llama"), max_total_tokens=160, disaggregation_mode="decode",
                 disaggregation_bootstrap_port=port, disaggregation_transfer_timeout=1.0)
    try:
        # a pull whose prefill never comes holds 100 tokens' pages of the 160 for its timeout
        small.add_request(Req("holder", prompt(8, 101), SamplingParams(**GREEDY),
                              bootstrap=Bootstrap("127.0.0.1", port, 399)))
        small.step()
        small.add_request(Req("other", prompt(12, 20), SamplingParams(max_new_tokens=10, temperature=0.0,
                                                                      ignore_eos=True)))
        outs = run_pair(prefill, small, prompt(9, 101), 306, port, timeout=30)
        ends = {o.rid: o for o in outs if o.finished}
        assert "no room" in ends["d306"].error, ends["d306"].error
        # (the decode side's timeout, or the prefill side's answer that it has nothing: both at 1 s)
        assert "no KV from the prefill server" in ends["holder"].error or "no computed prompt" in ends["holder"].error
        assert ends["other"].error is None and len([t for o in outs if o.rid == "other" for t in o.new_ids]) == 10
        whole_pools(prefill, small)
    finally:
        small.close()


def test_a_room_on_a_whole_server_and_bad_flags_are_refused(trio, tiny_model_dir):
    _, _, whole, port = trio
    with pytest.raises(InvalidRequestError, match="bootstrap_room=7"):
        whole.add_request(Req("r", prompt(1, 8), SamplingParams(**GREEDY), bootstrap=Bootstrap("h", 1, 7)))
    with pytest.raises(ConfigError, match="disaggregation_bootstrap_port"):
        load(tiny_model_dir("llama"), disaggregation_mode="prefill", disaggregation_bootstrap_port=port)  # taken
    with pytest.raises(ConfigError, match="radix cache"):
        EngineConfig.from_kwargs(disaggregation_mode="decode", disable_radix_cache=True)
    with pytest.raises(ConfigError, match="disaggregation_mode"):
        EngineConfig.from_kwargs(disaggregation_mode="both")


def test_another_page_size_is_refused_as_another_layout(trio, tiny_model_dir):
    prefill, _, _, port = trio
    other = load(tiny_model_dir("llama"), page_size=8, disaggregation_mode="decode",
                 disaggregation_bootstrap_port=port, disaggregation_transfer_timeout=2.0)
    try:
        outs = run_pair(prefill, other, prompt(11, 40), 307, port)
        assert "another model, KV format, page size or pool layout" in outs[-1].error
        whole_pools(prefill, other)
    finally:
        other.close()


def test_a_prefill_server_gone_after_its_offer_ends_the_pull_by_timeout(tiny_model_dir):
    """The prefill side computes and offers, then its process goes (its bootstrap port and transfer
    engine with it) before the decode side pulls: the pull times out, the request ends with an
    error, and the decode pool is whole once the grace after the cancel has passed."""
    model, port = tiny_model_dir("llama"), free_port()
    prefill = load(model, disaggregation_mode="prefill", disaggregation_bootstrap_port=port)
    decode = load(model, disaggregation_mode="decode", disaggregation_bootstrap_port=port,
                  disaggregation_transfer_timeout=1.0)
    try:
        b = Bootstrap("127.0.0.1", port, 401)
        prefill.add_request(Req("p401", prompt(13, 60), SamplingParams(**GREEDY), bootstrap=b))
        while prefill.scheduler.reqs:  # computed and offered
            prefill.step()
        prefill.close()
        decode.add_request(Req("d401", prompt(13, 60), SamplingParams(**GREEDY), bootstrap=b))
        outs, start = [], time.monotonic()
        while decode.has_work and time.monotonic() - start < 15:
            outs += decode.step()
        assert "no KV from the prefill server" in outs[-1].error
        assert 1.9 < time.monotonic() - start < 10  # the timeout, then the grace before the pages go back
        whole_pools(decode)
    finally:
        decode.close()
