"""Fixtures of the API tests: a real app (SQLite file, node, local executor) over real HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from pingo.api import runtime
from pingo.api.app import create_app
from pingo.config import Settings
from pingo.node import Node

from .documented import ResponseCheck

ADMIN_TOKEN = "admin-token-for-tests"
REPO = Path(__file__).resolve().parents[2]

AiohttpClient = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]


def make_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "home": tmp_path / "home",
        "admin_token": ADMIN_TOKEN,
        "poll_interval_s": 0.05,
        "local_slots": 4,
        "retry_backoff_s": 0.05,
        # CI runs the suite as root (see tests/conftest.py).
        "root_actions": "everyone",
        # Many tests end with actions still running: their node's stop need not wait.
        "stop_grace_s": 0.5,
    }
    values.update(overrides)
    return Settings(**values)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def command_workflow(
    commands: dict[int, list[str]],
    parents: dict[int, list[int]] | None = None,
    *,
    name: str = "wf",
    end: int | None = None,
    extra: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A command-line workflow: action id → argv, with optional parents."""
    parents = parents or {}
    actions = []
    for aid, argv in sorted(commands.items()):
        action: dict[str, Any] = {
            "id": aid,
            "name": f"step{aid}",
            "type": "command-line",
            "command": argv,
        }
        if parents.get(aid):
            action["parentActions"] = [{"id": p} for p in parents[aid]]
        action.update((extra or {}).get(aid, {}))
        actions.append(action)
    ids = sorted(commands)
    return {
        "name": name,
        "startActionId": ids[0],
        "endActionId": ids[-1] if end is None else end,
        "actions": actions,
    }


def chain(tag: str, n: int = 3, *, name: str = "chain") -> dict[str, Any]:
    """n actions in a line, each writing a line to its output; `tag` makes them unique."""
    commands = {i: ["sh", "-c", f'echo {tag}-{i} > "$PINGO_OUTPUT"'] for i in range(1, n + 1)}
    return command_workflow(commands, {i: [i - 1] for i in range(2, n + 1)}, name=name)


def sleeper(tag: str, seconds: int = 30, **extra: Any) -> dict[str, Any]:
    """One action that sleeps (so it stays RUNNING while a test looks at it)."""
    return command_workflow(
        {1: ["sh", "-c", f'sleep {seconds}; echo {tag} > "$PINGO_OUTPUT"']},
        name="sleeper",
        extra={1: extra} if extra else None,
    )


@dataclass
class Api:
    """A running app and the tokens of its users."""

    client: TestClient[Any, Any]
    app: web.Application
    tokens: dict[str, str]

    @property
    def node(self) -> Node:
        node = self.app[runtime.STATE_KEY].node
        assert node is not None
        return node

    def auth(self, user: str) -> dict[str, str]:
        return bearer(self.tokens[user])

    async def add_user(self, name: str, *, admin: bool = False) -> str:
        response = await self.client.post(
            "/api/v1/users", json={"name": name, "admin": admin}, headers=self.auth("admin")
        )
        assert response.status == 201, await response.text()
        token: str = (await response.json())["token"]
        self.tokens[name] = token
        return token

    async def submit(self, document: Any, user: str = "admin", **kwargs: Any) -> dict[str, Any]:
        response = await self.client.post(
            "/api/v1/workflows", json=document, headers=self.auth(user), **kwargs
        )
        assert response.status == 201, await response.text()
        result: dict[str, Any] = await response.json()
        return result

    async def workflow(self, workflow_id: str, user: str = "admin") -> dict[str, Any]:
        response = await self.client.get(
            f"/api/v1/workflows/{workflow_id}", headers=self.auth(user)
        )
        assert response.status == 200, await response.text()
        result: dict[str, Any] = await response.json()
        return result

    async def metric(self, sample: str) -> float:
        """A sample's value in `GET /metrics` (`name{labels}` as exposed), 0 if absent.

        The registry is the process's, shared by the tests of a session: compare values
        read before and after, never a value alone.
        """
        text = await (await self.client.get("/metrics")).text()
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name == sample:
                return float(value)
        return 0.0

    async def wait(self, workflow_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """Poll over HTTP until the workflow is no longer RUNNING."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            document = await self.workflow(workflow_id)
            if document["state"] != "RUNNING":
                return document
            assert loop.time() < deadline, f"still RUNNING: {document['counts']}"
            await asyncio.sleep(0.05)

    async def wait_action(
        self, workflow_id: str, action_id: int, states: set[str], timeout_s: float = 15.0
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            response = await self.client.get(
                f"/api/v1/workflows/{workflow_id}/actions/{action_id}", headers=self.auth("admin")
            )
            action: dict[str, Any] = await response.json()
            if action["state"] in states:
                return action
            assert loop.time() < deadline, f"action still {action['state']}"
            await asyncio.sleep(0.05)


@pytest.fixture(scope="session")
def response_check() -> ResponseCheck:
    """One checker for the session: its validators are compiled once."""
    return ResponseCheck()


@pytest.fixture
def aiohttp_client(
    aiohttp_client: AiohttpClient, response_check: ResponseCheck
) -> Callable[..., Awaitable[TestClient[Any, Any]]]:
    """pytest-aiohttp's client, every answer checked against the OpenAPI document."""

    async def client(app: web.Application, **kwargs: Any) -> TestClient[Any, Any]:
        middlewares = (*kwargs.pop("middlewares", ()), response_check.middleware)
        return await aiohttp_client(app, middlewares=middlewares, **kwargs)  # type: ignore[call-arg]

    return client


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path)


@pytest.fixture
async def api(aiohttp_client: AiohttpClient, settings: Settings) -> Api:
    """The whole server as `pingo server` runs it (create_app opens SQLite and runs a node)."""
    app = create_app(settings)
    client = await aiohttp_client(app)
    return Api(client=client, app=app, tokens={"admin": ADMIN_TOKEN})


@pytest.fixture
async def users_api(api: Api) -> Api:
    """`api` with two ordinary users, alice and bob."""
    await api.add_user("alice")
    await api.add_user("bob")
    return api
