"""The one reader of untrusted text: strict JSON and UTF-8, whatever arrives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pingo import untrusted


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}', "[1e400]", "-1e999"])
def test_non_finite_constants_are_malformed(text: str) -> None:
    with pytest.raises(untrusted.MalformedJSON):
        untrusted.loads(text)


@pytest.mark.parametrize(
    ("text", "pointer"),
    [
        ('"\\ud800"', ""),
        ('{"a": ["x", "\\udc00"]}', "/a/1"),
        ('{"k\\ud83d": 1}', "/k\ud83d"),
        ('{"a/b": "\\ud83dx"}', "/a~1b"),
    ],
)
def test_lone_surrogates_are_malformed_with_a_pointer(text: str, pointer: str) -> None:
    with pytest.raises(untrusted.MalformedJSON) as caught:
        untrusted.loads(text)
    assert caught.value.pointer == pointer


def test_paired_surrogates_and_escaped_backslashes_are_text() -> None:
    assert untrusted.loads('"\\ud83d\\ude00"') == "\U0001f600"
    assert untrusted.loads('"\\\\ud800"') == "\\ud800"


def test_bytes_must_decode() -> None:
    assert untrusted.loads('{"a": 1}'.encode("utf-16")) == {"a": 1}
    with pytest.raises(untrusted.MalformedJSON):
        untrusted.loads(b'"\xff\xfe\xfd"')


def test_to_bytes_refuses_what_utf8_cannot_hold() -> None:
    assert untrusted.to_bytes("été") == "été".encode()
    assert untrusted.to_bytes("\udcff") is None


# -- piece by piece: long texts decode to the same value, with the same refusals ----------

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=25,
)


@pytest.fixture
def piecewise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every text is long: decoded piece by piece, UTF-8 three bytes at a time."""
    monkeypatch.setattr(untrusted, "PIECEWISE_CHARS", 0)
    monkeypatch.setattr(untrusted, "_UTF8_PIECE", 3)


# The fixture only sets two module constants, the same for every example.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_VALUES, st.booleans(), st.sampled_from([None, ", ", "\n  "]))
def test_piecewise_decoding_returns_what_json_does(
    piecewise: None, value: Any, ascii_only: bool, indent: str | None
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=2 if indent else None)
    assert untrusted.loads(text) == json.loads(text)
    assert untrusted.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "{",
        '{"a": 1,}',
        '{"a" 1}',
        '{"a": [1, 2}',
        "[1, 2] 3",
        '{"a": [NaN]}',
        '{"a": [{"b": Infinity}]}',
        "[1e400]",
        '{"a": "x\ny"}',
        "{'a': 1}",
        "[1 2]",
    ],
)
def test_piecewise_decoding_refuses_what_loads_refuses(piecewise: None, text: str) -> None:
    with pytest.raises(untrusted.MalformedJSON):
        untrusted.loads(text)


@pytest.mark.parametrize(
    ("text", "pointer"),
    [
        ('"\\ud800"', ""),
        ('{"a": ["x", "\\udc00"]}', "/a/1"),
        ('{"a": [{"b": ["\\udc00"]}]}', "/a/0/b/0"),
        ('{"k\\ud83d": 1}', "/k\ud83d"),
        ('{"a/b": "\\ud83dx"}', "/a~1b"),
    ],
)
def test_piecewise_decoding_points_at_lone_surrogates(
    piecewise: None, text: str, pointer: str
) -> None:
    with pytest.raises(untrusted.MalformedJSON) as caught:
        untrusted.loads(text)
    assert caught.value.pointer == pointer


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 8])
def test_piecewise_decoding_checks_the_depth(piecewise: None, depth: int) -> None:
    text = '{"a": ' * (depth - 1) + "[1]" + "}" * (depth - 1)
    assert untrusted.loads(text, max_depth=depth) == json.loads(text)
    with pytest.raises(untrusted.MalformedJSON, match="nested deeper"):
        untrusted.loads(text, max_depth=depth - 1)


def test_piecewise_utf8_refuses_bad_bytes_split_anywhere(piecewise: None) -> None:
    assert untrusted.utf8("été 中文 😀".encode()) == "été 中文 😀"
    with pytest.raises(UnicodeDecodeError):
        untrusted.utf8(b"ab\xe4\xb8")  # a character cut short at the end
    with pytest.raises(UnicodeDecodeError):
        untrusted.utf8(b"abc\xff")


def test_a_long_workflow_decodes_piece_by_piece() -> None:
    document = {
        "name": "long",
        "actions": [{"id": i, "command": ["true", "é" * 3]} for i in range(20_000)],
    }
    text = json.dumps(document)
    assert len(text) > untrusted.PIECEWISE_CHARS
    assert untrusted.loads(text.encode(), max_depth=64) == document


def test_a_long_stored_object_is_decoded_on_first_read_only() -> None:
    document = {"name": "long", "actions": [{"id": i} for i in range(40_000)]}
    text = json.dumps(document)
    assert len(text) > untrusted.PIECEWISE_CHARS
    lazy = untrusted.stored_object(text)
    assert isinstance(lazy, untrusted.LazyObject)
    assert "characters of JSON" in repr(lazy)
    assert lazy["name"] == "long"
    assert lazy == document and len(lazy) == 2 and list(lazy) == ["name", "actions"]
    assert untrusted.plain(lazy) == document and type(untrusted.plain(lazy)) is dict
    assert untrusted.stored_object('{"a": 1}') == {"a": 1}
    with pytest.raises(untrusted.MalformedJSON):
        untrusted.stored_object("[1, 2]")
    with pytest.raises(untrusted.MalformedJSON):
        untrusted.stored_object("[" + "0, " * untrusted.PIECEWISE_CHARS + "NaN]")["a"]


def test_a_lazy_object_says_whether_its_text_is_still_undecoded() -> None:
    big = '{"actions": [' + ",".join(["1"] * (untrusted.PIECEWISE_CHARS // 2)) + "]}"
    lazy = untrusted.stored_object(big)
    assert untrusted.is_undecoded(lazy)
    assert len(lazy["actions"]) == untrusted.PIECEWISE_CHARS // 2
    assert not untrusted.is_undecoded(lazy)
    assert not untrusted.is_undecoded(untrusted.stored_object('{"a": 1}'))
    assert not untrusted.is_undecoded({"a": 1})


def _big(document: dict[str, Any]) -> Any:
    """`document` as a store reads back a big one: undecoded."""
    text = json.dumps(document) + " " * untrusted.PIECEWISE_CHARS
    lazy = untrusted.stored_object(text)
    assert untrusted.is_undecoded(lazy)
    return lazy


def test_may_have_key_looks_at_a_big_documents_text_without_decoding_it() -> None:
    plain = {"name": "w", "actions": [{"command": ["webhooks"]}]}
    assert not untrusted.may_have_key(_big({"name": "w"}), "webhooks")
    # Written as a key, or as a string anywhere, or escaped: maybe (then it is looked up).
    assert untrusted.may_have_key(_big({"webhooks": []}), "webhooks")
    assert untrusted.may_have_key(_big(plain), "webhooks")
    escaped = _big({"name": "w"})
    escaped._text = escaped._text.replace('"name"', '"\\u0077ebhooks"')
    assert untrusted.may_have_key(escaped, "webhooks")
    assert untrusted.is_undecoded(escaped)
    assert escaped["webhooks"] == "w"
    # A decoded document (or a plain dict) is simply asked.
    assert untrusted.may_have_key({"webhooks": []}, "webhooks")
    assert not untrusted.may_have_key(plain, "webhooks")
