"""The one place where untrusted text becomes bytes or values: strict JSON and UTF-8.

Everything the server reads from outside (request bodies, callback bodies,
workflow documents, stored documents, tokens, headers) goes through here, so
that one rule holds everywhere: text is valid Unicode that encodes to UTF-8,
and JSON is RFC 8259 JSON (no `NaN`, no `Infinity`, no lone surrogate escapes).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: Ids and counters are signed 64-bit integers: SQLite's INTEGER and MongoDB's int64.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# A `\uD800`-`\uDFFF` escape in the raw text; without one, no parsed string can
# hold a surrogate (a UTF-8 decoder already refuses encoded ones).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")

#: Texts longer than this (characters, or bytes before decoding) are decoded piece by
#: piece: no single C call (UTF-8 decoding, the JSON scanner, a regex) then runs over
#: the whole text, so a thread doing it holds the GIL only in short slices and the
#: event loop keeps answering while a 10 MB workflow is read (issue 13).
PIECEWISE_CHARS = 1 << 18
#: A workflow with more actions than this is big: planned in a child process (a re-run,
#: a schedule's tick; a submission by its body's size, `PIECEWISE_CHARS`) and its
#: documents built in a worker thread, not on the event loop (issue 13).
BIG_ACTIONS = 2_000
#: Unicode's bidirectional formatting characters: marks (LRM, RLM, ALM), embeddings and
#: overrides (LRE to RLO), isolates (LRI to PDI). HTML escaping leaves them be, and one in
#: a name makes a viewer show its text out of order ("a\u202egnp.exe" reads "aexe.png");
#: an unclosed one reorders what follows it too.
BIDI_CONTROLS = (0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
#: A `str.translate` table showing each bidirectional control as its escape (`\u202e`):
#: what the web UI prints and what the log and the CLI write.
BIDI_ESCAPES: dict[int, str] = {c: f"\\u{c:04x}" for c in BIDI_CONTROLS}
#: Bytes of UTF-8 decoded per C call when decoding piece by piece.
_UTF8_PIECE = 1 << 16
#: Containers this near the top are walked in Python when decoding piece by piece; every
#: value below them (a workflow's action, say) is decoded by one call of the C scanner.
_WALKED_LEVELS = 2
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_TO_SQUARE = str.maketrans("{}", "[]")


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


def loads(text: str | bytes | bytearray, *, max_depth: int | None = None) -> Any:
    """Parse strict JSON; raise `MalformedJSON` (a ValueError) for anything else.

    `NaN`, `Infinity` and `-Infinity` are refused (Python
    accepts them by default and would later write them back as bare `NaN`), and
    so are numbers too large for a double and strings holding a lone
    surrogate, which cannot become UTF-8. With `max_depth`, so is a text that
    nests containers deeper than that. Texts longer than `PIECEWISE_CHARS` are
    decoded piece by piece, to the same value and the same refusals.
    """
    if isinstance(text, bytes | bytearray):
        # RFC 8259 allows UTF-16 and UTF-32 files too (json.loads detects them);
        # HTTP bodies are held to UTF-8 by their reader before they get here.
        encoding = json.detect_encoding(text)
        try:
            text = utf8(text) if encoding == "utf-8" else bytes(text).decode(encoding)
        except UnicodeDecodeError as exc:
            raise MalformedJSON(f"the text is not {encoding}") from exc
    if len(text) > PIECEWISE_CHARS:
        return _Pieces(text, max_depth).document()
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise _malformed(exc) from exc
    if _SURROGATE_ESCAPE.search(text):
        pointer = _lone_surrogate(value, "")
        if pointer is not None:
            raise MalformedJSON("a string holds a lone UTF-16 surrogate", pointer)
    if max_depth is not None and depth_exceeds(text, max_depth):
        raise _too_deep(max_depth)
    return value


def stored_object(text: str) -> Mapping[str, Any]:
    """A JSON object read back from a store: decoded now when short, on first use when long.

    Reading a 100,000-action workflow's record (for its owner or its state) must
    not decode its 10 MB document every time; most readers never look at it.
    """
    if len(text) > PIECEWISE_CHARS:
        return LazyObject(text)
    value = loads(text)
    if not isinstance(value, Mapping):
        raise MalformedJSON("the stored document is not a JSON object")
    return value


def is_large(document: Mapping[str, Any]) -> bool:
    """Whether `document` was read back too long to decode eagerly (see `stored_object`):
    the workflow it belongs to has thousands of actions."""
    return isinstance(document, LazyObject)


def json_integer(value: object) -> int | None:
    """`value` as an int when JSON Schema calls it an `integer` (`3` and `3.0`), else None.

    Booleans are not integers here, whatever Python says.
    """
    if type(value) is int:
        return value
    if type(value) is float and value.is_integer():
        return int(value)
    return None


def may_have_key(document: Mapping[str, Any], key: str) -> bool:
    """Whether `document` may have `key` at its top level, without decoding a `LazyObject`
    still undecoded (a big workflow's: decoding it allocates hundreds of MiB, issue 13).

    False only when its text holds neither `"key"` nor any `\\u` escape, the two ways
    JSON can write the key: then it is certainly absent, at any depth. A key with `"`
    or `\\` in it is always looked up.
    """
    if not isinstance(document, LazyObject) or document._value is not None:
        return key in document
    if '"' in key or "\\" in key:
        return True
    text = document._text
    return f'"{key}"' in text or "\\u" in text


def is_undecoded(value: object) -> bool:
    """Whether `value` is a `LazyObject` whose first read would decode its text now."""
    return isinstance(value, LazyObject) and value.undecoded


class LazyObject(Mapping[str, Any]):
    """A JSON object kept as its text until something reads it, then decoded (strictly)."""

    __slots__ = ("_text", "_value")

    def __init__(self, text: str) -> None:
        self._text = text
        self._value: Mapping[str, Any] | None = None

    def decoded(self) -> Mapping[str, Any]:
        """The object itself (decoding it on the first call)."""
        if self._value is None:
            value = loads(self._text)
            if not isinstance(value, Mapping):
                raise MalformedJSON("the stored document is not a JSON object")
            self._value, self._text = value, ""
        return self._value

    @property
    def undecoded(self) -> bool:
        """Whether the text has not been decoded yet."""
        return self._value is None

    def __getitem__(self, key: str) -> Any:
        return self.decoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.decoded())

    def __len__(self) -> int:
        return len(self.decoded())

    def __repr__(self) -> str:
        if self._value is None:
            return f"LazyObject(<{len(self._text)} characters of JSON>)"
        return f"LazyObject({self._value!r})"


def plain(document: Mapping[str, Any]) -> Mapping[str, Any]:
    """`document` decoded if it is a `LazyObject` (slow for a big one: call it off-loop)."""
    return document.decoded() if isinstance(document, LazyObject) else document


def utf8(raw: bytes | bytearray) -> str:
    """`raw` decoded as strict UTF-8 (UnicodeDecodeError otherwise), in pieces when long."""
    if len(raw) <= PIECEWISE_CHARS:
        return bytes(raw).decode("utf-8")
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    pieces = [
        decoder.decode(view[start : start + _UTF8_PIECE])
        for start in range(0, len(raw), _UTF8_PIECE)
    ]
    pieces.append(decoder.decode(b"", final=True))
    return "".join(pieces)


def depth_exceeds(text: str, limit: int) -> bool:
    """Whether the (valid) JSON text `text` nests containers deeper than `limit`.

    Works on the text, in C-speed string operations rather than a walk over every
    value: cut the strings out, keep only the brackets (all made square), then
    peel one level of innermost `[]` pairs per pass. Valid JSON brackets match,
    so the text is empty after exactly as many passes as its depth.
    """
    if limit < 0:
        return True
    brackets = _NOT_BRACKETS.sub("", _JSON_STRING.sub("", text)).translate(_TO_SQUARE)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace("[]", "")
    return bool(brackets)


def _malformed(exc: json.JSONDecodeError) -> MalformedJSON:
    return MalformedJSON(f"{exc.msg} at line {exc.lineno} column {exc.colno}")


def _too_deep(limit: int) -> MalformedJSON:
    return MalformedJSON(f"nested deeper than {limit} levels")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
# The C scanner that raw_decode wraps, and the string reader: typeshed leaves both out.
_scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


class _Pieces:
    """A long JSON text decoded piece by piece, to what `loads` returns for it.

    The top `_WALKED_LEVELS` levels of containers are walked here, in Python; each
    value below them is one call of the C scanner (`raw_decode`), checked for
    depth and lone surrogates on its own slice of the text. Between two calls the
    interpreter may switch threads, which one C call over 10 MB never allows.
    """

    def __init__(self, text: str, max_depth: int | None) -> None:
        self.text = text
        self.max_depth = max_depth

    def document(self) -> Any:
        value, end = self._value(self._skip(0), 0, "")
        end = self._skip(end)
        if end != len(self.text):
            raise self._error("Extra data", end)
        return value

    def _skip(self, at: int) -> int:
        match = _WHITESPACE.match(self.text, at)
        return at if match is None else match.end()

    def _error(self, message: str, at: int) -> MalformedJSON:
        return _malformed(json.JSONDecodeError(message, self.text, at))

    def _value(self, at: int, level: int, pointer: str) -> tuple[Any, int]:
        opening = self.text[at : at + 1]
        if level < _WALKED_LEVELS and opening in ("{", "["):
            if self.max_depth is not None and level + 1 > self.max_depth:
                raise _too_deep(self.max_depth)
            if opening == "{":
                return self._object(at + 1, level + 1, pointer)
            return self._array(at + 1, level + 1, pointer)
        return self._leaf(at, level, pointer)

    def _leaf(self, at: int, level: int, pointer: str) -> tuple[Any, int]:
        try:
            # The C scanner itself (raw_decode without its Python wrapper).
            value, end = _scan_once(self.text, at)
        except StopIteration as exc:
            raise self._error("Expecting value", exc.value) from None
        except json.JSONDecodeError as exc:
            raise _malformed(exc) from exc
        if self.max_depth is not None:
            piece = self.text[at:end]
            limit = self.max_depth - level
            # Depth never exceeds the number of openings: most pieces need no more.
            if piece.count("[") + piece.count("{") > limit and depth_exceeds(piece, limit):
                raise _too_deep(self.max_depth)
        if _SURROGATE_ESCAPE.search(self.text, at, end):
            where = _lone_surrogate(value, pointer)
            if where is not None:
                raise MalformedJSON("a string holds a lone UTF-16 surrogate", where)
        return value, end

    def _object(self, at: int, level: int, pointer: str) -> tuple[dict[str, Any], int]:
        text = self.text
        result: dict[str, Any] = {}
        at = self._skip(at)
        if text[at : at + 1] == "}":
            return result, at + 1
        while True:
            if text[at : at + 1] != '"':
                raise self._error("Expecting property name enclosed in double quotes", at)
            try:
                key, at = _scanstring(text, at + 1, True)
            except json.JSONDecodeError as exc:
                raise _malformed(exc) from exc
            where = f"{pointer}/{pointer_token(key)}"
            if _SURROGATE.search(key):
                raise MalformedJSON("a string holds a lone UTF-16 surrogate", where)
            at = self._skip(at)
            if text[at : at + 1] != ":":
                raise self._error("Expecting ':' delimiter", at)
            result[key], at = self._value(self._skip(at + 1), level, where)
            at = self._skip(at)
            delimiter = text[at : at + 1]
            if delimiter == "}":
                return result, at + 1
            if delimiter != ",":
                raise self._error("Expecting ',' delimiter", at)
            at = self._skip(at + 1)

    def _array(self, at: int, level: int, pointer: str) -> tuple[list[Any], int]:
        text = self.text
        result: list[Any] = []
        at = self._skip(at)
        if text[at : at + 1] == "]":
            return result, at + 1
        while True:
            value, at = self._value(at, level, f"{pointer}/{len(result)}")
            result.append(value)
            at = self._skip(at)
            delimiter = text[at : at + 1]
            if delimiter == "]":
                return result, at + 1
            if delimiter != ",":
                raise self._error("Expecting ',' delimiter", at)
            at = self._skip(at + 1)


def pointer_token(key: object) -> str:
    """`key` as one RFC 6901 reference token of a JSON pointer (`~` and `/` escaped)."""
    return str(key).replace("~", "~0").replace("/", "~1")


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
                yield f"{at}/{pointer_token(key)}", key
                stack.append((v, f"{at}/{pointer_token(key)}"))


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
