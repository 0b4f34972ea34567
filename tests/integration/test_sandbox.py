"""Attacks on the server's secrets and other users' data from a user's own action.

Each test is an attack a plain (non-admin) user could try through a
command-line action, run end to end over HTTP against a real `pingo server`
subprocess with the sandbox on (PINGO_SANDBOX=on: it refuses to start
without working user namespaces rather than quietly running unsandboxed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pingo.actions.executors import sandbox
from pingo.client import ApiError, Client
from pingo.testing import free_port
from tests.conftest import server_environ

REPO = Path(__file__).resolve().parents[2]
PINGO = str(Path(sys.executable).parent / "pingo")
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    home: Path
    port: int
    env: dict[str, str]
    log: Path

    def client(self, token: str) -> Client:
        return Client(base_url=f"http://127.0.0.1:{self.port}", token=token, timeout_s=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def start_server(
    home: Path, port: int | None = None, *, as_user: Sequence[str] = (), **settings: str
) -> Server:
    """A sandboxed `pingo server` with its home at `home`; `as_user` prefixes its command
    (`setpriv` to run it as another OS user)."""
    port = port or free_port()
    env = server_environ()
    env.update({"PINGO_HOME": str(home), "PINGO_PORT": str(port), "PINGO_HOST": "127.0.0.1",
                "PINGO_POLL_INTERVAL_S": "0.05", "PINGO_SANDBOX": "on",
                "PINGO_ADMIN_TOKEN": ADMIN_TOKEN, "PINGO_LOG_LEVEL": "DEBUG",
                # Alice's unmanaged outputs (in her directory of a root): the scratch
                # directories and, to try them against the spawn's own check, Pingo's
                # files (the module's server has its home in `<root>/alice`).
                "PINGO_UNMANAGED_ROOTS": f"{SCRATCH_ROOT}:{home.parent.parent}"})  # fmt: skip
    env.update(settings)
    home.parent.mkdir(parents=True, exist_ok=True)
    log = home.parent / f"{home.name}-server.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [*as_user, PINGO, "server"], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    server = Server(process, home, port, env, log)
    deadline = time.monotonic() + 30
    while True:
        try:
            if server.client(ADMIN_TOKEN).health():
                return server
        except OSError:
            pass
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "pingo server did not become ready"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = start_server(tmp_path_factory.mktemp("sandboxed") / "alice" / "home")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def alice(server: Server) -> Client:
    token = server.client(ADMIN_TOKEN).create_user("alice")["token"]
    return server.client(token)


@pytest.fixture(scope="module")
def bob(server: Server) -> Client:
    token = server.client(ADMIN_TOKEN).create_user("bob")["token"]
    return server.client(token)


def _workflow(*commands: list[str], chain: bool = False) -> dict[str, Any]:
    """One action per command (each the child of the previous one with `chain`)."""
    actions: list[dict[str, Any]] = []
    for index, command in enumerate(commands, start=1):
        action: dict[str, Any] = {
            "id": index,
            "name": f"step{index}",
            "type": "command-line",
            "command": command,
        }
        if chain and index > 1:
            action["parentActions"] = [{"id": index - 1}]
        actions.append(action)
    return {
        "name": f"attack-{uuid.uuid4().hex[:8]}",
        "startActionId": 1,
        "endActionId": len(commands),
        "actions": actions,
    }


def _run(client: Client, document: dict[str, Any]) -> dict[str, Any]:
    workflow = client.submit(document)
    return client.wait(workflow["id"], timeout_s=60, poll_s=0.05)


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def _dataset_path(server: Server, workflow: dict[str, Any], action_id: int) -> Path:
    action = next(a for a in workflow["actions"] if a["actionId"] == action_id)
    dataset_id = action["datasetId"]
    return server.home / "datasets" / dataset_id[:2] / dataset_id


def _every_file(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


def _secrets(server: Server) -> list[bytes]:
    secret = (server.home / "callback.secret").read_bytes()
    admin = (server.home / "admin.token").read_text().strip().encode()
    assert admin == ADMIN_TOKEN.encode()
    return [admin, secret, secret.hex().encode()]


def _assert_no_secret_anywhere(server: Server) -> None:
    """No log, no dataset, not the server's own log holds a secret."""
    secrets = _secrets(server)
    for path in [*_every_file(server.home / "logs", server.home / "datasets"), server.log]:
        content = path.read_bytes()
        for secret in secrets:
            assert secret not in content, f"a secret leaked into {path}"


def test_the_sandbox_is_on_and_shown_by_readyz(server: Server) -> None:
    ready = server.client(ADMIN_TOKEN).request("GET", "/readyz").json()
    assert ready == {"status": "ready", "sandbox": "on"}


def test_an_action_cannot_read_the_secrets_in_pingo_home(server: Server, alice: Client) -> None:
    home = server.home
    steal = (
        f"cat {home}/admin.token {home}/callback.secret; ls -la {home} {home}/logs;"
        f" cat {home}/logs/*/*; cat $PINGO_HOME/admin.token; cp {home}/callback.secret"
        " $PINGO_OUTPUT; echo done >> $PINGO_OUTPUT"
    )
    workflow = _run(alice, _workflow(_sh(steal)))
    assert workflow["state"] == "SUCCEEDED"
    assert _dataset_path(server, workflow, 1).read_text() == "done\n"
    log = alice.logs(workflow["id"], 1)
    assert "No such file or directory" in log
    _assert_no_secret_anywhere(server)


def test_an_action_cannot_read_the_server_environment(server: Server, alice: Client) -> None:
    assert "PINGO_ADMIN_TOKEN" in server.env  # the server was given it...
    steal = (
        "tr '\\0' '\\n' < /proc/$PPID/environ; for f in /proc/[0-9]*/environ;"
        " do tr '\\0' '\\n' < $f; done; env; env > $PINGO_OUTPUT"
    )
    workflow = _run(alice, _workflow(_sh(steal)))
    assert workflow["state"] == "SUCCEEDED"
    seen = _dataset_path(server, workflow, 1).read_text()
    names = {line.split("=", 1)[0] for line in seen.splitlines() if "=" in line}
    # ...and the action sees only its own variables.
    assert names <= {"PATH", "PWD", "SHLVL", "_", "OLDPWD"} | {
        n for n in names if n.startswith("PINGO_")
    }
    assert "PINGO_HOME" not in names and "PINGO_ADMIN_TOKEN" not in names
    # The server's own /proc/<pid>/environ no longer holds it either.
    own = Path(f"/proc/{server.process.pid}/environ").read_bytes()
    assert ADMIN_TOKEN.encode() not in own
    _assert_no_secret_anywhere(server)


def test_an_action_has_no_capability_and_no_user_namespace_of_its_own(
    server: Server, alice: Client
) -> None:
    """bwrap run by root keeps every capability in the sandbox: enough to unmount the tmpfs
    over `$PINGO_HOME` and read its secrets, or remount `/` writable. A user namespace made
    inside would give them back (and is most kernel exploits' way in)."""
    probe = (
        "grep -E '^Cap(Eff|Prm|Bnd):' /proc/self/status > $PINGO_OUTPUT;"
        f" umount {server.home} 2>/dev/null && echo unmounted >> $PINGO_OUTPUT;"
        " mount -o remount,rw / 2>/dev/null && echo remounted >> $PINGO_OUTPUT;"
        " unshare -U true 2>/dev/null && echo userns >> $PINGO_OUTPUT; true"
    )
    workflow = _run(alice, _workflow(_sh(probe)))
    assert workflow["state"] == "SUCCEEDED", workflow
    seen = _dataset_path(server, workflow, 1).read_text().splitlines()
    assert sorted(line.split()[0] for line in seen) == ["CapBnd:", "CapEff:", "CapPrm:"], seen
    assert all(int(line.split()[1], 16) == 0 for line in seen), seen
    _assert_no_secret_anywhere(server)


_HOLDER = """
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind("\\0" + sys.argv[1]); s.listen(1)
print("listening", flush=True)
_, fds, _, _ = socket.recv_fds(s.accept()[0], 16, 1)
while not os.path.exists(sys.argv[2]):  # the test says the dataset is stored
    time.sleep(0.02)
os.pwrite(fds[0], b"EVIL", 0)
print("tampered", flush=True)
time.sleep(600)
"""
_PRODUCER = """
import os, socket, sys
out = os.environ["PINGO_OUTPUT"]
with open(out, "w") as f:
    f.write("GOOD DATA\\n")
c = socket.socket(socket.AF_UNIX); c.connect("\\0" + sys.argv[1])
socket.send_fds(c, [b"x"], [os.open(out, os.O_RDWR)])
"""


def _until_logged(client: Client, workflow_id: str, text: str) -> None:
    deadline = time.monotonic() + 30
    while text not in _log_so_far(client, workflow_id):
        assert time.monotonic() < deadline, _log_so_far(client, workflow_id)
        time.sleep(0.05)


def _log_so_far(client: Client, workflow_id: str) -> str:
    """The action's log, or nothing while it has none (not started yet)."""
    try:
        return client.logs(workflow_id, 1)
    except ApiError as exc:
        if exc.status != 404:
            raise
        return ""


def test_a_stored_dataset_is_not_the_file_a_sandbox_held_open(
    server: Server, alice: Client
) -> None:
    """Sandboxes sharing the host's network share its abstract Unix sockets: a producer can
    hand a writable descriptor of its output to another running action of its user. The
    stored dataset must not be that file, or it changes after its digest was taken."""
    address = "pingo-test-" + uuid.uuid4().hex  # abstract: the scripts prefix a NUL
    # On the root filesystem, which the sandbox sees, but in no root of unmanaged outputs.
    scratch = Path(tempfile.mkdtemp(prefix="pingo-signal-", dir="/var/tmp"))
    stored = scratch / "stored"
    holder = alice.submit(_workflow(["python3", "-c", _HOLDER, address, str(stored)]))
    try:
        _until_logged(alice, holder["id"], "listening")
        produced = _run(alice, _workflow(["python3", "-c", _PRODUCER, address]))
        assert produced["state"] == "SUCCEEDED", produced
        stored.touch()
        _until_logged(alice, holder["id"], "tampered")
        assert _dataset_path(server, produced, 1).read_bytes() == b"GOOD DATA\n"
        dataset = alice.verify(produced["endDatasetId"])
        assert dataset["verification"]["status"] == "match", dataset
    finally:
        alice.kill(holder["id"])
        shutil.rmtree(scratch, ignore_errors=True)


def test_an_output_nested_past_the_limit_fails_its_attempt_and_the_server_stays_up(
    server: Server, bob: Client
) -> None:
    """1,200 nested directories stopped the node once (the reaper's staging sweep raised
    RecursionError), and every restart after. Now the attempt fails, and nothing is left."""
    nest = 'cd "$PINGO_OUTPUT" && i=0; while [ $i -lt 1200 ]; do mkdir d && cd d; i=$((i+1)); done'
    document = _workflow(["sh", "-c", 'mkdir "$PINGO_OUTPUT" && ' + nest])
    document["actions"][0]["maxAttempts"] = 1
    workflow = _run(bob, document)
    assert workflow["state"] == "FAILED", workflow
    action = bob.action(workflow["id"], 1)
    assert "could not be stored" in action["error"] and "deeper than" in action["error"]
    staging = server.home / "datasets" / ".staging"
    assert not [p.name for p in staging.iterdir() if workflow["id"] in p.name]
    assert server.client(ADMIN_TOKEN).health()
    assert _run(bob, _workflow(_sh('echo after > "$PINGO_OUTPUT"')))["state"] == "SUCCEEDED"


def test_a_sparse_output_is_stored_sparse_and_one_of_mostly_holes_refused(
    server: Server, bob: Client
) -> None:
    """A hole costs the action nothing; copied out of its box, it must not cost the
    server's disk either. Past `trees.MAX_HOLE_BYTES` (a red-team review's 2 TiB file:
    half an hour of hashing, and a storage budget full of nothing) it is refused."""
    small = _run(bob, _workflow(_sh('truncate -s 512M "$PINGO_OUTPUT"')))
    assert small["state"] == "SUCCEEDED", small
    stored = _dataset_path(server, small, 1).stat()
    assert stored.st_size == 512 << 20 and stored.st_blocks * 512 < 1 << 24
    document = _workflow(_sh('truncate -s 2T "$PINGO_OUTPUT"'))
    document["actions"][0]["maxAttempts"] = 1
    big = _run(bob, document)
    assert big["state"] == "FAILED", big
    assert "holes" in (bob.action(big["id"], 1)["error"] or "")


def test_an_action_cannot_make_its_user_admin_through_the_store(
    server: Server, alice: Client
) -> None:
    db = server.home / "pingo.db"
    promote = (
        f"import sqlite3; c = sqlite3.connect({str(db)!r});"
        " c.execute(\"update users set is_admin=1 where name='alice'\"); c.commit()"
    )
    workflow = _run(alice, _workflow(["python3", "-c", promote]))
    assert workflow["state"] == "FAILED"
    assert alice.me()["admin"] is False
    with pytest.raises(ApiError) as refused:
        alice.users()
    assert refused.value.status == 403


def test_an_action_cannot_overwrite_another_users_datasets(
    server: Server, alice: Client, bob: Client
) -> None:
    marker = uuid.uuid4().hex
    bobs = _run(
        bob,
        _workflow(
            _sh(f"echo bob-{marker} > $PINGO_OUTPUT"),
            _sh(f"mkdir $PINGO_OUTPUT && echo part-{marker} > $PINGO_OUTPUT/part-0"),
        ),
    )
    assert bobs["state"] == "SUCCEEDED"
    file_dataset = _dataset_path(server, bobs, 1)
    dir_dataset = _dataset_path(server, bobs, 2)
    poison = (
        f"echo POISONED > {file_dataset}; echo POISONED > {dir_dataset}/part-0;"
        f" rm -rf {dir_dataset}; ln -sf /dev/null {file_dataset}; echo tried > $PINGO_OUTPUT"
    )
    digests = {a["actionId"]: bob.dataset(a["datasetId"])["digest"] for a in bobs["actions"]}
    workflow = _run(alice, _workflow(_sh(poison)))
    assert workflow["state"] == "SUCCEEDED"
    assert file_dataset.read_text() == f"bob-{marker}\n"
    assert (dir_dataset / "part-0").read_text() == f"part-{marker}\n"
    for action in bobs["actions"]:
        kept = bob.verify(action["datasetId"])
        assert kept["digest"] == digests[action["actionId"]] is not None
        assert kept["verification"]["status"] == "match"


def test_a_callback_cannot_be_forged_from_an_action(
    server: Server, alice: Client, bob: Client
) -> None:
    """Alice's action, told Bob's running action's callback id, cannot finish it for him.

    The forgery needs the callback secret; the action tries to read it where the
    server keeps it and signs a success with it. Unsandboxed, that read works and
    Bob's action would succeed at once with an empty dataset.
    """
    flag_dir = Path(tempfile.mkdtemp(prefix="pingo-forge-", dir="/var/tmp"))
    try:
        flag = flag_dir / "wait"
        flag.touch()
        marker = uuid.uuid4().hex
        bobs = bob.submit(
            _workflow(
                _sh(f"while [ -e {flag} ]; do sleep 0.05; done; echo bob-{marker} > $PINGO_OUTPUT")
            )
        )
        deadline = time.monotonic() + 30
        while not _processes_with(marker):
            assert time.monotonic() < deadline, "Bob's action never started"
            time.sleep(0.05)
        running = bob.action(bobs["id"], 1)
        secret_path = str(server.home / "callback.secret")
        forge = (
            "import hashlib, hmac, urllib.request\n"
            f"secret = bytes.fromhex(open({secret_path!r}).read().strip())\n"
            f"message = '{running['callbackId']}:1'.encode()\n"
            "token = hmac.new(secret, message, hashlib.sha256).hexdigest()\n"
            f"url = 'http://127.0.0.1:{server.port}/api/v1/callbacks/{running['callbackId']}/success'\n"
            "urllib.request.urlopen(urllib.request.Request(url + '?attempt=1&token=' + token,"
            " data=b'{}', method='POST', headers={'Content-Type': 'application/json'}),"
            " timeout=10)\n"
        )
        forged = _run(alice, _workflow(["python3", "-c", forge]))
        assert forged["state"] == "FAILED"
        assert "No such file or directory" in alice.logs(forged["id"], 1)
        assert bob.action(bobs["id"], 1)["state"] == running["state"] == "SUBMITTED"
        flag.unlink()
        done = bob.wait(bobs["id"], timeout_s=60, poll_s=0.05)
        assert done["state"] == "SUCCEEDED"
        assert done["actions"][0]["attempts"] == 1
        assert _dataset_path(server, done, 1).read_text() == f"bob-{marker}\n"
    finally:
        shutil.rmtree(flag_dir, ignore_errors=True)


def test_the_root_and_working_directory_are_read_only_and_tmp_private(
    server: Server, alice: Client
) -> None:
    """Only the output (and a /tmp of its own) is writable; /tmp is neither shared nor kept."""
    marker = uuid.uuid4().hex
    host_dir = Path(tempfile.mkdtemp(prefix="pingo-ro-", dir="/var/tmp"))
    try:
        write = (
            f"echo x > {host_dir}/{marker}; echo x > relative-{marker};"
            f" echo x > /tmp/{marker} && cat /tmp/{marker} > $PINGO_OUTPUT"
        )
        look = f"ls /tmp/{marker}; echo looked > $PINGO_OUTPUT"
        workflow = _run(alice, _workflow(_sh(write), _sh(look), chain=True))
        assert workflow["state"] == "SUCCEEDED"
        log = alice.logs(workflow["id"], 1)
        assert log.count("Read-only file system") == 2, log
        assert _dataset_path(server, workflow, 1).read_text() == "x\n"  # /tmp is writable
        assert "No such file or directory" in alice.logs(workflow["id"], 2)
        assert list(host_dir.iterdir()) == []
        assert not (REPO / f"relative-{marker}").exists()
        assert not (Path("/tmp") / marker).exists()
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def test_an_action_cannot_write_through_its_inputs(server: Server, alice: Client) -> None:
    """Inputs are bound read-only: a child cannot change the dataset it reads."""
    workflow = _run(
        alice,
        _workflow(
            _sh("mkdir $PINGO_OUTPUT && echo original > $PINGO_OUTPUT/part-0"),
            _sh(
                "echo POISONED > $PINGO_INPUT_1/part-0; touch $PINGO_INPUT_1/extra;"
                " echo tried > $PINGO_OUTPUT"
            ),
            chain=True,
        ),
    )
    assert workflow["state"] == "SUCCEEDED"
    parent = _dataset_path(server, workflow, 1)
    assert (parent / "part-0").read_text() == "original\n"
    assert sorted(p.name for p in parent.iterdir()) == ["part-0"]


def test_a_symlink_planted_in_an_output_reaches_nothing(server: Server, alice: Client) -> None:
    """An output holding links to the secrets and to another dataset leaks nothing."""
    home = server.home
    plant = (
        f"mkdir $PINGO_OUTPUT && ln -s {home}/admin.token $PINGO_OUTPUT/token"
        f" && ln -s {home}/callback.secret $PINGO_OUTPUT/secret && ln -s {home} $PINGO_OUTPUT/home"
    )
    follow = (
        "cat $PINGO_INPUT_1/token $PINGO_INPUT_1/secret; ls $PINGO_INPUT_1/home;"
        " echo leaked > $PINGO_INPUT_1/home/admin.token;"
        " cat $PINGO_INPUT_1/token > $PINGO_OUTPUT; echo followed >> $PINGO_OUTPUT"
    )
    workflow = _run(alice, _workflow(_sh(plant), _sh(follow), chain=True))
    assert workflow["state"] == "SUCCEEDED"
    assert _dataset_path(server, workflow, 2).read_text() == "followed\n"
    assert (home / "admin.token").read_text().strip() == ADMIN_TOKEN
    _assert_no_secret_anywhere(server)


def test_an_output_that_is_a_symlink_reaches_nothing(server: Server, alice: Client) -> None:
    """A dataset that is itself a link to a secret gives its readers nothing."""
    home = server.home
    plant = f"ln -s {home}/admin.token $PINGO_OUTPUT"
    follow = (
        "cat $PINGO_INPUT_1; cat $PINGO_INPUT_1 > $PINGO_OUTPUT; echo followed >> $PINGO_OUTPUT"
    )
    workflow = _run(alice, _workflow(_sh(plant), _sh(follow), chain=True))
    assert workflow["state"] == "SUCCEEDED"
    assert _dataset_path(server, workflow, 2).read_text() == "followed\n"
    _assert_no_secret_anywhere(server)


def test_the_network_is_on_by_default_and_off_on_request(
    server: Server, alice: Client, tmp_path: Path
) -> None:
    connect = _sh(
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {server.port}), 5)\""
        " && echo reached > $PINGO_OUTPUT"
    )
    online = _run(alice, _workflow(connect))
    assert online["state"] == "SUCCEEDED"

    offline_server = start_server(tmp_path / "home", PINGO_SANDBOX_NETWORK="off")
    try:
        offline = _run(offline_server.client(ADMIN_TOKEN), _workflow(connect))
        assert offline["state"] == "FAILED"
        log = offline_server.client(ADMIN_TOKEN).logs(offline["id"], 1)
        assert "Network is unreachable" in log or "Connection refused" in log
    finally:
        offline_server.stop()


def test_an_unmanaged_output_cannot_land_on_pingos_files(
    server: Server, alice: Client, bob: Client
) -> None:
    """The server moves an unmanaged output onto the user's path: never onto Pingo's own."""
    home = server.home
    bobs = _run(bob, _workflow(_sh(f"echo bob-{uuid.uuid4().hex} > $PINGO_OUTPUT")))
    assert bobs["state"] == "SUCCEEDED"
    dataset = _dataset_path(server, bobs, 1)
    kept = {p: p.read_bytes() for p in (home / "callback.secret", dataset)}
    # The same through a link: an unmanaged output may not plant one...
    planted = _scratch() / "to-home"
    try:
        plant = {
            "id": 1, "name": "plant", "type": "command-line", "isManaged": False,
            "outputPath": str(planted), "command": ["sh", "-c", f"ln -s {home} $PINGO_OUTPUT"],
        }  # fmt: skip
        refused = _run(alice, {**_workflow(["true"]), "actions": [plant]})
        assert refused["state"] == "FAILED"
        assert "symbolic link" in (alice.action(refused["id"], 1)["error"] or "")
        assert not os.path.lexists(planted) and not os.path.lexists(f"{planted}.box")
        # ...and one that is there anyway (the host's own) is not followed onto them.
        planted.symlink_to(home)
        targets = [*kept, home / "pingo.db", planted / "admin.token"]
        for target in targets:
            action = {
                "id": 1, "name": "overwrite", "type": "command-line", "isManaged": False,
                "outputPath": str(target), "command": ["sh", "-c", "echo OWNED > $PINGO_OUTPUT"],
            }  # fmt: skip
            workflow = _run(alice, {**_workflow(["true"]), "actions": [action]})
            assert workflow["state"] == "FAILED", target
            assert "Pingo's own" in (alice.action(workflow["id"], 1)["error"] or ""), target
        for path, content in kept.items():
            assert path.read_bytes() == content, path
        # The store's file changes as the server works (a WAL checkpoint rewrites its
        # pages): what must not happen is the output written over it.
        assert (home / "pingo.db").read_bytes().startswith(b"SQLite format 3\x00")
        with contextlib.closing(sqlite3.connect(home / "pingo.db")) as db:
            assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert (home / "admin.token").read_text().strip() == ADMIN_TOKEN
    finally:
        shutil.rmtree(planted.parent, ignore_errors=True)


def _unmanaged(path: Path, script: str, action_id: int = 1) -> dict[str, Any]:
    return {
        "id": action_id, "name": f"unmanaged{action_id}", "type": "command-line",
        "isManaged": False, "outputPath": str(path), "command": _sh(script),
    }  # fmt: skip


#: A root of unmanaged outputs (`PINGO_UNMANAGED_ROOTS`) outside pytest's temporary
#: directories (which the server's home is in, and /tmp is private in the sandbox).
SCRATCH_ROOT = Path("/var/tmp/pingo-test-roots")


def _scratch() -> Path:
    """A new directory in alice's own directory of `SCRATCH_ROOT`."""
    (SCRATCH_ROOT / "alice").mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="pingo-attack-", dir=SCRATCH_ROOT / "alice"))


def test_an_action_cannot_read_another_users_unmanaged_outputs(
    server: Server, alice: Client, bob: Client
) -> None:
    """The server writes every user's unmanaged outputs as the one OS user all actions
    run as: only the sandbox can keep bob's action out of alice's directory of a root.
    Alice's own next action still reads hers, as a declared input."""
    secret = f"alice-report-{uuid.uuid4().hex}"
    scratch = _scratch()
    report = scratch / "report.txt"
    try:
        reader = {
            "id": 2, "name": "reader", "type": "command-line", "parentActions": [{"id": 1}],
            "command": _sh("cat $PINGO_INPUT_1 > $PINGO_OUTPUT"),
        }  # fmt: skip
        document = {
            **_workflow(["true"]),
            "endActionId": 2,
            "actions": [_unmanaged(report, f"echo {secret} > $PINGO_OUTPUT"), reader],
        }
        mine = _run(alice, document)
        assert mine["state"] == "SUCCEEDED", [(a["state"], a.get("error")) for a in mine["actions"]]
        assert report.read_text() == f"{secret}\n"
        assert _dataset_path(server, mine, 2).read_text() == f"{secret}\n"
        steal = (
            f"ls -A {SCRATCH_ROOT} > $PINGO_OUTPUT; cat {SCRATCH_ROOT}/*/*/* {report}"
            " >> $PINGO_OUTPUT; echo tried >> $PINGO_OUTPUT"
        )
        stolen = _run(bob, _workflow(_sh(steal)))
        assert stolen["state"] == "SUCCEEDED"
        # The root looked empty, and the path led nowhere.
        assert _dataset_path(server, stolen, 1).read_text() == "tried\n"
        assert secret not in bob.logs(stolen["id"], 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_environment_reaches_the_command_not_bwrap(server: Server, alice: Client) -> None:
    """An action's `env` is the command's, inside: bwrap runs on the host, where an
    `LD_PRELOAD` would load the user's code before any namespace exists."""
    secret = f"s3cret-{uuid.uuid4().hex}"
    document = _workflow(_sh('echo "inside=$PROBE $LD_PRELOAD"; sleep 2; echo ok > $PINGO_OUTPUT'))
    document["actions"][0]["env"] = {"PROBE": secret, "LD_PRELOAD": "/nonexistent/evil.so"}
    submitted = alice.submit(document)
    tag = sandbox.TAG_PREFIX + str(server.process.pid)
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        seen = _processes_with(tag)
        time.sleep(0.05)
    assert seen, "no sandbox ran"
    for pid in seen:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            # Not in bwrap's environment, nor in its argv, which every local user may read.
            assert b"LD_PRELOAD" not in environ and secret.encode() not in environ
            assert secret.encode() not in cmdline
    workflow = alice.wait(submitted["id"], timeout_s=60, poll_s=0.05)
    assert workflow["state"] == "SUCCEEDED"
    assert f"inside={secret} /nonexistent/evil.so" in alice.logs(workflow["id"], 1)


def test_a_link_at_an_outputs_box_or_status_is_not_followed(
    server: Server, alice: Client, bob: Client
) -> None:
    """The server creates `<outputPath>.box` (bound writable into the sandbox) and
    `<outputPath>.exit` and `.completed`: links planted there must not reach Pingo's files
    or a dataset."""
    home = server.home
    bobs = _run(bob, _workflow(_sh(f"echo bob-{uuid.uuid4().hex} > $PINGO_OUTPUT")))
    dataset = _dataset_path(server, bobs, 1)
    kept = dataset.read_bytes()
    scratch = _scratch()
    try:
        (scratch / "out.box").symlink_to(home)
        (scratch / "out.exit").symlink_to(dataset)
        (scratch / "two.exit").symlink_to(home / "pingo.db")
        (scratch / "two.completed").symlink_to(dataset)
        steal = (
            f"cat {scratch}/admin.token; ls {scratch}; touch {scratch}/written-by-alice;"
            " echo mine > $PINGO_OUTPUT"
        )
        for name in ("out", "two"):
            document = {**_workflow(["true"]), "actions": [_unmanaged(scratch / name, steal)]}
            assert _run(alice, document)["state"] == "SUCCEEDED"
            assert (scratch / name).read_text() == "mine\n"
        assert dataset.read_bytes() == kept
        # The store changes as the server works (a WAL checkpoint rewrites its pages):
        # what must not happen is bwrap's exit status written over it.
        assert (home / "pingo.db").read_bytes().startswith(b"SQLite format 3\x00")
        with contextlib.closing(sqlite3.connect(home / "pingo.db")) as db:
            assert db.execute("PRAGMA quick_check").fetchone() == ("ok",)
        assert not (home / "written-by-alice").exists()
        assert not (scratch / "out.box").is_symlink()
        _assert_no_secret_anywhere(server)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_an_input_resolving_into_pingos_files_is_refused(server: Server, alice: Client) -> None:
    """An unmanaged input whose directory becomes a link to $PINGO_HOME after it was
    written (swapped by the host, as an unmanaged output can no longer do) is not bound."""
    home = server.home
    scratch = _scratch()
    try:
        (scratch / "dir").mkdir()
        document = _workflow(["true"], _sh("sleep 3; echo waited > $PINGO_OUTPUT"), ["true"])
        document["actions"][0] = _unmanaged(
            scratch / "dir" / "admin.token", "echo a > $PINGO_OUTPUT"
        )
        document["actions"][2] = {
            **document["actions"][2],
            "parentActions": [{"id": 1}, {"id": 2}],
            "command": _sh('cat "$PINGO_INPUT_1"; echo read > $PINGO_OUTPUT'),
        }
        submitted = alice.submit(document)
        deadline = time.monotonic() + 30
        while alice.action(submitted["id"], 1)["state"] != "FINISHED":
            assert time.monotonic() < deadline, alice.action(submitted["id"], 1)["error"]
            time.sleep(0.05)
        (scratch / "dir").rename(scratch / "was-dir")
        (scratch / "dir").symlink_to(home)
        workflow = alice.wait(submitted["id"], timeout_s=60, poll_s=0.05)
        assert workflow["state"] == "FAILED"
        assert "Pingo's own" in (alice.action(workflow["id"], 3)["error"] or "")
        _assert_no_secret_anywhere(server)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_data_root_linked_to_another_disk_stays_hidden(tmp_path: Path) -> None:
    """Datasets moved out of $PINGO_HOME behind a symlink are hidden where they really are."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    # Outside /tmp (private in the sandbox), as a bigger disk would be.
    disk = Path(tempfile.mkdtemp(prefix="pingo-disk-", dir="/var/tmp"))
    try:
        (disk / "datasets").mkdir()
        (home / "datasets").symlink_to(disk / "datasets")
        linked = start_server(home, PINGO_DATA_ROOT=str(home / "datasets"))
        try:
            admin = linked.client(ADMIN_TOKEN)
            bob = linked.client(admin.create_user("bob")["token"])
            alice = linked.client(admin.create_user("alice")["token"])
            marker = uuid.uuid4().hex
            bobs = _run(bob, _workflow(_sh(f"echo bob-{marker} > $PINGO_OUTPUT")))
            assert bobs["state"] == "SUCCEEDED"
            stored = disk / "datasets" / bobs["actions"][0]["datasetId"][:2]
            assert (stored / bobs["actions"][0]["datasetId"]).read_text() == f"bob-{marker}\n"
            steal = (
                f"cat {stored}/*; ls -R {disk}; cat {home}/datasets/*/*; echo tried > $PINGO_OUTPUT"
            )
            alices = _run(alice, _workflow(_sh(steal)))
            assert alices["state"] == "SUCCEEDED"
            assert marker not in alice.logs(alices["id"], 1)
            # Inputs reached through the link still work.
            chained = _run(
                alice,
                _workflow(
                    _sh("echo parent > $PINGO_OUTPUT"),
                    _sh("cat $PINGO_INPUT_1 > $PINGO_OUTPUT"),
                    chain=True,
                ),
            )
            assert chained["state"] == "SUCCEEDED"
            child = chained["actions"][1]["datasetId"]
            assert (disk / "datasets" / child[:2] / child).read_text() == "parent\n"
        finally:
            linked.stop()
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def test_a_store_outside_home_is_out_of_reach(tmp_path: Path) -> None:
    """The SQLite store configured elsewhere (and its journal files) is covered too."""
    elsewhere = Path(tempfile.mkdtemp(prefix="pingo-store-", dir="/var/tmp"))
    try:
        db = elsewhere / "pingo.db"
        server = start_server(tmp_path / "home", PINGO_STORE_URL=f"sqlite:///{db}")
        try:
            admin = server.client(ADMIN_TOKEN)
            alice = server.client(admin.create_user("alice")["token"])
            assert Path(f"{db}-wal").exists()  # the journal a writer would go through
            promote = (
                f"import sqlite3; c = sqlite3.connect({str(db)!r});"
                " c.execute(\"update users set is_admin=1 where name='alice'\"); c.commit()"
            )
            tried = _run(alice, _workflow(["python3", "-c", promote]))
            assert tried["state"] == "FAILED"
            assert alice.me()["admin"] is False
            peek = f"cat {db} {db}-wal | wc -c > $PINGO_OUTPUT; ls -la {elsewhere}"
            peeked = _run(alice, _workflow(_sh(peek)))
            assert peeked["state"] == "SUCCEEDED"
            assert _dataset_path(server, peeked, 1).read_text().strip() == "0"
        finally:
            server.stop()
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_no_orphan_survives_a_killed_server(tmp_path: Path) -> None:
    """kill -9 of the server takes its running action with it; the retry writes the dataset.

    bwrap's `--die-with-parent` takes it at once, unless the kill came in the
    moment before bwrap bound itself to its parent: then the next server kills it
    as it starts (`sandbox.kill_orphans`; tests/unit/test_sandbox_orphans.py).
    """
    marker = f"orphan-{uuid.uuid4().hex}"
    # Attempt 1 (its staging path ends in ".1") waits; the retry writes at once.
    script = f'case "$PINGO_OUTPUT" in *.1) sleep 30;; esac; echo {marker} > "$PINGO_OUTPUT"'
    home = tmp_path / "home"
    quick = {"PINGO_LEASE_S": "2", "PINGO_RECONCILE_GRACE_S": "0.5",
             "PINGO_RETRY_BACKOFF_S": "0.1"}  # fmt: skip
    first = start_server(home, **quick)
    admin = first.client(ADMIN_TOKEN)
    workflow = admin.submit(_workflow(_sh(script)))
    deadline = time.monotonic() + 30
    while not (attempt_1 := set(_processes_with(marker))):
        assert time.monotonic() < deadline, "the action never started"
        time.sleep(0.05)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=10)

    second = start_server(home, port=first.port, **quick)
    try:
        deadline = time.monotonic() + 10
        while attempt_1 & set(_processes_with(marker)):
            assert time.monotonic() < deadline, "attempt 1 outlived the server"
            time.sleep(0.05)
        done = second.client(ADMIN_TOKEN).wait(workflow["id"], timeout_s=60, poll_s=0.1)
        assert done["state"] == "SUCCEEDED"
        action = done["actions"][0]
        assert action["attempts"] == 2
        assert _dataset_path(second, done, 1).read_text() == f"{marker}\n"
        # Attempt 1's leftovers (its sandbox box) are swept once it holds no lease.
        staging = home / "datasets" / ".staging"
        deadline = time.monotonic() + 20
        while leftovers := [p.name for p in staging.iterdir() if workflow["id"] in p.name]:
            assert time.monotonic() < deadline, leftovers
            time.sleep(0.1)
    finally:
        second.stop()


def test_a_running_server_kills_the_sandboxes_a_dead_one_left(tmp_path: Path) -> None:
    """An orphaned sandbox is killed by a node that keeps running on the machine, every
    lease, not only by the next server to start (`Reaper`, `sandbox.kill_orphans`)."""
    server = start_server(tmp_path / "home", PINGO_LEASE_S="1")
    gone = subprocess.Popen(["sleep", "60"])
    tag = sandbox.owner_tag(gone.pid)
    gone.kill()
    gone.wait()
    # Left after the server's start-up sweep: only a later sweep can find it.
    orphan = subprocess.Popen([tag, "60"], executable="/bin/sleep")
    try:
        assert orphan.wait(timeout=15) == -signal.SIGKILL
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        server.stop()


def test_home_and_its_files_are_private(server: Server) -> None:
    assert (server.home.stat().st_mode & 0o777) == 0o700
    # The store keeps token hashes only.
    for store_file in server.home.glob("pingo.db*"):
        assert ADMIN_TOKEN.encode() not in store_file.read_bytes(), store_file
    for name in ("pingo.db", "admin.token", "callback.secret"):
        assert ((server.home / name).stat().st_mode & 0o077) == 0, name
    for path in (server.home / "logs").rglob("*"):
        assert (path.stat().st_mode & 0o077) == 0, path


def test_reading_the_workflow_document_does_not_need_the_sandbox(server: Server) -> None:
    # Sanity: the examples, which read files from the repository, run sandboxed too.
    document = json.loads((REPO / "examples" / "wordcount.json").read_text())
    done = _run(server.client(ADMIN_TOKEN), document)
    assert done["state"] == "SUCCEEDED", done


# Resource limits: one user's action must not take the machine from the others.

#: The OS user an unprivileged server runs as when the suite runs as root.
NOBODY = 65534
#: The limits the unprivileged server gives each action (small, so that a test reaches them).
MAX_PROCESSES = 64
MAX_MEMORY_MIB = 256


#: The action limits are set by util-linux's prlimit and choom (`sandbox.limits_prefix`).
needs_util_linux = pytest.mark.skipif(
    shutil.which("prlimit") is None or shutil.which("choom") is None,
    reason="the action limits need prlimit and choom (Debian package util-linux)",
)


def _as_unprivileged() -> list[str]:
    """The prefix that runs a server as an unprivileged user: none when the suite is not
    root; under root (CI), `setpriv` to nobody, whom the kernel holds to RLIMIT_NPROC."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running a server as nobody needs setpriv (Debian package util-linux)")
    prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import pingo"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run this interpreter: {probe.stderr.decode()[-300:]}")
    return prefix


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    """A server run as an unprivileged user (its home in /var/tmp, which nobody may
    enter), with small action limits."""
    if shutil.which("prlimit") is None or shutil.which("choom") is None:
        pytest.skip("the action limits need prlimit and choom (Debian package util-linux)")
    prefix = _as_unprivileged()
    top = Path(tempfile.mkdtemp(prefix="pingo-limits-", dir="/var/tmp"))
    if prefix:
        os.chown(top, NOBODY, NOBODY)
    running = start_server(
        top / "home",
        as_user=prefix,
        PINGO_ACTION_MAX_PROCESSES=str(MAX_PROCESSES),
        PINGO_ACTION_MAX_MEMORY=f"{MAX_MEMORY_MIB}MiB",
        PINGO_ACTION_MAX_FILE_SIZE="1MiB",
    )
    yield running
    running.stop()
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def limited_users(limited: Server) -> tuple[Client, Client]:
    admin = limited.client(ADMIN_TOKEN)
    return (
        limited.client(admin.create_user("alice")["token"]),
        limited.client(admin.create_user("mallory")["token"]),
    )


#: Forks sleeping children until a fork is refused; writes how many it made, then ends them.
FORK_UNTIL_REFUSED = f"""
import os, signal, time
children = []
while len(children) < {4 * MAX_PROCESSES}:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    children.append(pid)
open(os.environ["PINGO_OUTPUT"], "w").write(str(len(children)))
for pid in children:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""

#: Allocates twice the memory limit; writes what happened.
ALLOCATE = f"""
import os
try:
    block = bytearray({2 * MAX_MEMORY_MIB} * 2**20)
    outcome = "allocated"
except MemoryError:
    outcome = "refused"
open(os.environ["PINGO_OUTPUT"], "w").write(outcome)
"""


def test_a_fork_bomb_stops_at_the_process_limit_and_the_others_work_on(
    limited: Server, limited_users: tuple[Client, Client]
) -> None:
    alice, mallory = limited_users
    bomb = _run(mallory, _workflow(["python3", "-c", FORK_UNTIL_REFUSED]))
    assert bomb["state"] == "SUCCEEDED", mallory.logs(bomb["id"], 1)
    made = int(_dataset_path(limited, bomb, 1).read_text())
    # The sandbox's own init and python itself count too.
    assert 0 < made < MAX_PROCESSES
    fine = _run(alice, _workflow(_sh("echo fine > $PINGO_OUTPUT")))
    assert fine["state"] == "SUCCEEDED"


def test_each_action_has_a_process_budget_of_its_own(
    limited: Server, limited_users: tuple[Client, Client]
) -> None:
    """Counted in each sandbox's user namespace: one user's action holding most of its
    budget leaves another's whole (not one budget for every process of the server's user)."""
    alice, mallory = limited_users
    hold = f"for i in $(seq {MAX_PROCESSES - 8}); do sleep 60 & done; sleep 60"
    holder = mallory.submit(_workflow(_sh(hold)))
    try:
        deadline = time.monotonic() + 30
        # A local action is SUBMITTED while its process runs.
        while mallory.action(holder["id"], 1)["state"] != "SUBMITTED":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(2)  # its sleeps started
        bomb = _run(alice, _workflow(["python3", "-c", FORK_UNTIL_REFUSED]))
        assert bomb["state"] == "SUCCEEDED", alice.logs(bomb["id"], 1)
        assert int(_dataset_path(limited, bomb, 1).read_text()) > MAX_PROCESSES // 2
        # The holder still held its processes meanwhile.
        assert mallory.action(holder["id"], 1)["state"] == "SUBMITTED"
    finally:
        mallory.kill(holder["id"])


def test_an_action_past_its_memory_limit_is_refused_memory(
    limited: Server, limited_users: tuple[Client, Client]
) -> None:
    alice, _ = limited_users
    workflow = _run(alice, _workflow(["python3", "-c", ALLOCATE]))
    assert workflow["state"] == "SUCCEEDED", alice.logs(workflow["id"], 1)
    assert _dataset_path(limited, workflow, 1).read_text() == "refused"


def test_an_actions_tmp_in_memory_holds_no_more_than_its_memory_limit(
    limited: Server, limited_users: tuple[Client, Client]
) -> None:
    """`/tmp` and `/dev/shm` are memory no rlimit counts: a red-team review filled 1.9 GB
    of `/tmp` with a 9 MB process, and the OOM killer took another user's action. Files
    of under 1 MB each, below the file-size limit, twice the memory limit in all."""
    alice, _ = limited_users
    fill = (
        "for d in /tmp /dev/shm /dev; do i=0; while [ $i -lt"
        f" {2 * MAX_MEMORY_MIB} ] && head -c 1000000 /dev/zero > $d/f$i 2>/dev/null;"
        ' do i=$((i+1)); done; echo "$d $i"; done > $PINGO_OUTPUT'
    )
    workflow = _run(alice, _workflow(_sh(fill)))
    assert workflow["state"] == "SUCCEEDED", alice.logs(workflow["id"], 1)
    text = _dataset_path(limited, workflow, 1).read_text()
    written = {d: int(n) for d, n in (line.split() for line in text.splitlines())}
    limit_mb = MAX_MEMORY_MIB * 2**20 // 10**6
    assert 0 < written["/tmp"] <= limit_mb and 0 < written["/dev/shm"] <= limit_mb, written
    assert written["/dev"] == 0, written  # read-only


def test_an_action_past_its_file_size_limit_fails(
    limited: Server, limited_users: tuple[Client, Client]
) -> None:
    """A file past PINGO_ACTION_MAX_FILE_SIZE (1 MiB here) ends the writer (SIGXFSZ);
    the log, which the action writes itself, is held to it too."""
    alice, _ = limited_users
    big = _run(alice, _workflow(_sh("head -c 2000000 /dev/zero > $PINGO_OUTPUT")))
    assert big["state"] == "FAILED"
    chatty = _run(alice, _workflow(_sh("yes | head -c 2000000; echo still here")))
    assert chatty["state"] == "FAILED" or "still here" not in alice.logs(chatty["id"], 1)
    assert (limited.home / "logs").is_dir()


def test_an_output_holding_hard_links_fails_its_attempt(server: Server, bob: Client) -> None:
    """A red-team review stored 3,000 names of one 1 MiB file: 3 GB on disk, in the
    budget and to hash, from a 1 MiB write."""
    script = 'mkdir "$PINGO_OUTPUT" && cd "$PINGO_OUTPUT" && echo x > a && ln a b'
    document = _workflow(_sh(script))
    document["actions"][0]["maxAttempts"] = 1
    workflow = _run(bob, document)
    assert workflow["state"] == "FAILED"
    assert "hard links" in (workflow["actions"][0]["error"] or "")


def test_the_loaders_variables_reach_the_command_not_the_limits_before_it(
    server: Server, alice: Client
) -> None:
    """A red-team review's `LD_PRELOAD` loaded its code into `prlimit`, which exec'd the
    command itself: no limit was set, and its memory got the server OOM-killed. The
    loader's variables now reach the command only. `LD_DEBUG` shows, in the log, every
    program the loader starts with it."""
    document = _workflow(["true"])
    document["actions"][0]["env"] = {"LD_DEBUG": "libs", "MALLOC_CHECK_": "3"}
    workflow = _run(alice, document)
    assert workflow["state"] == "SUCCEEDED"
    started = {
        line.split("initialize program:")[1].strip().rsplit("/", 1)[-1]
        for line in alice.logs(workflow["id"], 1).splitlines()
        if "initialize program:" in line
    }
    assert "true" in started
    assert not started & {"prlimit", "choom"}, started
    # Ahead of the command, `env` started with the plain variables, none of these.
    probe = _workflow(_sh('echo "$LD_DEBUG $GCONV_PATH $PLAIN" > "$PINGO_OUTPUT"'))
    probe["actions"][0]["env"] = {"LD_DEBUG": "", "GCONV_PATH": "/x", "PLAIN": "p"}
    seen = _run(alice, probe)
    assert _dataset_path(server, seen, 1).read_text() == " /x p\n"


@needs_util_linux
def test_the_oom_killer_takes_an_action_before_the_server(server: Server, alice: Client) -> None:
    workflow = _run(alice, _workflow(_sh("cat /proc/self/oom_score_adj > $PINGO_OUTPUT")))
    assert _dataset_path(server, workflow, 1).read_text() == f"{sandbox.OOM_SCORE_ADJ}\n"
    assert Path(f"/proc/{server.process.pid}/oom_score_adj").read_text() == "0\n"
