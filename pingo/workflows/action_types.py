"""Action types: plug-ins that bring the schema of their own fields (and, later, an executor).

A type is registered under the entry-point group `pingo.action_types`; the four
built-ins below use the same mechanism (see pyproject.toml). A type's schema
describes only its own fields (`command`, `jar`, `conf`, …) and lives in
`schemas/workflow.schema.json` under `$defs/<type name>` for the built-ins, so
that file stays the single source of the language for both validation and the
API documentation.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pingo.workflows import _schema

logger = logging.getLogger(__name__)

#: The entry-point group action types register under.
ENTRY_POINT_GROUP = "pingo.action_types"


@functools.cache
def common_fields() -> frozenset[str]:
    """Fields every action has whatever its type (`$defs/actionCommon` of the schema).

    Everything else in an action is type-specific: the schema rejects fields that
    are neither.
    """
    return frozenset(_schema.workflow_schema()["$defs"]["actionCommon"]["properties"])


class _SchemaDef(Mapping[str, Any]):
    """`$defs/<name>` of the workflow schema, read on first use (no I/O at import time)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _target(self) -> Mapping[str, Any]:
        target: Mapping[str, Any] = _schema.workflow_schema()["$defs"][self._name]
        return target

    def __getitem__(self, key: str) -> Any:
        return self._target()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._target())

    def __len__(self) -> int:
        return len(self._target())

    def __repr__(self) -> str:
        return f"<workflow schema $defs/{self._name}>"


@dataclass(frozen=True, eq=False)
class ActionType:
    """An action type: its name and the JSON Schema of its type-specific fields.

    `schema` is an object schema. `#/$defs/...` references inside it resolve
    against the workflow schema's `$defs` (so a plug-in may reuse `argv` or
    `stringMap`); a schema that carries its own `$id` is resolved on its own.
    Equality is identity: a type is one object, loaded once.
    """

    name: str
    schema: Mapping[str, Any]

    def spec(self, action_json: Mapping[str, Any]) -> dict[str, Any]:
        """The type-specific fields of an action (what, with the parents, identifies its output)."""
        common = common_fields()
        return {k: v for k, v in action_json.items() if k not in common}


def _builtin(name: str) -> ActionType:
    return ActionType(name=name, schema=_SchemaDef(name))


COMMAND_LINE = _builtin("command-line")
MAPREDUCE_V1 = _builtin("mapreduce-v1")
MAPREDUCE_V2 = _builtin("mapreduce-v2")
SPARK = _builtin("spark")

#: The built-in types, used when no entry point can be read (e.g. running from a
#: source tree that was never installed).
BUILTIN: Mapping[str, ActionType] = {
    t.name: t for t in (COMMAND_LINE, MAPREDUCE_V1, MAPREDUCE_V2, SPARK)
}

_loaded: dict[str, ActionType] | None = None


def load_action_types() -> dict[str, ActionType]:
    """Every action type registered under `pingo.action_types`, by name (cached).

    A plug-in that fails to load, or does not provide an `ActionType`, is logged
    and skipped; the built-ins are always present.
    """
    global _loaded
    if _loaded is None:
        found: dict[str, ActionType] = dict(BUILTIN)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = ep.load()
            except Exception:
                logger.exception(
                    "action type %s failed to load",
                    ep.name,
                    extra={"event": "action_type_load_failed", "action_type": ep.name},
                )
                continue
            if not isinstance(loaded, ActionType):
                logger.error(
                    "entry point %s does not name an ActionType (got %r)",
                    ep.name,
                    type(loaded).__name__,
                    extra={"event": "action_type_load_failed", "action_type": ep.name},
                )
                continue
            if loaded.name != ep.name:
                logger.error(
                    "entry point %s names action type %r; the names must match",
                    ep.name,
                    loaded.name,
                    extra={"event": "action_type_load_failed", "action_type": ep.name},
                )
                continue
            found[ep.name] = loaded
        _loaded = found
    return dict(_loaded)
