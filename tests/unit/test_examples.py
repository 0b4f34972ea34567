"""Every workflow under examples/ is valid, and the cluster examples use what they show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pingo.workflows import language

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DOCUMENTS = sorted(EXAMPLES.rglob("*.json"))


def test_the_cluster_examples_exist() -> None:
    names = {p.relative_to(EXAMPLES).as_posix() for p in DOCUMENTS}
    assert {"wordcount.json", "mapreduce.json", "spark/wordcount.json"} <= names


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_example_is_a_valid_workflow(path: Path) -> None:
    assert language.validate(path.read_bytes()) == []


def test_the_mapreduce_example_lets_the_manifest_pick_the_main_class() -> None:
    document = json.loads((EXAMPLES / "mapreduce.json").read_text())
    (job,) = [a for a in document["actions"] if a["type"] == "mapreduce-v2"]
    assert "mainClass" not in job and job["files"] and job["properties"]
    # Its manifest's ExampleDriver reads the program's name first: the options follow it.
    assert job["arguments"][:2] == ["wordcount", "{options}"]
    spark = json.loads((EXAMPLES / "spark" / "wordcount.json").read_text())
    (app,) = [a for a in spark["actions"] if a["type"] == "spark"]
    assert (EXAMPLES.parent / app["application"]).is_file()
