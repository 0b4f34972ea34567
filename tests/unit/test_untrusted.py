"""The one reader of untrusted text: strict JSON and UTF-8, whatever arrives."""

from __future__ import annotations

import pytest

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
