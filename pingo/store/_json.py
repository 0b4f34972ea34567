"""JSON as every backend writes it: compact, and a big workflow document in pieces.

A store keeps free-form JSON (workflow documents, action definitions, event
payloads) as text. The C encoder holds the GIL for the whole of one call, and a
100,000-action document is about 10 MB: one call would stop every other thread,
the event loop's included, for a few hundred milliseconds (issue 13). So a
document's top-level lists are encoded one element per call, which lets the
interpreter switch threads between elements; the text is the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Compact JSON, `json.dumps(value, separators=(",", ":"))` without its per-call set-up.
dumps = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode

#: Lists shorter than this are encoded in one call (one call is cheaper below it).
_PIECEWISE_ITEMS = 512


def dumps_document(document: Mapping[str, Any]) -> str:
    """`dumps(document)`, with each long top-level list encoded element by element."""
    if not any(isinstance(v, list) and len(v) > _PIECEWISE_ITEMS for v in document.values()):
        return dumps(document)
    members = [f"{dumps(key)}:{_dumps_value(value)}" for key, value in document.items()]
    return "{" + ",".join(members) + "}"


def _dumps_value(value: Any) -> str:
    if isinstance(value, list) and len(value) > _PIECEWISE_ITEMS:
        return "[" + ",".join([dumps(item) for item in value]) + "]"
    return dumps(value)
