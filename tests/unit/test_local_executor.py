"""The local executor runs real subprocesses and reports through a Reporter."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pingo import errors
from pingo.actions.executors import base, sandbox
from pingo.actions.executors.local import (
    ExecutorClosed,
    KilledBeforeStart,
    LocalExecutor,
    create,
    server_environment,
)
from pingo.config import Settings
from pingo.datasets import trees
from pingo.datasets.storage import (
    COMPLETED_SUFFIX,
    EXIT_STATUS_SUFFIX,
    Completion,
    read_completion,
)


@dataclass
class Recorder:
    """A Reporter that remembers every report, and signals each one."""

    reports: list[tuple[str, str, int, dict[str, Any]]] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def _add(self, kind: str, callback_id: str, attempt: int, **details: Any) -> None:
        self.reports.append((kind, callback_id, attempt, details))
        self.event.set()

    async def running(self, callback_id: str, attempt: int) -> object:
        self._add("running", callback_id, attempt)
        return None

    async def success(
        self, callback_id: str, attempt: int, *, runtime_s: float | None = None
    ) -> object:
        self._add("success", callback_id, attempt, runtime_s=runtime_s)
        return None

    async def failed(self, callback_id: str, attempt: int, error: str) -> object:
        self._add("failed", callback_id, attempt, error=error)
        return None

    async def killed(self, callback_id: str, attempt: int) -> object:
        self._add("killed", callback_id, attempt)
        return None

    async def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        async def until() -> None:
            while len(self.reports) < count:
                self.event.clear()
                await self.event.wait()

        await asyncio.wait_for(until(), timeout_s)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def executor(recorder: Recorder) -> Any:
    ex = LocalExecutor(recorder, slots=2, node_id="node-a", kill_grace_s=1.0, close_grace_s=0.5)
    await ex.start()
    yield ex
    await ex.close()


_ids = iter(range(1, 1_000_000))


def submission(
    tmp_path: Path,
    command: Sequence[str],
    *,
    inputs: Mapping[int, str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    attempt: int = 1,
) -> base.Submission:
    action_id = next(_ids)
    definition: dict[str, Any] = {"id": action_id, "type": "command-line", "command": command}
    if env is not None:
        definition["env"] = dict(env)
    return base.Submission(
        workflow_id="wf1",
        action_id=action_id,
        attempt=attempt,
        action_type="command-line",
        definition=definition,
        output_path=str(tmp_path / "data" / ".staging" / f"out.{action_id}.{attempt}"),
        inputs=dict(inputs or {}),
        callback_id=f"cb{action_id}",
        callback_url=f"http://localhost/api/v1/callbacks/cb{action_id}",
        callback_token="t",
        timeout_s=timeout_s,
        log_path=base.log_path(tmp_path / "home", "wf1", action_id, attempt),
    )


def read(path: str | Path) -> str:
    with open(path) as f:
        return f.read()


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in the group: orphans' zombies wait for init."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command name: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


async def group_gone(pgid: int, timeout_s: float = 2.0) -> bool:
    """Whether the group empties within `timeout_s` (a SIGKILL is delivered asynchronously)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while group_alive(pgid):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def pid_of(executor: LocalExecutor, external_id: str) -> int:
    pid = executor.pid(external_id)
    assert pid is not None, f"{external_id} is not running"
    return pid


async def test_inputs_sh_quotes_every_path_for_a_shell(tmp_path: Path) -> None:
    """`{inputs:sh}` inside `sh -c`: each path one word, whatever it holds."""
    recorder = Recorder()
    ex = LocalExecutor(recorder, slots=1, node_id="n")
    await ex.start()
    hostile = {1: "/data/a b", 2: "/data/it's", 3: "/data/$(touch pwned);x", 4: "/data/*"}
    sub = submission(
        tmp_path,
        ["sh", "-c", 'for p in {inputs:sh}; do printf "%s\\n" "$p"; done > "$PINGO_OUTPUT"'],
        inputs=hostile,
    )
    await ex.submit(sub)
    await recorder.wait_for(1)
    assert recorder.reports[0][0] == "success", read(sub.log_path)
    assert read(sub.output_path).splitlines() == [hostile[k] for k in sorted(hostile)]
    await ex.close()


async def test_runs_argv_with_placeholders_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PINGO_ADMIN_TOKEN", "admin-secret")
    monkeypatch.setenv("DB_PASSWORD", "hunter2")
    monkeypatch.setenv("SOME_SETTING", "kept")
    recorder = Recorder()
    ex = LocalExecutor(recorder, slots=1, node_id="n")
    await ex.start()
    script = (
        "import json, os, sys\n"
        "out = sys.argv[1]\n"
        "json.dump({'argv': sys.argv[2:], 'env': dict(os.environ)}, open(out, 'w'))\n"
        "print('to stdout'); print('to stderr', file=sys.stderr)\n"
    )
    sub = submission(
        tmp_path,
        [sys.executable, "-c", script, "{output}", "{input:3}", "{inputs}", "x={inputs}", "-"],
        inputs={7: "/data/b", 3: "/data/a"},
        env={"MINE": "in={input:7}"},
    )
    external_id = await ex.submit(sub)
    assert external_id.endswith("@n")
    await recorder.wait_for(1)
    kind, callback_id, attempt, details = recorder.reports[0]
    assert (kind, callback_id, attempt) == ("success", sub.callback_id, 1)
    assert details["runtime_s"] > 0
    written = json.loads(read(sub.output_path))
    assert written["argv"] == ["/data/a", "/data/a", "/data/b", "x=/data/a,/data/b", "-"]
    env = written["env"]
    assert env["PINGO_OUTPUT"] == sub.output_path
    assert env["PINGO_INPUT_3"] == "/data/a"
    assert env["PINGO_INPUT_7"] == "/data/b"
    assert json.loads(env["PINGO_INPUTS"]) == {"3": "/data/a", "7": "/data/b"}
    assert env["PINGO_INPUTS_SH"] == "/data/a /data/b"
    assert env["PINGO_WORKFLOW_ID"] == "wf1"
    assert env["PINGO_ACTION_ID"] == str(sub.action_id)
    assert env["MINE"] == "in=/data/b"
    assert env["SOME_SETTING"] == "kept"
    assert "PINGO_ADMIN_TOKEN" not in env and "DB_PASSWORD" not in env
    log = read(sub.log_path)
    assert "to stdout" in log and "to stderr" in log
    await ex.close()


def test_server_environment_drops_secrets() -> None:
    env = server_environment(
        {"PATH": "/bin", "PINGO_TOKEN": "a", "aws_secret_access_key": "b", "X_PASSWORD_Y": "c"}
    )
    assert env == {"PATH": "/bin"}


async def test_nonzero_exit_reports_failure_with_log_tail(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    sub = submission(tmp_path, ["sh", "-c", "echo something broke >&2; exit 3"])
    await executor.submit(sub)
    await recorder.wait_for(1)
    kind, _, _, details = recorder.reports[0]
    assert kind == "failed"
    assert "exited with status 3" in details["error"]
    assert "something broke" in details["error"]


class Checking(Recorder):
    """Reads what says each attempt completed at the moment it is reported."""

    def __init__(self, outputs: Mapping[str, str], *, drop_note: bool = False) -> None:
        super().__init__()
        self.outputs = outputs
        self.drop_note = drop_note
        self.evidence: dict[str, Completion | None] = {}

    def _look(self, callback_id: str) -> None:
        output = self.outputs[callback_id]
        if self.drop_note:  # as if the node died before writing it
            Path(output + COMPLETED_SUFFIX).unlink(missing_ok=True)
        self.evidence[callback_id] = read_completion(output)

    async def success(
        self, callback_id: str, attempt: int, *, runtime_s: float | None = None
    ) -> object:
        self._look(callback_id)
        return await super().success(callback_id, attempt, runtime_s=runtime_s)

    async def failed(self, callback_id: str, attempt: int, error: str) -> object:
        self._look(callback_id)
        return await super().failed(callback_id, attempt, error)


async def _completed_or_not(
    tmp_path: Path, box: sandbox.Sandbox | None, *, drop_note: bool = False
) -> tuple[Checking, base.Submission, base.Submission]:
    ok = submission(tmp_path, ["sh", "-c", 'echo whole > "$PINGO_OUTPUT"'])
    failing = submission(tmp_path, ["sh", "-c", 'echo partial > "$PINGO_OUTPUT"; exit 1'])
    outputs = {sub.callback_id: sub.output_path for sub in (ok, failing)}
    recorder = Checking(outputs, drop_note=drop_note)
    ex = LocalExecutor(recorder, slots=2, node_id="n", box=box)
    await ex.start()
    await ex.submit(ok)
    await ex.submit(failing)
    await recorder.wait_for(2)
    await ex.close()
    return recorder, ok, failing


async def test_a_success_is_noted_beside_its_output_before_it_is_reported(
    tmp_path: Path,
) -> None:
    # Should the node die during the success report, the reaper of another node
    # finishes the attempt from this note rather than running it a second time.
    recorder, ok, failing = await _completed_or_not(tmp_path, None)
    (runtime,) = (r[3]["runtime_s"] for r in recorder.reports if r[0] == "success")
    noted = recorder.evidence[ok.callback_id]
    assert noted is not None and noted.runtime_s == pytest.approx(runtime, abs=1e-5)
    assert recorder.evidence[failing.callback_id] is None
    # Once the outcome is recorded the note goes (a staging directory is not a log).
    assert read_completion(ok.output_path) is None


async def test_a_sandboxed_attempt_leaves_its_exit_status_as_it_exits(tmp_path: Path) -> None:
    # bwrap writes the exit code itself as the command exits: even a node that died
    # before its own note leaves evidence of a completed attempt, and only of that.
    try:
        box = sandbox.from_settings(Settings(home=tmp_path / "home", sandbox="on"))
    except errors.SandboxUnavailable as exc:
        pytest.skip(str(exc))
    recorder, ok, failing = await _completed_or_not(tmp_path, box, drop_note=True)
    assert recorder.evidence == {ok.callback_id: Completion(None), failing.callback_id: None}
    assert read_completion(ok.output_path) is None
    left = [sub.output_path + EXIT_STATUS_SUFFIX for sub in (ok, failing)]
    assert not any(map(os.path.lexists, left)), "the exit status outlived the report"


async def test_timeout_kills_the_process_group(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    # The shell's background child shares its process group and must die too.
    sub = submission(tmp_path, ["sh", "-c", "sleep 60 & sleep 60; wait"], timeout_s=0.3)
    external_id = await executor.submit(sub)
    pgid = pid_of(executor, external_id)
    assert group_alive(pgid)
    await recorder.wait_for(1)
    kind, _, _, details = recorder.reports[0]
    assert kind == "failed"
    assert details["error"] == "timed out after 0.3 s"
    assert await group_gone(pgid)


async def test_kill_stops_the_group_and_reports_killed(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    sub = submission(tmp_path, ["sh", "-c", "trap '' TERM; sleep 60 & sleep 60; wait"])
    external_id = await executor.submit(sub)
    assert external_id == executor.external_id_for(sub.callback_id, sub.attempt)
    assert await executor.status(external_id) is base.ExecutorStatus.RUNNING
    pgid = pid_of(executor, external_id)
    # The shell ignores SIGTERM: the kill must escalate to SIGKILL after the grace.
    await executor.kill(external_id)
    assert await group_gone(pgid)
    assert executor.pid(external_id) is None
    await recorder.wait_for(1)
    assert recorder.reports[0][0] == "killed"
    assert await executor.status(external_id) is base.ExecutorStatus.UNKNOWN
    await executor.kill(external_id)  # idempotent
    await executor.kill("cb1.1@another-node")


async def test_status_of_foreign_or_finished_work_is_unknown(executor: LocalExecutor) -> None:
    assert await executor.status(f"{os.getpid()}@node-b") is base.ExecutorStatus.UNKNOWN
    assert await executor.status("garbage") is base.ExecutorStatus.UNKNOWN


async def test_slots_bound_concurrency(tmp_path: Path, recorder: Recorder) -> None:
    ex = LocalExecutor(recorder, slots=2, node_id="n")
    await ex.start()
    subs = [submission(tmp_path, ["sleep", "0.3"]) for _ in range(5)]
    tasks = [asyncio.create_task(ex.submit(s)) for s in subs]
    await asyncio.sleep(0.1)
    # Two started; the other submits wait for a slot before starting anything.
    assert sum(t.done() for t in tasks) == 2
    assert ex.running == 2
    await asyncio.gather(*tasks)
    await recorder.wait_for(5)
    assert [r[0] for r in recorder.reports] == ["success"] * 5
    await ex.close()


async def test_work_killed_while_it_waits_for_a_slot_never_starts(
    tmp_path: Path, recorder: Recorder
) -> None:
    """A red-team review saw a killed action start once a slot freed, and write."""
    ex = LocalExecutor(recorder, slots=1, node_id="n")
    await ex.start()
    busy = await ex.submit(submission(tmp_path, ["sleep", "60"]))
    marker = tmp_path / "started"
    queued = submission(tmp_path, ["touch", str(marker)])
    waiting = asyncio.create_task(ex.submit(queued))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await ex.kill(ex.external_id_for(queued.callback_id, queued.attempt))
    await ex.kill(busy)
    with pytest.raises(KilledBeforeStart):
        await waiting
    await recorder.wait_for(1)
    assert [r[0] for r in recorder.reports] == ["killed"]
    assert not marker.exists()
    # Its slot was given back: work still runs.
    await ex.submit(submission(tmp_path, ["true"]))
    await recorder.wait_for(2)
    await ex.close()


async def test_missing_program_raises_from_submit(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    with pytest.raises(FileNotFoundError):
        await executor.submit(submission(tmp_path, ["/no/such/program"]))
    # The slot was given back: work still runs.
    await executor.submit(submission(tmp_path, ["true"]))
    await executor.submit(submission(tmp_path, ["true"]))
    await recorder.wait_for(2)


async def test_close_stops_running_work_without_reporting(
    tmp_path: Path, recorder: Recorder
) -> None:
    ex = LocalExecutor(recorder, slots=1, node_id="n", close_grace_s=0.2)
    await ex.start()
    external_id = await ex.submit(submission(tmp_path, ["sleep", "60"]))
    pgid = pid_of(ex, external_id)
    await ex.close()
    assert await group_gone(pgid)
    assert recorder.reports == []
    with pytest.raises(ExecutorClosed):
        await ex.submit(submission(tmp_path, ["true"]))


async def test_close_lets_short_work_finish(tmp_path: Path, recorder: Recorder) -> None:
    ex = LocalExecutor(recorder, slots=1, node_id="n", close_grace_s=5)
    await ex.start()
    await ex.submit(submission(tmp_path, ["sleep", "0.2"]))
    await ex.close()
    assert [r[0] for r in recorder.reports] == ["success"]


def test_create_reads_settings(tmp_path: Path, recorder: Recorder) -> None:
    ex = create(Settings(home=tmp_path, local_slots=3, node_id="me", stop_grace_s=1.5), recorder)
    assert (ex.slots, ex.node_id, ex.close_grace_s) == (3, "me", 1.5)
    with pytest.raises(errors.ConfigurationError, match="PINGO_STOP_GRACE_S"):
        Settings.from_env({"PINGO_STOP_GRACE_S": "-1", "PINGO_HOME": str(tmp_path)})


async def test_signal_death_is_reported(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    await executor.submit(submission(tmp_path, ["sh", "-c", f"kill -{signal.SIGUSR1} $$"]))
    await recorder.wait_for(1)
    assert "killed by signal SIGUSR1" in recorder.reports[0][3]["error"]


async def test_child_gets_default_sigpipe_and_its_own_path(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    # Python ignores SIGPIPE for itself; a child inheriting that breaks pipelines.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "report-sigign"
    program.write_text('#!/bin/sh\ngrep SigIgn /proc/$$/status > "$PINGO_OUTPUT"\n')
    program.chmod(0o755)
    sub = submission(tmp_path, ["report-sigign"], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    await executor.submit(sub)
    await recorder.wait_for(1)
    assert recorder.reports[0][0] == "success", recorder.reports
    ignored = int(read(sub.output_path).split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


async def test_a_program_that_moved_on_path_is_found_again(
    tmp_path: Path, executor: LocalExecutor, recorder: Recorder
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
    script = '#!/bin/sh\necho ran > "$PINGO_OUTPUT"\n'
    (first / "moving-program").write_text(script)
    (first / "moving-program").chmod(0o755)
    env = {"PATH": f"{first}:{second}:/usr/bin:/bin"}
    await executor.submit(submission(tmp_path, ["moving-program"], env=env))
    await recorder.wait_for(1)
    (first / "moving-program").rename(second / "moving-program")
    await executor.submit(submission(tmp_path, ["moving-program"], env=env))
    await recorder.wait_for(2)
    assert [r[0] for r in recorder.reports] == ["success", "success"]


def test_the_environment_reaches_bwrap_as_options_never_as_its_own() -> None:
    env = {"PATH": "/bin", "A": "x y", "LD_PRELOAD": "/evil.so"}
    assert sandbox.env_arguments(env).split(b"\0") == [
        b"--clearenv", b"--setenv", b"PATH", b"/bin", b"--setenv", b"A", b"x y",
        b"--setenv", b"LD_PRELOAD", b"/evil.so", b"",
    ]  # fmt: skip
    # A NUL would end one option and start another (a bind of the user's choosing).
    for bad in ({"A": "x\0--bind\0/\0/r"}, {"A\0--bind": "x"}, {"A=B": "x"}, {"": "x"}):
        with pytest.raises(errors.Forbidden):
            sandbox.env_arguments(bad)


def test_a_box_is_made_afresh_and_a_link_at_its_place_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    output = str(tmp_path / "out")
    os.symlink(target, sandbox.box_for(output))
    box = sandbox.make_box(output)
    assert os.path.isdir(box) and not os.path.islink(box) and not any(target.iterdir())
    (Path(box) / "out").mkdir()
    assert sandbox.planted_link(output) is None
    os.symlink("/etc", Path(box) / "out" / "inner")
    assert sandbox.planted_link(output) == "inner"
    assert sandbox.make_box(output) == box and not any(Path(box).iterdir())


@pytest.mark.parametrize("fresh", [True, False])
def test_collecting_a_box_copies_it_into_new_files_when_asked(tmp_path: Path, fresh: bool) -> None:
    """Fresh: new inodes (a descriptor the action handed out reaches none of them), links
    kept as links, a FIFO left out (copying it would wait for a writer); else a rename,
    of an output without FIFOs (`test_a_renamed_output_may_hold_no_fifo`)."""
    output = str(tmp_path / "out")
    written = Path(sandbox.make_box(output)) / "out"
    (written / "part").mkdir(parents=True)
    (written / "part" / "data").write_text("rows\n")
    os.symlink("/etc/passwd", written / "link")
    if fresh:
        os.mkfifo(written / "fifo")
    held = os.open(written / "part" / "data", os.O_RDWR)
    try:
        before = os.fstat(held).st_ino
        sandbox.collect(output, fresh=fresh)
        os.pwrite(held, b"EVIL", 0)
    finally:
        os.close(held)
    stored = Path(output)
    assert not os.path.lexists(sandbox.box_for(output))
    assert os.readlink(stored / "link") == "/etc/passwd"
    data = stored / "part" / "data"
    if fresh:
        assert data.read_text() == "rows\n" and data.stat().st_ino != before
        assert not (stored / "fifo").exists()
    else:
        assert data.read_text() == "EVIL\n" and data.stat().st_ino == before


def test_a_renamed_output_may_hold_no_fifo(tmp_path: Path) -> None:
    """Stored as it is beside a user's path, a FIFO named `<path>.exit` held the server's
    thread that opened it (a red-team review): refused, and nothing is left."""
    output = str(tmp_path / "out")
    written = Path(sandbox.make_box(output)) / "out"
    written.mkdir()
    os.mkfifo(written / "v.exit")
    with pytest.raises(trees.UnstorableOutput, match="FIFO"):
        sandbox.collect(output, fresh=False)
    assert not os.path.lexists(output) and not os.path.lexists(sandbox.box_for(output))


@pytest.mark.parametrize("fresh", [True, False])
def test_collecting_an_output_nested_too_deep_leaves_nothing(tmp_path: Path, fresh: bool) -> None:
    """Copied or renamed, an output deeper than `trees.MAX_DEPTH` is refused: nothing at
    the staging path (nor a partial copy beside it), and its box is gone."""
    output = str(tmp_path / "out")
    deepest = Path(sandbox.make_box(output)) / "out"
    for _ in range(trees.MAX_DEPTH + 2):
        deepest = deepest / "d"
    deepest.mkdir(parents=True)
    with pytest.raises(trees.UnstorableOutput):
        sandbox.collect(output, fresh=fresh)
    assert not os.path.lexists(output)
    assert not os.path.lexists(output + sandbox.COLLECTING_SUFFIX)
    assert not os.path.lexists(sandbox.box_for(output))


@pytest.mark.parametrize("fresh", [True, False])
def test_an_output_that_may_hold_no_link_is_refused_as_one(tmp_path: Path, fresh: bool) -> None:
    """An unmanaged output swapped for a link (or given one inside) after `planted_link`
    looked at its box is refused by the collect itself: nothing lands on the user's path."""
    output = str(tmp_path / "out")
    written = Path(sandbox.make_box(output)) / "out"
    written.symlink_to("/etc")
    with pytest.raises(trees.UnstorableOutput, match="symbolic link"):
        sandbox.collect(output, fresh=fresh, links=False)
    assert not os.path.lexists(output)
    assert not os.path.lexists(sandbox.box_for(output))
    inside = Path(sandbox.make_box(output)) / "out"
    inside.mkdir()
    (inside / "link").symlink_to("/etc")
    if fresh:  # renamed (no network), the box was checked before and nobody changes it
        with pytest.raises(trees.UnstorableOutput, match="symbolic link"):
            sandbox.collect(output, fresh=True, links=False)
        assert not os.path.lexists(output)


def test_a_box_replaced_by_a_link_before_the_spawn_is_refused(tmp_path: Path) -> None:
    """bwrap binds the box on the host, following a link: one swapped in after the box
    was made would mount its target writable into the action (a red-team review)."""
    output = str(tmp_path / "out")
    box = sandbox.make_box(output)
    sandbox.ensure_plain_box(output)
    os.rmdir(box)
    os.symlink(tmp_path, box)
    with pytest.raises(errors.Forbidden, match="replaced by a link"):
        sandbox.ensure_plain_box(output)
