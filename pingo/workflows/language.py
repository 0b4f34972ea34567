"""The workflow language: parse and validate a document into a `WorkflowDefinition`.

Validation reports every problem it finds, each as a `ValidationIssue` with a
stable code and an RFC 6901 pointer:

- the document's shape is checked against `schemas/workflow.schema.json`: the
  top level with one validator, then each action with the validator compiled
  for its type (so a bad `type` gives one `UNKNOWN_ACTION_TYPE` instead of an
  unreadable dump of every type's schema);
- the semantic rules (unique ids, known references, no cycle, the end action not
  an ancestor of the start action, `outputPath` for unmanaged actions) are then
  checked on whatever parts are well-formed enough to reason about.

Everything is linear in the number of actions and parents: the 100,000-action
limit is meant to be reachable.
"""

from __future__ import annotations

import functools
import logging
import re
import secrets
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pingo import errors, heap, untrusted
from pingo.errors import ValidationIssue
from pingo.workflows import _schema, action_types
from pingo.workflows.definition import ActionDefinition, WorkflowDefinition

if TYPE_CHECKING:
    import networkx as nx

logger = logging.getLogger(__name__)

#: Stable error codes, returned by the API as they are.
MALFORMED_JSON = "MALFORMED_JSON"
SCHEMA_VIOLATION = "SCHEMA_VIOLATION"
UNKNOWN_ACTION_TYPE = "UNKNOWN_ACTION_TYPE"
NO_ACTIONS = "NO_ACTIONS"
DUPLICATE_ACTION_ID = "DUPLICATE_ACTION_ID"
UNKNOWN_ACTION_ID = "UNKNOWN_ACTION_ID"
CYCLE = "CYCLE"
END_BEFORE_START = "END_BEFORE_START"
OUTPUT_PATH_REQUIRED = "OUTPUT_PATH_REQUIRED"
UNMANAGED_NOT_DETERMINISTIC = "UNMANAGED_NOT_DETERMINISTIC"
TOO_LARGE = "TOO_LARGE"

#: Every code `validate` may return.
CODES: tuple[str, ...] = (
    MALFORMED_JSON,
    SCHEMA_VIOLATION,
    UNKNOWN_ACTION_TYPE,
    NO_ACTIONS,
    DUPLICATE_ACTION_ID,
    UNKNOWN_ACTION_ID,
    CYCLE,
    END_BEFORE_START,
    OUTPUT_PATH_REQUIRED,
    UNMANAGED_NOT_DETERMINISTIC,
    TOO_LARGE,
)

#: Key of `WorkflowDefinition.graph.graph` holding the action ids in a topological
#: order (parents first), computed while checking for cycles and reused by `ids`.
TOPOLOGICAL_ORDER = "topological_order"


def parse(
    document: bytes | str | Mapping[str, Any],
    *,
    max_actions: int = 100_000,
    action_types: Mapping[str, action_types.ActionType] | None = None,
) -> WorkflowDefinition:
    """Parse and validate a workflow; raise `ValidationFailed` listing every issue."""
    issues, definition = _analyse(document, max_actions, action_types)
    if definition is None:
        raise errors.ValidationFailed(issues)
    return definition


def validate(
    document: bytes | str | Mapping[str, Any],
    *,
    max_actions: int = 100_000,
    action_types: Mapping[str, action_types.ActionType] | None = None,
) -> list[ValidationIssue]:
    """Every issue of a workflow document; an empty list means it is valid."""
    # Only the issues: no definition (and no graph) is built.
    issues, _ = _analyse(document, max_actions, action_types, build=False)
    return issues


# -- schema validators ---------------------------------------------------------


class _Checker:
    """A compiled schema: a fast exact predicate when the schema allows one, and
    jsonschema, the authority, which explains what the predicate rejects.

    jsonschema is imported and its validator built only when the predicate rejects
    (or cannot judge) a document: `pingo validate` of a valid file never pays for it.
    """

    __slots__ = ("_validator", "fast", "schema")

    def __init__(self, schema: Mapping[str, Any], fast: _schema.Predicate | None) -> None:
        self.schema = schema
        self.fast = fast
        self._validator: Any = None

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> _Checker:
        return cls(schema, _schema.compile_predicate(schema, schema))

    @property
    def validator(self) -> Any:
        if self._validator is None:
            import jsonschema

            self._validator = jsonschema.Draft202012Validator(self.schema)
        return self._validator

    def issues(self, instance: Any, base: str) -> Iterator[ValidationIssue]:
        # The happy path builds no error objects.
        if self.fast is not None and self.fast(instance):
            return
        if self.validator.is_valid(instance):
            return
        yield from _explain(self.validator, instance, base)


@dataclass(frozen=True, slots=True)
class _Validators:
    """The compiled checkers for one set of action types."""

    top: _Checker
    #: For an action whose type is missing or unknown: the common fields only.
    common: _Checker
    by_type: Mapping[str, _Checker]
    types: Mapping[str, action_types.ActionType]


def _top_schema(root: Mapping[str, Any]) -> dict[str, Any]:
    # Actions are validated one by one with their type's validator, so the top
    # level only needs to know that `actions` is an array.
    schema = dict(root)
    schema["properties"] = {**root["properties"], "actions": {"type": "array"}}
    return schema


def _action_schema(root: Mapping[str, Any], atype: action_types.ActionType) -> dict[str, Any]:
    """The schema of a whole action of type `atype`: common fields plus the type's own."""
    common = root["$defs"]["actionCommon"]
    own = atype.schema
    flat_keys = {"type", "properties", "required", "description", "title", "$comment"}
    if set(own) <= flat_keys and own.get("type", "object") == "object":
        # Flattened, so that unknown fields are caught by the fast
        # `additionalProperties` rather than `unevaluatedProperties`.
        return {
            "$defs": root["$defs"],
            "type": "object",
            "required": [*common["required"], *own.get("required", [])],
            "properties": {
                **own.get("properties", {}),
                **common["properties"],
                "type": {"const": atype.name},
            },
            "additionalProperties": False,
        }
    return {
        "$defs": root["$defs"],
        "type": "object",
        "allOf": [{"$ref": "#/$defs/actionCommon"}, dict(own)],
        "properties": {"type": {"const": atype.name}},
        "unevaluatedProperties": False,
    }


@functools.lru_cache(maxsize=16)
def _compile(types_key: tuple[action_types.ActionType, ...]) -> _Validators:
    root = _schema.workflow_schema()
    common = {"$defs": root["$defs"], "$ref": "#/$defs/actionCommon"}
    return _Validators(
        top=_Checker.of(_top_schema(root)),
        common=_Checker.of(common),
        by_type={t.name: _Checker.of(_action_schema(root, t)) for t in types_key},
        types={t.name: t for t in types_key},
    )


def _validators(types: Mapping[str, action_types.ActionType] | None) -> _Validators:
    if types is None:
        types = action_types.load_action_types()
    return _compile(tuple(types[name] for name in sorted(types)))


def _pointer(base: str, path: Sequence[object]) -> str:
    return base + "".join("/" + untrusted.pointer_token(p) for p in path)


def _explain(validator: Any, instance: Any, base: str) -> Iterator[ValidationIssue]:
    for error in validator.iter_errors(instance):
        where = _pointer(base, list(error.absolute_path))
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            # One issue per unknown field, pointing at the field itself.
            known = error.schema.get("properties", {})
            for key in error.instance:
                if key not in known:
                    yield ValidationIssue(
                        SCHEMA_VIOLATION,
                        f"unknown field {key!r} (free-form data belongs in an action's metadata)",
                        f"{where}/{untrusted.pointer_token(key)}",
                    )
            continue
        if "propertyNames" in error.relative_schema_path and isinstance(error.instance, str):
            # jsonschema points at the object; the culprit is one of its keys.
            where = f"{where}/{untrusted.pointer_token(error.instance)}"
        message = error.message
        if error.validator == "pattern" and "description" in error.schema:
            # "'a\x00' does not match '^[^\\u0000]*$'" says less than the rule itself.
            message = f"{error.instance!r} is not allowed: {error.schema['description']}"
        yield ValidationIssue(SCHEMA_VIOLATION, message, where)


# -- analysis --------------------------------------------------------------------


def _decode(document: bytes | str | Mapping[str, Any]) -> tuple[Any, ValidationIssue | None]:
    if isinstance(document, Mapping):
        return document, None
    try:
        return untrusted.loads(document), None
    except untrusted.MalformedJSON as exc:
        return None, ValidationIssue(MALFORMED_JSON, f"not valid JSON: {exc}", exc.pointer)
    except TypeError as exc:  # not text at all (an already parsed array, a number)
        return None, ValidationIssue(MALFORMED_JSON, f"not valid JSON: {exc}", "")


def _as_id(value: Any) -> int | None:
    """An action id as an int, or None when `value` is not one (JSON Schema's `integer`)."""
    return untrusted.json_integer(value)


def _analyse(
    document: bytes | str | Mapping[str, Any],
    max_actions: int,
    types: Mapping[str, action_types.ActionType] | None,
    *,
    build: bool = True,
) -> tuple[list[ValidationIssue], WorkflowDefinition | None]:
    # A 100,000-action document allocates millions of dicts and lists, none of them
    # garbage: full collections would walk them all again and again (twice the parse
    # time). Young collections go on, so none walks them all at once afterwards
    # (turning the collector off left them for two 100 ms young collections, issue 13).
    with heap.full_collections_deferred():
        return _analyse_document(document, max_actions, types, build=build)


def _analyse_document(
    document: bytes | str | Mapping[str, Any],
    max_actions: int,
    types: Mapping[str, action_types.ActionType] | None,
    *,
    build: bool = True,
) -> tuple[list[ValidationIssue], WorkflowDefinition | None]:
    doc, malformed = _decode(document)
    if malformed is not None:
        return [malformed], None
    if isinstance(doc, Mapping) and not isinstance(doc, dict):
        doc = dict(doc)  # JSON Schema's "object" is a dict to jsonschema
    if not isinstance(doc, Mapping):
        kind = type(doc).__name__ if doc is not None else "null"
        return [
            ValidationIssue(SCHEMA_VIOLATION, f"a workflow is a JSON object, not {kind}", "")
        ], None
    actions = doc.get("actions")
    # Checked first so that an oversized document costs nothing more.
    if isinstance(actions, list) and len(actions) > max_actions:
        return [
            ValidationIssue(
                TOO_LARGE,
                f"{len(actions)} actions is over the limit of {max_actions}",
                "/actions",
            )
        ], None

    compiled = _validators(types)
    issues: list[ValidationIssue] = list(compiled.top.issues(doc, ""))
    if not isinstance(actions, list):
        return issues, None  # the top-level schema already said so
    if not actions:
        issues.append(
            ValidationIssue(NO_ACTIONS, "a workflow needs at least one action", "/actions")
        )

    known_types = compiled.types
    by_type = compiled.by_type
    for index, action in enumerate(actions):
        base = f"/actions/{index}"
        if not isinstance(action, dict):
            issues.append(ValidationIssue(SCHEMA_VIOLATION, "an action is a JSON object", base))
            continue
        atype = action.get("type")
        checker = by_type.get(atype) if isinstance(atype, str) else None
        if checker is None:
            if isinstance(atype, str) and atype:
                issues.append(
                    ValidationIssue(
                        UNKNOWN_ACTION_TYPE,
                        f"unknown action type {atype!r}; known types: "
                        + ", ".join(sorted(known_types)),
                        f"{base}/type",
                    )
                )
            checker = compiled.common
        issues.extend(checker.issues(action, base))

    checked = _check_graph(doc, actions, _may_hold_placeholders(document))
    issues.extend(checked.issues)
    if issues or not build:
        return issues, None
    return [], _build(doc, actions, known_types, checked)


@dataclass(slots=True)
class _Checked:
    """What the semantic checks learnt about the actions."""

    issues: list[ValidationIssue]
    #: Index in `actions` of the (first) action with each id.
    index_of: dict[int, int]
    #: Known parent ids of each action, sorted, without duplicates.
    parents: dict[int, tuple[int, ...]]
    #: Action ids, parents first; partial when there is a cycle.
    order: list[int]


def _parent_ids(action: Mapping[str, Any]) -> list[int | None]:
    """The id of each `parentActions` entry, None where the entry is malformed."""
    entries = action.get("parentActions")
    if type(entries) is not list:
        return []
    pids = [entry.get("id") if type(entry) is dict else None for entry in entries]
    if all(type(pid) is int for pid in pids):
        return pids
    return [_as_id(pid) for pid in pids]


def _may_hold_placeholders(document: bytes | str | Mapping[str, Any]) -> bool:
    """False only when the raw text surely holds no `{input:` (a cheap substring search)."""
    if isinstance(document, str):
        return "{input:" in document or "\\u" in document
    if isinstance(document, bytes | bytearray):
        # UTF-16/32 text (NUL bytes) or \u escapes could hide one from a byte search.
        return b"{input:" in document or b"\\u" in document or b"\x00" in document[:4]
    return True


def _check_graph(doc: Mapping[str, Any], actions: list[Any], placeholders: bool) -> _Checked:
    """The semantic rules, on every part of the document well-formed enough to check."""
    issues: list[ValidationIssue] = []
    index_of: dict[int, int] = {}
    pids_at: list[list[int | None]] = []
    for index, action in enumerate(actions):
        if type(action) is not dict:
            pids_at.append([])
            continue
        pids_at.append(_parent_ids(action))
        aid = action.get("id")
        if type(aid) is not int:
            aid = _as_id(aid)
            if aid is None:
                continue
        first = index_of.setdefault(aid, index)
        if first != index:
            issues.append(
                ValidationIssue(
                    DUPLICATE_ACTION_ID,
                    f"action id {aid} is already used by /actions/{first}",
                    f"/actions/{index}/id",
                )
            )
        if action.get("isManaged") is False and "outputPath" not in action:
            issues.append(
                ValidationIssue(
                    OUTPUT_PATH_REQUIRED,
                    f"action {aid} has isManaged false, so it needs an outputPath",
                    f"/actions/{index}",
                )
            )
        if action.get("isManaged") is False and action.get("isDeterministic") is False:
            # Each run would be a dataset of its own at the one path: deleting an old
            # one would remove the newest output.
            issues.append(
                ValidationIssue(
                    UNMANAGED_NOT_DETERMINISTIC,
                    f"action {aid} has isManaged false, so its output is its outputPath and"
                    " cannot be computed anew as a dataset of its own at every run: make it"
                    " managed, or use forceComputation",
                    f"/actions/{index}/isDeterministic",
                )
            )

    for key in ("startActionId", "endActionId"):
        ref = _as_id(doc.get(key))
        # With no action at all, NO_ACTIONS already says everything.
        if ref is not None and actions and ref not in index_of:
            issues.append(ValidationIssue(UNKNOWN_ACTION_ID, f"no action has id {ref}", f"/{key}"))

    known: list[tuple[int, ...]] = []
    for index, pids in enumerate(pids_at):
        if all(pid in index_of for pid in pids):
            known.append(tuple(sorted(set(pids))))  # type: ignore[arg-type]
            continue
        for position, pid in enumerate(pids):
            if pid is not None and pid not in index_of:
                issues.append(
                    ValidationIssue(
                        UNKNOWN_ACTION_ID,
                        f"parent action {pid} is not defined",
                        f"/actions/{index}/parentActions/{position}/id",
                    )
                )
        known.append(tuple(sorted({pid for pid in pids if pid is not None and pid in index_of})))
    parents = {aid: known[index] for aid, index in index_of.items()}
    if placeholders:
        for index, action in enumerate(actions):
            if type(action) is dict:
                declared = {pid for pid in pids_at[index] if pid is not None}
                issues.extend(_placeholder_issues(action, declared, f"/actions/{index}"))

    order = _topological_order(parents)
    checked = _Checked(issues, index_of, parents, order)
    if len(order) < len(parents):
        issues.append(_cycle_issue(checked, actions))
        return checked

    start, end = _as_id(doc.get("startActionId")), _as_id(doc.get("endActionId"))
    if start in parents and end in parents and start != end and _is_ancestor(end, start, parents):
        issues.append(
            ValidationIssue(
                END_BEFORE_START,
                f"the end action {end} is an ancestor of the start action {start}",
                "/endActionId",
            )
        )
    return checked


#: `{input:<parentId>}` in a type-specific string: the path of that parent's dataset.
INPUT_PLACEHOLDER = re.compile(r"\{input:(\d+)\}")


def _placeholder_issues(
    action: Mapping[str, Any], parents: set[int], base: str
) -> Iterator[ValidationIssue]:
    """`{input:<id>}` placeholders naming an action that is not a parent of this one."""
    common = action_types.common_fields()
    for key, value in action.items():
        if key in common:
            continue
        for where, text in _strings(value, f"{base}/{untrusted.pointer_token(key)}"):
            for match in INPUT_PLACEHOLDER.finditer(text):
                if int(match.group(1)) not in parents:
                    yield ValidationIssue(
                        UNKNOWN_ACTION_ID,
                        f"{match.group(0)} names action {match.group(1)}, "
                        "which is not a parent of this action",
                        where,
                    )


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string inside `value` that holds an input placeholder, with its pointer."""
    if isinstance(value, str):
        if "{input:" in value:
            yield where, value
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}/{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}/{untrusted.pointer_token(key)}")


def _topological_order(parents: Mapping[int, tuple[int, ...]]) -> list[int]:
    """Kahn's algorithm, parents first; actions on or behind a cycle are left out."""
    pending = {aid: len(pids) for aid, pids in parents.items()}
    children: dict[int, list[int]] = {aid: [] for aid in parents}
    for aid, pids in parents.items():
        for pid in pids:
            children[pid].append(aid)
    ready = deque(aid for aid, count in pending.items() if count == 0)
    order: list[int] = []
    while ready:
        aid = ready.popleft()
        order.append(aid)
        for child in children[aid]:
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    return order


def _cycle_issue(checked: _Checked, actions: list[Any]) -> ValidationIssue:
    """One cycle among the actions Kahn's algorithm could not order."""
    ordered = set(checked.order)
    stuck = {aid for aid in checked.parents if aid not in ordered}
    # Walking parent links from any action on or behind a cycle must reach the
    # cycle: such an action keeps at least one parent that is itself stuck.
    current = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = min(pid for pid in checked.parents[current] if pid in stuck)
    cycle = path[seen[current] :]  # each element's parent is the next one
    cycle.reverse()  # now parent → child
    first = cycle.index(min(cycle))  # shown from its smallest id, for stable messages
    cycle = cycle[first:] + cycle[:first]
    child, parent = cycle[0], cycle[-1]
    index = checked.index_of[child]
    position = _parent_ids(actions[index]).index(parent)
    shown = " → ".join(str(a) for a in [*cycle, cycle[0]])
    return ValidationIssue(
        CYCLE,
        f"actions {shown} form a cycle",
        f"/actions/{index}/parentActions/{position}/id",
    )


def _is_ancestor(candidate: int, of: int, parents: Mapping[int, tuple[int, ...]]) -> bool:
    seen = {of}
    stack = [of]
    while stack:
        for pid in parents[stack.pop()]:
            if pid == candidate:
                return True
            if pid not in seen:
                seen.add(pid)
                stack.append(pid)
    return False


def _digraph(nodes: Sequence[int], parents: Mapping[int, tuple[int, ...]]) -> nx.DiGraph:
    """The DAG, edges parent → child, as networkx would build it from `add_edges_from`."""
    # Imported here: validating (`pingo validate`) needs no graph, only parsing does.
    import networkx as nx

    graph = nx.DiGraph()
    succ, pred, node = graph._succ, graph._pred, graph._node
    if not (
        type(succ) is dict and type(pred) is dict and type(node) is dict and graph._adj is succ
    ):
        # A networkx whose storage differs from the documented dict-of-dicts.
        graph.add_nodes_from(nodes)
        graph.add_edges_from((p, c) for c in nodes for p in parents[c])
        return graph
    # add_edges_from costs about 3 µs an edge (0.6 s for 200,000), most of it
    # generic bookkeeping; filling the documented adjacency dicts directly, with
    # one shared attribute dict per edge as networkx does, is five times faster.
    for aid in nodes:
        succ[aid] = {}
        pred[aid] = {}
        node[aid] = {}
    for child in nodes:
        into = pred[child]
        for parent in parents[child]:
            data: dict[str, Any] = {}
            succ[parent][child] = data
            into[parent] = data
    return graph


def _build(
    doc: Mapping[str, Any],
    actions: list[dict[str, Any]],
    types: Mapping[str, action_types.ActionType],
    checked: _Checked,
) -> WorkflowDefinition:
    definitions: dict[int, ActionDefinition] = {}
    empty: Mapping[str, Any] = MappingProxyType({})
    for aid in sorted(checked.index_of):
        raw = actions[checked.index_of[aid]]
        timeout = raw.get("timeoutSeconds")
        attempts = raw.get("maxAttempts")
        metadata = raw.get("metadata")
        definitions[aid] = ActionDefinition(
            id=aid,
            name=raw["name"],
            type=raw["type"],
            parents=checked.parents[aid],
            force_computation=raw.get("forceComputation", False),
            is_managed=raw.get("isManaged", True),
            output_path=raw.get("outputPath"),
            timeout_s=float(timeout) if timeout is not None else None,
            max_attempts=int(attempts) if attempts is not None else None,
            metadata=empty if metadata is None else MappingProxyType(metadata),
            spec=MappingProxyType(types[raw["type"]].spec(raw)),
            raw=MappingProxyType(raw),
            run=None if raw.get("isDeterministic", True) else secrets.token_hex(16),
        )
    graph = _digraph(list(definitions), checked.parents)
    graph.graph[TOPOLOGICAL_ORDER] = tuple(checked.order)
    start = _as_id(doc["startActionId"])
    end = _as_id(doc["endActionId"])
    assert start is not None and end is not None  # the schema said they are integers
    return WorkflowDefinition(
        name=doc["name"],
        description=doc.get("description"),
        start_action_id=start,
        end_action_id=end,
        on_failure=doc.get("onFailure", "abort"),
        actions=MappingProxyType(definitions),
        graph=graph,
        document=doc,
    )
