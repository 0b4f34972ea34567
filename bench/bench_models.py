"""msgspec against pydantic v2 for the API's typed models (issue 14): which one to use.

models_encode_api_ms        what the server does: `documents.encode_workflow_document` of a
                            1,000-action workflow (sorting, twins, reuse words included);
                            hand-built dicts and `json.dumps` before issue 14, msgspec now
models_encode_msgspec_ms    the same document as msgspec Structs built from the records,
                            encoded by one `msgspec.json.Encoder`
models_encode_pydantic_ms   the same as pydantic models (validated on construction, as a
                            model is normally built), `model_dump_json(by_alias=True)`
models_encode_pydantic_construct_ms   pydantic's `model_construct` (no validation), dumped
                            the same way: pydantic's fastest honest way
models_decode_api_ms        what the server does now: 10,000 `PATCH /users/{name}` bodies
                            read by `untrusted.loads` and `bodies.read_model` (msgspec, and
                            the model's JSON Schema to list every issue of a refused one)
models_decode_msgspec_ms    the same bodies, `msgspec.json.decode(raw, type=UserUpdate)`
models_decode_pydantic_ms   the same bodies, `UserUpdate.model_validate_json(raw)`

Both libraries get the same models, field for field, with camelCase names on the wire.
The records are built and the validators compiled before the clock starts; each figure
is the best of 5 repetitions inside a run, so a run resists a neighbour's burst.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
import pydantic
from pydantic.alias_generators import to_camel

from pingo import errors, states
from pingo.api import bodies, documents, models
from pingo.store.protocol import ActionRecord, WorkflowRecord
from pingo.untrusted import loads

RUNS = 5
ACTIONS = 1000
BODIES = 10_000
REPEAT = 5

_T0 = datetime(2026, 1, 1, tzinfo=UTC)


# ---- msgspec


class MsgspecAction(msgspec.Struct, rename="camel"):
    action_id: int
    name: str
    type: str
    state: str
    dataset_id: str
    reused: bool
    reuse: str
    shared_with: dict[str, Any] | None
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


class MsgspecWorkflow(msgspec.Struct, rename="camel"):
    id: str
    name: str
    owner: str
    state: str
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    counts: dict[str, int]
    reuse: dict[str, int]
    end_dataset_id: str | None
    actions: list[MsgspecAction]


_Limit = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]


class MsgspecLimits(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    max_workflows: _Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_in_flight_actions: _Limit | msgspec.UnsetType | None = msgspec.UNSET
    submissions_per_minute: _Limit | msgspec.UnsetType | None = msgspec.UNSET


class MsgspecUserUpdate(msgspec.Struct, forbid_unknown_fields=True):
    limits: MsgspecLimits


# ---- pydantic


_CAMEL = pydantic.ConfigDict(alias_generator=to_camel, populate_by_name=True)


class PydanticAction(pydantic.BaseModel):
    model_config = _CAMEL
    action_id: int
    name: str
    type: str
    state: str
    dataset_id: str
    reused: bool
    reuse: str
    shared_with: dict[str, Any] | None
    attempts: int
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


class PydanticWorkflow(pydantic.BaseModel):
    model_config = _CAMEL
    id: str
    name: str
    owner: str
    state: str
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    counts: dict[str, int]
    reuse: dict[str, int]
    end_dataset_id: str | None
    actions: list[PydanticAction]


_PLimit = Annotated[int, pydantic.Field(ge=1, le=1_000_000, strict=True)]


class PydanticLimits(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=to_camel, extra="forbid")
    max_workflows: _PLimit | None = None
    max_in_flight_actions: _PLimit | None = None
    submissions_per_minute: _PLimit | None = None


class PydanticUserUpdate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    limits: PydanticLimits


# ---- the data


def _records() -> tuple[WorkflowRecord, list[ActionRecord]]:
    workflow = WorkflowRecord(
        id="w" * 32,
        name="layered",
        owner="alice",
        state=states.WorkflowState.SUCCEEDED,
        document={},
        scope="server",
        on_failure="abort",
        created_at=_T0,
        finished_at=_T0 + timedelta(seconds=30),
        end_dataset_id="e" * 64,
    )
    actions = [
        ActionRecord(
            workflow_id=workflow.id,
            action_id=i,
            name=f"step-{i}",
            type="command-line",
            state=states.ActionState.FINISHED,
            dataset_id=f"{i:064x}",
            reused=i % 3 == 0,
            reason="absent",
            definition={"id": i, "command": ["true"]},
            inputs={},
            waiting_on=(),
            children=(),
            callback_id=f"cb{i}",
            created_at=_T0,
            updated_at=_T0,
            attempts=1,
            started_at=_T0 + timedelta(seconds=i),
            finished_at=_T0 + timedelta(seconds=i + 1),
        )
        for i in range(1, ACTIONS + 1)
    ]
    return workflow, actions


def _fields(
    workflow: WorkflowRecord, actions: list[ActionRecord]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The values both libraries' models are built from (what a record maps to)."""
    head = {
        "id": workflow.id,
        "name": workflow.name,
        "owner": workflow.owner,
        "state": workflow.state.value,
        "created_at": workflow.created_at,
        "finished_at": workflow.finished_at,
        "error": workflow.error,
        "end_dataset_id": workflow.end_dataset_id,
    }
    rows = [
        {
            "action_id": a.action_id,
            "name": a.name,
            "type": a.type,
            "state": a.state.value,
            "dataset_id": a.dataset_id,
            "reused": a.reused,
            "reuse": documents.action_outcome(a).value,
            "shared_with": None,
            "attempts": a.attempts,
            "started_at": a.started_at,
            "finished_at": a.finished_at,
            "error": a.error,
        }
        for a in actions
    ]
    return head, rows


def _bodies() -> list[bytes]:
    shapes = [
        {"limits": {"maxWorkflows": 5}},
        {"limits": {"maxInFlightActions": None, "submissionsPerMinute": 60}},
        {"limits": {"maxWorkflows": 0}},  # refused: below 1
        {"limits": {"bogus": 1}},  # refused: unknown field
    ]
    return [json.dumps(shapes[i % len(shapes)]).encode() for i in range(BODIES)]


def _best_ms(work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEAT):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def measure() -> dict[str, float]:
    """One run of every figure."""
    workflow, actions = _records()
    head, rows = _fields(workflow, actions)
    counts = documents.counts(actions)
    reuse = {"computed": 667, "shared": 0, "reused": 333, "notNeeded": 0}
    encoder = msgspec.json.Encoder()
    raw_bodies = _bodies()
    decoder = msgspec.json.Decoder(MsgspecUserUpdate)

    def encode_msgspec() -> bytes:
        document = MsgspecWorkflow(
            **head, counts=counts, reuse=reuse, actions=[MsgspecAction(**r) for r in rows]
        )
        return encoder.encode(document)

    def encode_pydantic() -> bytes:
        document = PydanticWorkflow(
            **head, counts=counts, reuse=reuse, actions=[PydanticAction(**r) for r in rows]
        )
        return document.model_dump_json(by_alias=True).encode()

    def encode_pydantic_construct() -> bytes:
        document = PydanticWorkflow.model_construct(
            **head,
            counts=counts,
            reuse=reuse,
            actions=[PydanticAction.model_construct(**r) for r in rows],
        )
        return document.model_dump_json(by_alias=True).encode()

    def decode_api() -> None:
        for raw in raw_bodies:
            try:
                bodies.read_model(loads(raw.decode()), models.UserUpdate)
            except errors.ValidationFailed:
                pass

    def decode_msgspec() -> None:
        for raw in raw_bodies:
            try:
                decoder.decode(raw)
            except msgspec.ValidationError:
                pass

    def decode_pydantic() -> None:
        for raw in raw_bodies:
            try:
                PydanticUserUpdate.model_validate_json(raw)
            except pydantic.ValidationError:
                pass

    # The three encodings agree on the document (times aside, whose spelling differs).
    assert json.loads(encode_msgspec())["actions"][0]["actionId"] == 1
    assert json.loads(encode_pydantic())["actions"][0]["datasetId"] == rows[0]["dataset_id"]
    return {
        "models_encode_api_ms": _best_ms(
            lambda: documents.encode_workflow_document(workflow, actions)
        ),
        "models_encode_msgspec_ms": _best_ms(encode_msgspec),
        "models_encode_pydantic_ms": _best_ms(encode_pydantic),
        "models_encode_pydantic_construct_ms": _best_ms(encode_pydantic_construct),
        "models_decode_api_ms": _best_ms(decode_api),
        "models_decode_msgspec_ms": _best_ms(decode_msgspec),
        "models_decode_pydantic_ms": _best_ms(decode_pydantic),
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
