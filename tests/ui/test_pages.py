"""The web UI over real HTTP: sign-in, session cookie, CSRF, ownership and escaping."""

from __future__ import annotations

import dataclasses
import re
import time

from pingo import ui
from tests.api.conftest import Api, chain, command_workflow, sleeper

SCRIPT = "<script>alert(1)</script>"


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
    users = await (await users_api.client.get("/users")).text()
    assert "alice" in users
    assert "bob" not in users
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
