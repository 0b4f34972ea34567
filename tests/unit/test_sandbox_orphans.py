"""`sandbox.kill_orphans`: the sandboxes a killed server left are killed, no other process.

Real processes, tagged as the local executor tags bwrap (its argv[0]), stand in
for sandboxes: a server killed in the window before bwrap binds itself to its
parent cannot be timed from a test, the state it leaves behind can.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from pingo.actions.executors import sandbox


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _tagged(procs: list[subprocess.Popen[bytes]], tag: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([tag, "60"], executable="/bin/sleep")
    procs.append(proc)
    return proc


def _dead_server_tag() -> str:
    server = subprocess.Popen(["sleep", "60"])
    tag = sandbox.owner_tag(server.pid)
    server.kill()
    server.wait()
    return tag


def _killed(proc: subprocess.Popen[bytes]) -> bool:
    return proc.wait(timeout=10) == -9


def test_a_sandbox_whose_server_is_gone_is_killed(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    orphan = _tagged(spawned, _dead_server_tag())
    assert sandbox.kill_orphans() >= 1
    assert _killed(orphan)


def test_a_recycled_server_pid_does_not_keep_a_sandbox_alive(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    # Our own pid, alive, but with another start time: the process that was this
    # pid is gone.
    own = sandbox.owner_tag(os.getpid())
    pid, started = own.removeprefix(sandbox.TAG_PREFIX).split(":")
    orphan = _tagged(spawned, f"{sandbox.TAG_PREFIX}{pid}:{int(started) + 1}")
    sandbox.kill_orphans()
    assert _killed(orphan)


def test_a_live_servers_sandboxes_and_other_processes_are_left_alone(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    live = _tagged(spawned, sandbox.Sandbox("/bin/true", False, (), ()).tag)
    plain = _tagged(spawned, "sleep")
    forged = [
        _tagged(spawned, tag)
        for tag in ("pingo-sandbox", "pingo-sandbox:", "pingo-sandbox:x:1", "xpingo-sandbox:1:1")
    ]
    sandbox.kill_orphans()
    time.sleep(0.2)  # time enough for a SIGKILL sent to die of it
    for proc in (live, plain, *forged):
        assert proc.poll() is None, proc.args
