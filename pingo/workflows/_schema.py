"""Loading `schemas/workflow.schema.json`, the single source of the workflow language."""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from collections.abc import Callable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any

#: The file's name, both in the repository's `schemas/` and in the wheel's `pingo/_schemas/`.
WORKFLOW_SCHEMA = "workflow.schema.json"

# An editable install runs from the repository, whose schemas/ is the file being
# edited; a wheel force-includes the same directory as the `pingo/_schemas` package data.
_REPO_SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def read_schema_text(name: str = WORKFLOW_SCHEMA) -> str:
    """The text of a schema file shipped with Pingo."""
    candidate = _REPO_SCHEMAS / name
    if candidate.is_file():
        return candidate.read_text(encoding="utf-8")
    resource = importlib.resources.files("pingo").joinpath("_schemas", name)
    return resource.read_text(encoding="utf-8")


@functools.cache
def workflow_schema() -> Mapping[str, Any]:
    """The workflow JSON Schema (2020-12), parsed once. Callers must not mutate it."""
    document: dict[str, Any] = json.loads(read_schema_text(WORKFLOW_SCHEMA))
    return document


# -- fast predicates ---------------------------------------------------------------
#
# jsonschema interprets a schema on every call (about 100 µs per action here),
# which is 10 s for a 100,000-action workflow. `compile_predicate` turns the
# subset of JSON Schema the workflow language uses into plain closures that
# answer "valid or not" exactly as jsonschema would; jsonschema itself is then
# only asked to explain the documents a predicate rejects. A schema using any
# keyword outside the subset compiles to None and jsonschema does all the work.

Predicate = Callable[[Any], bool]

#: Keywords that never affect validity.
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "$defs", "title", "description", "default", "examples",
     "deprecated", "readOnly", "writeOnly"}
)  # fmt: skip
_SUPPORTED = _ANNOTATIONS | {
    "$ref", "type", "properties", "required", "additionalProperties", "items", "minItems",
    "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "enum", "const",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "allOf", "anyOf", "oneOf",
    "not", "pattern", "propertyNames",
}  # fmt: skip


class _Unsupported(Exception):
    """The schema uses a keyword (or a `$ref`) the fast path does not handle."""


def _is_integer(x: Any) -> bool:
    # As jsonschema: booleans are not numbers, and 1.0 is an integer.
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


_TYPE_CHECKS: dict[str, Predicate] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "integer": _is_integer,
    "number": _is_number,
}


def compile_predicate(schema: Any, root: Mapping[str, Any]) -> Predicate | None:
    """A function telling exactly whether an instance is valid, or None if unsupported.

    `$ref`s must be local (`#/$defs/<name>`) and resolve in `root`.
    """
    try:
        return _compile(schema, root, ())
    except _Unsupported:
        return None


def _always(_: Any) -> bool:
    return True


def _never(_: Any) -> bool:
    return False


def _all(preds: Sequence[Predicate]) -> Predicate:
    if not preds:
        return _always
    if len(preds) == 1:
        return preds[0]
    frozen = tuple(preds)

    def check(x: Any) -> bool:
        for p in frozen:
            if not p(x):
                return False
        return True

    return check


def _compile(schema: Any, root: Mapping[str, Any], refs: tuple[str, ...]) -> Predicate:
    if schema is True:
        return _always
    if schema is False:
        return _never
    if not isinstance(schema, Mapping) or not set(schema) <= _SUPPORTED:
        raise _Unsupported
    fused = _fused(schema, root, refs)
    if fused is not None:
        return fused
    preds: list[Predicate] = []
    if "$ref" in schema:
        preds.append(_compile_ref(schema["$ref"], root, refs))
    if "type" in schema:
        preds.append(_compile_type(schema["type"]))
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        # Only strings: jsonschema's equality (1 == 1.0, True != 1) is then plain `in`.
        if not all(isinstance(v, str) for v in values):
            raise _Unsupported
        preds.append(_one_of_strings(frozenset(values)))
    preds.extend(_compile_bounds(schema))
    if "pattern" in schema:
        preds.append(_matches(schema["pattern"]))
    if "propertyNames" in schema:
        preds.append(_each_key(_compile(schema["propertyNames"], root, refs)))
    if {"properties", "required", "additionalProperties"} & set(schema):
        preds.append(_compile_object(schema, root, refs))
    if "items" in schema:
        preds.append(_each_item(_compile(schema["items"], root, refs)))
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            subs = tuple(_compile(s, root, refs) for s in schema[key])
            preds.append({"allOf": _all, "anyOf": _any, "oneOf": _exactly_one}[key](subs))
    if "not" in schema:
        preds.append(_negate(_compile(schema["not"], root, refs)))
    return _all(preds)


def _fused(
    schema: Mapping[str, Any], root: Mapping[str, Any], refs: tuple[str, ...]
) -> Predicate | None:
    """One closure for the commonest shapes (a typed string, array or object with its own
    keywords only), where `_all` would chain one per keyword: an action of a 1,000-action
    workflow is checked by dozens of them. None for any other schema."""
    kind = schema.get("type")
    keys = set(schema) - _ANNOTATIONS - {"type"}
    if kind == "string" and keys <= {"minLength", "maxLength", "pattern"}:
        return _fused_string(schema)
    if kind == "array" and keys <= {"items", "minItems", "maxItems"}:
        item = _compile(schema["items"], root, refs) if "items" in schema else _always
        return _fused_array(item, schema.get("minItems", 0), schema.get("maxItems"))
    if kind == "object" and keys <= {"properties", "required", "additionalProperties"}:
        return _compile_object(schema, root, refs, objects_only=True)
    return None


def _fused_string(schema: Mapping[str, Any]) -> Predicate:
    low = schema.get("minLength", 0)
    high = schema.get("maxLength")
    search = _matches(schema["pattern"]) if "pattern" in schema else _always

    def check(x: Any) -> bool:
        if not isinstance(x, str):
            return False
        size = len(x)
        return size >= low and (high is None or size <= high) and search(x)

    return check


def _fused_array(item: Predicate, low: int, high: int | None) -> Predicate:
    def check(x: Any) -> bool:
        if not isinstance(x, list):
            return False
        size = len(x)
        return size >= low and (high is None or size <= high) and all(map(item, x))

    return check


def _one_of_strings(allowed: frozenset[str]) -> Predicate:
    def check(x: Any) -> bool:
        return isinstance(x, str) and x in allowed

    return check


def _each_item(item: Predicate) -> Predicate:
    def check(x: Any) -> bool:
        return not isinstance(x, list) or all(item(v) for v in x)

    return check


def _matches(pattern: Any) -> Predicate:
    # jsonschema uses `re.search` too; the schema's patterns are in the subset
    # where ECMA-262 and Python regular expressions agree.
    if not isinstance(pattern, str):
        raise _Unsupported
    search = re.compile(pattern).search

    def check(x: Any) -> bool:
        return not isinstance(x, str) or search(x) is not None

    return check


def _each_key(name: Predicate) -> Predicate:
    def check(x: Any) -> bool:
        return not isinstance(x, dict) or all(name(k) for k in x)

    return check


def _any(subs: Sequence[Predicate]) -> Predicate:
    def check(x: Any) -> bool:
        return any(s(x) for s in subs)

    return check


def _exactly_one(subs: Sequence[Predicate]) -> Predicate:
    def check(x: Any) -> bool:
        return sum(1 for s in subs if s(x)) == 1

    return check


def _negate(pred: Predicate) -> Predicate:
    def check(x: Any) -> bool:
        return not pred(x)

    return check


def _compile_ref(ref: Any, root: Mapping[str, Any], refs: tuple[str, ...]) -> Predicate:
    if not isinstance(ref, str) or not ref.startswith("#/$defs/") or ref in refs:
        raise _Unsupported  # remote, JSON-pointer-escaped or recursive: leave it to jsonschema
    name = ref[len("#/$defs/") :]
    if "/" in name or "~" in name or name not in root.get("$defs", {}):
        raise _Unsupported
    return _compile(root["$defs"][name], root, (*refs, ref))


def _compile_type(types: Any) -> Predicate:
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not all(n in _TYPE_CHECKS for n in names):
        raise _Unsupported
    checks = tuple(_TYPE_CHECKS[n] for n in names)
    return checks[0] if len(checks) == 1 else _any(checks)


def _size_bound(kind: type[Sized], low: int | None, high: int | None) -> Predicate:
    def check(x: Any) -> bool:
        if not isinstance(x, kind):
            return True
        size = len(x)
        return (low is None or size >= low) and (high is None or size <= high)

    return check


def _number_bound(key: str, bound: float) -> Predicate:
    def check(x: Any) -> bool:
        if not _is_number(x):
            return True
        if key == "minimum":
            return bool(x >= bound)
        if key == "maximum":
            return bool(x <= bound)
        if key == "exclusiveMinimum":
            return bool(x > bound)
        return bool(x < bound)

    return check


def _compile_bounds(schema: Mapping[str, Any]) -> list[Predicate]:
    preds: list[Predicate] = []
    for kind, low_key, high_key in (
        (str, "minLength", "maxLength"),
        (list, "minItems", "maxItems"),
        (dict, "minProperties", "maxProperties"),
    ):
        if low_key in schema or high_key in schema:
            preds.append(_size_bound(kind, schema.get(low_key), schema.get(high_key)))
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            preds.append(_number_bound(key, schema[key]))
    return preds


def _compile_object(
    schema: Mapping[str, Any],
    root: Mapping[str, Any],
    refs: tuple[str, ...],
    *,
    objects_only: bool = False,
) -> Predicate:
    """The object keywords' check; with `objects_only` (`"type": "object"` too) anything
    but an object fails it, where the keywords alone let it pass."""
    required = tuple(schema.get("required", ()))
    properties = {k: _compile(v, root, refs) for k, v in schema.get("properties", {}).items()}
    extra_schema = schema.get("additionalProperties", True)
    forbid_extra = extra_schema is False
    extra = None if extra_schema is True or forbid_extra else _compile(extra_schema, root, refs)

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return not objects_only
        for key in required:
            if key not in x:
                return False
        for key, value in x.items():
            prop = properties.get(key)
            if prop is not None:
                if not prop(value):
                    return False
            elif forbid_extra:
                return False
            elif extra is not None and not extra(value):
                return False
        return True

    return check
