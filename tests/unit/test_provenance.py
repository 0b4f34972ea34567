"""Provenance dataset ids: what they depend on, and what they must not depend on."""

from __future__ import annotations

import copy
import random
import re
from typing import Any

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pingo import errors
from pingo.workflows import language, provenance
from pingo.workflows.definition import WorkflowDefinition

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def dataset_ids(document: dict[str, Any], scope: str = "server") -> dict[int, str]:
    return provenance.dataset_ids(language.parse(document), scope)


def two_step(**second: Any) -> dict[str, Any]:
    child = {
        "id": 2,
        "name": "count",
        "type": "command-line",
        "parentActions": [{"id": 1}],
        "command": ["wc", "{input:1}"],
    }
    child.update(second)
    return {
        "name": "wf",
        "startActionId": 1,
        "endActionId": 2,
        "actions": [
            {"id": 1, "name": "extract", "type": "command-line", "command": ["extract"]},
            child,
        ],
    }


def test_ids_are_sha256_hex_and_deterministic() -> None:
    first, second = dataset_ids(two_step()), dataset_ids(two_step())
    assert first == second
    assert all(HEX64.match(v) for v in first.values())
    assert first[1] != first[2]


def test_identity_document_is_what_is_hashed() -> None:
    definition = language.parse(two_step(env={"A": "é"}))
    found = provenance.dataset_ids(definition, "server")
    parent_doc = provenance.identity(definition.actions[1], [], "server")
    assert parent_doc == {
        "type": "command-line",
        "spec": {"command": ["extract"]},
        "parents": [],
        "scope": "server",
    }
    assert provenance.hash_identity(parent_doc) == found[1]
    child_doc = provenance.identity(definition.actions[2], [found[1]], "server")
    assert child_doc["spec"]["command"] == ["wc", "{input:1}"]
    assert child_doc["parents"] == [found[1]]
    assert child_doc["inputs"] == {"1": found[1]}
    assert provenance.hash_identity(child_doc) == found[2]
    # A mapping parent action id → dataset id is accepted too.
    assert provenance.identity(definition.actions[2], {1: found[1]}, "server") == child_doc


def test_canonical_json_is_sorted_compact_and_unescaped() -> None:
    assert provenance.canonical_json({"b": [1, "é"], "a": {}}) == '{"a":{},"b":[1,"é"]}'


def test_identity_rejects_a_wrong_number_of_parent_ids() -> None:
    definition = language.parse(two_step())
    with pytest.raises(ValueError, match="1 parents"):
        provenance.identity(definition.actions[2], [], "server")


def test_scope_is_part_of_the_id() -> None:
    server = dataset_ids(two_step())
    alice = dataset_ids(two_step(), provenance.user_scope("alice"))
    bob = dataset_ids(two_step(), provenance.user_scope("bob"))
    assert len({server[1], alice[1], bob[1]}) == 3
    with pytest.raises(ValueError):
        dataset_ids(two_step(), "")


@pytest.mark.parametrize(
    "change",
    [
        {"name": "renamed"},
        {"metadata": {"owner": "x"}},
        {"forceComputation": True},
        {"timeoutSeconds": 5},
        {"maxAttempts": 9},
    ],
)
def test_non_definition_fields_are_not_part_of_the_id(change: dict[str, Any]) -> None:
    assert dataset_ids(two_step(**change)) == dataset_ids(two_step())


@pytest.mark.parametrize(
    "change",
    [
        {"command": ["wc", "-l", "{input:1}"]},
        {"env": {"LC_ALL": "C"}},
        {"isManaged": False, "outputPath": "/mine"},
        {"type": "spark", "command": None, "application": "count.py"},
    ],
)
def test_definition_fields_are_part_of_the_id(change: dict[str, Any]) -> None:
    document = two_step(**change)
    document["actions"][1] = {k: v for k, v in document["actions"][1].items() if v is not None}
    before, after = dataset_ids(two_step()), dataset_ids(document)
    assert before[1] == after[1] and before[2] != after[2]


def test_unmanaged_output_path_is_part_of_the_id() -> None:
    one = dataset_ids(two_step(isManaged=False, outputPath="/a"))
    other = dataset_ids(two_step(isManaged=False, outputPath="/b"))
    assert one[2] != other[2]


def test_a_definition_built_without_the_cached_order_gets_the_same_ids() -> None:
    definition = language.parse(two_step())
    graph = nx.DiGraph(definition.graph.edges)
    bare = WorkflowDefinition(
        name=definition.name,
        description=None,
        start_action_id=1,
        end_action_id=2,
        on_failure="abort",
        actions=definition.actions,
        graph=graph,
        document=definition.document,
    )
    assert provenance.dataset_ids(bare, "server") == provenance.dataset_ids(definition, "server")


# -- properties ------------------------------------------------------------------------

words = st.sampled_from(["a", "b", "cat", "-n", "x y", "é"])


@st.composite
def workflows(draw: st.DrawFn) -> dict[str, Any]:
    """Small random DAGs of command-line actions numbered 1..n, parents before children."""
    n = draw(st.integers(1, 6))
    actions = []
    for aid in range(1, n + 1):
        parents = (
            draw(st.lists(st.integers(1, aid - 1), unique=True, max_size=3)) if aid > 1 else []
        )
        command = draw(st.lists(words, min_size=1, max_size=3))
        if parents and draw(st.booleans()):
            command.append(f"{{input:{draw(st.sampled_from(parents))}}}")
        action: dict[str, Any] = {
            "id": aid,
            "name": f"n{aid}",
            "type": "command-line",
            "command": command,
        }
        if parents:
            action["parentActions"] = [{"id": p} for p in parents]
        if draw(st.booleans()):
            action["env"] = draw(st.dictionaries(st.sampled_from(["A", "B"]), words, max_size=2))
        if draw(st.integers(0, 4)) == 0:
            action["isManaged"] = False
            action["outputPath"] = f"/out/{draw(words)}"
        actions.append(action)
    return {"name": "prop", "startActionId": 1, "endActionId": n, "actions": actions}


def renumber(document: dict[str, Any], mapping: dict[int, int]) -> dict[str, Any]:
    """The same workflow with action ids (and `{input:N}` placeholders) renumbered."""
    out = copy.deepcopy(document)

    def placeholder(match: re.Match[str]) -> str:
        return "{input:" + str(mapping[int(match.group(1))]) + "}"

    for action in out["actions"]:
        action["id"] = mapping[action["id"]]
        for entry in action.get("parentActions", []):
            entry["id"] = mapping[entry["id"]]
        action["command"] = [
            language.INPUT_PLACEHOLDER.sub(placeholder, arg) for arg in action["command"]
        ]
    out["startActionId"] = mapping[out["startActionId"]]
    out["endActionId"] = mapping[out["endActionId"]]
    return out


@settings(max_examples=75, deadline=None)
@given(workflows(), st.randoms(use_true_random=False))
def test_ids_survive_renaming_metadata_and_reordering(
    document: dict[str, Any], rnd: random.Random
) -> None:
    original = dataset_ids(document)
    changed = copy.deepcopy(document)
    rnd.shuffle(changed["actions"])
    for action in changed["actions"]:
        action["name"] = f"renamed-{rnd.random()}"
        action["metadata"] = {"note": rnd.random(), "tags": ["x"]}
        action["forceComputation"] = rnd.random() < 0.5
        action["maxAttempts"] = rnd.randint(1, 5)
        rnd.shuffle(action.get("parentActions", []))
    assert dataset_ids(changed) == original


@settings(max_examples=75, deadline=None)
@given(workflows(), st.randoms(use_true_random=False))
def test_renumbering_changes_exactly_the_actions_that_see_a_parent_renumbered(
    document: dict[str, Any], rnd: random.Random
) -> None:
    """A command sees its inputs under its parents' action ids (`PINGO_INPUT_<id>`,
    `{inputs}` in their order), so those ids are part of what it computes; its own id
    is not, nor are the ids of actions it does not read."""
    original = dataset_ids(document)
    count = len(document["actions"])
    mapping = dict(zip(range(1, count + 1), rnd.sample(range(1, 10_000), count), strict=True))
    after = dataset_ids(renumber(document, mapping))
    parents = {a["id"]: [p["id"] for p in a.get("parentActions", [])] for a in document["actions"]}
    changed: set[int] = set()
    for aid in sorted(parents):  # parents are numbered before their children
        if any(mapping[p] != p or p in changed for p in parents[aid]):
            changed.add(aid)
    for aid, dataset_id in original.items():
        assert (after[mapping[aid]] != dataset_id) == (aid in changed), aid


def test_parents_numbered_the_other_way_round_are_another_computation() -> None:
    """The red-team review's swap: the same merge, its two inputs numbered the other way
    round. `cat {inputs:sh}` (in parent id order) and `$PINGO_INPUT_1` read them in the
    other order, so the merge must not be reused for the other workflow."""

    def merge(first: str, second: str) -> dict[str, Any]:
        return {
            "name": "merge",
            "startActionId": 1,
            "endActionId": 3,
            "actions": [
                {"id": 1, "name": "a", "type": "command-line", "command": ["echo", first]},
                {"id": 2, "name": "b", "type": "command-line", "command": ["echo", second]},
                {
                    "id": 3,
                    "name": "merge",
                    "type": "command-line",
                    "parentActions": [{"id": 1}, {"id": 2}],
                    "command": ["sh", "-c", 'cat {inputs:sh} > "$PINGO_OUTPUT"'],
                },
            ],
        }

    alice, mallory = dataset_ids(merge("allow", "deny")), dataset_ids(merge("deny", "allow"))
    assert {alice[1], alice[2]} == {mallory[1], mallory[2]}
    assert alice[3] != mallory[3]


def test_a_placeholder_typed_as_its_parents_dataset_id_is_another_computation() -> None:
    """`{input:<dataset id>}` typed by hand is left as text by the executor: it must not
    share an id with `{input:1}`, which the executor resolves to that dataset's path."""
    resolved = dataset_ids(two_step())
    typed = dataset_ids(two_step(command=["wc", "{input:" + resolved[1] + "}"]))
    assert typed[1] == resolved[1] and typed[2] != resolved[2]


@settings(max_examples=75, deadline=None)
@given(workflows(), st.data())
def test_changing_a_definition_field_changes_the_action_and_its_descendants_only(
    document: dict[str, Any], data: st.DataObject
) -> None:
    original = dataset_ids(document)
    definition = language.parse(document)
    target = data.draw(st.sampled_from(sorted(definition.actions)), label="target")
    changed = copy.deepcopy(document)
    action = changed["actions"][target - 1]
    how = data.draw(st.sampled_from(["command", "env", "unmanaged", "type"]), label="how")
    if how == "command":
        action["command"] = [*action["command"], "--changed"]
    elif how == "env":
        action["env"] = {**action.get("env", {}), "CHANGED": "1"}
    elif how == "unmanaged":
        if action.get("isManaged") is False:
            action["outputPath"] += "/changed"
        else:
            action["isManaged"] = False
            action["outputPath"] = "/changed"
    else:
        action["type"] = "spark"
        action["application"] = " ".join(action.pop("command"))
        action.pop("env", None)
    after = dataset_ids(changed)
    affected = {target} | nx.descendants(definition.graph, target)
    for aid, dataset in original.items():
        assert (after[aid] != dataset) == (aid in affected), (aid, how)


@settings(max_examples=50, deadline=None)
@given(workflows(), st.data())
def test_adding_a_parent_changes_the_id(document: dict[str, Any], data: st.DataObject) -> None:
    count = len(document["actions"])
    if count < 2:
        return
    child = data.draw(st.integers(2, count), label="child")
    action = document["actions"][child - 1]
    existing = {p["id"] for p in action.get("parentActions", [])}
    candidates = [p for p in range(1, child) if p not in existing]
    if not candidates:
        return
    original = dataset_ids(document)
    changed = copy.deepcopy(document)
    changed["actions"][child - 1].setdefault("parentActions", []).append(
        {"id": data.draw(st.sampled_from(candidates), label="parent")}
    )
    assert dataset_ids(changed)[child] != original[child]


@settings(max_examples=50, deadline=None)
@given(workflows())
def test_fast_path_equals_hashing_the_identity_document(document: dict[str, Any]) -> None:
    definition = language.parse(document)
    found = provenance.dataset_ids(definition, "user:ann")
    for aid, action in definition.actions.items():
        doc = provenance.identity(action, [found[p] for p in action.parents], "user:ann")
        assert provenance.hash_identity(doc) == found[aid]


def test_fast_path_orders_inputs_as_the_encoder_does_past_nine_parents() -> None:
    # JSON's sorted keys are text: "10" comes before "9" (the property test stops at 6).
    roots = [
        {"id": i, "name": f"r{i}", "type": "command-line", "command": ["r", str(i)]}
        for i in range(1, 13)
    ]
    merge = {
        "id": 13,
        "name": "merge",
        "type": "command-line",
        "command": ["cat", "{inputs}"],
        "parentActions": [{"id": i} for i in (12, 3, 10, 1, 9, 11, 2, 4, 5, 6, 7, 8)],
    }
    document = {"name": "wide", "startActionId": 1, "endActionId": 13, "actions": [*roots, merge]}
    definition = language.parse(document)
    found = provenance.dataset_ids(definition, "server")
    action = definition.actions[13]
    slow = provenance.identity(action, [found[p] for p in action.parents], "server")
    text = provenance.canonical_json(slow["inputs"])
    assert text.index('"10":') < text.index('"2":')
    assert provenance.hash_identity(slow) == found[13]


@settings(max_examples=50, deadline=None)
@given(workflows(), st.data())
def test_an_action_reading_the_world_is_a_new_dataset_at_each_parse_and_so_is_all_below_it(
    document: dict[str, Any], data: st.DataObject
) -> None:
    """`isDeterministic: false`: its identity holds a random `run`, so its dataset (and
    every descendant's) is never one an earlier submission, anyone's, stored."""
    definition = language.parse(document)
    target = data.draw(st.sampled_from(sorted(definition.actions)), label="target")
    changed = copy.deepcopy(document)
    action = changed["actions"][target - 1]
    action["isDeterministic"] = False
    action.pop("outputPath", None)
    action.pop("isManaged", None)
    plain = dataset_ids(document)
    first, second = dataset_ids(changed), dataset_ids(changed)
    below = {target} | nx.descendants(definition.graph, target)
    for aid in definition.actions:
        assert (first[aid] != second[aid]) == (aid in below), aid
        assert (first[aid] != plain[aid]) == (aid in below), aid
    # The fast path holds the run as the identity document does.
    parsed = language.parse(changed)
    found = provenance.dataset_ids(parsed, "server")
    for aid, each in parsed.actions.items():
        doc = provenance.identity(each, [found[p] for p in each.parents], "server")
        assert provenance.hash_identity(doc) == found[aid]
    assert "run" in provenance.identity(
        parsed.actions[target], [found[p] for p in parsed.actions[target].parents], "server"
    )


def test_an_unmanaged_action_cannot_be_computed_anew_at_every_run() -> None:
    document = two_step()
    document["actions"][0].update(isManaged=False, outputPath="/srv/a", isDeterministic=False)
    with pytest.raises(errors.ValidationFailed) as failed:
        language.parse(document)
    assert [i.code for i in failed.value.issues] == [language.UNMANAGED_NOT_DETERMINISTIC]
    assert failed.value.issues[0].pointer == "/actions/0/isDeterministic"
