"""The `pingo` commands against a real `pingo server` subprocess on a free port."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PINGO = str(Path(sys.executable).parent / "pingo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[str]
    env: dict[str, str]
    home: Path

    def run(
        self, *args: str, token: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env)
        if token is not None:
            env["PINGO_TOKEN"] = token
        return subprocess.run(
            [PINGO, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    home = tmp_path_factory.mktemp("pingo-home")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINGO_")}
    env.update({"PINGO_HOME": str(home), "PINGO_PORT": str(port), "PINGO_HOST": "127.0.0.1",
                "PINGO_POLL_INTERVAL_S": "0.05"})  # fmt: skip
    process = subprocess.Popen(
        [PINGO, "server"], env=env, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                break
        except OSError:
            assert process.poll() is None, "pingo server exited"
            assert time.monotonic() < deadline, "pingo server did not become ready"
            time.sleep(0.1)
    yield Server(process, env, home)
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)
    if process.stdout is not None:
        process.stdout.close()


def test_first_start_prints_the_admin_token_and_keeps_it_private(server: Server) -> None:
    token_file = server.home / "admin.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    result = server.run("users", "list")  # the CLI finds the token file by itself
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["name", "role", "created"]
    assert result.stdout.splitlines()[1].split()[:2] == ["admin", "admin"]


def test_submit_wait_succeeds_then_every_action_is_reused(server: Server) -> None:
    first = server.run("submit", "examples/wordcount.json", "--wait")
    assert first.returncode == 0, first.stderr
    lines = first.stdout.strip().splitlines()
    workflow_id = lines[0]
    assert workflow_id.startswith("wf-")
    assert lines[-1] == (
        f"{workflow_id} SUCCEEDED: 5 actions, 5 computed, 0 shared, 0 reused, 0 not needed"
    )

    again = server.run("submit", "examples/wordcount.json", "--wait", "--json")
    assert again.returncode == 0, again.stderr
    document = json.loads(again.stdout)
    assert document["state"] == "SUCCEEDED"
    assert all(a["reused"] for a in document["actions"])

    status = server.run("status", workflow_id)
    assert status.returncode == 0
    assert "SUCCEEDED" in status.stdout
    for name in ("tokenize", "count", "top10", "total", "report"):
        assert name in status.stdout
    listing = server.run("list")
    assert workflow_id in listing.stdout and document["id"] in listing.stdout


def test_submit_wait_exits_1_when_the_workflow_fails(server: Server, tmp_path: Path) -> None:
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps({
        "name": "failing", "startActionId": 1, "endActionId": 1,
        "actions": [{"id": 1, "name": "boom", "type": "command-line", "maxAttempts": 1,
                     "command": ["sh", "-c", "echo about to fail; exit 4"]}],
    }))  # fmt: skip
    result = server.run("submit", str(failing), "--wait")
    assert result.returncode == 1
    workflow_id = result.stdout.splitlines()[0]
    assert "FAILED" in result.stdout
    assert f"pingo logs {workflow_id} 1" in result.stderr
    assert "Traceback" not in result.stderr

    logs = server.run("logs", workflow_id, "boom")
    assert logs.returncode == 0
    assert "about to fail" in logs.stdout
    by_id = server.run("logs", workflow_id, "1", "--attempt", "1")
    assert by_id.stdout == logs.stdout


def test_invalid_documents_get_clear_errors(server: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": 3, "actions": []}')
    result = server.run("submit", str(bad))
    assert result.returncode == 1
    assert result.stderr.startswith("error: VALIDATION_FAILED (422)")
    assert "/name" in result.stderr
    assert "Traceback" not in result.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{nope")
    result = server.run("submit", str(garbage))
    assert result.returncode == 1
    assert "MALFORMED_JSON" in result.stderr
    missing = server.run("submit", str(tmp_path / "absent.json"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


def test_users_add_prints_the_token_last_and_revoke_ends_it(server: Server) -> None:
    added = server.run("users", "add", "bob")
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip().splitlines()[-1]
    assert len(token) >= 32 and " " not in token
    mine = server.run("list", token=token)
    assert mine.returncode == 0
    assert mine.stdout == ""  # bob sees only his own workflows: none yet
    forbidden = server.run("users", "list", token=token)
    assert forbidden.returncode == 1
    assert "FORBIDDEN" in forbidden.stderr
    assert "bob" in server.run("users", "list").stdout
    assert server.run("users", "revoke", "bob").returncode == 0
    revoked = server.run("list", token=token)
    assert revoked.returncode == 1
    assert "UNAUTHORIZED" in revoked.stderr


def test_datasets_and_lineage_commands(server: Server) -> None:
    done = server.run("submit", "examples/wordcount.json", "--wait", "--json")
    document = json.loads(done.stdout)
    end = document["endDatasetId"]
    listing = server.run("datasets", "ls")
    assert end in listing.stdout
    shown = json.loads(server.run("datasets", "show", end).stdout)
    assert shown["state"] == "LEAF"
    lineage = server.run("lineage", end)
    assert lineage.returncode == 0
    assert lineage.stdout.count("->") == 5
    refused = server.run("datasets", "rm", end)
    assert refused.returncode == 1
    assert "CONFLICT" in refused.stderr


def test_storage_command_shows_usage_by_state(server: Server) -> None:
    server.run("submit", "examples/wordcount.json", "--wait")
    answer = json.loads(server.run("storage", "--json").stdout)
    assert answer["usedBytes"] > 0
    assert "DELETED" not in answer["bytesByState"] or answer["bytesByState"]["DELETED"] == 0
    shown = server.run("storage")
    assert shown.returncode == 0
    assert "capacity  unlimited" in shown.stdout
    assert f"used      {answer['usedBytes']:,} B" in shown.stdout
    assert "LEAF" in shown.stdout
    assert f"policy    {answer['policy']}" in shown.stdout
    unauthenticated = server.run("storage", token="not-a-token")
    assert unauthenticated.returncode == 1
    assert "UNAUTHORIZED" in unauthenticated.stderr


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINGO_")}
    env.update({"PINGO_URL": f"http://127.0.0.1:{_free_port()}", "PINGO_TOKEN": "x",
                "PINGO_HOME": str(tmp_path)})  # fmt: skip
    result = subprocess.run([PINGO, "list"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot reach Pingo" in result.stderr
    assert "Traceback" not in result.stderr


def test_server_stops_cleanly_on_sigterm(server: Server) -> None:
    # Runs last in this module: it stops the shared server.
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    assert server.process.stdout is not None
    output = server.process.stdout.read()
    token = (server.home / "admin.token").read_text().strip()
    assert token in output  # printed once, at first start
