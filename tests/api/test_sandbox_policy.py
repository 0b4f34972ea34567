"""PINGO_SANDBOX over HTTP: no silent fallback to running users' commands unsandboxed.

The "no user namespaces" case is a node whose local executor has no sandbox,
which is what `sandbox.from_settings` gives the executor when the probe fails
under `auto` (this machine has working namespaces, so the probe itself cannot
fail here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pingo import errors
from pingo.actions.executors import base, sandbox
from pingo.actions.executors.local import LocalExecutor
from pingo.api.app import create_app
from pingo.config import Settings
from pingo.node import Node
from pingo.store import open_store
from tests.api.conftest import (
    ADMIN_TOKEN,
    AiohttpClient,
    Api,
    chain,
    make_settings,
)


def _unsandboxed(settings: Settings, reporter: base.Reporter) -> LocalExecutor:
    return LocalExecutor(reporter, slots=2, node_id=settings.node_id, box=None)


@contextlib.asynccontextmanager
async def _node_without_sandbox(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> AsyncIterator[tuple[Node, Api]]:
    """A node under `auto` whose local executor got no sandbox (no user namespaces), and
    its API as the admin."""
    settings = make_settings(tmp_path, sandbox="auto")
    async with open_store(f"sqlite:///{tmp_path / 'pingo.db'}") as store:
        node = Node(settings, store, executors={"command-line": _unsandboxed})
        await node.start()
        try:
            app = create_app(settings, node=node)
            yield node, Api(await aiohttp_client(app), app, {"admin": ADMIN_TOKEN})
        finally:
            await node.stop()


async def _readyz(api: Api) -> dict[str, str]:
    response = await api.client.get("/readyz")
    assert response.status == 200
    body: dict[str, str] = await response.json()
    return body


async def test_readyz_shows_the_sandbox_on(api: Api) -> None:
    assert await _readyz(api) == {"status": "ready", "sandbox": "on"}


async def test_auto_without_namespaces_refuses_users_but_not_admins(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    async with _node_without_sandbox(aiohttp_client, tmp_path) as (_node, api):
        assert await _readyz(api) == {"status": "ready", "sandbox": "unavailable"}
        await api.add_user("alice")
        await _submissions_refused(api, sandbox.UNAVAILABLE_DETAIL)
        done = await api.wait((await api.submit(chain("admin")))["id"])
        assert done["state"] == "SUCCEEDED"


async def _submissions_refused(api: Api, detail: str) -> None:
    """Alice's command-line workflow is refused (403, `detail`) as a submission and as a
    dry run, and nothing of it is stored."""
    for query in ("", "?dryRun=true"):
        refused = await api.client.post(
            f"/api/v1/workflows{query}", json=chain("a"), headers=api.auth("alice")
        )
        assert refused.status == 403, await refused.text()
        assert refused.content_type == "application/problem+json"
        problem = await refused.json()
        assert problem["code"] == "SANDBOX_UNAVAILABLE"
        assert problem["detail"] == detail
    listing = await api.client.get("/api/v1/workflows", headers=api.auth("alice"))
    assert (await listing.json())["items"] == []  # nothing was stored


async def test_off_is_explicit_and_shown(
    aiohttp_client: AiohttpClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, sandbox="off")
    with caplog.at_level(logging.INFO, logger="pingo"):
        app = create_app(settings)
        api = Api(await aiohttp_client(app), app, {"admin": ADMIN_TOKEN})
    # At start-up: a warning that says what it gives away, and the node's start line.
    events = {getattr(r, "event", None): r for r in caplog.records}
    assert events["sandbox_off"].levelno == logging.WARNING
    assert "unsandboxed" in events["sandbox_off"].getMessage()
    assert getattr(events["node_started"], "sandbox", None) == "off"
    assert await _readyz(api) == {"status": "ready", "sandbox": "off"}
    await api.add_user("alice")
    done = await api.wait((await api.submit(chain("off"), user="alice"))["id"])
    assert done["state"] == "SUCCEEDED"


def test_a_bad_sandbox_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigurationError):
        Settings.from_env({"PINGO_SANDBOX": "maybe", "PINGO_HOME": str(tmp_path)})
    with pytest.raises(errors.ConfigurationError):
        Settings.from_env({"PINGO_SANDBOX_NETWORK": "sometimes", "PINGO_HOME": str(tmp_path)})


async def test_a_users_action_reaching_an_unsandboxed_node_otherwise_is_refused_there(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """Work the API did not see on this node (another node's, a schedule's tick) is gated too.

    The workflow is stored as a tick stores it (`WorkflowManager.submit` with the
    schedule's owner); the node must not run Alice's command unsandboxed.
    """
    async with _node_without_sandbox(aiohttp_client, tmp_path) as (node, api):
        await api.add_user("alice")
        await _refused_at_the_spawn(node, api, tmp_path / "ran", sandbox.UNAVAILABLE_DETAIL)


async def _refused_at_the_spawn(node: Node, api: Api, marker: Path, detail: str) -> None:
    """Alice's command-line action, stored as a schedule's tick stores it, fails with
    `detail` before its process starts; re-running it over the API is refused like a
    submission; an admin's workflow reaching the node the same way runs."""
    document = chain("tick", n=1)
    document["actions"][0]["command"] = ["sh", "-c", f"cat /etc/shadow > {marker}"]
    document["actions"][0]["maxAttempts"] = 1
    stored = await node.workflows.submit(document, owner="alice")
    assert (await api.wait(stored.id))["state"] == "FAILED"
    action = await api.wait_action(stored.id, 1, {"FAILED"})
    assert detail in action["error"]
    assert not await asyncio.to_thread(marker.exists)
    rerun = await api.client.post(
        f"/api/v1/workflows/{stored.id}/rerun", json={}, headers=api.auth("alice")
    )
    assert rerun.status == 403, await rerun.text()
    assert (await rerun.json())["code"] == "SANDBOX_UNAVAILABLE"
    admins = await node.workflows.submit(chain("tick-admin", n=1), owner="admin")
    assert (await api.wait(admins.id))["state"] == "SUCCEEDED"


@pytest.mark.parametrize(
    ("store_url", "network", "warned"),
    [
        ("mongodb://127.0.0.1:27017/pingo", "on", True),
        ("mongodb://pingo:secret@127.0.0.1:27017/pingo", "on", False),
        ("mongodb://127.0.0.1:27017/pingo", "off", False),
        ("", "on", False),  # the default SQLite file, hidden by the sandbox
    ],
)
def test_a_mongo_store_open_to_the_actions_network_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, store_url: str, network: str, warned: bool
) -> None:
    settings = make_settings(tmp_path, sandbox="on", sandbox_network=network, store_url=store_url)
    with caplog.at_level(logging.WARNING, logger="pingo"):
        assert sandbox.from_settings(settings) is not None
    events = [getattr(r, "event", None) for r in caplog.records]
    assert ("sandbox_store_reachable" in events) is warned


def test_auto_without_namespaces_warns_once_and_on_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bwrap that cannot run (here /bin/false: it exits 1 like one refused namespaces)."""
    monkeypatch.setattr(sandbox, "bwrap_binary", lambda: "/bin/false")
    with caplog.at_level(logging.WARNING, logger="pingo"):
        assert sandbox.from_settings(make_settings(tmp_path, sandbox="auto")) is None
    warnings = [r for r in caplog.records if getattr(r, "event", None) == "sandbox_unavailable"]
    assert len(warnings) == 1
    assert "admins' run unsandboxed" in warnings[0].getMessage()
    with pytest.raises(errors.SandboxUnavailable):
        sandbox.from_settings(make_settings(tmp_path, sandbox="on"))


def test_a_bad_root_actions_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigurationError, match="PINGO_ROOT_ACTIONS"):
        Settings.from_env({"PINGO_ROOT_ACTIONS": "some", "PINGO_HOME": str(tmp_path)})


_AS_ROOT = pytest.mark.skipif(
    os.geteuid() != 0, reason="the gate is for a server run as root; CI runs the suite as root"
)


@_AS_ROOT
async def test_a_server_run_as_root_refuses_users_command_lines_but_not_admins(
    aiohttp_client: AiohttpClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As root, a sandboxed action is still root to the files the sandbox leaves visible
    (`/etc/shadow`), so a user's command-line action is refused at every door into the
    node: a submission, a dry run, a re-run, and work stored another way (a tick)."""
    settings = make_settings(tmp_path, sandbox="on", root_actions="admins")
    with caplog.at_level(logging.WARNING, logger="pingo"):
        app = create_app(settings)
        api = Api(await aiohttp_client(app), app, {"admin": ADMIN_TOKEN})
    warning = next(r for r in caplog.records if getattr(r, "event", None) == "sandbox_as_root")
    assert "refused" in warning.getMessage()
    assert await _readyz(api) == {"status": "ready", "sandbox": "on"}
    await api.add_user("alice")
    await _submissions_refused(api, sandbox.AS_ROOT_DETAIL)

    await _refused_at_the_spawn(api.node, api, tmp_path / "ran", sandbox.AS_ROOT_DETAIL)


@_AS_ROOT
async def test_root_actions_everyone_runs_users_command_lines_as_root(
    aiohttp_client: AiohttpClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(tmp_path, sandbox="on", root_actions="everyone")
    with caplog.at_level(logging.WARNING, logger="pingo"):
        app = create_app(settings)
        api = Api(await aiohttp_client(app), app, {"admin": ADMIN_TOKEN})
    warning = next(r for r in caplog.records if getattr(r, "event", None) == "sandbox_as_root")
    assert "PINGO_ROOT_ACTIONS=everyone" in warning.getMessage()
    await api.add_user("alice")
    done = await api.wait((await api.submit(chain("everyone"), user="alice"))["id"])
    assert done["state"] == "SUCCEEDED"
