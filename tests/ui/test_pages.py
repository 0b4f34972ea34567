"""The web UI over real HTTP: sign-in, session cookie, CSRF, ownership and escaping."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

from pingo import ui
from pingo.api import runtime
from pingo.retention.policy import DECLINE_EVENT
from tests.api.conftest import Api, chain, command_workflow, sleeper

SCRIPT = "<script>alert(1)</script>"
#: Unicode's bidirectional formatting characters: marks, embeddings, overrides, isolates.
BIDI = "\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
#: What a page shows of `BIDI`: each character's escape, as text.
ESCAPED_BIDI = "".join(f"\\u{ord(c):04x}" for c in BIDI)


async def sign_in(api: Api, user: str) -> str:
    """Sign `user` in through the form; return the CSRF token of their session."""
    response = await api.client.post(
        "/login", data={"token": api.tokens[user]}, allow_redirects=False
    )
    assert response.status == 303
    assert response.headers["Location"] == "/workflows"
    page = await (await api.client.get("/workflows")).text()
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


async def test_root_without_session_goes_to_login(api: Api) -> None:
    response = await api.client.get("/", allow_redirects=False)
    assert response.status == 303
    assert response.headers["Location"] == "/login"
    pages = await api.client.get("/workflows", allow_redirects=False)
    assert pages.headers["Location"] == "/login"


async def test_a_wrong_token_does_not_sign_in(api: Api) -> None:
    response = await api.client.post("/login", data={"token": "guess"}, allow_redirects=False)
    assert response.status == 401
    assert "pingo_session" not in response.cookies
    assert "not valid" in await response.text()


async def test_the_session_cookie_is_http_only_and_strict(api: Api) -> None:
    response = await api.client.post(
        "/login", data={"token": api.tokens["admin"]}, allow_redirects=False
    )
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS the cookie is Secure


async def test_a_forged_session_cookie_is_refused(api: Api) -> None:
    api.client.session.cookie_jar.update_cookies({"pingo_session": "forged"})
    response = await api.client.get("/workflows", allow_redirects=False)
    assert response.headers["Location"] == "/login"


async def test_logout_needs_the_csrf_token(users_api: Api) -> None:
    csrf = await sign_in(users_api, "alice")
    refused = await users_api.client.post("/logout", data={}, allow_redirects=False)
    assert refused.status == 403
    wrong = await users_api.client.post("/logout", data={"csrf": "x"}, allow_redirects=False)
    assert wrong.status == 403
    done = await users_api.client.post("/logout", data={"csrf": csrf}, allow_redirects=False)
    assert done.status == 303
    after = await users_api.client.get("/workflows", allow_redirects=False)
    assert after.headers["Location"] == "/login"


async def test_another_users_workflow_is_not_found(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-own", 2, name="alices-secret"), user="alice")
    await sign_in(users_api, "bob")
    listing = await (await users_api.client.get("/workflows")).text()
    assert "alices-secret" not in listing
    assert submitted["id"] not in listing
    response = await users_api.client.get(f"/workflows/{submitted['id']}")
    assert response.status == 404
    assert "alices-secret" not in await response.text()


async def test_owner_sees_the_workflow_and_its_actions(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-see", 2, name="mine"), user="alice")
    await users_api.wait(submitted["id"])
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/workflows/{submitted['id']}")).text()
    assert "mine" in page
    assert "SUCCEEDED" in page
    assert "step2" in page


async def test_html_in_names_is_escaped(users_api: Api) -> None:
    document = chain("ui-esc", 1, name="wf")
    document["actions"][0]["name"] = SCRIPT
    document["name"] = "x" + SCRIPT.replace("/", "")
    submitted = await users_api.submit(document, user="alice")
    await sign_in(users_api, "alice")
    listing = await (await users_api.client.get("/workflows")).text()
    page = await (await users_api.client.get(f"/workflows/{submitted['id']}")).text()
    for html in (listing, page):
        assert "<script>" not in html
        assert "&lt;script&gt;" in html


async def test_bidi_controls_in_names_are_shown_as_escapes(users_api: Api) -> None:
    # Raw, U+202E shows bob's "a<RLO>gnp.exe" as "aexe.png" on other users' pages.
    document = chain("ui-bidi", 1, name=f"w{BIDI}x")
    document["actions"][0]["name"] = "a\u202egnp.exe"
    submitted = await users_api.submit(document, user="bob")
    await users_api.wait(submitted["id"])
    workflow = f"/workflows/{submitted['id']}"
    await sign_in(users_api, "alice")
    pages = {"/datasets": await (await users_api.client.get("/datasets")).text()}
    await sign_in(users_api, "admin")
    for path in ("/workflows", workflow, f"{workflow}/live", f"{workflow}/actions/1"):
        pages[path] = await (await users_api.client.get(path)).text()
    for path, page in pages.items():
        assert not set(BIDI) & set(page), path
    assert "a\\u202egnp.exe" in pages["/datasets"]
    assert f"w{ESCAPED_BIDI}x" in pages["/workflows"] and f"w{ESCAPED_BIDI}x" in pages[workflow]
    assert pages[workflow].count("a\\u202egnp.exe") >= 2  # the action table and the graph
    assert "<h1>a\\u202egnp.exe</h1>" in pages[f"{workflow}/actions/1"]


async def test_action_page_shows_the_log_escaped(users_api: Api) -> None:
    document = command_workflow(
        {1: ["sh", "-c", f"echo '{SCRIPT}'; echo done > \"$PINGO_OUTPUT\""]}, name="logger"
    )
    submitted = await users_api.submit(document, user="alice")
    await users_api.wait(submitted["id"])
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/workflows/{submitted['id']}/actions/1")).text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>" not in page
    await sign_in(users_api, "bob")
    other = await users_api.client.get(f"/workflows/{submitted['id']}/actions/1")
    assert other.status == 404


async def test_kill_needs_csrf_and_ownership(users_api: Api) -> None:
    submitted = await users_api.submit(sleeper("ui-kill"), user="alice")
    url = f"/workflows/{submitted['id']}/kill"
    bob_csrf = await sign_in(users_api, "bob")
    as_bob = await users_api.client.post(url, data={"csrf": bob_csrf}, allow_redirects=False)
    assert as_bob.status == 404
    csrf = await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/workflows/{submitted['id']}")).text()
    assert "Kill" in page
    forged = await users_api.client.post(url, data={}, allow_redirects=False)
    assert forged.status == 403
    assert (await users_api.workflow(submitted["id"]))["state"] == "RUNNING"
    done = await users_api.client.post(url, data={"csrf": csrf}, allow_redirects=False)
    assert done.status == 303
    assert (await users_api.wait(submitted["id"]))["state"] == "KILLED"
    # The audit log holds the UI's kill (alice's), and neither refused attempt.
    audit = await users_api.client.get("/api/v1/audit", headers=users_api.auth("admin"))
    kills = [e for e in (await audit.json())["items"] if e["action"] == "workflow.kill"]
    assert [(e["actor"], e["target"]["workflow_id"], e["status"]) for e in kills] == [
        ("alice", submitted["id"], 303)
    ]


async def test_dataset_pages_show_lineage(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-lineage", 2), user="alice")
    finished = await users_api.wait(submitted["id"])
    end = finished["endDatasetId"]
    parent = finished["actions"][0]["datasetId"]
    await sign_in(users_api, "alice")
    listing = await (await users_api.client.get("/datasets")).text()
    assert end[:16] in listing
    page = await (await users_api.client.get(f"/datasets/{end}")).text()
    assert end in page
    assert f"/datasets/{parent}" in page


async def test_live_fragment_answers_304_while_unchanged(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-live", 1), user="alice")
    await users_api.wait(submitted["id"])
    await sign_in(users_api, "alice")
    url = f"/workflows/{submitted['id']}/live"
    first = await users_api.client.get(url)
    assert first.status == 200
    assert "SUCCEEDED" in await first.text()
    again = await users_api.client.get(url, headers={"If-None-Match": first.headers["ETag"]})
    assert again.status == 304
    await sign_in(users_api, "bob")
    assert (await users_api.client.get(url)).status == 404
    script = await users_api.client.get("/ui/static/live.js")
    assert script.status == 200


async def test_storage_and_users_pages(users_api: Api) -> None:
    await sign_in(users_api, "alice")
    storage = await (await users_api.client.get("/storage")).text()
    assert 'id="used"' in storage
    assert '<dd id="yours">0</dd>' in storage
    # As the API's user list: for admins only.
    users = await users_api.client.get("/users")
    assert users.status == 403
    assert "bob" not in await users.text()
    await sign_in(users_api, "admin")
    everyone = await (await users_api.client.get("/users")).text()
    assert "alice" in everyone and "bob" in everyone


async def test_the_dag_is_an_svg_with_escaped_names(users_api: Api) -> None:
    document = command_workflow(
        {i: ["sh", "-c", f'echo dag-{i} > "$PINGO_OUTPUT"'] for i in range(1, 5)},
        {2: [1], 3: [1], 4: [2, 3]},
        name="diamond",
    )
    document["actions"][1]["name"] = SCRIPT
    submitted = await users_api.submit(document, user="alice")
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/workflows/{submitted['id']}")).text()
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert svg.count("<circle") == 4
    assert svg.count("<line") == 4
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg


async def test_an_expired_session_signs_out(users_api: Api) -> None:
    await sign_in(users_api, "alice")
    sessions = users_api.app[ui.SESSIONS_KEY].by_id
    for session_id, session in list(sessions.items()):
        sessions[session_id] = dataclasses.replace(session, expires_at=time.time() - 1)
    response = await users_api.client.get("/workflows", allow_redirects=False)
    assert response.headers["Location"] == "/login"
    assert not sessions


async def test_a_revoked_token_ends_the_session(users_api: Api) -> None:
    await sign_in(users_api, "alice")
    revoked = await users_api.client.delete("/api/v1/users/alice", headers=users_api.auth("admin"))
    assert revoked.status == 204
    response = await users_api.client.get("/workflows", allow_redirects=False)
    assert response.headers["Location"] == "/login"


async def test_the_schedules_page_shows_only_ones_own_escaped(users_api: Api) -> None:
    api = users_api
    body = {"name": SCRIPT, "cron": "0 3 * * *", "workflow": chain("ui-schedule")}
    response = await api.client.post("/api/v1/schedules", json=body, headers=api.auth("alice"))
    assert response.status == 201, await response.text()
    await sign_in(api, "alice")
    page = await (await api.client.get("/schedules")).text()
    assert SCRIPT not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "0 3 * * *" in page
    await api.client.post(
        "/logout", data={"csrf": re.search(r'name="csrf" value="([^"]+)"', page).group(1)}
    )  # type: ignore[union-attr]
    await sign_in(api, "bob")
    page = await (await api.client.get("/schedules")).text()
    assert "0 3 * * *" not in page
    assert "No schedules yet" in page


async def test_the_schedules_page_shows_data_triggers_escaped(users_api: Api) -> None:
    api = users_api
    body = {
        "name": "on-data",
        "trigger": {"dataset": {"workflow": SCRIPT, "action": "<b>count</b>"}},
        "workflow": chain("ui-trigger"),
    }
    response = await api.client.post("/api/v1/schedules", json=body, headers=api.auth("alice"))
    assert response.status == 201, await response.text()
    await sign_in(api, "alice")
    page = await (await api.client.get("/schedules")).text()
    assert SCRIPT not in page and "<b>count</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;count&lt;/b&gt;" in page
    assert "on data" in page
    assert "None" not in page


async def test_pages_carry_the_security_headers(users_api: Api) -> None:
    await sign_in(users_api, "alice")
    for path in ("/login", "/workflows", "/storage", "/nowhere"):
        response = await users_api.client.get(path, headers={"Accept": "text/html"})
        policy = response.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in policy, path
        assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Cache-Control"] == "no-store", path
    api_answer = await users_api.client.get("/api/v1/me", headers=users_api.auth("alice"))
    assert "Content-Security-Policy" not in api_answer.headers


async def test_errors_are_html_pages_for_the_ui_and_problems_for_the_api(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-html-404", 1, name="alices"), user="alice")
    await sign_in(users_api, "bob")
    for path in ("", "/actions/1", "/actions/1/log", "/definition.json", "/status.json", "/live"):
        response = await users_api.client.get(f"/workflows/{submitted['id']}{path}")
        assert response.status == 404, path
        assert response.content_type == "text/html"
        page = await response.text()
        assert "404 Not Found" in page and "alices" not in page
    unknown = await users_api.client.get("/no/such/page", headers={"Accept": "text/html"})
    assert unknown.status == 404 and unknown.content_type == "text/html"
    api_unknown = await users_api.client.get("/api/v1/nope", headers={"Accept": "text/html"})
    assert api_unknown.content_type == "application/problem+json"
    forged = await users_api.client.post(f"/workflows/{submitted['id']}/rerun", data={})
    assert forged.status == 403 and forged.content_type == "text/html"
    bad_state = await users_api.client.get("/workflows?state=<b>")
    assert bad_state.status == 400
    assert "&lt;b&gt;" in await bad_state.text()


async def test_a_login_posted_by_another_site_is_refused(users_api: Api) -> None:
    token = users_api.tokens["alice"]
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        response = await users_api.client.post(
            "/login", data={"token": token}, headers=headers, allow_redirects=False
        )
        assert response.status == 403, headers
        assert "pingo_session" not in response.cookies
    host = users_api.client.make_url("").host
    port = users_api.client.make_url("").port
    for headers in ({"Origin": f"http://{host}:{port}"}, {"Sec-Fetch-Site": "same-origin"}, {}):
        response = await users_api.client.post(
            "/login", data={"token": token}, headers=headers, allow_redirects=False
        )
        assert response.status == 303, headers


async def test_workflows_are_filtered_and_paged(users_api: Api, monkeypatch: Any) -> None:
    monkeypatch.setattr(ui, "PAGE_SIZE", 2)
    ids = []
    for i, name in enumerate(("north", "south", "north")):
        submitted = await users_api.submit(chain(f"ui-page-{i}", 1, name=name), user="alice")
        ids.append(submitted["id"])
        await users_api.wait(submitted["id"])
    await users_api.submit(sleeper("ui-page-running"), user="alice")
    await sign_in(users_api, "alice")

    def links(page: str) -> set[str]:
        return set(re.findall(r'href="/workflows/([^"/]+)"', page))

    first = await (await users_api.client.get("/workflows?name=north")).text()
    assert links(first) == {ids[0], ids[2]}
    assert 'rel="next"' not in first
    running = await (await users_api.client.get("/workflows?state=running")).text()
    assert "sleeper" in running and "north" not in running
    page_one = await (await users_api.client.get("/workflows")).text()
    found = re.search(r'href="([^"]+)" rel="next"', page_one)
    assert found is not None
    page_two = await (await users_api.client.get(found.group(1).replace("&amp;", "&"))).text()
    assert links(page_two) == {ids[0], ids[1]}
    live = await users_api.client.get("/workflows/live?name=north")
    assert live.status == 200
    again = await users_api.client.get(
        "/workflows/live?name=north", headers={"If-None-Match": live.headers["ETag"]}
    )
    assert again.status == 304


async def test_rerun_from_the_form(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-rerun-form", 2, name="again"), user="alice")
    await users_api.wait(submitted["id"])
    url = f"/workflows/{submitted['id']}/rerun"
    bob_csrf = await sign_in(users_api, "bob")
    as_bob = await users_api.client.post(url, data={"csrf": bob_csrf}, allow_redirects=False)
    assert as_bob.status == 404
    csrf = await sign_in(users_api, "alice")
    unknown = await users_api.client.post(
        url, data={"csrf": csrf, "force": "<nope>"}, allow_redirects=False
    )
    assert unknown.status == 422
    assert "no action named" in await unknown.text()
    assert "&lt;nope&gt;" in await unknown.text()
    done = await users_api.client.post(
        url, data={"csrf": csrf, "force": "1, step2"}, allow_redirects=False
    )
    assert done.status == 303
    rerun_id = done.headers["Location"].rsplit("/", 1)[1]
    rerun = await users_api.wait(rerun_id)
    assert rerun["state"] == "SUCCEEDED"
    assert [a["reused"] for a in rerun["actions"]] == [False, False]


async def test_the_workflow_json_downloads(users_api: Api) -> None:
    document = chain("ui-download", 2, name="download")
    submitted = await users_api.submit(document, user="alice")
    await sign_in(users_api, "alice")
    definition = await users_api.client.get(f"/workflows/{submitted['id']}/definition.json")
    assert definition.headers["Content-Disposition"].startswith("attachment")
    assert await definition.json() == document
    status = await users_api.client.get(f"/workflows/{submitted['id']}/status.json")
    assert status.headers["Content-Disposition"].startswith("attachment")
    assert (await status.json())["id"] == submitted["id"]


async def test_the_workflow_json_download_never_holds_a_webhook_secret(users_api: Api) -> None:
    secret = "ui-download-webhook-secret"
    hook = {"url": "https://hooks.example.org/pingo", "secret": secret}
    document = {**chain("ui-hooked", 1, name="hooked"), "webhooks": [hook]}
    submitted = await users_api.submit(document, user="alice")
    await sign_in(users_api, "alice")
    for path in ("/definition.json", "/status.json", ""):
        page = await users_api.client.get(f"/workflows/{submitted['id']}{path}")
        assert page.status == 200
        assert secret not in await page.text(), path
    definition = await users_api.client.get(f"/workflows/{submitted['id']}/definition.json")
    # The webhook is still named (to add a secret before submitting it again).
    expected = {**document, "webhooks": [{"url": hook["url"], "events": ["workflow.finished"]}]}
    assert await definition.json() == expected


async def test_dataset_search(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-search", 2, name="searched"), user="alice")
    finished = await users_api.wait(submitted["id"])
    first, end = finished["actions"][0]["datasetId"], finished["endDatasetId"]
    await sign_in(users_api, "alice")

    async def found(query: str) -> str:
        response = await users_api.client.get(f"/datasets?{query}")
        assert response.status == 200, query
        return await response.text()

    by_prefix = await found(f"prefix={end[:10]}")
    assert end[:16] in by_prefix and first[:16] not in by_prefix
    by_producer = await found("producer=step1")
    assert first[:16] in by_producer and end[:16] not in by_producer
    assert end[:16] in await found("state=leaf")
    assert end[:16] not in await found("state=stored")
    # Bob sees the datasets (one sharing scope) as the API shows them to him: the
    # producing action's name and type (docs/security.md), never alice's workflow.
    await sign_in(users_api, "bob")
    page = await found("prefix=")
    assert first[:16] in page and submitted["id"] not in page
    assert first[:16] in await found("producer=step1")


async def test_a_declined_dataset_is_a_decision_with_its_reason_escaped(users_api: Api) -> None:
    finished = await users_api.wait(
        (await users_api.submit(chain("ui-decline", 1), user="alice"))["id"]
    )
    dataset_id = finished["endDatasetId"]
    node = users_api.app[runtime.STATE_KEY].node
    assert node is not None
    event = await node.store.append_event(
        DECLINE_EVENT,
        dataset_id=dataset_id,
        payload={"policy": "lineage", "reason": "<script>alert(1)</script> 5.0% read"},
    )
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get("/storage")).text()
    row = re.search(r'<tr><td><a href="/storage/decisions/\d+">[^<]*</a></td>(.*?)</tr>', page)
    assert row is not None
    assert "<td>decline</td>" in row.group(1) and dataset_id[:16] in row.group(1)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; 5.0% read" in row.group(1)
    assert "<script>alert" not in page
    decision = await (await users_api.client.get(f"/storage/decisions/{event.seq}")).text()
    assert "Declined (not kept past its run)" in decision and "<script>alert" not in decision


async def test_an_unknown_retention_decision_is_not_found(users_api: Api) -> None:
    await sign_in(users_api, "alice")
    response = await users_api.client.get("/storage/decisions/12345")
    assert response.status == 404
    assert response.content_type == "text/html"


async def test_signing_in_drops_expired_sessions(users_api: Api) -> None:
    sessions = users_api.app[ui.SESSIONS_KEY]
    stale_id, stale = sessions.open("no-such-hash")
    sessions.by_id[stale_id] = dataclasses.replace(stale, expires_at=time.time() - 1)
    await sign_in(users_api, "alice")
    assert stale_id not in sessions.by_id
    assert len(sessions.by_id) == 1


async def test_a_big_workflows_page_is_not_drawn_and_lists_only_its_first_actions(
    users_api: Api, monkeypatch: Any
) -> None:
    # Issue 13: a page of every action of a 100,000-action workflow would be tens of MB,
    # and building it stopped the server for seconds. The limits are lowered here; the
    # page is built the same way.
    monkeypatch.setattr(ui, "DRAWN_ACTIONS", 10)
    monkeypatch.setattr(ui, "LISTED_ACTIONS", 4)
    document = chain("ui-big", 12, name="big")
    document["actions"][0]["command"] = ["sh", "-c", 'sleep 60; echo > "$PINGO_OUTPUT"']
    submitted = await users_api.submit(document, user="alice")
    csrf = await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/workflows/{submitted['id']}")).text()
    assert "<svg" not in page
    assert 'id="too-big"' in page and "12 actions are too many to draw" in page
    assert f"/workflows/{submitted['id']}/status.json" in page
    assert page.count(f"/workflows/{submitted['id']}/actions/") == 4
    assert "of 12</p>" in page
    url = f"/workflows/{submitted['id']}/live"
    first = await users_api.client.get(url)
    assert first.status == 200
    # Every action's state is in the ETag, listed or not: a kill changes it.
    killed = await users_api.client.post(
        f"/workflows/{submitted['id']}/kill", data={"csrf": csrf}, allow_redirects=False
    )
    assert killed.status == 303
    again = await users_api.client.get(url, headers={"If-None-Match": first.headers["ETag"]})
    assert again.status == 200
    assert "12 killed" in await again.text()
    small = await users_api.submit(chain("ui-small", 3, name="small"), user="alice")
    page = await (await users_api.client.get(f"/workflows/{small['id']}")).text()
    assert "<svg" in page and 'id="too-big"' not in page
