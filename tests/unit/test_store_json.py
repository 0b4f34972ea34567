"""The stores' JSON text: a big document encoded in pieces is the same text as in one call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pingo.store import _json


def _action(i: int) -> dict[str, Any]:
    parents = [{"id": i - 1}] if i > 1 else []
    return {"id": i, "name": f"a{i}", "command": ["echo", "\\n \u00e9"], "parentActions": parents}


def _document(actions: int) -> dict[str, Any]:
    return {
        "name": 'big \u00e9\u2603 "quoted"',
        "startActionId": 1,
        "actions": [_action(i) for i in range(1, actions + 1)],
        "empty": [],
        "nested": {"list": list(range(2000))},
    }


@pytest.mark.parametrize("actions", [0, 3, 513, 5000])
def test_a_document_in_pieces_is_the_same_text_as_in_one_call(actions: int) -> None:
    document = _document(actions)
    text = _json.dumps_document(document)
    assert text == json.dumps(document, separators=(",", ":"))
    assert json.loads(text) == document


def test_an_empty_document_is_an_empty_object() -> None:
    assert _json.dumps_document({}) == "{}"
