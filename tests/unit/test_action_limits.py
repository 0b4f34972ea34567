"""The limits each sandboxed action runs under: their settings and the argv that applies them.

What they do to a real action is tested against a real server, run as an unprivileged
user, in tests/integration/test_sandbox.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pingo import errors
from pingo.actions.executors import sandbox
from pingo.config import Settings

needs_util_linux = pytest.mark.skipif(
    shutil.which("prlimit") is None or shutil.which("choom") is None,
    reason="prlimit and choom come with the Debian package util-linux",
)


def test_by_default_an_action_has_a_process_limit_and_no_other() -> None:
    settings = Settings.from_env({})
    assert settings.action_max_processes == 1024
    assert settings.action_max_memory is None
    assert settings.action_max_file_size is None


def test_limits_are_read_as_counts_sizes_or_unlimited() -> None:
    settings = Settings.from_env({
        "PINGO_ACTION_MAX_PROCESSES": "unlimited",
        "PINGO_ACTION_MAX_MEMORY": "4GiB",
        "PINGO_ACTION_MAX_FILE_SIZE": "500MB",
    })  # fmt: skip
    assert settings.action_max_processes is None
    assert settings.action_max_memory == 4 * 2**30
    assert settings.action_max_file_size == 500 * 10**6
    assert Settings.from_env({"PINGO_ACTION_MAX_MEMORY": "unlimited"}).action_max_memory is None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PINGO_ACTION_MAX_PROCESSES", "0"),
        ("PINGO_ACTION_MAX_PROCESSES", "-5"),
        ("PINGO_ACTION_MAX_PROCESSES", "many"),
        ("PINGO_ACTION_MAX_MEMORY", "0"),
        ("PINGO_ACTION_MAX_MEMORY", "lots"),
        ("PINGO_ACTION_MAX_FILE_SIZE", "0B"),
    ],
)
def test_a_limit_that_would_refuse_everything_or_means_nothing_stops_the_server(
    name: str, value: str
) -> None:
    with pytest.raises(errors.ConfigurationError):
        Settings.from_env({name: value})


@needs_util_linux
def test_the_prefix_sets_each_limit_as_soft_and_hard_then_the_oom_preference() -> None:
    settings = Settings.from_env({
        "PINGO_ACTION_MAX_PROCESSES": "100",
        "PINGO_ACTION_MAX_MEMORY": "1MiB",
    })  # fmt: skip
    prefix = sandbox.limits_prefix(settings)
    assert prefix == (
        shutil.which("prlimit"), "--nproc=100:100", f"--as={2**20}:{2**20}", "--",
        shutil.which("choom"), "-n", str(sandbox.OOM_SCORE_ADJ), "--",
    )  # fmt: skip


@needs_util_linux
def test_without_limits_the_prefix_still_sets_the_oom_preference() -> None:
    settings = Settings.from_env({"PINGO_ACTION_MAX_PROCESSES": "unlimited"})
    assert sandbox.limits_prefix(settings) == (
        shutil.which("choom"), "-n", str(sandbox.OOM_SCORE_ADJ), "--",
    )  # fmt: skip


@needs_util_linux
def test_a_sandboxed_command_cannot_raise_its_limits_back(tmp_path: Path) -> None:
    """Outside the sandbox root could (CAP_SYS_RESOURCE); inside it nobody can."""
    settings = Settings.from_env(
        {"PINGO_HOME": str(tmp_path), "PINGO_ACTION_MAX_FILE_SIZE": "1MiB"}
    )
    box = sandbox.from_settings(settings)
    if box is None:
        pytest.skip("no sandbox here: user namespaces do not work")
    script = (
        "ulimit -f unlimited 2>/dev/null && echo raised;"
        " grep 'Max file size' /proc/self/limits; cat /proc/self/oom_score_adj"
    )
    argv = box.argv(["sh", "-c", script], output=str(tmp_path / "out"), box=None, inputs=[])
    done = subprocess.run(argv, executable=box.bwrap, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "Max", "file", "size", str(2**20), str(2**20), "bytes", str(sandbox.OOM_SCORE_ADJ)
    ]  # fmt: skip


def test_without_util_linux_actions_run_without_limits_and_the_log_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert sandbox.limits_prefix(Settings.from_env({})) == ()
    assert [r.event for r in caplog.records] == ["sandbox_limits_unavailable"]  # type: ignore[attr-defined]


def test_the_loaders_variables_are_split_off_for_the_command_alone() -> None:
    box = sandbox.Sandbox(
        "/bin/true", False, (), (), limits=("/usr/bin/choom", "-n", "1000", "--"),
        env_program="/usr/bin/env",
    )  # fmt: skip
    early, late = box.split_environment(
        {"PATH": "/bin", "LD_PRELOAD": "/x.so", "MALLOC_ARENA_MAX": "2", "GCONV_PATH": "/g"}
    )
    assert early == {"PATH": "/bin"}
    assert late == {"LD_PRELOAD": "/x.so", "MALLOC_ARENA_MAX": "2", "GCONV_PATH": "/g"}
    argv = box.argv(["a=b", "x"], output="/o", box=None, inputs=[], loader_env={"LD_X": "1"})
    tail = argv[argv.index("--") + 1 :]
    assert tail == [
        "/usr/bin/choom", "-n", "1000", "--",
        "/usr/bin/env", "--", "LD_X=1", "sh", "-c", 'exec "$0" "$@"', "a=b", "x",
    ]  # fmt: skip
    # Without limits there is nothing to protect: bwrap sets everything, as before.
    plain = sandbox.Sandbox("/bin/true", False, (), ())
    assert plain.split_environment({"LD_PRELOAD": "/x.so"}) == ({"LD_PRELOAD": "/x.so"}, {})


def test_a_process_limit_the_server_shares_with_full_slots_is_warned_about(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The kernel holds every sandbox of the server's user, with the server, to the
    server's RLIMIT_NPROC: 4 slots of 1,024 do not fit in 2,000."""
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sandbox.resource, "getrlimit", lambda _: (2000, 2000))
    sandbox._check_process_budget(Settings(local_slots=4))
    assert [r.event for r in caplog.records] == ["sandbox_process_budget"]  # type: ignore[attr-defined]
    caplog.clear()
    sandbox._check_process_budget(Settings(local_slots=1))
    sandbox._check_process_budget(Settings(local_slots=4, action_max_processes=400))
    assert caplog.records == []
