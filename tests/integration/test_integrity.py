"""Dataset integrity end to end: digests recorded at commit, verification, recomputation.

Against a real `pingo server` subprocess with the sandbox on (PINGO_SANDBOX=on),
over HTTP and through the `pingo` CLI. Poisoning is done by the test itself,
writing into the data root as the server's OS user would (a disk fault, an
operator, an unsandboxed process): the sandbox keeps actions from doing it
(tests/integration/test_sandbox.py), verification is the second line.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pingo.client import Client
from pingo.datasets import integrity
from tests.integration import test_sandbox as sandboxed

Server = sandboxed.Server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = sandboxed.start_server(tmp_path_factory.mktemp("integrity") / "home")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def alice(server: Server) -> Client:
    token = server.client(sandboxed.ADMIN_TOKEN).create_user("alice")["token"]
    return server.client(token)


@pytest.fixture(scope="module")
def bob(server: Server) -> Client:
    token = server.client(sandboxed.ADMIN_TOKEN).create_user("bob")["token"]
    return server.client(token)


def _chain(first: str, marker: str) -> dict[str, Any]:
    """`first` writes dataset 1; action 2 copies what it reads of it (a reader of dataset 1)."""
    document = sandboxed._workflow(
        sandboxed._sh(first),
        sandboxed._sh(f'cat -- "$PINGO_INPUT_1" $(find "$PINGO_INPUT_1" -type f 2>/dev/null | sort)'
                      f' > "$PINGO_OUTPUT" 2>/dev/null; echo {marker} >> "$PINGO_OUTPUT"'),
        chain=True,
    )  # fmt: skip
    return document


def _another_reader(document: dict[str, Any]) -> dict[str, Any]:
    """The same workflow with a reader of another identity (an extra argument, `$0` of its
    script), so dataset 1 is reused (and checked). Not the reader forced: its dataset is
    Alice's, which Bob may not force (tests/api/test_forcing.py)."""
    actions = [dict(a) for a in document["actions"]]
    actions[1]["command"] = [*actions[1]["command"], "another-reader"]
    return {**document, "actions": actions}


def _cli(server: Server, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(server.env)
    env.update({"PINGO_URL": f"http://127.0.0.1:{server.port}", "PINGO_TOKEN": token})
    return subprocess.run(
        [sandboxed.PINGO, *args], env=env, capture_output=True, text=True, timeout=60
    )


def _mismatches(server: Server) -> float:
    text = server.client(sandboxed.ADMIN_TOKEN).request("GET", "/metrics").body.decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith('pingo_dataset_digest_mismatches_total{where="plan"}'):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _action(workflow: dict[str, Any], action_id: int) -> dict[str, Any]:
    return next(a for a in workflow["actions"] if a["actionId"] == action_id)


def _poison_and_recompute(
    server: Server, alice: Client, bob: Client, first: str, poison: Any
) -> None:
    """Store dataset 1, poison it, see verify report it and the next reuse recompute it."""
    marker = uuid.uuid4().hex
    document = _chain(first.replace("MARK", marker), marker)
    original = sandboxed._run(alice, document)
    assert original["state"] == "SUCCEEDED"
    dataset_id = _action(original, 1)["datasetId"]
    path = sandboxed._dataset_path(server, original, 1)
    recorded = alice.dataset(dataset_id)
    measured = integrity.measure(str(path))
    assert measured is not None
    assert recorded["digest"] == measured.digest
    assert recorded["sizeBytes"] == measured.size_bytes
    assert alice.verify(dataset_id)["verification"]["status"] == "match"

    poison(path)

    answer = bob.verify(dataset_id)["verification"]
    assert answer["status"] == "mismatch"
    assert answer["recordedDigest"] == recorded["digest"] != answer["actualDigest"]
    cli = _cli(server, alice.token or "", "datasets", "verify", dataset_id)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "mismatch" in cli.stdout

    plan = bob.submit(_another_reader(document), dry_run=True)
    assert plan["actions"][0]["reason"] == "digest-mismatch" and plan["actions"][0]["compute"]
    before = _mismatches(server)
    again = sandboxed._run(bob, _another_reader(document))
    assert again["state"] == "SUCCEEDED"
    action = bob.action(again["id"], 1)
    assert action["reused"] is False and action["attempts"] == 1, action
    assert _mismatches(server) == before + 1
    # The copy was replaced by the recomputation: the reader saw the original content.
    assert "POISON" not in sandboxed._dataset_path(server, again, 2).read_text()
    healed = bob.verify(dataset_id)
    assert healed["verification"]["status"] == "match"
    assert healed["digest"] == recorded["digest"]  # the same program wrote the same bytes
    assert _cli(server, alice.token or "", "datasets", "verify", dataset_id).returncode == 0


def test_a_poisoned_file_is_found_and_recomputed(
    server: Server, alice: Client, bob: Client
) -> None:
    def poison(path: Path) -> None:
        size = path.stat().st_size
        path.write_bytes(b"P" * size)  # same size: a size check alone would miss it

    _poison_and_recompute(server, alice, bob, 'echo MARK-file > "$PINGO_OUTPUT"', poison)


def test_a_poisoned_directory_is_found_and_recomputed(
    server: Server, alice: Client, bob: Client
) -> None:
    first = (
        'mkdir -p "$PINGO_OUTPUT/sub" && echo MARK-a > "$PINGO_OUTPUT/part-0"'
        ' && echo MARK-b > "$PINGO_OUTPUT/sub/part-1"'
    )

    def poison(path: Path) -> None:
        # A rename alone, contents untouched.
        (path / "sub" / "part-1").rename(path / "sub" / "part-2")

    _poison_and_recompute(server, alice, bob, first, poison)


def test_a_removed_dataset_is_recomputed(server: Server, alice: Client, bob: Client) -> None:
    def poison(path: Path) -> None:
        path.unlink()
        path.write_text("POISON\n")

    _poison_and_recompute(server, alice, bob, 'echo MARK-gone > "$PINGO_OUTPUT"', poison)


def test_a_symlink_planted_in_an_output_is_hashed_as_a_link(server: Server, alice: Client) -> None:
    home = server.home
    marker = uuid.uuid4().hex
    plant = (
        f'mkdir "$PINGO_OUTPUT" && echo {marker} > "$PINGO_OUTPUT/data"'
        f' && ln -s {home}/admin.token "$PINGO_OUTPUT/token"'
    )
    workflow = sandboxed._run(alice, sandboxed._workflow(sandboxed._sh(plant)))
    assert workflow["state"] == "SUCCEEDED"
    path = sandboxed._dataset_path(server, workflow, 1)
    assert (path / "token").is_symlink()
    dataset = alice.dataset(_action(workflow, 1)["datasetId"])
    # The link counts its target string; the token behind it is never read.
    assert dataset["sizeBytes"] == len(f"{marker}\n") + len(f"{home}/admin.token")
    assert dataset["digest"] == integrity.measure(str(path)).digest  # type: ignore[union-attr]
    assert alice.verify(dataset["id"])["verification"]["status"] == "match"
    # Pointing the link elsewhere is a change like any other.
    (path / "token").unlink()
    (path / "token").symlink_to(home / "callback.secret")
    assert alice.verify(dataset["id"])["verification"]["status"] == "mismatch"
    sandboxed._assert_no_secret_anywhere(server)


def test_an_output_that_is_a_symlink_records_the_link(server: Server, alice: Client) -> None:
    target = f"{server.home}/callback.secret"
    workflow = sandboxed._run(
        alice, sandboxed._workflow(sandboxed._sh(f'ln -s {target} "$PINGO_OUTPUT"'))
    )
    assert workflow["state"] == "SUCCEEDED"
    dataset = alice.dataset(_action(workflow, 1)["datasetId"])
    assert dataset["sizeBytes"] == len(target)
    assert alice.verify(dataset["id"])["verification"]["status"] == "match"


def test_a_forced_rerun_changes_the_digest(server: Server, alice: Client) -> None:
    random_output = 'od -An -N16 -tx1 /dev/urandom > "$PINGO_OUTPUT"'
    first = sandboxed._run(alice, sandboxed._workflow(sandboxed._sh(random_output)))
    assert first["state"] == "SUCCEEDED"
    dataset_id = _action(first, 1)["datasetId"]
    before = alice.dataset(dataset_id)
    rerun = alice.rerun(first["id"], force=["step1"])
    assert alice.wait(rerun["id"], timeout_s=60, poll_s=0.05)["state"] == "SUCCEEDED"
    after = alice.verify(dataset_id)
    assert after["digest"] != before["digest"]
    assert after["verification"]["status"] == "match"
    path = sandboxed._dataset_path(server, first, 1)
    assert after["digest"] == integrity.measure(str(path)).digest  # type: ignore[union-attr]


def test_verify_all_reports_every_dataset(server: Server, alice: Client) -> None:
    workflow = sandboxed._run(
        alice, sandboxed._workflow(sandboxed._sh(f'echo {uuid.uuid4().hex} > "$PINGO_OUTPUT"'))
    )
    dataset_id = _action(workflow, 1)["datasetId"]
    listed = _cli(server, sandboxed.ADMIN_TOKEN, "datasets", "verify", "--all")
    assert dataset_id in listed.stdout
    line = next(x for x in listed.stdout.splitlines() if x.startswith(dataset_id))
    assert " match " in line
    assert _cli(server, sandboxed.ADMIN_TOKEN, "datasets", "verify").returncode != 0


def test_a_forced_rerun_keeps_running_readers_on_the_old_copy(tmp_path: Path) -> None:
    """A reader that started on a directory dataset reads it whole while a rerun replaces it.

    The reader has the old copy bound in its sandbox; the replaced copy is kept for
    it (not removed under it) and swept once its claim is gone.
    """
    quick = {"PINGO_LEASE_S": "2", "PINGO_RECONCILE_GRACE_S": "0.5"}
    server = sandboxed.start_server(tmp_path / "home", **quick)
    flag_dir = Path(tempfile.mkdtemp(prefix="pingo-reader-", dir="/var/tmp"))
    try:
        admin = server.client(sandboxed.ADMIN_TOKEN)
        alice = server.client(admin.create_user("alice")["token"])
        bob = server.client(admin.create_user("bob")["token"])
        flag = flag_dir / "wait"
        flag.touch()
        marker = uuid.uuid4().hex
        produce = sandboxed._sh(
            'mkdir "$PINGO_OUTPUT" && od -An -N16 -tx1 /dev/urandom > "$PINGO_OUTPUT/part-0"'
            ' && echo tail > "$PINGO_OUTPUT/part-1"'
        )
        first = sandboxed._run(alice, sandboxed._workflow(produce))
        assert first["state"] == "SUCCEEDED"
        dataset_id = _action(first, 1)["datasetId"]
        before = alice.dataset(dataset_id)["digest"]
        read = (
            f': {marker}; a=$(cat "$PINGO_INPUT_1"/part-0 "$PINGO_INPUT_1"/part-1);'
            ' echo started > "$PINGO_OUTPUT";'
            f" while [ -e {flag} ]; do sleep 0.05; done;"
            ' b=$(cat "$PINGO_INPUT_1"/part-0 "$PINGO_INPUT_1"/part-1);'
            ' [ -n "$a" ] && [ "$a" = "$b" ] && echo "$b" > "$PINGO_OUTPUT"'
        )
        reader = bob.submit(sandboxed._workflow(produce, sandboxed._sh(read), chain=True))
        # Its output box (on the host) says when it has read the old copy once.
        boxes = server.home / "datasets" / ".staging"
        deadline = time.monotonic() + 30
        while not list(boxes.glob("*.box/*")):
            assert time.monotonic() < deadline, "the reader never started"
            time.sleep(0.05)

        rerun = alice.rerun(first["id"], force=["step1"])
        assert alice.wait(rerun["id"], timeout_s=60, poll_s=0.05)["state"] == "SUCCEEDED"
        assert alice.dataset(dataset_id)["digest"] != before
        replaced = server.home / "datasets" / ".replaced"
        assert [p.name.split(".")[0] for p in replaced.iterdir()] == [dataset_id]

        flag.unlink()
        done = bob.wait(reader["id"], timeout_s=60, poll_s=0.05)
        assert done["state"] == "SUCCEEDED", bob.logs(reader["id"], 2)
        # On its first attempt: a reader whose files vanished under it would fail, and
        # its retry would read the new copy.
        assert _action(done, 2)["attempts"] == 1, bob.logs(reader["id"], 2)
        # The reader saw one copy from start to end: the old one.
        copied = sandboxed._dataset_path(server, done, 2).read_text()
        assert copied.endswith("tail\n") and copied.split()[:-1]
        path = sandboxed._dataset_path(server, first, 1)
        assert copied.split()[:-1] != (path / "part-0").read_text().split()
        deadline = time.monotonic() + 20
        while list(replaced.iterdir()):
            assert time.monotonic() < deadline, "the replaced copy was never swept"
            time.sleep(0.1)
    finally:
        server.stop()
        shutil.rmtree(flag_dir, ignore_errors=True)
