"""The web UI in a real headless Chromium (Debian's `chromium`), driven by Playwright.

Every test runs the whole server (SQLite file, node, sandboxed local executor)
and a real browser against it: pages are clicked through, live updates are
watched without reloading, and each page is checked by axe-core (vendored in
tests/ui/vendor) for serious or critical accessibility violations. The pages
are saved as screenshots, into docs/ui/ when PINGO_SCREENSHOTS=1 (that is how
the committed ones were made), else into the test's temporary folder.

Without /usr/bin/chromium the tests skip, naming the package; with CI=true
they fail instead, since CI installs it (.ci/run).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import Browser, BrowserContext, ConsoleMessage, Page, async_playwright

from pingo.api.app import create_app
from tests.api.conftest import (
    ADMIN_TOKEN,
    REPO,
    AiohttpClient,
    Api,
    chain,
    command_workflow,
    make_settings,
    sleeper,
)

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
SCREENSHOTS = REPO / "docs" / "ui"
#: How long a page may take to show a state the server reached (the machine is shared).
LIVE_TIMEOUT_MS = 30_000
#: HTML and script in names and logs: were any of it to run, `window.pwned` would be set.
HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


def _chromium_or_skip() -> None:
    if CHROMIUM.exists():
        return
    message = (
        f"{CHROMIUM} is missing: the browser tests need Debian's `chromium` package "
        "(apt-get install -y chromium)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    _chromium_or_skip()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Ui:
    """A browser context (one user's cookie jar) on a running server."""

    api: Api
    context: BrowserContext
    base: str
    shots: Path
    #: Console errors (a CSP refusal among them) and dialogs (an alert() that ran).
    problems: list[str] = field(default_factory=list)

    async def page(self) -> Page:
        page = await self.context.new_page()
        page.on("console", self._console)
        page.on("dialog", lambda d: self.problems.append(f"dialog: {d.message}"))
        page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        return page

    def _console(self, message: ConsoleMessage) -> None:
        # An answer's status (a 404 page, a refused login) is asserted by the tests
        # themselves; any other error (a CSP refusal, a script error) is a failure.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.problems.append(f"console: {message.text}")

    def url(self, path: str) -> str:
        return self.base + path

    async def sign_in(self, page: Page, user: str) -> None:
        await page.goto(self.url("/"))
        assert page.url == self.url("/login")
        await page.get_by_label("API token").fill(self.api.tokens[user])
        await page.get_by_role("button", name="Sign in").click()
        await page.wait_for_url(self.url("/workflows"))

    async def check(self, page: Page, shot: str | None = None) -> None:
        """No serious or critical axe violation on the page; save its screenshot."""
        await page.evaluate(AXE.read_text())
        result = await page.evaluate(
            "axe.run(document, {resultTypes: ['violations']})"
            ".then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
            " nodes: v.nodes.map(n => n.html).slice(0, 3)})))"
        )
        bad = [v for v in result if v["impact"] in ("serious", "critical")]
        assert not bad, f"{page.url}: {json.dumps(bad, indent=2)}"
        if shot is not None:
            await page.screenshot(path=str(self.shots / f"{shot}.png"), full_page=True)

    def assert_quiet(self) -> None:
        assert not self.problems, self.problems


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("PINGO_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return SCREENSHOTS
    return tmp_path


async def _ui(api: Api, browser: Browser, shots: Path) -> AsyncIterator[Ui]:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    ui = Ui(api=api, context=context, base=str(api.client.make_url("")).rstrip("/"), shots=shots)
    try:
        yield ui
        ui.assert_quiet()
    finally:
        await context.close()


@pytest.fixture
async def ui(users_api: Api, browser: Browser, shots: Path) -> AsyncIterator[Ui]:
    async for made in _ui(users_api, browser, shots):
        yield made


@pytest.fixture
async def second(users_api: Api, browser: Browser, shots: Path) -> AsyncIterator[Ui]:
    """Another browser (its own cookies) on the same server: another user."""
    async for made in _ui(users_api, browser, shots):
        yield made


async def test_sign_in_and_out(ui: Ui) -> None:
    page = await ui.page()
    await page.goto(ui.url("/workflows"))
    assert page.url == ui.url("/login")
    await ui.check(page, "login")
    await page.get_by_label("API token").fill("not-a-token")
    await page.get_by_role("button", name="Sign in").click()
    assert "not valid" in await page.get_by_role("alert").inner_text()
    await ui.sign_in(page, "alice")
    cookies = {c["name"]: c for c in await ui.context.cookies()}
    assert cookies["pingo_session"]["httpOnly"] is True
    assert cookies["pingo_session"]["sameSite"] == "Strict"
    await page.get_by_role("button", name="Sign out").click()
    await page.wait_for_url(ui.url("/login"))
    await page.goto(ui.url("/workflows"))
    assert page.url == ui.url("/login")


async def test_a_submitted_workflow_goes_live_to_succeeded(ui: Ui) -> None:
    page = await ui.page()
    await ui.sign_in(page, "alice")
    document = command_workflow(
        {
            1: ["sh", "-c", 'sleep 2; echo one > "$PINGO_OUTPUT"'],
            2: ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"'],
            3: ["sh", "-c", 'cat "$PINGO_INPUT_1" > "$PINGO_OUTPUT"'],
            4: ["sh", "-c", 'cat "$PINGO_INPUT_2" "$PINGO_INPUT_3" > "$PINGO_OUTPUT"'],
        },
        {2: [1], 3: [1], 4: [2, 3]},
        name="live-diamond",
    )
    submitted = await ui.api.submit(document, user="alice")
    listing = page
    await listing.goto(ui.url("/workflows"))
    await listing.get_by_role("cell", name="RUNNING").wait_for()
    workflow = await ui.page()
    await workflow.goto(ui.url(f"/workflows/{submitted['id']}"))
    assert await workflow.locator("#state").inner_text() == "RUNNING"
    # A mark a reload would wipe out: the page must change in place.
    await workflow.evaluate("window.stayed = true")
    await workflow.locator("#state", has_text="SUCCEEDED").wait_for(timeout=LIVE_TIMEOUT_MS)
    assert await workflow.evaluate("window.stayed") is True
    assert "4 computed" in await workflow.locator("#summary").inner_text()
    assert await workflow.locator("svg.dag circle.FINISHED").count() == 4
    await listing.get_by_role("cell", name="SUCCEEDED").wait_for(timeout=LIVE_TIMEOUT_MS)
    await ui.check(listing, "workflows")
    await ui.check(workflow, "workflow")


async def test_open_an_actions_log(ui: Ui) -> None:
    document = command_workflow(
        {1: ["sh", "-c", 'echo "hello from the sandbox"; echo out > "$PINGO_OUTPUT"']},
        name="logged",
    )
    submitted = await ui.api.submit(document, user="alice")
    await ui.api.wait(submitted["id"])
    page = await ui.page()
    await ui.sign_in(page, "alice")
    await page.get_by_role("link", name="logged").click()
    await page.get_by_role("link", name="step1", exact=True).click()
    await page.wait_for_url(ui.url(f"/workflows/{submitted['id']}/actions/1"))
    assert "hello from the sandbox" in await page.locator("#log").inner_text()
    await ui.check(page, "action")
    await page.get_by_role("link", name="Full log of attempt 1").click()
    assert "hello from the sandbox" in await page.locator("body").inner_text()


async def test_kill_a_running_workflow_from_the_page(ui: Ui) -> None:
    submitted = await ui.api.submit(sleeper("ui-browser-kill", seconds=60), user="alice")
    await ui.api.wait_action(submitted["id"], 1, {"SUBMITTED", "RUNNING"})
    page = await ui.page()
    await ui.sign_in(page, "alice")
    await page.goto(ui.url(f"/workflows/{submitted['id']}"))
    await ui.check(page, "workflow-running")
    await page.get_by_role("button", name="Kill").click()
    await page.locator("#state", has_text="KILLED").wait_for(timeout=LIVE_TIMEOUT_MS)
    assert (await ui.api.wait(submitted["id"]))["state"] == "KILLED"


async def test_rerun_with_force_from_the_page(ui: Ui) -> None:
    submitted = await ui.api.submit(chain("ui-browser-rerun", 2, name="rerun-me"), user="alice")
    await ui.api.wait(submitted["id"])
    page = await ui.page()
    await ui.sign_in(page, "alice")
    await page.goto(ui.url(f"/workflows/{submitted['id']}"))
    await page.get_by_label("Force (action names or ids, comma-separated)").fill("step2")
    await page.get_by_role("button", name="Rerun").click()
    await page.get_by_role("link", name=submitted["id"]).wait_for()
    assert page.url != ui.url(f"/workflows/{submitted['id']}")
    await page.locator("#state", has_text="SUCCEEDED").wait_for(timeout=LIVE_TIMEOUT_MS)
    summary = await page.locator("#summary").inner_text()
    assert summary.startswith("1 computed · 1 reused"), summary


async def test_the_dataset_pages_lineage(ui: Ui) -> None:
    submitted = await ui.api.submit(chain("ui-browser-lineage", 3, name="lineage"), user="alice")
    finished = await ui.api.wait(submitted["id"])
    first, end = finished["actions"][0]["datasetId"], finished["endDatasetId"]
    page = await ui.page()
    await ui.sign_in(page, "alice")
    await page.goto(ui.url(f"/workflows/{submitted['id']}/actions/3"))
    await page.get_by_role("link", name=end).click()
    await page.wait_for_url(ui.url(f"/datasets/{end}"))
    lineage = page.locator("#lineage")
    assert await lineage.get_by_role("link").count() == 3
    assert await page.locator("svg.lineage circle").count() == 3
    assert await page.locator("svg.lineage circle.root").count() == 1
    await ui.check(page, "dataset")
    await lineage.get_by_role("link", name=first[:16]).click()
    await page.wait_for_url(ui.url(f"/datasets/{first}"))
    # From the top, the graph goes down: two descendants, and the workflow that used it.
    assert "descendant" in await lineage.inner_text()
    await page.locator("svg.lineage a").nth(2).click()
    await page.wait_for_url(ui.url(f"/datasets/{end}"))
    await page.goto(ui.url(f"/datasets/{first}"))
    await page.locator("#used-by").get_by_role("link", name="lineage").click()
    await page.wait_for_url(ui.url(f"/workflows/{submitted['id']}"))
    await page.goto(ui.url("/datasets"))
    await page.get_by_label("Id prefix").fill(end[:8])
    await page.get_by_role("button", name="Search").click()
    rows = page.locator("tbody tr")
    assert await rows.count() == 1
    assert "step3" in await rows.inner_text()
    await ui.check(page, "datasets")


BIG_BYTES = 40_000


@pytest.fixture
async def budget_api(aiohttp_client: AiohttpClient, tmp_path: Path) -> Api:
    """A server whose storage budget is smaller than what two workflows keep."""
    settings = make_settings(
        tmp_path,
        storage_capacity_bytes=100_000,
        high_water=0.9,
        low_water=0.5,
        retention_interval_s=0.1,
        deletor_interval_s=0.1,
    )
    app = create_app(settings)
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    return api


def _big_chain(tag: str) -> dict[str, Any]:
    write = f'head -c {BIG_BYTES} /dev/zero > "$PINGO_OUTPUT"; echo {tag} >> "$PINGO_OUTPUT"'
    leaf = f'echo {tag} > "$PINGO_OUTPUT"'
    return command_workflow(
        {1: ["sh", "-c", write], 2: ["sh", "-c", write], 3: ["sh", "-c", leaf]},
        {2: [1], 3: [2]},
        name=f"big-{tag}",
    )


async def test_the_storage_page_under_a_budget(
    budget_api: Api, browser: Browser, shots: Path
) -> None:
    for tag in ("a", "b"):
        submitted = await budget_api.submit(_big_chain(tag), user="alice")
        assert (await budget_api.wait(submitted["id"]))["state"] == "SUCCEEDED"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while True:
        response = await budget_api.client.get("/api/v1/storage", headers=budget_api.auth("alice"))
        storage = await response.json()
        if storage["decisions"]:
            break
        assert loop.time() < deadline, storage
        await asyncio.sleep(0.1)
    async for ui in _ui(budget_api, browser, shots):
        page = await ui.page()
        await ui.sign_in(page, "alice")
        await page.get_by_role("link", name="Storage").click()
        assert await page.locator("#capacity").inner_text() == "100000"
        assert await page.locator("meter").count() == 1
        decisions = page.locator("#decisions tbody tr")
        assert await decisions.count() >= 1
        assert storage["policy"] in await decisions.first.inner_text()
        await ui.check(page, "storage")
        await decisions.first.get_by_role("link").click()
        assert await page.locator("#reason").inner_text() != ""
        assert float(await page.locator("#recompute").inner_text()) > 0
        await ui.check(page, "decision")


async def test_another_users_workflow_is_a_404_page(ui: Ui, second: Ui) -> None:
    submitted = await ui.api.submit(chain("ui-browser-404", 1, name="alices-secret"), user="alice")
    await ui.api.wait(submitted["id"])
    page = await second.page()
    await second.sign_in(page, "bob")
    assert "alices-secret" not in await page.locator("main").inner_text()
    for path in ("", "/actions/1", "/actions/1/log", "/definition.json", "/status.json"):
        response = await page.goto(second.url(f"/workflows/{submitted['id']}{path}"))
        assert response is not None and response.status == 404, path
        assert "404 Not Found" in await page.locator("h1").inner_text()
        assert "alices-secret" not in await page.content()
    await second.check(page, "not-found")
    # Seen as alice, the same page is there.
    own = await ui.page()
    await ui.sign_in(own, "alice")
    response = await own.goto(ui.url(f"/workflows/{submitted['id']}"))
    assert response is not None and response.status == 200


async def test_html_and_script_in_names_and_logs_show_literally(ui: Ui) -> None:
    document = command_workflow(
        {1: ["sh", "-c", f"echo '{HOSTILE}'; echo out > \"$PINGO_OUTPUT\""]}, name=HOSTILE
    )
    document["actions"][0]["name"] = HOSTILE
    submitted = await ui.api.submit(document, user="alice")
    await ui.api.wait(submitted["id"])
    page = await ui.page()
    await ui.sign_in(page, "alice")
    assert HOSTILE in await page.locator("tbody").inner_text()
    await page.goto(ui.url(f"/workflows/{submitted['id']}"))
    assert await page.locator("h1").inner_text() == HOSTILE
    assert await page.locator("svg.dag title").first.text_content() == f"{HOSTILE} (FINISHED)"
    await page.goto(ui.url(f"/workflows/{submitted['id']}/actions/1"))
    assert HOSTILE in await page.locator("#log").inner_text()
    assert await page.locator("h1").inner_text() == HOSTILE
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("main script, main img").count() == 0
    # The dataset page: the producer's name in the lineage graph and its table, the
    # workflow's name among those that used it.
    finished = await ui.api.wait(submitted["id"])
    await page.goto(ui.url(f"/datasets/{finished['endDatasetId']}"))
    assert await page.locator("svg.lineage text").first.text_content() == HOSTILE[:18]
    assert HOSTILE in await page.locator("#lineage").inner_text()
    assert HOSTILE in await page.locator("#used-by").inner_text()
    assert await page.evaluate("window.pwned") is None
    assert await page.locator("main script, main img").count() == 0


async def test_users_page_adds_and_revokes(ui: Ui) -> None:
    page = await ui.page()
    await ui.sign_in(page, "admin")
    await page.get_by_role("link", name="Users").click()
    names = await page.locator("#users tbody").inner_text()
    assert "alice" in names and "bob" in names
    await ui.check(page, "users")
    await page.get_by_label("Name", exact=True).fill("carol")
    await page.get_by_role("button", name="Add user").click()
    token = await page.get_by_label("Token of carol").input_value()
    me = await ui.api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert (await me.json())["name"] == "carol"
    await ui.check(page, "users-added")
    await page.get_by_role("button", name="Revoke carol").click()
    await page.wait_for_url(ui.url("/users"))
    assert "carol" not in await page.locator("#users tbody").inner_text()
    gone = await ui.api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert gone.status == 401


async def test_users_page_is_not_for_others(ui: Ui) -> None:
    page = await ui.page()
    await ui.sign_in(page, "alice")
    assert await page.get_by_role("link", name="Users").count() == 0
    response = await page.goto(ui.url("/users"))
    assert response is not None and response.status == 403


async def test_pin_unpin_and_delete_from_the_dataset_page(ui: Ui, second: Ui) -> None:
    submitted = await ui.api.submit(chain("ui-browser-pin", 2, name="pinned"), user="alice")
    finished = await ui.api.wait(submitted["id"])
    first = finished["actions"][0]["datasetId"]
    # Bob may look at it (one sharing scope) but not change it: no buttons.
    other = await second.page()
    await second.sign_in(other, "bob")
    await other.goto(second.url(f"/datasets/{first}"))
    assert await other.get_by_role("button", name="Pin").count() == 0
    assert await other.get_by_role("button", name="Delete").count() == 0
    page = await ui.page()
    await ui.sign_in(page, "alice")
    await page.goto(ui.url(f"/datasets/{first}"))
    await page.get_by_role("button", name="Pin").click()
    await page.wait_for_url(ui.url(f"/datasets/{first}"))
    assert await page.locator("#pinned").inner_text() == "yes"
    await ui.check(page, "dataset-pinned")
    await page.get_by_role("button", name="Unpin").click()
    await page.locator("#pinned", has_text="no").wait_for()
    await page.get_by_role("button", name="Delete").click()
    await page.wait_for_url(ui.url(f"/datasets/{first}"))
    assert await page.locator("dd").first.inner_text() != "STORED"
    response = await ui.api.client.get(f"/api/v1/datasets/{first}", headers=ui.api.auth("alice"))
    assert (await response.json())["state"] in {"STORED_TO_DELETE", "DELETING", "DELETED"}


async def test_a_form_on_another_site_cannot_sign_you_in(ui: Ui, aiohttp_server: Any) -> None:
    """Login CSRF: another origin's page posts the attacker's token to /login."""
    attacker = web.Application()
    form = (
        f'<form id="f" method="post" action="{ui.url("/login")}">'
        f'<input name="token" value="{ui.api.tokens["bob"]}"></form>'
    )

    async def evil(request: web.Request) -> web.Response:
        return web.Response(text=f"<!doctype html>{form}", content_type="text/html")

    attacker.router.add_get("/", evil)
    server = await aiohttp_server(attacker)
    page = await ui.page()
    await page.goto(str(server.make_url("/")))
    async with page.expect_navigation():
        await page.evaluate("document.getElementById('f').submit()")
    assert "403" in await page.locator("h1").inner_text()
    assert not [c for c in await ui.context.cookies() if c["name"] == "pingo_session"]


async def test_the_schedules_page(ui: Ui) -> None:
    body = {"name": HOSTILE, "cron": "0 3 * * *", "workflow": chain("ui-browser-schedule")}
    response = await ui.api.client.post(
        "/api/v1/schedules", json=body, headers=ui.api.auth("alice")
    )
    assert response.status == 201, await response.text()
    page = await ui.page()
    await ui.sign_in(page, "alice")
    await page.get_by_role("link", name="Schedules").click()
    assert HOSTILE in await page.locator("tbody").inner_text()
    assert "0 3 * * *" in await page.locator("tbody").inner_text()
    assert await page.evaluate("window.pwned") is None
    await ui.check(page, "schedules")
