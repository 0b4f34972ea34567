"""SQLite rows built from records' dataclass fields, and records from rows.

A table's columns are its record's fields, in the dataclass's order and under the
same names; a nested dataclass field (a user's limits) spreads over its own fields'
columns. Only the conversions SQLite needs are named per field (times as
microseconds, JSON text, booleans as integers). Adding a field to a record adds it
to every SELECT, INSERT and decoding at once, where positional tuples let a column
and an index drift apart silently.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Generic, TypeVar

from pingo import untrusted
from pingo.store import _cursor, _json

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Conversion:
    """How one field becomes a column value (`store`) and back (`load`)."""

    store: Callable[[Any], Any]
    load: Callable[[Any], Any]


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


TIME = Conversion(_cursor.to_micros, _cursor.from_micros)
OPTIONAL_TIME = Conversion(_optional(_cursor.to_micros), _optional(_cursor.from_micros))
BOOL = Conversion(int, bool)
JSON = Conversion(_json.dumps, json.loads)
#: A JSON object that may be long (a schedule's whole workflow document): decoded when a
#: reader first looks into it (`untrusted.stored_object`), not with every row read.
DOCUMENT = Conversion(_json.dumps, untrusted.stored_object)
OPTIONAL_JSON = Conversion(_optional(_json.dumps), _optional(json.loads))
BYTES = Conversion(bytes, bytes)


class Rows(Generic[R]):
    """The columns of `record`'s table and the conversions between rows and records."""

    def __init__(self, record: type[R], conversions: Mapping[str, Conversion] | None = None):
        conversions = conversions or {}
        self._record = record
        #: Each field: its name, and for a nested dataclass its type and its fields' names.
        self._parts: list[tuple[str, type[Any] | None, tuple[str, ...]]] = []
        names: list[str] = []
        # Annotations are strings under `from __future__ import annotations`.
        hints = typing.get_type_hints(record)
        for field in fields(record):  # type: ignore[arg-type]
            nested = hints[field.name]
            if isinstance(nested, type) and is_dataclass(nested):
                inner = tuple(f.name for f in fields(nested))
                names += inner
                self._parts.append((field.name, nested, inner))
            else:
                names.append(field.name)
                self._parts.append((field.name, None, ()))
        self.names: tuple[str, ...] = tuple(names)
        #: `a, b, c`: for SELECT, RETURNING and INSERT column lists.
        self.columns = ", ".join(names)
        #: `?, ?, ?`: one placeholder per column.
        self.placeholders = ", ".join("?" * len(names))
        self._store = [conversions[n].store if n in conversions else None for n in names]
        self._load = [conversions[n].load if n in conversions else None for n in names]

    def row(self, record: R) -> tuple[Any, ...]:
        """The column values of `record`, in `columns` order."""
        values: list[Any] = []
        for name, nested, inner in self._parts:
            value = getattr(record, name)
            if nested is None:
                values.append(value)
            else:
                values += [getattr(value, n) for n in inner]
        return tuple(
            v if store is None else store(v) for store, v in zip(self._store, values, strict=True)
        )

    def record(self, row: Sequence[Any]) -> R:
        """The record a row of `columns` holds."""
        values = [v if load is None else load(v) for load, v in zip(self._load, row, strict=True)]
        arguments: list[Any] = []
        at = 0
        for _, nested, inner in self._parts:
            if nested is None:
                arguments.append(values[at])
                at += 1
            else:
                arguments.append(nested(*values[at : at + len(inner)]))
                at += len(inner)
        return self._record(*arguments)
