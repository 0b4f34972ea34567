"""The retention plug-in API stands apart from the engine (issue 14)."""

from __future__ import annotations

import subprocess
import sys

ENGINE = ("pingo.workflows.planner", "pingo.outcomes.service", "pingo.actions", "pingo.node")


def test_importing_the_policy_api_does_not_import_the_engine() -> None:
    # A fresh interpreter: this test process has imported everything already.
    script = (
        "import sys, pingo.retention.policy\n"
        f"print(' '.join(m for m in {ENGINE!r} if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert found == []
