"""Local files a cluster action names, which its client would read here, over HTTP.

With a cluster master in cluster deploy mode a Spark driver runs on the cluster, so
any user may submit Spark actions. But `spark-submit` itself still runs on this
machine, unsandboxed, as the server's OS user, and uploads the local files the action
names (`application`, `files`, `libjars`, `archives`, and any `conf` value such as
`spark.yarn.dist.files` or `spark.kerberos.keytab`) for the job to read. So a
non-admin's action naming a local path is refused at the API and again before the
spawn (`pingo.actions.executors.cluster.host_file_refusal`); remote URIs are not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pingo.api.app import create_app
from pingo.config import Settings
from tests.api.conftest import ADMIN_TOKEN, AiohttpClient, Api, make_settings

pytestmark = pytest.mark.timeout(60)

#: What the server's refusal says (`cluster.HOST_FILE_DETAIL`).
REFUSED = "names a file on this server's machine"


def _spark(fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A one-action Spark workflow with `fields` (a remote application unless given)."""
    action: dict[str, Any] = {
        "id": 1,
        "name": "job",
        "type": "spark",
        "application": "hdfs://nn/jobs/job.py",
        **fields,
    }
    return {"name": "spark-job", "startActionId": 1, "endActionId": 1, "actions": [action], **extra}


def _with_parent(fields: dict[str, Any]) -> dict[str, Any]:
    """A command-line action 1 and a Spark action 2 reading its dataset."""
    document = _spark(fields)
    document["actions"][0].update(id=2, parentActions=[{"id": 1}])
    parent = {"id": 1, "name": "make", "type": "command-line", "command": ["true"]}
    document["actions"].insert(0, parent)
    document.update(startActionId=1, endActionId=2)
    return document


async def _cluster_api(aiohttp_client: AiohttpClient, tmp_path: Path, **overrides: Any) -> Api:
    """A server whose Spark driver runs on the cluster (YARN, cluster mode), and bob."""
    settings: Settings = make_settings(
        tmp_path, spark_master="yarn", spark_deploy_mode="cluster", **overrides
    )
    app = create_app(settings)
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("bob")
    return api


async def _dry_run(api: Api, document: dict[str, Any], user: str = "bob") -> tuple[int, str]:
    response = await api.client.post(
        "/api/v1/workflows?dryRun=true", json=document, headers=api.auth(user)
    )
    return response.status, await response.text()


def _home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def _local_fields(home: Path) -> list[tuple[str, dict[str, Any]]]:
    """(what the message names, fields): the server's secrets, each way a field names them."""
    return [
        ("application", {"application": f"{home}/callback.secret"}),
        ("application", {"application": f"file://{home}/admin.token"}),
        ("files", {"files": [f"{home}/admin.token#token"]}),
        ("files", {"files": ["hdfs://nn/a.txt", "callback.secret"]}),
        ("libjars", {"libjars": [f"file:{home}/pingo.db"]}),
        ("archives", {"archives": [f"local:{home}/callback.secret"]}),
        ("archives", {"archives": [" hdfs://nn/env.zip"]}),
        ("spark.yarn.dist.files", {"conf": {"spark.yarn.dist.files": f"{home}/pingo.db"}}),
        (
            "spark.submit.pyFiles",
            {"conf": {"spark.submit.pyFiles": f"hdfs://nn/ok.py,file://{home}/callback.secret"}},
        ),
        ("spark.kerberos.keytab", {"conf": {"spark.kerberos.keytab": "home/admin.token"}}),
        ("spark.jars.ivySettings", {"conf": {"spark.jars.ivySettings": "./ivysettings.xml"}}),
        ("spark.yarn.keytab", {"properties": {"spark.yarn.keytab": f"~/{home.name}/x.keytab"}}),
        ("spark.files", {"conf": {"spark.files": f"jceks://file{home}/secrets.jceks"}}),
    ]


async def test_a_non_admins_local_files_are_refused(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    api = await _cluster_api(aiohttp_client, tmp_path)
    for field, fields in _local_fields(_home(tmp_path)):
        status, text = await _dry_run(api, _spark(fields))
        assert status == 403, (fields, text)
        assert REFUSED in text and field in text and "docs/security.md" in text, text
        response = await api.client.post(
            "/api/v1/workflows", json=_spark(fields), headers=api.auth("bob")
        )
        assert response.status == 403, fields
        schedule = {"name": "nightly", "cron": "0 3 * * *", "workflow": _spark(fields)}
        response = await api.client.post(
            "/api/v1/schedules", json=schedule, headers=api.auth("bob")
        )
        assert response.status == 403, fields


async def test_a_bare_name_in_conf_is_refused_when_the_client_would_find_it(
    aiohttp_client: AiohttpClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark-submit resolves a relative path against its working directory, the server's:
    there `callback.secret` is the server's secret, while `4g` names nothing."""
    api = await _cluster_api(aiohttp_client, tmp_path)
    home = _home(tmp_path)
    assert (home / "callback.secret").exists()
    monkeypatch.chdir(home)
    status, text = await _dry_run(api, _spark({"conf": {"spark.yarn.keytab": "callback.secret"}}))
    assert status == 403 and "spark.yarn.keytab" in text, text
    status, text = await _dry_run(api, _spark({"conf": {"spark.executor.memory": "4g"}}))
    assert status == 200, text


async def test_remote_uris_are_accepted_and_local_paths_are_not(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    api = await _cluster_api(aiohttp_client, tmp_path)
    remote = {
        "application": "hdfs://nn/jobs/job.py",
        "files": ["s3a://bucket/a.txt", "https://example.com/b.txt#b"],
        "libjars": ["gs://bucket/lib.jar"],
        "archives": ["abfs://c@acct.dfs.core.windows.net/env.zip#env"],
        "conf": {
            "spark.yarn.dist.files": "viewfs://cluster/a,hdfs:///b",
            "spark.executor.memory": "4g",
            "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
            "spark.executor.extraJavaOptions": "-XX:+UseG1GC -XX:HeapDumpPath=/tmp/dumps",
            "spark.yarn.historyServer.address": "history.example.com:18080",
        },
        "properties": {"spark.sql.warehouse.dir": "hdfs:///user/hive/warehouse"},
    }
    status, text = await _dry_run(api, _spark(remote))
    assert status == 200, text
    for key, local in (
        ("files", ["s3a://bucket/a.txt", "/etc/hostname"]),
        ("conf", {**remote["conf"], "spark.sql.warehouse.dir": "/user/hive/warehouse"}),
    ):
        status, text = await _dry_run(api, _spark({**remote, key: local}))
        assert status == 403, (key, text)


async def test_an_admin_or_everyone_trusted_is_not_refused(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    home = _home(tmp_path)
    document = _spark({"files": [f"{home}/callback.secret"]})
    api = await _cluster_api(aiohttp_client, tmp_path)
    assert (await _dry_run(api, document))[0] == 403
    status, text = await _dry_run(api, document, user="admin")
    assert status == 200, text
    trusting = await _cluster_api(aiohttp_client, tmp_path / "trusting", host_clients="everyone")
    status, text = await _dry_run(trusting, document)
    assert status == 200, text


async def test_a_parents_dataset_is_allowed_where_it_is_remote(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """`{input:1}` is the action's own input. On a local data root it is a path on this
    machine, whose files a sandboxed action may have made links to the server's secrets
    (which spark-submit would follow): refused. On a remote root it is a remote URI."""
    fields = {"files": ["{input:1}"], "conf": {"spark.yarn.dist.archives": "{input:1}#data"}}
    local_root = await _cluster_api(aiohttp_client, tmp_path)
    status, text = await _dry_run(local_root, _with_parent(fields))
    assert status == 403 and "{input:1}" in text, text
    remote_root = await _cluster_api(
        aiohttp_client, tmp_path / "remote", data_root="memory://pingo-cluster-paths"
    )
    status, text = await _dry_run(remote_root, _with_parent(fields))
    assert status == 200, text
    escape = {"files": ["{input:1}", f"{_home(tmp_path)}/callback.secret"]}
    status, text = await _dry_run(remote_root, _with_parent(escape))
    assert status == 403, text


@pytest.mark.parametrize("owner", ["bob", "ghost"])
async def test_the_refusal_holds_for_work_that_did_not_pass_the_api(
    aiohttp_client: AiohttpClient, tmp_path: Path, owner: str
) -> None:
    """Work from another node, a schedule, or queued before the rule: refused before
    spawning spark-submit. `ghost` has no user record, so is no admin."""
    api = await _cluster_api(aiohttp_client, tmp_path)
    if "spark" not in api.node.executors:
        pytest.skip("this node has no spark-submit (the pyspark package)")
    document = _spark({"conf": {"spark.yarn.dist.files": f"{_home(tmp_path)}/callback.secret"}})
    document["actions"][0]["maxAttempts"] = 1
    stored = await api.node.workflows.submit(document, owner=owner)
    assert (await api.wait(stored.id))["state"] == "FAILED"
    action = await api.wait_action(stored.id, 1, {"FAILED"})
    assert REFUSED in action["error"] and "spark.yarn.dist.files" in action["error"]
