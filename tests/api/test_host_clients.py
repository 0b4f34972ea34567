"""Cluster actions whose client would run a user's code on the server's machine, over HTTP.

`hadoop jar` runs the jar's main class in the client, and a Spark driver runs in the
client in client deploy mode (the whole job with a local master): outside the sandbox,
as the server's OS user, where `$PINGO_HOME` is readable. So a non-admin's such action is
refused (`PINGO_HOST_CLIENTS=admins`, the default), at submission and again before the
spawn; a Spark job whose driver runs on the cluster is not.
"""

from __future__ import annotations

from typing import Any

import pytest

from pingo.api import runtime
from pingo.config import Settings
from tests.api.conftest import AiohttpClient, Api, make_settings

pytestmark = pytest.mark.timeout(60)


def _cluster(kind: str) -> dict[str, Any]:
    action: dict[str, Any] = {"id": 1, "name": "job", "type": kind}
    if kind == "spark":
        action["application"] = "/opt/jobs/job.py"
    else:
        action["jar"] = "/opt/jobs/job.jar"
    return {"name": f"{kind}-job", "startActionId": 1, "endActionId": 1, "actions": [action]}


async def _dry_run(api: Api, document: dict[str, Any], user: str) -> tuple[int, str]:
    response = await api.client.post(
        "/api/v1/workflows?dryRun=true", json=document, headers=api.auth(user)
    )
    return response.status, await response.text()


async def test_a_non_admins_client_side_code_is_refused(users_api: Api) -> None:
    api = users_api
    for kind in ("spark", "mapreduce-v1", "mapreduce-v2"):
        status, text = await _dry_run(api, _cluster(kind), "bob")
        assert status == 403 and "PINGO_HOST_CLIENTS" in text, (kind, text)
        schedule = {"name": "nightly", "cron": "0 3 * * *", "workflow": _cluster(kind)}
        response = await api.client.post(
            "/api/v1/schedules", json=schedule, headers=api.auth("bob")
        )
        assert response.status == 403, kind
        # An admin's is not refused for it (422 where this node has no such client).
        assert (await _dry_run(api, _cluster(kind), "admin"))[0] in (200, 422)


@pytest.mark.parametrize("owner", ["bob", "carol"])
async def test_the_refusal_holds_for_work_that_did_not_pass_the_api(
    users_api: Api, owner: str
) -> None:
    """bob's work came another way (another node, a schedule); carol's was queued before
    an admin revoked her: an owner who no longer exists is no admin either."""
    api = users_api
    node = api.app[runtime.STATE_KEY].node
    assert node is not None
    if "spark" not in node.executors:
        pytest.skip("this node has no spark-submit (the pyspark package)")
    if owner == "carol":
        await api.add_user("carol")
        response = await api.client.delete("/api/v1/users/carol", headers=api.auth("admin"))
        assert response.status == 204
    document = _cluster("spark")
    document["actions"][0]["maxAttempts"] = 1
    stored = await node.workflows.submit(document, owner=owner)
    assert (await api.wait(stored.id))["state"] == "FAILED"
    action = await api.wait_action(stored.id, 1, {"FAILED"})
    assert "PINGO_HOST_CLIENTS" in action["error"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"spark_master": "yarn", "spark_deploy_mode": "cluster"},
        {"host_clients": "everyone"},
    ],
)
async def test_a_driver_on_the_cluster_or_an_admins_choice_lets_users_run_spark(
    aiohttp_client: AiohttpClient, tmp_path: Any, overrides: dict[str, str]
) -> None:
    from pingo.api.app import create_app

    settings: Settings = make_settings(tmp_path, **overrides)
    app = create_app(settings)
    client = await aiohttp_client(app)
    api = Api(client=client, app=app, tokens={"admin": "admin-token-for-tests"})
    await api.add_user("bob")
    document = _cluster("spark")
    # A local application would be shipped from this machine (tests/api/test_cluster_paths.py).
    document["actions"][0]["application"] = "hdfs://nn/jobs/job.py"
    status, text = await _dry_run(api, document, "bob")
    assert status != 403, text
