"""The workflow language: every rule, with documents it accepts and documents it rejects."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingo import errors
from pingo.workflows import _schema, action_types, language
from pingo.workflows.definition import WorkflowDefinition


def action(aid: int, *parents: int, **fields: Any) -> dict[str, Any]:
    """A command-line action with `fields` overriding the defaults."""
    doc: dict[str, Any] = {
        "id": aid,
        "name": f"a{aid}",
        "type": "command-line",
        "command": ["true"],
    }
    if parents:
        doc["parentActions"] = [{"id": p} for p in parents]
    doc.update(fields)
    return doc


def workflow(*actions: dict[str, Any], **fields: Any) -> dict[str, Any]:
    ids = [a["id"] for a in actions]
    doc: dict[str, Any] = {
        "name": "wf",
        "startActionId": ids[0] if ids else 1,
        "endActionId": ids[-1] if ids else 1,
        "actions": list(actions),
    }
    doc.update(fields)
    return doc


def codes(document: Any, **kwargs: Any) -> list[tuple[str, str]]:
    return [(i.code, i.pointer) for i in language.validate(document, **kwargs)]


DESIGN_EXAMPLE = {
    "name": "daily-clicks",
    "startActionId": 1,
    "endActionId": 2,
    "actions": [
        {
            "id": 1,
            "name": "extract",
            "type": "command-line",
            "command": ["python", "extract.py", "--out", "{output}"],
        },
        {
            "id": 2,
            "name": "count",
            "type": "command-line",
            "parentActions": [{"id": 1}],
            "command": ["python", "count.py", "{input:1}", "{output}"],
        },
    ],
}


# -- accepted documents --------------------------------------------------------------


def test_design_example_parses_into_a_definition() -> None:
    definition = language.parse(DESIGN_EXAMPLE)
    assert isinstance(definition, WorkflowDefinition)
    assert definition.name == "daily-clicks"
    assert (definition.start_action_id, definition.end_action_id) == (1, 2)
    assert definition.on_failure == "abort"
    assert definition.description is None
    assert list(definition.actions) == [1, 2]
    count = definition.actions[2]
    assert count.parents == (1,)
    assert dict(count.spec) == {"command": ["python", "count.py", "{input:1}", "{output}"]}
    assert (count.force_computation, count.is_managed, count.output_path) == (False, True, None)
    assert (count.timeout_s, count.max_attempts, dict(count.metadata)) == (None, None, {})
    assert list(definition.graph.edges) == [(1, 2)]
    assert definition.children(1) == (2,) and definition.leaves() == (2,)
    assert definition.document is DESIGN_EXAMPLE


@pytest.mark.parametrize("encode", [json.dumps, lambda d: json.dumps(d).encode(), lambda d: d])
def test_parse_accepts_bytes_str_and_mappings(encode: Any) -> None:
    assert language.parse(encode(DESIGN_EXAMPLE)).actions[2].parents == (1,)


def test_optional_fields_are_carried() -> None:
    doc = workflow(
        action(
            1,
            forceComputation=True,
            isManaged=False,
            outputPath="/data/out",
            timeoutSeconds=1.5,
            maxAttempts=3,
            metadata={"anything": {"goes": [1, None]}},
            env={"A": "b"},
        ),
        description="why",
        onFailure="continue",
    )
    definition = language.parse(doc)
    a = definition.actions[1]
    assert (a.force_computation, a.is_managed, a.output_path) == (True, False, "/data/out")
    assert (a.timeout_s, a.max_attempts) == (1.5, 3)
    assert dict(a.metadata) == {"anything": {"goes": [1, None]}}
    assert dict(a.spec) == {"command": ["true"], "env": {"A": "b"}}
    assert (definition.description, definition.on_failure) == ("why", "continue")


def test_parents_are_sorted_and_unique_and_the_graph_points_parent_to_child() -> None:
    doc = workflow(action(1), action(2), action(3, 2, 1, 2), start=None)
    doc.pop("start")
    definition = language.parse(doc)
    assert definition.actions[3].parents == (1, 2)
    assert sorted(definition.graph.edges) == [(1, 3), (2, 3)]
    assert definition.graph.graph[language.TOPOLOGICAL_ORDER][-1] == 3


def test_definition_is_read_only() -> None:
    a = language.parse(DESIGN_EXAMPLE).actions[1]
    with pytest.raises(TypeError):
        a.spec["command"] = ["x"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        a.name = "other"  # type: ignore[misc]


def test_a_single_action_may_be_both_start_and_end() -> None:
    assert codes(workflow(action(7))) == []


def test_integral_floats_are_integers_as_in_json_schema() -> None:
    definition = language.parse(workflow(action(1), action(2.0, 1.0)))  # type: ignore[arg-type]
    assert definition.actions[2].parents == (1,)
    assert definition.end_action_id == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "command-line", "command": ["a", "b"], "env": {"K": "v"}},
        {"type": "mapreduce-v1", "jar": "wc.jar"},
        {
            "type": "mapreduce-v1",
            "jar": "wc.jar",
            "mainClass": "WordCount",
            "arguments": ["{input:1}", "{output}"],
            "configuration": {"mapreduce.job.reduces": "4"},
            "queue": "batch",
        },
        {"type": "mapreduce-v2", "jar": "wc.jar", "arguments": [], "configuration": {}},
        {"type": "spark", "application": "job.py"},
        {
            "type": "spark",
            "application": "job.jar",
            "mainClass": "Job",
            "arguments": ["--in", "{input:1}"],
            "conf": {"spark.executor.memory": "2g"},
        },
    ],
)
def test_every_action_type_accepts_its_fields(fields: dict[str, Any]) -> None:
    doc = workflow(action(1), {"id": 2, "name": "t", "parentActions": [{"id": 1}], **fields})
    assert codes(doc) == []
    assert dict(language.parse(doc).actions[2].spec) == {
        k: v for k, v in fields.items() if k != "type"
    }


# -- rejected documents: one rule at a time ------------------------------------------

REJECTED: list[tuple[str, Any, list[tuple[str, str]]]] = [
    ("not json", b'{"name": ', [("MALFORMED_JSON", "")]),
    ("not utf-8", b'{"name": "\xff"}', [("MALFORMED_JSON", "")]),
    ("NaN is not JSON", '{"name": NaN}', [("MALFORMED_JSON", "")]),
    ("top level array", "[]", [("SCHEMA_VIOLATION", "")]),
    ("top level null", "null", [("SCHEMA_VIOLATION", "")]),
    (
        "missing name",
        {k: v for k, v in workflow(action(1)).items() if k != "name"},
        [("SCHEMA_VIOLATION", "")],
    ),
    ("unknown top-level field", workflow(action(1), owner="x"), [("SCHEMA_VIOLATION", "/owner")]),
    ("bad onFailure", workflow(action(1), onFailure="retry"), [("SCHEMA_VIOLATION", "/onFailure")]),
    (
        "actions not a list",
        {**workflow(action(1)), "actions": {}},
        [("SCHEMA_VIOLATION", "/actions")],
    ),
    (
        "start not an int",
        workflow(action(1), startActionId="1"),
        [("SCHEMA_VIOLATION", "/startActionId")],
    ),
    (
        "start is a bool",
        workflow(action(1), startActionId=True),
        [("SCHEMA_VIOLATION", "/startActionId")],
    ),
    (
        "action not an object",
        workflow(action(1), endActionId=1) | {"actions": [action(1), 3]},
        [("SCHEMA_VIOLATION", "/actions/1")],
    ),
    (
        "unknown action field",
        workflow(action(1, owner="x")),
        [("SCHEMA_VIOLATION", "/actions/0/owner")],
    ),
    (
        "field of another type",
        workflow(action(1, jar="x.jar")),
        [("SCHEMA_VIOLATION", "/actions/0/jar")],
    ),
    (
        "missing command",
        workflow({"id": 1, "name": "a", "type": "command-line"}),
        [("SCHEMA_VIOLATION", "/actions/0")],
    ),
    (
        "empty command",
        workflow(action(1, command=[])),
        [("SCHEMA_VIOLATION", "/actions/0/command")],
    ),
    (
        "command not strings",
        workflow(action(1, command=["a", 1])),
        [("SCHEMA_VIOLATION", "/actions/0/command/1")],
    ),
    (
        "env not strings",
        workflow(action(1, env={"A": 1})),
        [("SCHEMA_VIOLATION", "/actions/0/env/A")],
    ),
    (
        "missing jar",
        workflow({"id": 1, "name": "a", "type": "mapreduce-v2"}),
        [("SCHEMA_VIOLATION", "/actions/0")],
    ),
    (
        "configuration not strings",
        workflow(
            {"id": 1, "name": "a", "type": "mapreduce-v1", "jar": "j", "configuration": {"k": 2}}
        ),
        [("SCHEMA_VIOLATION", "/actions/0/configuration/k")],
    ),
    (
        "missing application",
        workflow({"id": 1, "name": "a", "type": "spark"}),
        [("SCHEMA_VIOLATION", "/actions/0")],
    ),
    (
        "spark has no configuration",
        workflow(
            {"id": 1, "name": "a", "type": "spark", "application": "a.py", "configuration": {}}
        ),
        [("SCHEMA_VIOLATION", "/actions/0/configuration")],
    ),
    (
        "id not an int",
        workflow(action(1), action(2, 1)) | {"actions": [action(1), action(2, 1, id="2")]},
        [("SCHEMA_VIOLATION", "/actions/1/id"), ("UNKNOWN_ACTION_ID", "/endActionId")],
    ),
    (
        "name missing",
        workflow({"id": 1, "type": "command-line", "command": ["x"]}),
        [("SCHEMA_VIOLATION", "/actions/0")],
    ),
    (
        "timeout zero",
        workflow(action(1, timeoutSeconds=0)),
        [("SCHEMA_VIOLATION", "/actions/0/timeoutSeconds")],
    ),
    (
        "maxAttempts zero",
        workflow(action(1, maxAttempts=0)),
        [("SCHEMA_VIOLATION", "/actions/0/maxAttempts")],
    ),
    (
        "forceComputation not bool",
        workflow(action(1, forceComputation="yes")),
        [("SCHEMA_VIOLATION", "/actions/0/forceComputation")],
    ),
    (
        "metadata not an object",
        workflow(action(1, metadata=[])),
        [("SCHEMA_VIOLATION", "/actions/0/metadata")],
    ),
    (
        "parent entry with extra field",
        workflow(action(1), action(2, parentActions=[{"id": 1, "x": 0}])),
        [("SCHEMA_VIOLATION", "/actions/1/parentActions/0/x")],
    ),
    (
        "unknown type",
        workflow(action(1, type="hive")),
        [("UNKNOWN_ACTION_TYPE", "/actions/0/type")],
    ),
    (
        "type missing",
        workflow({"id": 1, "name": "a", "command": ["x"]}),
        [("SCHEMA_VIOLATION", "/actions/0")],
    ),
    ("no actions", workflow() | {"actions": []}, [("NO_ACTIONS", "/actions")]),
    (
        "duplicate id",
        workflow(action(1), action(1, name="again")),
        [("DUPLICATE_ACTION_ID", "/actions/1/id")],
    ),
    (
        "unknown start",
        workflow(action(1), startActionId=5),
        [("UNKNOWN_ACTION_ID", "/startActionId")],
    ),
    ("unknown end", workflow(action(1), endActionId=5), [("UNKNOWN_ACTION_ID", "/endActionId")]),
    (
        "unknown parent",
        workflow(action(1), action(2, 1, 9)),
        [("UNKNOWN_ACTION_ID", "/actions/1/parentActions/1/id")],
    ),
    (
        "placeholder of a non-parent",
        workflow(action(1), action(2, command=["cat", "{input:1}"])),
        [("UNKNOWN_ACTION_ID", "/actions/1/command/1")],
    ),
    ("self parent", workflow(action(1, 1)), [("CYCLE", "/actions/0/parentActions/0/id")]),
    (
        "two-cycle",
        workflow(action(1), action(2, 1, 3), action(3, 2), endActionId=3),
        [("CYCLE", "/actions/1/parentActions/1/id")],
    ),
    (
        "end before start",
        workflow(action(1), action(2, 1), startActionId=2, endActionId=1),
        [("END_BEFORE_START", "/endActionId")],
    ),
    (
        "unmanaged without outputPath",
        workflow(action(1, isManaged=False)),
        [("OUTPUT_PATH_REQUIRED", "/actions/0")],
    ),
]


@pytest.mark.parametrize(
    ("document", "expected"), [(d, e) for _, d, e in REJECTED], ids=[n for n, _, _ in REJECTED]
)
def test_rejected(document: Any, expected: list[tuple[str, str]]) -> None:
    assert codes(document) == expected
    with pytest.raises(errors.ValidationFailed) as caught:
        language.parse(document)
    assert [(i.code, i.pointer) for i in caught.value.issues] == expected


def test_malformed_json_keeps_its_code_on_the_exception() -> None:
    with pytest.raises(errors.ValidationFailed) as caught:
        language.parse("{")
    assert caught.value.code == "MALFORMED_JSON"
    assert "line 1 column 2" in caught.value.issues[0].message


def test_cycle_message_names_one_cycle() -> None:
    doc = workflow(action(1), action(2, 1, 4), action(3, 2), action(4, 3), action(5, 4))
    [issue] = language.validate(doc)
    assert issue.code == "CYCLE"
    assert issue.message == "actions 2 → 3 → 4 → 2 form a cycle"


def test_self_parent_message() -> None:
    [issue] = language.validate(workflow(action(1), action(2, 1, 2)))
    assert issue.message == "actions 2 → 2 form a cycle"


def test_end_may_be_unrelated_to_start() -> None:
    assert codes(workflow(action(1), action(2), startActionId=2, endActionId=1)) == []


def test_unknown_type_lists_known_types_instead_of_every_schema() -> None:
    [issue] = language.validate(workflow(action(1, type="hive", query="select 1")))
    assert issue.message.startswith("unknown action type 'hive'; known types: command-line")


def test_unmanaged_with_output_path_is_accepted() -> None:
    assert codes(workflow(action(1, isManaged=False, outputPath="/mine"))) == []


def test_metadata_accepts_anything() -> None:
    meta = {"owner": "x", "nested": {"a": [1, 2, {"b": None}]}, "n": 1.5}
    assert codes(workflow(action(1, metadata=meta))) == []


def test_every_error_is_reported_at_once() -> None:
    doc = workflow(
        action(1, command=[]),
        action(2, 1, 9, type="hive"),
        action(2, owner="me"),
        action(3, 3, isManaged=False),
        endActionId=8,
        extra=True,
    )
    assert codes(doc) == [
        ("SCHEMA_VIOLATION", "/extra"),
        ("SCHEMA_VIOLATION", "/actions/0/command"),
        ("UNKNOWN_ACTION_TYPE", "/actions/1/type"),
        ("SCHEMA_VIOLATION", "/actions/2/owner"),
        ("DUPLICATE_ACTION_ID", "/actions/2/id"),
        ("OUTPUT_PATH_REQUIRED", "/actions/3"),
        ("UNKNOWN_ACTION_ID", "/endActionId"),
        ("UNKNOWN_ACTION_ID", "/actions/1/parentActions/1/id"),
        ("CYCLE", "/actions/3/parentActions/0/id"),
    ]


def test_semantic_checks_still_run_on_actions_with_schema_errors() -> None:
    # Action 1's command is wrong, but it is still defined for its child.
    assert codes(workflow(action(1, command=[]), action(2, 1))) == [
        ("SCHEMA_VIOLATION", "/actions/0/command")
    ]


def test_pointer_escapes_slash_and_tilde() -> None:
    [issue] = language.validate(workflow(action(1, env={"a/b~c": 1})))
    assert issue.pointer == "/actions/0/env/a~1b~0c"


@pytest.mark.parametrize(("count", "limit", "too_large"), [(3, 3, False), (4, 3, True)])
def test_too_large(count: int, limit: int, too_large: bool) -> None:
    doc = workflow(*(action(i) for i in range(1, count + 1)))
    expected = [("TOO_LARGE", "/actions")] if too_large else []
    assert codes(doc, max_actions=limit) == expected


def test_too_large_is_checked_before_anything_else() -> None:
    doc = workflow(*(action(1, type="hive") for _ in range(5)), extra=1)
    assert codes(doc, max_actions=2) == [("TOO_LARGE", "/actions")]


# -- action types are plug-ins -------------------------------------------------------


def test_builtin_types_come_from_the_entry_points() -> None:
    loaded = action_types.load_action_types()
    assert {"command-line", "mapreduce-v1", "mapreduce-v2", "spark"} <= set(loaded)
    assert loaded["spark"] is action_types.SPARK
    assert action_types.COMMAND_LINE.schema == _schema.workflow_schema()["$defs"]["command-line"]


SQL = action_types.ActionType(
    name="sql",
    schema={
        "type": "object",
        "required": ["query"],
        "properties": {"query": {"type": "string"}, "params": {"$ref": "#/$defs/stringMap"}},
    },
)


def test_a_plugin_type_brings_its_schema() -> None:
    plugged = {**action_types.load_action_types(), "sql": SQL}
    good = workflow({"id": 1, "name": "q", "type": "sql", "query": "select 1", "params": {}})
    definition = language.parse(good, action_types=plugged)
    assert dict(definition.actions[1].spec) == {"query": "select 1", "params": {}}
    bad = workflow({"id": 1, "name": "q", "type": "sql", "query": 1, "command": ["x"]})
    assert sorted(codes(bad, action_types=plugged)) == [
        ("SCHEMA_VIOLATION", "/actions/0/command"),
        ("SCHEMA_VIOLATION", "/actions/0/query"),
    ]
    assert codes(good) == [("UNKNOWN_ACTION_TYPE", "/actions/0/type")]


def test_a_plugin_schema_outside_the_fast_subset_still_validates() -> None:
    pattern = action_types.ActionType(
        name="pattern",
        schema={"type": "object", "properties": {"path": {"type": "string", "pattern": "^/"}}},
    )
    plugged = {"pattern": pattern}
    ok = workflow({"id": 1, "name": "p", "type": "pattern", "path": "/x"})
    bad = workflow({"id": 1, "name": "p", "type": "pattern", "path": "x"})
    assert codes(ok, action_types=plugged) == []
    assert codes(bad, action_types=plugged) == [("SCHEMA_VIOLATION", "/actions/0/path")]


# -- the schema file is the single source ----------------------------------------------


def test_schema_file_is_a_valid_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(_schema.workflow_schema())


SCHEMA_ONLY = [
    d for name, d, e in REJECTED if isinstance(d, dict) and e[0][0] == "SCHEMA_VIOLATION"
]


@pytest.mark.parametrize("document", [DESIGN_EXAMPLE, *SCHEMA_ONLY])
def test_whole_schema_file_agrees_with_the_parser(document: dict[str, Any]) -> None:
    whole = jsonschema.Draft202012Validator(_schema.workflow_schema())
    parser_says_shape_ok = not any(
        i.code in ("SCHEMA_VIOLATION", "UNKNOWN_ACTION_TYPE") for i in language.validate(document)
    )
    assert whole.is_valid(document) == parser_says_shape_ok


# -- the fast predicates agree exactly with jsonschema ---------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.0, 1.0, 2.5, -1.0])
    | st.sampled_from(["", "x", "true", "{input:1}"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["id", "A", "k"]), inner, max_size=2)
    ),
    max_leaves=6,
)
field_names = st.sampled_from(
    ["id", "name", "type", "command", "env", "parentActions", "forceComputation", "isManaged",
     "outputPath", "metadata", "timeoutSeconds", "maxAttempts", "jar", "conf", "bogus"]
)  # fmt: skip


TYPE_FIELDS = {
    "command-line": {"command": ["true"], "env": {"A": "b"}},
    "mapreduce-v1": {"jar": "j.jar", "arguments": ["x"], "configuration": {"k": "v"}},
    "mapreduce-v2": {"jar": "j.jar", "mainClass": "M", "queue": "q"},
    "spark": {"application": "a.py", "conf": {"k": "v"}},
}


@st.composite
def near_actions(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid actions of any type with a few fields replaced by random JSON."""
    kind = draw(st.sampled_from(sorted(TYPE_FIELDS)))
    base = action(draw(st.integers(1, 3)), *draw(st.lists(st.integers(1, 3), max_size=2)))
    del base["command"]
    base.update(type=kind, **copy.deepcopy(TYPE_FIELDS[kind]))
    for name in draw(st.lists(field_names, max_size=3)):
        if draw(st.booleans()):
            base.pop(name, None)
        else:
            base[name] = draw(json_values)
    return base


def _jsonschema_agrees(schema: dict[str, Any], candidate: Any) -> None:
    fast = _schema.compile_predicate(schema, schema)
    assert fast is not None
    assert fast(candidate) == jsonschema.Draft202012Validator(schema).is_valid(candidate)


@settings(max_examples=100, deadline=None)
@given(near_actions())
def test_fast_predicate_matches_jsonschema(candidate: dict[str, Any]) -> None:
    root = _schema.workflow_schema()
    for atype in (
        action_types.COMMAND_LINE,
        action_types.MAPREDUCE_V1,
        action_types.MAPREDUCE_V2,
        action_types.SPARK,
    ):
        _jsonschema_agrees(language._action_schema(root, atype), candidate)
    _jsonschema_agrees({"$defs": root["$defs"], "$ref": "#/$defs/actionCommon"}, candidate)


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["name", "startActionId", "endActionId", "actions", "onFailure", "x"]),
        json_values,
        max_size=5,
    )
)
def test_fast_top_level_predicate_matches_jsonschema(candidate: dict[str, Any]) -> None:
    _jsonschema_agrees(language._top_schema(_schema.workflow_schema()), candidate)


def test_unsupported_keywords_leave_validation_to_jsonschema() -> None:
    assert _schema.compile_predicate({"type": "array", "uniqueItems": True}, {}) is None
    assert _schema.compile_predicate({"$ref": "#/$defs/missing"}, {}) is None
    recursive = {"$defs": {"node": {"items": {"$ref": "#/$defs/node"}}}, "$ref": "#/$defs/node"}
    assert _schema.compile_predicate(recursive, recursive) is None
    assert _schema.compile_predicate({"enum": [1, "a"]}, {}) is None


def test_parse_does_not_change_the_document() -> None:
    doc = workflow(action(1), action(2, 1, metadata={"x": [1]}))
    before = copy.deepcopy(doc)
    language.parse(doc)
    assert doc == before


def test_docs_list_every_error_code() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "language.md"
    documented = re.findall(r"^\| `([A-Z_]+)` \|", docs.read_text(encoding="utf-8"), re.M)
    assert documented == list(language.CODES)


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(workflow(action(1), action(2, command=["cat", "{input:1}"]))),
        json.dumps(workflow(action(1), action(2, command=["cat", "{input:1}"]))).replace(
            "{input:", "\\u007binput:"
        ),
    ],
    ids=["plain", "escaped"],
)
@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_placeholders_are_checked_in_raw_text(text: str, encoding: str) -> None:
    for document in (text, text.encode(encoding)):
        assert codes(document) == [("UNKNOWN_ACTION_ID", "/actions/1/command/1")]


@pytest.mark.parametrize(
    "candidate",
    [
        {"id": 1, "name": "a", "type": "command-line", "command": ["a\x00b"]},
        {"id": 1, "name": "a", "type": "command-line", "command": ["ok"], "env": {"": "x"}},
        {"id": 1, "name": "a", "type": "command-line", "command": ["ok"], "env": {"A=B": "x"}},
        {"id": 1, "name": "a", "type": "command-line", "command": ["ok"], "env": {"A\x00": "x"}},
        {"id": 1, "name": "a", "type": "command-line", "command": ["ok"], "env": {"A": "x\x00"}},
        {"id": 1, "name": "a", "type": "command-line", "command": ["ok"], "env": {"A": "=\n"}},
        {"id": 2**63, "name": "a", "type": "command-line", "command": ["ok"]},
        {"id": -(2**63), "name": "a", "type": "command-line", "command": ["ok"]},
        {"id": 1e300, "name": "a", "type": "command-line", "command": ["ok"]},
        {"id": 1, "name": "a", "type": "command-line", "command": ["ok"], "maxAttempts": 2**63},
    ],
)
def test_fast_predicate_agrees_on_patterns_names_and_ranges(candidate: dict[str, Any]) -> None:
    root = _schema.workflow_schema()
    _jsonschema_agrees(language._action_schema(root, action_types.COMMAND_LINE), candidate)
