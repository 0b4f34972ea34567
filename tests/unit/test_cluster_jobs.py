"""Cluster jobs: the options Pingo ships, the jobs a client log names, and their kills.

The kills run the stand-in `hadoop` and `yarn` of tests/fixtures/bin (no YARN cluster
runs here); they record their argv, so the tests assert exactly what would be sent.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pingo.actions.executors import base, cluster, hadoop, spark
from pingo.config import Settings
from tests.unit.test_local_executor import Recorder

STANDIN_BIN = Path(__file__).resolve().parents[1] / "fixtures" / "bin"

HADOOP_LOG = """\
INFO client.RMProxy: Connecting to ResourceManager at rm.example/10.0.0.1:8032
INFO impl.YarnClientImpl: Submitted application application_1700000000000_0042
INFO mapreduce.Job: The url to track the job: http://rm.example:8088/proxy/application_1700000000000_0042/
INFO mapreduce.Job: Running job: job_1700000000000_0042
"""
SPARK_STANDALONE_LOG = """\
INFO ClientEndpoint: Driver successfully submitted as driver-20261123201500-0007
INFO Utils: Successfully started service 'SparkUI' on port 4040.
INFO SparkUI: Bound SparkUI to 0.0.0.0, and started at http://driver.example:4040
"""


def test_find_jobs_reads_yarn_applications_drivers_and_urls() -> None:
    jobs = cluster.find_jobs(HADOOP_LOG + SPARK_STANDALONE_LOG + HADOOP_LOG)
    assert jobs.application_ids == ("application_1700000000000_0042",)
    assert jobs.driver_ids == ("driver-20261123201500-0007",)
    assert jobs.urls == (
        "http://rm.example:8088/proxy/application_1700000000000_0042/",
        "http://driver.example:4040",
    )
    assert not cluster.find_jobs("nothing submitted here application_x_1 driver-1-2")


def submission(tmp_path: Path, action_type: str, **definition: Any) -> base.Submission:
    return base.Submission(
        workflow_id="wf1",
        action_id=2,
        attempt=1,
        action_type=action_type,
        definition={"type": action_type, **definition},
        output_path="/data/.staging/out",
        inputs={1: "/data/in"},
        callback_id="cb2",
        callback_url="http://pingo.test/api/v1/callbacks/cb2",
        callback_token="t",
        timeout_s=None,
        log_path=base.log_path(tmp_path / "home", "wf1", 2, 1),
    )


SHIPPED = {
    "files": ["/jobs/stop.txt", "{input:1}"],
    "libjars": ["/jobs/a.jar"],
    "archives": ["/jobs/d.zip#d"],
    "properties": {"k": "{output}"},
}


def test_spark_ships_files_jars_archives_and_properties(tmp_path: Path) -> None:
    argv = spark.spark_submit_command(
        "spark-submit",
        "yarn",
        "cluster",
        submission(tmp_path, "spark", application="/jobs/app.py", conf={"a": "1"}, **SHIPPED),
    )
    assert argv[argv.index("--conf") :] == [
        "--conf", "a=1",
        "--conf", "k=/data/.staging/out",
        "--files", "/jobs/stop.txt,/data/in",
        "--jars", "/jobs/a.jar",
        "--archives", "/jobs/d.zip#d",
        "/jobs/app.py",
    ]  # fmt: skip


def test_mapreduce_main_class_is_optional(tmp_path: Path) -> None:
    with_class = hadoop.hadoop_command(
        "hadoop", hadoop.MR2, submission(tmp_path, "mapreduce-v2", jar="/j.jar", mainClass="M")
    )
    without = hadoop.hadoop_command(
        "hadoop", hadoop.MR2, submission(tmp_path, "mapreduce-v2", jar="/j.jar", **SHIPPED)
    )
    assert with_class[:4] == ["hadoop", "jar", "/j.jar", "M"]
    assert without[:9] == [
        "hadoop", "jar", "/j.jar",
        "-files", "/jobs/stop.txt,/data/in",
        "-libjars", "/jobs/a.jar",
        "-archives", "/jobs/d.zip#d",
    ]  # fmt: skip
    assert "k=/data/.staging/out" in without


def test_mapreduce_options_go_where_the_arguments_say(tmp_path: Path) -> None:
    # A ProgramDriver jar (Hadoop's examples) reads the program's name first: the
    # options must follow it, or the driver takes `-files` for a program's name.
    job = submission(
        tmp_path,
        "mapreduce-v2",
        jar="/examples.jar",
        arguments=["wordcount", "{options}", "{input:1}", "{output}"],
        **SHIPPED,
    )
    argv = hadoop.hadoop_command("hadoop", hadoop.MR2, job)
    assert argv == [
        "hadoop", "jar", "/examples.jar", "wordcount",
        "-files", "/jobs/stop.txt,/data/in",
        "-libjars", "/jobs/a.jar",
        "-archives", "/jobs/d.zip#d",
        "-D", "k=/data/.staging/out",
        "-D", f"mapreduce.job.end-notification.url={hadoop.notification_url(job)}",
        "/data/in", "/data/.staging/out",
    ]  # fmt: skip
    # Without the placeholder, the options come first, as ToolRunner reads them.
    first = hadoop.hadoop_command(
        "hadoop",
        hadoop.MR2,
        submission(tmp_path, "mapreduce-v2", jar="/j.jar", arguments=["{input:1}", "{output}"]),
    )
    assert first[3] == "-D" and first[-2:] == ["/data/in", "/data/.staging/out"]


def test_spark_cluster_mode_kills_drivers_with_spark_submit(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        spark_submit_bin=str(STANDIN_BIN / "hadoop"),  # any executable: only argv is built
        yarn_bin=str(STANDIN_BIN / "yarn"),
        spark_master="spark://master.example:7077",
        spark_deploy_mode="cluster",
    )
    executor = spark.SparkExecutor(settings, Recorder())
    commands = executor.kill_commands(cluster.find_jobs(HADOOP_LOG + SPARK_STANDALONE_LOG))
    assert commands == [
        (
            [str(STANDIN_BIN / "yarn"), "application", "-kill", "application_1700000000000_0042"],
            "application_1700000000000_0042",
        ),
        (
            [
                str(STANDIN_BIN / "hadoop"),
                "--master",
                "spark://master.example:7077",
                "--kill",
                "driver-20261123201500-0007",
            ],
            "driver-20261123201500-0007",
        ),
    ]
    client = spark.SparkExecutor(settings.replace(spark_deploy_mode="client"), Recorder())
    assert [job for _, job in client.kill_commands(cluster.find_jobs(SPARK_STANDALONE_LOG))] == []


@pytest.fixture
def standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HADOOP_STANDIN_MODE", "hang")
    monkeypatch.setenv("YARN_STANDIN_RECORD", str(tmp_path / "yarn.jsonl"))
    return tmp_path / "yarn.jsonl"


async def test_a_kill_kills_the_yarn_application_once_and_logs_it(
    tmp_path: Path, standins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    executor = hadoop.create_v2(Settings(home=tmp_path, node_id="n"), recorder)
    executor.kill_grace_s = 1.0
    await executor.start()
    try:
        work = submission(tmp_path, "mapreduce-v2", jar="/j.jar", arguments=["/in", "/out"])
        external_id = await executor.submit(work)
        for _ in range(300):
            if "Submitted application" in _read(work.log_path):
                break
            await asyncio.sleep(0.05)
        (app,) = cluster.scan_log(work.log_path).application_ids
        caplog.set_level("INFO", logger="pingo.actions.executors.cluster")
        await executor.kill(external_id)
        await recorder.wait_for(1)
        await executor.kill(external_id)  # idempotent: the job is not killed twice
    finally:
        await executor.close()
    calls = [json.loads(line)["argv"] for line in _read(standins).splitlines()]
    assert calls == [["application", "-kill", app]]
    assert [kind for kind, *_ in recorder.reports] == ["killed"]
    killed = [r for r in caplog.records if getattr(r, "event", None) == "cluster_killed"]
    assert len(killed) == 1 and app in killed[0].getMessage()


async def test_a_failed_yarn_kill_is_logged_and_still_stops_the_client(
    tmp_path: Path, standins: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    settings = Settings(home=tmp_path, node_id="n", yarn_bin="/bin/false")
    executor = hadoop.create_v2(settings, recorder)
    executor.kill_grace_s = 1.0
    await executor.start()
    try:
        work = submission(tmp_path, "mapreduce-v2", jar="/j.jar", arguments=["/in", "/out"])
        external_id = await executor.submit(work)
        for _ in range(300):
            if "Submitted application" in _read(work.log_path):
                break
            await asyncio.sleep(0.05)
        await executor.kill(external_id)
        await recorder.wait_for(1)
    finally:
        await executor.close()
    assert [kind for kind, *_ in recorder.reports] == ["killed"]
    failed = [r for r in caplog.records if getattr(r, "event", None) == "cluster_kill_failed"]
    assert failed and "exit 1" in failed[0].getMessage()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
