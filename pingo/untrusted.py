"""The one place where untrusted text becomes bytes or values: strict JSON and UTF-8.

Everything the server reads from outside (request bodies, callback bodies,
workflow documents, stored documents, tokens, headers) goes through here, so
that one rule holds everywhere: text is valid Unicode that encodes to UTF-8,
and JSON is RFC 8259 JSON (no `NaN`, no `Infinity`, no lone surrogate escapes).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

#: Ids and counters are signed 64-bit integers: SQLite's INTEGER and MongoDB's int64.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# A `\uD800`-`\uDFFF` escape in the raw text; without one, no parsed string can
# hold a surrogate (a UTF-8 decoder already refuses encoded ones).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


class MalformedJSON(ValueError):
    """The text is not strict JSON; `pointer` locates the offending value ("" for all)."""

    def __init__(self, message: str, pointer: str = "") -> None:
        super().__init__(message)
        self.pointer = pointer


def _reject_constant(name: str) -> Any:
    raise MalformedJSON(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        # 1e400 is JSON, but as a float it is Infinity, which JSON cannot write back.
        raise MalformedJSON(f"{text} is out of the range of a double")
    return value


def loads(text: str | bytes | bytearray) -> Any:
    """Parse strict JSON; raise `MalformedJSON` (a ValueError) for anything else.

    `NaN`, `Infinity` and `-Infinity` are refused (Python
    accepts them by default and would later write them back as bare `NaN`), and
    so are numbers too large for a double and strings holding a lone
    surrogate, which cannot become UTF-8.
    """
    if isinstance(text, bytes | bytearray):
        # RFC 8259 allows UTF-16 and UTF-32 files too (json.loads detects them);
        # HTTP bodies are held to UTF-8 by their reader before they get here.
        encoding = json.detect_encoding(text)
        try:
            text = bytes(text).decode(encoding)
        except UnicodeDecodeError as exc:
            raise MalformedJSON(f"the text is not {encoding}") from exc
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise MalformedJSON(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if _SURROGATE_ESCAPE.search(text):
        pointer = _lone_surrogate(value, "")
        if pointer is not None:
            raise MalformedJSON("a string holds a lone UTF-16 surrogate", pointer)
    return value


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _lone_surrogate(value: Any, where: str) -> str | None:
    """The JSON pointer of the first string (or key) holding a surrogate, if any."""
    for pointer, text in _strings(value, where):
        if _SURROGATE.search(text):
            return pointer
    return None


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    # Iterative: a document's depth is bounded elsewhere, but not necessarily yet.
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            yield at, item
        elif isinstance(item, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(item))
        elif isinstance(item, dict):
            for key, v in item.items():
                yield f"{at}/{_escape(key)}", key
                stack.append((v, f"{at}/{_escape(key)}"))


def to_bytes(text: str) -> bytes | None:
    """`text` as UTF-8, or None when it cannot be (a lone or smuggled surrogate).

    Header values reach Python decoded with `surrogateescape`, so a byte like
    0xFF arrives as a lone surrogate: callers treat None as "not a valid value"
    rather than letting `str.encode` raise deep inside a check.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None
