"""`pingo schedules add|list|show|pause|resume|rm` against a real `pingo server`."""

from __future__ import annotations

import json

from tests.integration.test_cli import Server, server

__all__ = ["server"]


def test_schedules_from_the_command_line(server: Server) -> None:
    added = server.run(
        "schedules", "add", "yearly", "0 0 1 1 *", "examples/wordcount.json",
        "--timezone", "Europe/Paris", "--param", "region=eu", "--catch-up", "none",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    lines = added.stdout.strip().splitlines()
    schedule_id = lines[0]
    assert schedule_id.startswith("sch-")
    assert [line.split()[0] for line in lines[1:]] == ["next"] * 5
    assert "T23:00:00Z" in lines[1]  # midnight in Paris is 23:00 UTC

    listed = server.run("schedules", "list")
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith(schedule_id)]
    assert "yearly" in row and "Europe/Paris" in row and "T23:00:00Z" in row

    shown = server.run("schedules", "show", schedule_id)
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["parameters"] == {"region": "eu"}
    assert document["catchUp"] == "none"
    assert document["runs"] == []

    assert "paused" in server.run("schedules", "pause", schedule_id).stdout
    listed = server.run("schedules", "list")
    assert f"{schedule_id}" in listed.stdout and "paused" in listed.stdout
    resumed = server.run("schedules", "resume", schedule_id)
    assert resumed.returncode == 0 and "next" in resumed.stdout

    assert server.run("schedules", "rm", schedule_id).returncode == 0
    gone = server.run("schedules", "show", schedule_id)
    assert gone.returncode == 1
    assert "no schedule" in gone.stderr

    bad = server.run("schedules", "add", "bad", "61 * * * *", "examples/wordcount.json")
    assert bad.returncode == 1
    assert "INVALID_CRON" in bad.stderr or "cron" in bad.stderr


def test_data_triggered_schedules_from_the_command_line(server: Server) -> None:
    added = server.run(
        "schedules", "add", "after-counts", "examples/wordcount.json",
        "--when-stored", "daily-clicks", "count",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    stored_id = added.stdout.strip().splitlines()[0]
    added = server.run(
        "schedules", "add", "on-drop", "examples/wordcount.json", "--when-appears", "in/_SUCCESS"
    )
    assert added.returncode == 0, added.stderr
    path_id = added.stdout.strip().splitlines()[0]
    listed = server.run("schedules", "list").stdout.splitlines()
    [stored_row] = [line for line in listed if line.startswith(stored_id)]
    [path_row] = [line for line in listed if line.startswith(path_id)]
    assert "stored daily-clicks/count" in stored_row and "on data" in stored_row
    assert "appears in/_SUCCESS" in path_row
    shown = json.loads(server.run("schedules", "show", path_id).stdout)
    assert shown["trigger"] == {"path": "in/_SUCCESS"}

    both = server.run(
        "schedules", "add", "both", "* * * * *", "examples/wordcount.json",
        "--when-appears", "in/_SUCCESS",
    )  # fmt: skip
    assert both.returncode == 2
    assert "one of them" in both.stderr
    outside = server.run(
        "schedules", "add", "out", "examples/wordcount.json", "--when-appears", "../etc"
    )
    assert outside.returncode == 1
    assert "trigger" in outside.stderr
