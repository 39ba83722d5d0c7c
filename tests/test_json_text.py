"""`radixkv.json_text`: how deep client JSON nests, checked without recursion, named by path."""

import pytest

from radixkv.errors import InvalidRequestError
from radixkv.json_text import check_depth, depth_path, loads_bounded


def test_the_path_reported_is_the_first_container_past_the_limit():
    assert depth_path([[1], [[2]]], 2) == ["[1]", "[0]"]
    assert depth_path([[[]]], 2) == ["[0]", "[0]"]
    assert depth_path({"a": {"b": 1}}, 2) is None and depth_path(5) is None
    deep: dict = {"x": 1}
    for _ in range(70):
        deep = {"a": [deep]}
    assert depth_path(deep)[:4] == [".a", "[0]", ".a", "[0]"] and len(depth_path(deep)) == 64


def test_a_wide_body_passes_and_a_deep_one_names_its_field():
    check_depth({"input_ids": [list(range(512)) for _ in range(64)]}, "")  # wide, two levels: fine
    deep: dict = {"x": 1}
    for _ in range(100):
        deep = {"x": deep}
    with pytest.raises(InvalidRequestError, match=r"^tools\[0\]\.x\.x\.\.\. \(\d+ levels down\): nested more than 64"):
        check_depth({"tools": [deep]}, "")


def test_json_text_in_a_field_is_bounded_too():
    with pytest.raises(InvalidRequestError, match="^arguments: nested more than 64"):
        loads_bounded("[" * 5000 + "]" * 5000, "arguments")  # past Python's recursion limit
    with pytest.raises(InvalidRequestError, match=r"^arguments\[0\]"):
        loads_bounded("[" * 80 + "]" * 80, "arguments")
    with pytest.raises(InvalidRequestError, match="^arguments: not valid JSON"):
        loads_bounded("{nope", "arguments")
    assert loads_bounded('{"a": [1, 2]}', "arguments") == {"a": [1, 2]}
