"""Loading `schemas/workflow.schema.json`, the single source of the workflow language."""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Mapping
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
