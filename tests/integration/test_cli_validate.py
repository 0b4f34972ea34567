"""`pingo validate FILE...` through the installed console script, in a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PINGO = Path(sys.executable).parent / "pingo"

VALID: dict[str, Any] = {
    "name": "ok",
    "startActionId": 1,
    "endActionId": 2,
    "actions": [
        {"id": 1, "name": "a", "type": "command-line", "command": ["true"]},
        {"id": 2, "name": "b", "type": "command-line", "command": ["cat", "{input:1}"],
         "parentActions": [{"id": 1}]},
    ],
}  # fmt: skip
INVALID: dict[str, Any] = {
    "name": "bad",
    "startActionId": 1,
    "endActionId": 3,
    "actions": [
        {"id": 1, "name": "a", "type": "command-line", "command": []},
        {"id": 2, "name": "b", "type": "hive", "parentActions": [{"id": 2}]},
    ],
}


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if not PINGO.exists():
        pytest.skip(f"{PINGO} is not installed")
    return subprocess.run(
        [str(PINGO), "validate", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, doc in (("valid", VALID), ("invalid", INVALID)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(doc))
    paths["garbage"] = tmp_path / "garbage.json"
    paths["garbage"].write_text("{not json")
    return paths


def test_valid_file_exits_0_and_says_ok(files: dict[str, Path]) -> None:
    result = run(str(files["valid"]))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{files['valid']}: OK\n"


def test_invalid_file_exits_1_listing_every_error(files: dict[str, Path]) -> None:
    result = run(str(files["invalid"]))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{files['invalid']}: 4 errors"
    assert lines[1:] == [
        "  SCHEMA_VIOLATION /actions/0/command: [] should be non-empty",
        "  UNKNOWN_ACTION_TYPE /actions/1/type: unknown action type 'hive'; known types: "
        "command-line, mapreduce-v1, mapreduce-v2, spark",
        "  UNKNOWN_ACTION_ID /endActionId: no action has id 3",
        "  CYCLE /actions/1/parentActions/0/id: actions 2 → 2 form a cycle",
    ]


def test_json_for_one_file(files: dict[str, Path]) -> None:
    result = run("--json", str(files["garbage"]))
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False and "file" not in report
    [error] = report["errors"]
    assert error["code"] == "MALFORMED_JSON" and error["pointer"] == ""
    assert set(error) == {"code", "message", "pointer"}
    ok = json.loads(run("--json", str(files["valid"])).stdout)
    assert ok == {"valid": True, "errors": []}


def test_json_for_several_files_is_a_list(files: dict[str, Path]) -> None:
    result = run(str(files["valid"]), str(files["invalid"]), "--json")
    assert result.returncode == 1
    reports = json.loads(result.stdout)
    assert [(r["file"], r["valid"]) for r in reports] == [
        (str(files["valid"]), True),
        (str(files["invalid"]), False),
    ]
    assert [e["code"] for e in reports[1]["errors"]] == [
        "SCHEMA_VIOLATION",
        "UNKNOWN_ACTION_TYPE",
        "UNKNOWN_ACTION_ID",
        "CYCLE",
    ]


def test_all_valid_files_exit_0(files: dict[str, Path]) -> None:
    assert run(str(files["valid"]), str(files["valid"])).returncode == 0


def test_stdin(files: dict[str, Path]) -> None:
    result = run("-", stdin=json.dumps(VALID))
    assert (result.returncode, result.stdout) == (0, "-: OK\n")


def test_missing_file_is_a_usage_error(files: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = run(str(files["valid"]), str(missing))
    assert result.returncode == 2
    assert result.stdout == ""
    assert f"cannot read {missing}: No such file or directory" in result.stderr


def test_no_file_is_a_usage_error() -> None:
    result = run()
    assert result.returncode == 2
    assert "Missing argument" in result.stderr


def test_max_actions_option_and_environment(files: dict[str, Path]) -> None:
    result = run("--max-actions", "1", str(files["valid"]))
    assert result.returncode == 1
    assert "TOO_LARGE /actions: 2 actions is over the limit of 1" in result.stdout
