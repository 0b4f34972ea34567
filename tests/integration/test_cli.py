"""The `pingo` commands against a real `pingo server` subprocess on a free port."""

from __future__ import annotations

import json
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
from typing import Any

import pytest

from tests.conftest import server_environ

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
    env = server_environ()
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


def test_logs_stream_and_tail_a_log_larger_than_memory(server: Server, tmp_path: Path) -> None:
    """A red-team review made its log a 1 TiB sparse file, and the log reader died
    holding it: `pingo logs` streams, and `--tail` asks only for the end."""
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({
        "name": "huge-log", "startActionId": 1, "endActionId": 2,
        "actions": [
            {"id": 1, "name": "sparse", "type": "command-line",
             "command": ["sh", "-c", "echo head; truncate -s 64G /proc/self/fd/1;"
                         ' echo the end; echo > "$PINGO_OUTPUT"']},
            {"id": 2, "name": "quiet", "type": "command-line", "parentActions": [{"id": 1}],
             "command": ["sh", "-c", 'echo > "$PINGO_OUTPUT"']},
        ],
    }))  # fmt: skip
    result = server.run("submit", str(huge), "--wait")
    assert result.returncode == 0, result.stderr
    workflow_id = result.stdout.splitlines()[0]
    tail = server.run("logs", workflow_id, "sparse", "--tail", "8", "--no-cluster")
    assert (tail.returncode, tail.stdout) == (0, "the end\n"), tail.stderr
    kib = server.run("logs", workflow_id, "1", "--tail", "1KiB", "--no-cluster")
    assert len(kib.stdout) == 1024 and kib.stdout.endswith("\0the end\n")
    # An empty log has no last bytes: nothing printed, no error.
    empty = server.run("logs", workflow_id, "quiet", "--tail", "10", "--no-cluster")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")
    bad = server.run("logs", workflow_id, "quiet", "--tail", "lots")
    assert bad.returncode == 2 and "not a size" in bad.stderr


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


def test_users_limits_shows_and_changes_limits(server: Server) -> None:
    token = server.run("users", "add", "carol").stdout.strip().splitlines()[-1]
    shown = server.run("users", "limits", "carol", token=token)
    assert shown.returncode == 0, shown.stderr
    assert "maxWorkflows           100                (server default)" in shown.stdout
    assert "maxStorageBytes        unlimited          (server default)" in shown.stdout
    # Carol may read hers, but not change them.
    raised = server.run("users", "limits", "carol", "--max-workflows", "1000", token=token)
    assert raised.returncode == 1
    assert "FORBIDDEN" in raised.stderr
    changed = server.run(
        "users", "limits", "carol", "--max-workflows", "2", "--submissions-per-minute", "30",
        "--max-storage-bytes", "2GiB", "--json",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    document = json.loads(changed.stdout)
    assert document["ownLimits"] == {"maxWorkflows": 2, "maxInFlightActions": None,
                                     "submissionsPerMinute": 30,
                                     "maxStorageBytes": 2 * 2**30}  # fmt: skip
    reset = server.run("users", "limits", "carol", "--max-workflows", "default")
    assert "maxWorkflows           100                (server default)" in reset.stdout
    assert "submissionsPerMinute   30                 (own)" in reset.stdout
    assert "maxStorageBytes        2,147,483,648      (own)" in reset.stdout
    size = server.run("users", "limits", "carol", "--max-storage-bytes", "lots")
    assert size.returncode == 2 and "Traceback" not in size.stderr
    assert "neither a size" in size.stderr
    zero = server.run("users", "limits", "carol", "--max-in-flight-actions", "0")
    assert zero.returncode == 1
    assert "VALIDATION_FAILED (422)" in zero.stderr and "/limits/maxInFlightActions" in zero.stderr
    word = server.run("users", "limits", "carol", "--max-workflows", "lots")
    assert word.returncode == 2
    assert "Traceback" not in word.stderr


def test_datasets_and_lineage_commands(server: Server) -> None:
    done = server.run("submit", "examples/wordcount.json", "--wait", "--json")
    document = json.loads(done.stdout)
    end = document["endDatasetId"]
    listing = server.run("datasets", "ls")
    assert end in listing.stdout
    shown = json.loads(server.run("datasets", "show", end).stdout)
    assert shown["state"] == "LEAF"
    assert shown["digest"].startswith("sha256:") and shown["sizeBytes"] > 0
    lineage = server.run("lineage", end)
    assert lineage.returncode == 0
    assert lineage.stdout.count("->") == 5
    # Every dataset of the lineage is listed with its digest.
    nodes = [line for line in lineage.stdout.splitlines() if "->" not in line]
    assert len(nodes) == 5 and all(" sha256:" in line for line in nodes), lineage.stdout
    assert any(line.startswith(end) and shown["digest"] in line for line in nodes)
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
    env = server_environ()
    env.update({"PINGO_URL": f"http://127.0.0.1:{_free_port()}", "PINGO_TOKEN": "x",
                "PINGO_HOME": str(tmp_path)})  # fmt: skip
    result = subprocess.run([PINGO, "list"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot reach Pingo" in result.stderr
    assert "Traceback" not in result.stderr


def _json(server: Server, *args: str, token: str | None = None) -> Any:
    result = server.run(*args, "--json", token=token)
    assert result.returncode == 0, (args, result.stderr)
    return json.loads(result.stdout)


def _write(tmp_path: Path, name: str, document: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(document))
    return str(path)


def _one_action(name: str, script: str) -> dict[str, Any]:
    return {"name": name, "startActionId": 1, "endActionId": 1,
            "actions": [{"id": 1, "name": name, "type": "command-line", "maxAttempts": 1,
                         "command": ["sh", "-c", script]}]}  # fmt: skip


def test_ids_are_taken_by_unique_prefix(server: Server, tmp_path: Path) -> None:
    done = _json(server, "submit", "examples/wordcount.json", "--wait")
    status = server.run("status", done["id"][:-4])
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(done["id"])
    # The dataset id as `pingo status` prints it on a terminal (12 characters).
    shown = _json(server, "datasets", "show", done["endDatasetId"][:12])
    assert shown["id"] == done["endDatasetId"]
    assert server.run("lineage", done["endDatasetId"][:8]).returncode == 0

    # Two workflows submitted together share the start of their ids (the time in
    # base36: 8 characters span 28 minutes, so a second pair is needed only rarely).
    # A user of their own submits them: a prefix matches only the requester's ids, so
    # the module's other workflows of the same minutes cannot crowd them out of the error.
    twins = server.run("users", "add", "twins").stdout.strip().splitlines()[-1]
    for attempt in range(2):
        ids = [
            server.run(
                "submit",
                _write(tmp_path, f"p{i}", _one_action(f"p{i}", f"true {attempt}")),
                token=twins,
            ).stdout.splitlines()[0]
            for i in range(2)
        ]
        common = next(i for i, (a, b) in enumerate(zip(*ids, strict=True)) if a != b)
        if common >= 8:
            break
    ambiguous = server.run("status", ids[0][:common], token=twins)
    assert ambiguous.returncode == 1
    assert ambiguous.stderr.startswith("error: AMBIGUOUS_ID (400)")
    assert ids[0] in ambiguous.stderr and ids[1] in ambiguous.stderr
    server.run("users", "revoke", "twins")

    # Another user: the admin's ids, whole or in part, do not exist.
    token = server.run("users", "add", "mallory").stdout.strip().splitlines()[-1]
    for ref in (done["id"], done["id"][:-4], done["id"][:8]):
        foreign = server.run("status", ref, token=token)
        assert foreign.returncode == 1
        assert foreign.stderr.startswith("error: NOT_FOUND (404)"), foreign.stderr
    server.run("users", "revoke", "mallory")


def test_one_reuse_vocabulary_in_plan_submit_status_and_logs(server: Server) -> None:
    server.run("submit", "examples/wordcount.json", "--wait")
    plan = _json(server, "submit", "examples/wordcount.json", "--dry-run")
    summary = plan["summary"]
    assert summary["computed"] == summary["shared"] == 0
    assert summary["reused"] + summary["notNeeded"] == 5 and summary["notNeeded"] > 0
    phrase = f"0 computed, 0 shared, {summary['reused']} reused, {summary['notNeeded']} not needed"

    dry = server.run("submit", "examples/wordcount.json", "--dry-run")
    assert dry.stdout.splitlines()[-1] == f"plan: {phrase}"
    assert "not needed" in dry.stdout.splitlines()[1]
    submitted = server.run("submit", "examples/wordcount.json", "--wait")
    workflow_id = submitted.stdout.splitlines()[0]
    assert submitted.stdout.splitlines()[-1] == f"{workflow_id} SUCCEEDED: 5 actions, {phrase}"
    status = server.run("status", workflow_id)
    assert status.stdout.splitlines()[0] == f"{workflow_id} SUCCEEDED: 5 actions, {phrase}"
    assert "not needed" in status.stdout and "reused" in status.stdout
    not_needed = next(a for a in plan["actions"] if a["reuse"] == "not needed")
    logs = server.run("logs", workflow_id, str(not_needed["actionId"]))
    assert logs.returncode == 1
    assert "never runs: its dataset was not needed" in logs.stderr


def test_status_shows_why_an_action_failed(server: Server, tmp_path: Path) -> None:
    failing = _one_action("boom", "echo 'disk [bold]full[/bold]' >&2; exit 4")
    result = server.run("submit", _write(tmp_path, "boom", failing), "--wait")
    assert result.returncode == 1
    workflow_id = result.stdout.splitlines()[0]

    status = server.run("status", workflow_id)

    assert status.returncode == 0
    assert "error: action 1 (boom) failed: exited with status 4" in status.stdout
    assert "action 1 (boom) FAILED: exited with status 4" in status.stdout
    assert "disk [bold]full[/bold]" in status.stdout  # shown as written, never as markup


def test_continue_shows_what_a_failure_left_unrun(server: Server, tmp_path: Path) -> None:
    document = {"name": "cont", "startActionId": 1, "endActionId": 2, "onFailure": "continue",
                "actions": [
                    {"id": 1, "name": "breaks", "type": "command-line", "maxAttempts": 1,
                     "command": ["sh", "-c", "exit 2"]},
                    {"id": 2, "name": "after", "type": "command-line",
                     "parentActions": [{"id": 1}], "command": ["true"]},
                    {"id": 3, "name": "aside", "type": "command-line",
                     "command": ["sh", "-c", 'echo aside > "$PINGO_OUTPUT"']}]}  # fmt: skip
    result = server.run("submit", _write(tmp_path, "cont", document), "--wait")
    assert result.returncode == 1
    workflow_id = result.stdout.splitlines()[0]
    assert result.stdout.splitlines()[-1].endswith("1 failed, 1 upstream failed")
    status = server.run("status", workflow_id)
    assert "UPSTREAM_FAILED" in status.stdout and "KILLED" not in status.stdout
    assert "action 2 (after) UPSTREAM_FAILED: parent action 1 (breaks) did not finish" in (
        status.stdout
    )


def test_piped_tables_are_whole(server: Server, tmp_path: Path) -> None:
    name = "extract-" + "d" * 120
    document = _one_action(name, 'echo x > "$PINGO_OUTPUT"')
    done = _json(server, "submit", _write(tmp_path, "long", document), "--wait")

    status = server.run("status", done["id"])
    assert name in status.stdout and done["actions"][0]["datasetId"] in status.stdout
    assert "…" not in status.stdout
    listing = server.run("list", "--name", name)
    assert listing.stdout.splitlines()[0].split() == ["id", "state", "created", "owner", "name"]
    assert done["id"] in listing.stdout and name in listing.stdout
    datasets = server.run("datasets", "ls")
    assert done["endDatasetId"] in datasets.stdout and "…" not in datasets.stdout


def test_every_listing_and_showing_command_has_json(server: Server) -> None:
    done = _json(server, "submit", "examples/wordcount.json", "--wait")
    dataset = done["endDatasetId"]
    for args in (["list"], ["datasets", "ls"], ["users", "list"], ["storage"],
                 ["status", done["id"]], ["lineage", dataset], ["datasets", "show", dataset],
                 ["datasets", "pin", dataset], ["datasets", "unpin", dataset]):  # fmt: skip
        assert isinstance(_json(server, *args), dict), args
    killed = server.run("kill", done["id"], "--json")
    assert killed.returncode == 1 and "CONFLICT" in killed.stderr  # it had ended already


def test_list_pages_with_cursor_and_all_and_says_when_empty(server: Server) -> None:
    token = server.run("users", "add", "newcomer").stdout.strip().splitlines()[-1]
    empty = server.run("list", token=token)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "no workflows yet" in empty.stderr and "pingo submit" in empty.stderr
    assert "no workflow matches" in server.run("list", "--state", "KILLED", token=token).stderr
    server.run("users", "revoke", "newcomer")

    everything = _json(server, "list", "--limit", "1000")["items"]
    assert len(everything) >= 3
    first = _json(server, "list", "--limit", "1")
    assert first["items"] == everything[:1] and first["next"]
    hint = server.run("list", "--limit", "1")
    assert f"more: pingo list --cursor {first['next']}" in hint.stderr
    second = _json(server, "list", "--limit", "1", "--cursor", first["next"])
    assert second["items"] == everything[1:2]
    assert _json(server, "list", "--limit", "1", "--all") == {"items": everything, "next": None}


def test_a_401_without_a_token_names_the_file_it_looked_for(server: Server, tmp_path: Path) -> None:
    env = {k: v for k, v in server.env.items() if k != "PINGO_TOKEN"}
    env["PINGO_HOME"] = str(tmp_path / "wrong")
    result = subprocess.run([PINGO, "list"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "UNAUTHORIZED (401)" in result.stderr
    assert f"{tmp_path / 'wrong' / 'admin.token'} does not exist" in result.stderr


def test_deleted_datasets_take_no_bytes(server: Server) -> None:
    done = _json(server, "submit", "examples/wordcount.json", "--wait")
    stored = [d for d in _json(server, "datasets", "ls", "--all")["items"]
              if d["state"] == "STORED" and d["sizeBytes"]]  # fmt: skip
    assert stored, done
    victim = stored[0]["id"]
    assert server.run("datasets", "rm", victim).returncode == 0
    deadline = time.monotonic() + 60
    while _json(server, "datasets", "show", victim)["state"] != "DELETED":
        assert time.monotonic() < deadline, "the deletor did not delete it"
        time.sleep(0.2)
    assert _json(server, "datasets", "show", victim)["sizeBytes"] is None
    listed = server.run("datasets", "ls", "--state", "DELETED")
    row = next(line for line in listed.stdout.splitlines() if line.startswith(victim))
    assert row.split()[1:3] == ["DELETED", "-"]
    assert "DELETED" not in _json(server, "storage")["bytesByState"]


def test_status_and_dry_run_say_shared_with_the_producer(server: Server, tmp_path: Path) -> None:
    # Dave's action sleeps while Erin plans and submits the same one: she shares it.
    dave = server.run("users", "add", "dave").stdout.strip().splitlines()[-1]
    erin = server.run("users", "add", "erin").stdout.strip().splitlines()[-1]
    script = 'sleep 8; echo shared-by-dave > "$PINGO_OUTPUT"'
    producer = _write(tmp_path, "dave", _one_action("slowstep", script))
    submitted = server.run("submit", producer, "--json", token=dave)
    assert submitted.returncode == 0, submitted.stderr
    dave_id = json.loads(submitted.stdout)["id"]
    consumer = _write(tmp_path, "erin", _one_action("slowstep", script))
    plan = server.run("submit", consumer, "--dry-run", token=erin)
    assert plan.returncode == 0, plan.stderr
    assert "shared with slowstep" in plan.stdout and dave_id not in plan.stdout
    # Dave sharing with himself sees his own workflow named.
    own = server.run("submit", producer, "--dry-run", token=dave)
    assert f"shared with {dave_id}/1 (slowstep)" in own.stdout
    done = server.run("submit", consumer, "--wait", token=erin)
    assert done.returncode == 0, done.stderr + done.stdout
    erin_id = done.stdout.split()[0]
    status = server.run("status", erin_id, token=erin)
    assert "shared with slowstep" in status.stdout and dave_id not in status.stdout


def test_names_with_controls_are_shown_escaped(server: Server, tmp_path: Path) -> None:
    """A workflow or action name is anyone's text: an escape sequence in it must not
    drive the reader's terminal, nor a bidirectional control reorder the line."""
    evil = "report\x1b[2J\x1b]0;owned\x07\u202egnp.exe"
    document = {
        "name": evil,
        "startActionId": 1,
        "endActionId": 1,
        "actions": [{"id": 1, "name": evil, "type": "command-line", "command": ["true"]}],
    }
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(document))
    plan = server.run("submit", str(path), "--dry-run")
    submitted = server.run("submit", str(path), "--wait")
    listed = server.run("list", "--limit", "1000")
    for shown in (plan, submitted, listed):
        assert shown.returncode == 0, shown.stderr
        assert not set("\x1b\x07\u202e") & set(shown.stdout + shown.stderr), shown.stdout
    assert "report\\x1b[2J\\x1b]0;owned\\x07\\u202egnp.exe" in plan.stdout + listed.stdout


def test_server_stops_cleanly_on_sigterm(server: Server) -> None:
    # Runs last in this module: it stops the shared server.
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) == 0
    assert server.process.stdout is not None
    output = server.process.stdout.read()
    token = (server.home / "admin.token").read_text().strip()
    assert token in output  # printed once, at first start
