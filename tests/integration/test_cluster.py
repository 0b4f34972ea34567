"""Cluster executors end to end over real HTTP: MapReduce through a stand-in
`hadoop` and `yarn` (no Hadoop distribution or YARN cluster can run here), Spark for
real in local mode.

The stand-ins (tests/fixtures/bin/hadoop and yarn) record their argv; `hadoop` prints
a YARN application id as Hadoop's client does and calls the job-end notification URL
as Hadoop's JobEndNotifier does, so these tests exercise the command lines Pingo
builds (generic options, kills, log fetches) and the signed GET callback, not a real
cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pingo.api.app import create_app
from pingo.config import Settings
from tests.conftest import server_environ

REPO = Path(__file__).resolve().parents[2]
STANDIN_BIN = REPO / "tests" / "fixtures" / "bin"
TOKEN = "cluster-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A real Pingo server on a loopback port, and a client for it."""

    def __init__(self, base: str, session: aiohttp.ClientSession) -> None:
        self.base = base
        self.session = session
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    async def get(self, path: str) -> Any:
        async with self.session.get(self.base + path, headers=self.headers) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    async def submit(self, document: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(
            f"{self.base}/api/v1/workflows", json=document, headers=self.headers
        ) as response:
            assert response.status == 201, await response.text()
            result: dict[str, Any] = await response.json()
            return result

    async def kill(self, workflow_id: str) -> None:
        async with self.session.post(
            f"{self.base}/api/v1/workflows/{workflow_id}/kill", headers=self.headers
        ) as response:
            assert response.status in (200, 202), await response.text()

    async def wait(self, workflow_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            document: dict[str, Any] = await self.get(f"/api/v1/workflows/{workflow_id}")
            if document["state"] != "RUNNING":
                return document
            assert asyncio.get_running_loop().time() < deadline, document["counts"]
            await asyncio.sleep(0.1)

    async def wait_action(
        self, workflow_id: str, action_id: int, states: set[str], timeout_s: float = 60.0
    ) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            action: dict[str, Any] = await self.get(
                f"/api/v1/workflows/{workflow_id}/actions/{action_id}"
            )
            if action["state"] in states:
                return action
            assert asyncio.get_running_loop().time() < deadline, action["state"]
            await asyncio.sleep(0.1)


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in `hadoop` and `yarn` first on PATH; returns the file `hadoop`'s argv
    is recorded in (`yarn`'s goes to `yarn-argv.jsonl` beside it)."""
    record = tmp_path / "hadoop-argv.jsonl"
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HADOOP_STANDIN_RECORD", str(record))
    monkeypatch.setenv("YARN_STANDIN_RECORD", str(tmp_path / "yarn-argv.jsonl"))
    return record


async def _serve(tmp_path: Path, **overrides: Any) -> AsyncIterator[Server]:
    port = free_port()
    values: dict[str, Any] = {
        "home": tmp_path / "home",
        "admin_token": TOKEN,
        "port": port,
        "poll_interval_s": 0.05,
        "retry_backoff_s": 0.05,
        "lease_s": 2.0,
        "reconcile_grace_s": 0.5,
        "root_actions": "everyone",  # CI runs as root (tests/conftest.py)
    }
    values.update(overrides)
    settings = Settings(**values)
    runner = web.AppRunner(create_app(settings))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Server(settings.base_url, session)
    finally:
        await runner.cleanup()


@pytest.fixture
def hadoop_mode() -> str:
    """How the stand-in ends its jobs; tests override it with parametrize."""
    return "success"


@pytest.fixture
async def server(
    tmp_path: Path, standin: Path, hadoop_mode: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Server]:
    # Set before the server starts: executors take the server's environment at start.
    monkeypatch.setenv("HADOOP_STANDIN_MODE", hadoop_mode)
    async for s in _serve(tmp_path):
        yield s


def mapreduce_workflow(generation: str, tag: str, **action: Any) -> dict[str, Any]:
    """A text file made by a command-line action, then read by one MapReduce job."""
    job: dict[str, Any] = {
        "id": 2,
        "name": "count",
        "type": generation,
        "parentActions": [{"id": 1}],
        "jar": "/opt/jobs/wordcount.jar",
        "mainClass": "org.example.WordCount",
        "configuration": {"mapreduce.job.reduces": "2", "pingo.test.input": "{input:1}"},
        "queue": "analytics",
        "arguments": ["{input:1}", "{output}"],
    }
    job.update(action)
    return {
        "name": f"mr-{tag}",
        "startActionId": 1,
        "endActionId": 2,
        "actions": [
            {
                "id": 1,
                "name": "text",
                "type": "command-line",
                "command": ["sh", "-c", f'echo "{tag} words words" > "$PINGO_OUTPUT"'],
            },
            job,
        ],
    }


def recorded(record: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in record.read_text().splitlines()]


def properties(argv: list[str]) -> dict[str, str]:
    pairs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-D"]
    return dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize(
    ("generation", "queue_key", "notify_key"),
    [
        ("mapreduce-v2", "mapreduce.job.queuename", "mapreduce.job.end-notification.url"),
        ("mapreduce-v1", "mapred.job.queue.name", "job.end.notification.url"),
    ],
)
async def test_mapreduce_job_is_built_and_completed_by_its_notification(
    server: Server, standin: Path, generation: str, queue_key: str, notify_key: str
) -> None:
    workflow = await server.submit(mapreduce_workflow(generation, generation))
    done = await server.wait(workflow["id"])
    assert done["state"] == "SUCCEEDED", done

    (argv,) = recorded(standin)
    assert argv[:3] == ["jar", "/opt/jobs/wordcount.jar", "org.example.WordCount"]
    props = properties(argv)
    assert props[queue_key] == "analytics"
    assert props["mapreduce.job.reduces"] == "2"
    action = await server.get(f"/api/v1/workflows/{workflow['id']}/actions/2")
    url = props[notify_key]
    assert url.startswith(f"{server.base}/api/v1/callbacks/{action['callbackId']}?attempt=1&")
    assert "token=" in url and url.endswith("status=$jobStatus")
    # Placeholders resolve to the input dataset's path and the staging output path.
    source = await server.get(f"/api/v1/datasets/{done['actions'][0]['datasetId']}")
    assert props["pingo.test.input"] == source["path"] == argv[-2]
    assert "/.staging/" in argv[-1]
    # The staging output was promoted onto the dataset's own path.
    dataset = await server.get(f"/api/v1/datasets/{action['datasetId']}")
    assert dataset["state"] == "LEAF"
    assert (Path(dataset["path"]) / "part-r-00000").is_file()


async def test_a_notification_frees_the_type_slot_at_once(
    tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One MapReduce client at a time, and leases far longer than the test: the
    # second job can start in time only if the first one's HTTP notification
    # releases its slot (no lease renewal or reconciliation comes to the rescue).
    monkeypatch.setenv("HADOOP_STANDIN_MODE", "success")
    document = mapreduce_workflow("mapreduce-v2", "slots")
    second = dict(document["actions"][1], id=3, name="count-again", queue="other")
    document["actions"].append(second)
    document["endActionId"] = 3
    limits = {"mapreduce-v2": 1}
    async for server in _serve(tmp_path, executor_limits=limits, lease_s=60.0):
        workflow = await server.submit(document)
        done = await server.wait(workflow["id"], timeout_s=10)
        assert done["state"] == "SUCCEEDED", done
    assert len(recorded(standin)) == 2


@pytest.mark.parametrize("hadoop_mode", ["fail"])
async def test_failed_job_status_fails_the_action(server: Server, standin: Path) -> None:
    workflow = await server.submit(mapreduce_workflow("mapreduce-v2", "fails", maxAttempts=2))
    done = await server.wait(workflow["id"])
    assert done["state"] == "FAILED"
    assert len(recorded(standin)) == 2  # both attempts ran, each notified FAILED
    action = await server.get(f"/api/v1/workflows/{workflow['id']}/actions/2")
    assert action["state"] == "FAILED" and action["attempts"] == 2


@pytest.mark.parametrize("hadoop_mode", ["silent"])
async def test_lost_notification_is_resolved_by_reconciliation(
    server: Server, standin: Path
) -> None:
    workflow = await server.submit(mapreduce_workflow("mapreduce-v2", "silent"))
    done = await server.wait(workflow["id"])
    assert done["state"] == "SUCCEEDED", done
    assert len(recorded(standin)) == 1
    metrics = await server.session.get(f"{server.base}/metrics")
    assert 'pingo_reconciliations_total{outcome="succeeded"}' in await metrics.text()


@pytest.mark.parametrize("hadoop_mode", ["hang"])
async def test_killing_a_workflow_kills_the_running_hadoop_client(
    server: Server, standin: Path
) -> None:
    workflow = await server.submit(mapreduce_workflow("mapreduce-v2", "hangs"))
    await server.wait_action(workflow["id"], 2, {"SUBMITTED", "RUNNING"})
    # The client leads its own process group (its children would share it).
    pid = json.loads((await _text_of(standin, 15)).splitlines()[0])["pid"]
    await server.kill(workflow["id"])
    assert (await server.wait(workflow["id"]))["state"] == "KILLED"
    await _gone(pid)


async def test_mapreduce_without_main_class_lets_the_manifest_decide_and_ships_files(
    server: Server, standin: Path
) -> None:
    document = mapreduce_workflow(
        "mapreduce-v2",
        "manifest",
        files=["/opt/jobs/stopwords.txt", "{input:1}"],
        libjars=["/opt/jobs/lib/a.jar", "/opt/jobs/lib/b.jar"],
        archives=["/opt/jobs/dict.zip#dict"],
        properties={"mapreduce.map.memory.mb": "2048"},
    )
    del document["actions"][1]["mainClass"]
    workflow = await server.submit(document)
    done = await server.wait(workflow["id"])
    assert done["state"] == "SUCCEEDED", done

    (argv,) = recorded(standin)
    source = await server.get(f"/api/v1/datasets/{done['actions'][0]['datasetId']}")
    # `hadoop jar JAR` then the generic options: no main class, as the manifest decides.
    assert argv[:8] == [
        "jar",
        "/opt/jobs/wordcount.jar",
        "-files",
        f"/opt/jobs/stopwords.txt,{source['path']}",
        "-libjars",
        "/opt/jobs/lib/a.jar,/opt/jobs/lib/b.jar",
        "-archives",
        "/opt/jobs/dict.zip#dict",
    ]
    props = properties(argv)
    assert props["mapreduce.map.memory.mb"] == "2048"
    assert props["mapreduce.job.reduces"] == "2"  # `configuration` still applies


async def test_a_comma_in_a_shipped_path_is_refused(server: Server) -> None:
    document = mapreduce_workflow("mapreduce-v2", "comma", files=["/a,b"])
    async with server.session.post(
        f"{server.base}/api/v1/workflows", json=document, headers=server.headers
    ) as response:
        assert response.status == 422
        assert "/actions/1/files/0" in json.dumps(await response.json())


def yarn_calls(standin: Path) -> list[list[str]]:
    return recorded(standin.parent / "yarn-argv.jsonl")


def application_of(home: Path, workflow_id: str) -> str:
    (log,) = (home / "logs" / workflow_id).glob("2.*.log")
    (app,) = {w for w in log.read_text().split() if w.startswith("application_")}
    return app


@pytest.mark.parametrize("hadoop_mode", ["hang"])
async def test_killing_a_workflow_kills_its_yarn_application_once(
    server: Server, standin: Path, tmp_path: Path
) -> None:
    workflow = await server.submit(mapreduce_workflow("mapreduce-v2", "yarnkill"))
    await server.wait_action(workflow["id"], 2, {"SUBMITTED", "RUNNING"})
    pid = json.loads((await _text_of(standin, 15)).splitlines()[0])["pid"]
    await server.kill(workflow["id"])
    assert (await server.wait(workflow["id"]))["state"] == "KILLED"
    await _gone(pid)
    app = application_of(tmp_path / "home", workflow["id"])
    assert yarn_calls(standin) == [["application", "-kill", app]]


async def test_pingo_logs_says_where_the_cluster_logs_are_and_fetches_them(
    server: Server, standin: Path, tmp_path: Path
) -> None:
    workflow = await server.submit(mapreduce_workflow("mapreduce-v2", "logs"))
    assert (await server.wait(workflow["id"]))["state"] == "SUCCEEDED"
    app = application_of(tmp_path / "home", workflow["id"])
    jobs = await server.get(f"/api/v1/workflows/{workflow['id']}/actions/2/cluster-jobs")
    assert jobs == {
        "attempt": 1,
        "applications": [{"id": app, "logsCommand": ["yarn", "logs", "-applicationId", app]}],
        "drivers": [],
        "urls": [f"http://rm.test:8088/proxy/{app}/"],
    }
    command_line = await server.get(f"/api/v1/workflows/{workflow['id']}/actions/1/cluster-jobs")
    assert command_line["applications"] == command_line["urls"] == []

    env = server_environ()
    env.update({"PINGO_URL": server.base, "PINGO_TOKEN": TOKEN})
    pingo = str(Path(sys.executable).parent / "pingo")
    shown = await asyncio.to_thread(
        subprocess.run,
        [pingo, "logs", workflow["id"], "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"Submitted application {app}" in shown.stdout  # the client's own log
    assert f"YARN application {app}: yarn logs -applicationId {app}" in shown.stdout
    assert f"stand-in log line of {app}" in shown.stdout  # fetched with the yarn CLI
    assert yarn_calls(standin) == [["logs", "-applicationId", app]]

    env["PATH"] = "/usr/bin:/bin"  # no yarn here: say where, fetch nothing
    hint = await asyncio.to_thread(
        subprocess.run,
        [pingo, "logs", workflow["id"], "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert hint.returncode == 0, hint.stderr
    assert "no YARN CLI here" in hint.stdout
    assert len(yarn_calls(standin)) == 1


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


async def _text_of(path: Path, timeout_s: float) -> str:
    """The file's text once it has some."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        text = await asyncio.to_thread(_read, path)
        if text:
            return text
        assert asyncio.get_running_loop().time() < deadline, f"{path} never written"
        await asyncio.sleep(0.1)


async def _gone(pid: int, timeout_s: float = 15.0) -> None:
    """Wait until no process of `pid`'s process group is left."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        assert asyncio.get_running_loop().time() < deadline, f"process group {pid} survives"
        await asyncio.sleep(0.1)


async def test_mapreduce_without_hadoop_is_refused_at_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    async for server in _serve(tmp_path, hadoop_bin="hadoop"):
        async with server.session.post(
            f"{server.base}/api/v1/workflows",
            json=mapreduce_workflow("mapreduce-v2", "nohadoop"),
            headers=server.headers,
        ) as response:
            assert response.status == 422
            problem = await response.json()
            assert "mapreduce-v2" in json.dumps(problem)
        listed = await server.get("/api/v1/workflows")
        assert listed["items"] == []


# ------------------------------------------------------------------------- Spark, for real

SPARK_APP = REPO / "examples" / "spark" / "wordcount.py"
TEXT = "the quick brown fox jumps over the lazy dog the end"


def spark_workflow(application: str = str(SPARK_APP), **action: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": 2,
        "name": "wordcount",
        "type": "spark",
        "parentActions": [{"id": 1}],
        "application": application,
        "arguments": ["{input:1}", "{output}"],
        "conf": {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    }
    job.update(action)
    return {
        "name": "spark-wordcount",
        "startActionId": 1,
        "endActionId": 2,
        "actions": [
            {
                "id": 1,
                "name": "text",
                "type": "command-line",
                "command": ["sh", "-c", f'echo "{TEXT}" > "$PINGO_OUTPUT"'],
            },
            job,
        ],
    }


@pytest.fixture
async def spark_server(tmp_path: Path) -> AsyncIterator[Server]:
    async for s in _serve(tmp_path, spark_master="local[2]", lease_s=10.0):
        yield s


@pytest.mark.slow
async def test_pyspark_wordcount_runs_as_an_action_and_is_reused(spark_server: Server) -> None:
    first = await spark_server.submit(spark_workflow())
    done = await spark_server.wait(first["id"], timeout_s=180)
    assert done["state"] == "SUCCEEDED", done
    dataset = await spark_server.get(f"/api/v1/datasets/{done['actions'][1]['datasetId']}")
    assert dataset["state"] == "LEAF"
    lines = "".join(p.read_text() for p in sorted(Path(dataset["path"]).glob("part-*")))  # noqa: ASYNC240
    counts = dict(line.split("\t") for line in lines.splitlines())
    assert counts["the"] == "3" and counts["fox"] == "1"

    again = await spark_server.submit(spark_workflow())
    assert again["state"] == "SUCCEEDED"
    assert all(action["reused"] for action in again["actions"])


@pytest.mark.slow
async def test_killing_a_workflow_kills_spark_submit(spark_server: Server, tmp_path: Path) -> None:
    app = tmp_path / "slow.py"
    group_file = tmp_path / "spark-group"
    app.write_text(
        "import os, sys, time\n"
        "from pyspark.sql import SparkSession\n"
        "spark = SparkSession.builder.getOrCreate()\n"
        f"open({str(group_file)!r}, 'w').write(str(os.getpgrp()))\n"
        "time.sleep(600)\n"
    )
    workflow = await spark_server.submit(spark_workflow(str(app)))
    await spark_server.wait_action(workflow["id"], 2, {"RUNNING"}, timeout_s=120)
    pid = int(await _text_of(group_file, 120))
    await spark_server.kill(workflow["id"])
    assert (await spark_server.wait(workflow["id"]))["state"] == "KILLED"
    await _gone(pid, timeout_s=30)
