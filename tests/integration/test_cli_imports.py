"""`pingo validate` starts fast: it imports no server, driver or graph module (cli_validate_s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Top-level packages `pingo validate` must never import: the HTTP server, the database
#: drivers, the numeric and graph libraries, pydantic (typer >= 0.29 coerces through it).
HEAVY = (
    *("aiohttp", "pymongo", "sqlite3", "scipy", "numpy", "networkx", "pydantic", "jinja2"),
    "msgspec",  # the API's models: never needed to validate a document locally
)

_PROBE = """
import json, sys
sys.argv = ["pingo", "validate", *sys.argv[1:]]
from pingo import cli
try:
    cli.main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _imported(*args: str) -> tuple[int, set[str]]:
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report["code"], {m.split(".")[0] for m in report["modules"]}


def test_validating_a_valid_document_imports_nothing_heavy() -> None:
    code, packages = _imported("examples/wordcount.json")
    assert code == 0
    assert "pingo" in packages  # the probe did run the command
    assert not packages & set(HEAVY), sorted(packages & set(HEAVY))


def test_an_invalid_document_still_needs_no_server_or_graph(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": 3, "actions": [{"id": 1}]}')
    code, packages = _imported(str(bad))
    assert code == 1
    # jsonschema explains the errors; nothing else heavy comes with it.
    assert "jsonschema" in packages
    assert not packages & set(HEAVY), sorted(packages & set(HEAVY))
