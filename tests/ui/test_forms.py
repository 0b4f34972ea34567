"""The UI's state-changing forms and detail pages over real HTTP: who may use them,
CSRF on each, hostile input, and what they change as the API sees it."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from aiohttp import ClientResponse

from pingo import ui
from pingo.api.app import create_app
from tests.api.conftest import (
    ADMIN_TOKEN,
    AiohttpClient,
    Api,
    bearer,
    chain,
    command_workflow,
    make_settings,
)
from tests.ui.test_pages import SCRIPT, sign_in


def _cells(page: str, link: str) -> list[str]:
    """The text of each cell of the table row that holds `link`."""
    row = next(r for r in re.findall(r"<tr>.*?</tr>", page, re.S) if link in r)
    return [
        html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
        for c in re.findall(r"<td.*?</td>", row, re.S)
    ]


async def test_users_page_is_for_admins_only(users_api: Api) -> None:
    anonymous = await users_api.client.get("/users", allow_redirects=False)
    assert anonymous.status == 303 and anonymous.headers["Location"] == "/login"
    csrf = await sign_in(users_api, "alice")
    assert "/users" not in await (await users_api.client.get("/workflows")).text()
    assert (await users_api.client.get("/users")).status == 403
    posted = await users_api.client.post("/users", data={"csrf": csrf, "name": "mallory"})
    assert posted.status == 403
    revoked = await users_api.client.post("/users/bob/revoke", data={"csrf": csrf})
    assert revoked.status == 403
    me = await users_api.client.get("/api/v1/users/bob", headers=users_api.auth("admin"))
    assert me.status == 200
    missing = await users_api.client.get("/api/v1/users/mallory", headers=users_api.auth("admin"))
    assert missing.status == 404


async def test_an_admin_adds_a_user_whose_token_is_shown_once(users_api: Api) -> None:
    csrf = await sign_in(users_api, "admin")
    forged = await users_api.client.post("/users", data={"name": "carol"})
    assert forged.status == 403
    added = await users_api.client.post(
        "/users", data={"csrf": csrf, "name": "carol", "admin": "yes"}, allow_redirects=False
    )
    assert added.status == 201
    assert added.headers["Cache-Control"] == "no-store"
    found = re.search(r'id="new-token" readonly value="([^"]+)"', await added.text())
    assert found is not None
    token = html.unescape(found.group(1))
    me = await users_api.client.get("/api/v1/me", headers=bearer(token))
    assert (await me.json())["name"] == "carol" and (await me.json())["admin"] is True
    # Shown once: the list page afterwards never holds it.
    assert token not in await (await users_api.client.get("/users")).text()
    again = await users_api.client.post("/users", data={"csrf": csrf, "name": "carol"})
    assert again.status == 409


async def test_hostile_user_names_are_refused_and_escaped(users_api: Api) -> None:
    csrf = await sign_in(users_api, "admin")
    for name in (SCRIPT, "a\x00b", "", "x" * 65, "user:bob", "é"):
        response = await users_api.client.post("/users", data={"csrf": csrf, "name": name})
        assert response.status == 422, name
        assert "<script>" not in await response.text()
    listing = await (await users_api.client.get("/users")).text()
    assert "script" not in listing


async def test_an_admin_revokes_a_user(users_api: Api) -> None:
    bob = users_api.tokens["bob"]
    csrf = await sign_in(users_api, "admin")
    forged = await users_api.client.post("/users/bob/revoke", data={})
    assert forged.status == 403
    assert (await users_api.client.get("/api/v1/me", headers=bearer(bob))).status == 200
    itself = await users_api.client.post("/users/admin/revoke", data={"csrf": csrf})
    assert itself.status == 409
    unknown = await users_api.client.post("/users/nobody/revoke", data={"csrf": csrf})
    assert unknown.status == 404
    done = await users_api.client.post(
        "/users/bob/revoke", data={"csrf": csrf}, allow_redirects=False
    )
    assert done.status == 303 and done.headers["Location"] == "/users"
    assert (await users_api.client.get("/api/v1/me", headers=bearer(bob))).status == 401
    assert ">bob<" not in await (await users_api.client.get("/users")).text()


async def _dataset(api: Api, user: str, dataset_id: str) -> dict[str, object]:
    response = await api.client.get(f"/api/v1/datasets/{dataset_id}", headers=api.auth(user))
    assert response.status == 200
    document: dict[str, object] = await response.json()
    return document


async def test_dataset_forms_follow_the_apis_rules(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-dataset-forms", 2), user="alice")
    finished = await users_api.wait(submitted["id"])
    first, end = finished["actions"][0]["datasetId"], finished["endDatasetId"]
    pin = f"/datasets/{first}/pin"
    anonymous = await users_api.client.post(pin, data={}, allow_redirects=False)
    assert anonymous.status == 303 and anonymous.headers["Location"] == "/login"
    # Bob sees the dataset (one sharing scope) but did not produce it: no forms, 403.
    bob_csrf = await sign_in(users_api, "bob")
    seen = await (await users_api.client.get(f"/datasets/{first}")).text()
    assert f"/datasets/{first}/pin" not in seen and f"/datasets/{first}/delete" not in seen
    for change in ("pin", "unpin", "delete"):
        response = await users_api.client.post(
            f"/datasets/{first}/{change}", data={"csrf": bob_csrf}
        )
        assert response.status == 403, change
    assert (await _dataset(users_api, "alice", first))["pinned"] is False
    csrf = await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/datasets/{first}")).text()
    assert f'action="/datasets/{first}/pin"' in page
    assert f'action="/datasets/{first}/delete"' in page
    assert (await users_api.client.post(pin, data={})).status == 403
    assert (await users_api.client.post(pin, data={"csrf": "x" * 43})).status == 403
    done = await users_api.client.post(pin, data={"csrf": csrf}, allow_redirects=False)
    assert done.status == 303 and done.headers["Location"] == f"/datasets/{first}"
    assert (await _dataset(users_api, "alice", first))["pinned"] is True
    page = await (await users_api.client.get(f"/datasets/{first}")).text()
    assert f'action="/datasets/{first}/unpin"' in page
    await users_api.client.post(f"/datasets/{first}/unpin", data={"csrf": csrf})
    assert (await _dataset(users_api, "alice", first))["pinned"] is False
    # A workflow's final output needs the force box, as the API's ?force=true.
    leaf = await users_api.client.post(f"/datasets/{end}/delete", data={"csrf": csrf})
    assert leaf.status == 409
    assert (await _dataset(users_api, "alice", end))["state"] == "LEAF"
    forced = await users_api.client.post(
        f"/datasets/{end}/delete", data={"csrf": csrf, "force": "yes"}
    )
    assert forced.status == 200
    assert (await _dataset(users_api, "alice", end))["state"] != "LEAF"
    await users_api.client.post(f"/datasets/{first}/delete", data={"csrf": csrf})
    assert (await _dataset(users_api, "alice", first))["state"] != "STORED"
    unknown = await users_api.client.post("/datasets/00000000deadbeef/pin", data={"csrf": csrf})
    assert unknown.status == 404


async def test_an_admin_may_manage_anyones_dataset(users_api: Api) -> None:
    submitted = await users_api.submit(chain("ui-dataset-admin", 1), user="alice")
    end = (await users_api.wait(submitted["id"]))["endDatasetId"]
    csrf = await sign_in(users_api, "admin")
    assert f"/datasets/{end}/pin" in await (await users_api.client.get(f"/datasets/{end}")).text()
    await users_api.client.post(f"/datasets/{end}/pin", data={"csrf": csrf})
    assert (await _dataset(users_api, "alice", end))["pinned"] is True


async def test_the_uis_changes_are_in_the_audit_log(users_api: Api) -> None:
    """Every change the web UI makes is audited as the API's is: who, what, from where."""
    submitted = await users_api.submit(chain("ui-audited", 1), user="alice")
    dataset = (await users_api.wait(submitted["id"]))["actions"][0]["datasetId"]
    bob_csrf = await sign_in(users_api, "bob")
    refused = await users_api.client.post(f"/datasets/{dataset}/pin", data={"csrf": bob_csrf})
    assert refused.status == 403
    csrf = await sign_in(users_api, "alice")
    for change in ("pin", "unpin", "delete"):
        response = await users_api.client.post(
            f"/datasets/{dataset}/{change}",
            data={"csrf": csrf, "force": "yes"},
            allow_redirects=False,
        )
        assert response.status == 303, change
    csrf = await sign_in(users_api, "admin")
    added = await users_api.client.post("/users", data={"csrf": csrf, "name": "carol"})
    assert added.status == 201
    revoked = await users_api.client.post(
        "/users/carol/revoke", data={"csrf": csrf}, allow_redirects=False
    )
    assert revoked.status == 303
    audit = await users_api.client.get("/api/v1/audit", headers=users_api.auth("admin"))
    fixture = {"/api/v1/users/alice", "/api/v1/users/bob"}  # users_api's own, by the API
    # A form's redirect is recorded as its location, as the UI's kill and re-run are.
    page = {"dataset_id": dataset, "location": f"/datasets/{dataset}"}
    entries = [
        e
        for e in (await audit.json())["items"]
        if e["action"] != "workflow.submit" and e["target"].get("location") not in fixture
    ]
    assert [(e["actor"], e["action"], e["target"], e["status"]) for e in reversed(entries)] == [
        ("alice", "dataset.pin", page, 303),
        ("alice", "dataset.unpin", page, 303),
        ("alice", "dataset.delete", page, 303),
        ("admin", "user.add", {"location": "/api/v1/users/carol"}, 201),
        ("admin", "user.revoke", {"name": "carol", "location": "/users"}, 303),
    ]
    assert {e["remote"] for e in entries} == {"127.0.0.1"}


async def test_schedule_forms_follow_the_apis_rules(users_api: Api) -> None:
    body = {"name": "ui-nightly", "cron": "0 3 * * *", "workflow": chain("ui-schedule", 1)}
    created = await users_api.client.post(
        "/api/v1/schedules", json=body, headers=users_api.auth("alice")
    )
    assert created.status == 201
    sid = (await created.json())["id"]

    async def schedule() -> ClientResponse:
        return await users_api.client.get(
            f"/api/v1/schedules/{sid}", headers=users_api.auth("alice")
        )

    pause = f"/schedules/{sid}/pause"
    anonymous = await users_api.client.post(pause, data={}, allow_redirects=False)
    assert anonymous.status == 303 and anonymous.headers["Location"] == "/login"
    # Bob does not see it, and cannot change it: a 404, as from the API.
    bob_csrf = await sign_in(users_api, "bob")
    assert pause not in await (await users_api.client.get("/schedules")).text()
    for change in ("pause", "resume", "delete"):
        response = await users_api.client.post(
            f"/schedules/{sid}/{change}", data={"csrf": bob_csrf}
        )
        assert response.status == 404, change
    csrf = await sign_in(users_api, "alice")
    page = await (await users_api.client.get("/schedules")).text()
    assert f'action="{pause}"' in page and f'action="/schedules/{sid}/delete"' in page
    assert (await users_api.client.post(pause, data={})).status == 403
    assert (await (await schedule()).json())["paused"] is False
    done = await users_api.client.post(pause, data={"csrf": csrf}, allow_redirects=False)
    assert done.status == 303 and done.headers["Location"] == "/schedules"
    assert (await (await schedule()).json())["paused"] is True
    page = await (await users_api.client.get("/schedules")).text()
    assert f'action="/schedules/{sid}/resume"' in page
    await users_api.client.post(f"/schedules/{sid}/resume", data={"csrf": csrf})
    resumed = await (await schedule()).json()
    assert resumed["paused"] is False and resumed["nextFireAt"] is not None
    await users_api.client.post(f"/schedules/{sid}/delete", data={"csrf": csrf})
    assert (await schedule()).status == 404
    audit = await users_api.client.get("/api/v1/audit", headers=users_api.auth("admin"))
    changes = [
        (e["actor"], e["action"], e["target"]["schedule_id"])
        for e in reversed((await audit.json())["items"])
        if e["action"] in ("schedule.pause", "schedule.resume", "schedule.rm")
    ]
    assert changes == [
        ("alice", "schedule.pause", sid),
        ("alice", "schedule.resume", sid),
        ("alice", "schedule.rm", sid),
    ]


async def test_the_action_page_shows_history_attempts_and_timings(users_api: Api) -> None:
    document = command_workflow(
        {1: ["sh", "-c", f"echo '{SCRIPT}'; echo done > \"$PINGO_OUTPUT\""]}, name="timed"
    )
    submitted = await users_api.submit(document, user="alice")
    await users_api.wait(submitted["id"])
    await sign_in(users_api, "alice")
    url = f"/workflows/{submitted['id']}/actions/1"
    page = await (await users_api.client.get(url)).text()
    history = page[page.index('id="history"') : page.index("</table>", page.index('id="history"'))]
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>([^<]*)</td></tr>", history)
    # The store's record, as the API shows it: every state, when, and for how long.
    detail = await users_api.client.get(
        f"/api/v1/workflows/{submitted['id']}/actions/1", headers=users_api.auth("alice")
    )
    recorded = (await detail.json())["history"]
    assert [(state, at) for state, at, _ in rows] == [(e["state"], e["at"]) for e in recorded]
    # The local executor reports no start: SUBMITTED goes straight to FINISHED.
    assert [state for state, _, _ in rows] == [
        "READY",
        "PROCESSING",
        "SUBMITTED",
        "FINISHED",
    ]
    assert all(re.fullmatch(r"\d+\.\d{3}", lasted) for _, _, lasted in rows[:-1])
    assert rows[-1][2] == ""  # ended: no duration for the last state
    assert f'href="{url}/log?attempt=1"' in page
    attempts = _cells(page, f"{url}/log?attempt=1")
    assert attempts[0] == "1" and int(attempts[1]) > 0
    assert re.search(r"<dt>Ran \(s\)</dt><dd>\d+\.\d{3}</dd>", page)
    assert "&lt;script&gt;" in page and SCRIPT not in page


async def test_the_workflows_list_counts_reuse_and_failures(users_api: Api) -> None:
    first = await users_api.submit(chain("ui-list-counts", 2, name="counted"), user="alice")
    await users_api.wait(first["id"])
    again = await users_api.submit(chain("ui-list-counts", 3, name="counted"), user="alice")
    await users_api.wait(again["id"])
    failing = command_workflow(
        {1: ["sh", "-c", "exit 3"]}, name="broken", extra={1: {"maxAttempts": 1}}
    )
    broken = await users_api.submit(failing, user="alice")
    await users_api.wait(broken["id"])
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get("/workflows")).text()
    assert '<th scope="col">Owner</th>' not in page
    for submitted in (first, again, broken):
        document = await users_api.workflow(submitted["id"])
        cells = _cells(page, f'href="/workflows/{submitted["id"]}"')
        reuse, total = document["reuse"], len(document["actions"])
        assert cells[2:7] == [
            f"{total} / {total}",
            str(reuse["computed"]),
            str(reuse["reused"]),
            str(reuse["shared"]),
            str(document["counts"]["FAILED"]),
        ], cells
    assert _cells(page, f'href="/workflows/{again["id"]}"')[3:5] == ["1", "1"]
    assert _cells(page, f'href="/workflows/{broken["id"]}"')[6] == "1"
    await sign_in(users_api, "admin")
    everyone = await (await users_api.client.get("/workflows")).text()
    assert _cells(everyone, f'href="/workflows/{first["id"]}"')[1] == "alice"


async def test_the_dataset_page_draws_ancestors_descendants_and_its_workflows(
    users_api: Api,
) -> None:
    first = await users_api.submit(chain("ui-lineage-graph", 3, name="first"), user="alice")
    finished = await users_api.wait(first["id"])
    ids = [a["datasetId"] for a in finished["actions"]]
    # Alice's second workflow reuses step 1's dataset; bob's computes from it too.
    again = await users_api.submit(chain("ui-lineage-graph", 2, name=SCRIPT), user="alice")
    await users_api.wait(again["id"])
    theirs = await users_api.submit(chain("ui-lineage-graph", 2, name="bobs"), user="bob")
    await users_api.wait(theirs["id"])
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/datasets/{ids[1]}")).text()
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert svg.count("<circle") == 3 and svg.count("<line") == 2
    for dataset_id in ids:
        assert f'href="/datasets/{dataset_id}"' in svg
    assert svg.count(' root"') == 1
    assert re.search(rf'href="/datasets/{ids[1]}"><circle [^>]*r="12" class="[A-Z_]+ root"', svg)
    relations = {cells[1] for cells in (_cells(page, f'href="/datasets/{i}"') for i in ids)}
    assert relations == {"ancestor", "this dataset", "descendant"}
    # Ancestors above, descendants below.
    ys = [
        int(re.search(rf'href="/datasets/{i}"><circle cx="\d+" cy="(\d+)"', svg).group(1))
        for i in ids
    ]  # type: ignore[union-attr]
    assert ys == sorted(ys) and len(set(ys)) == 3
    used = page[page.index('id="used-by"') :]
    assert f'href="/workflows/{first["id"]}"' in used and f'href="/workflows/{again["id"]}"' in used
    assert _cells(used, f'href="/workflows/{first["id"]}"')[3] == "planned it and computed from it"
    assert _cells(used, f'href="/workflows/{again["id"]}"')[3] == "planned it"
    assert "&lt;script&gt;" in used and SCRIPT not in page
    # Bob's workflow used it too, but it is not alice's to see.
    assert theirs["id"] not in page and "bobs" not in page
    top = await (await users_api.client.get(f"/datasets/{ids[0]}")).text()
    assert _cells(top, f'href="/workflows/{again["id"]}"')[3] == "planned it and computed from it"
    await sign_in(users_api, "bob")
    seen = await (await users_api.client.get(f"/datasets/{ids[0]}")).text()
    assert theirs["id"] in seen and first["id"] not in seen and again["id"] not in seen


async def test_a_large_lineage_is_cut_and_says_so(users_api: Api, monkeypatch: Any) -> None:
    monkeypatch.setattr(ui, "LINEAGE_NODES", 3)
    submitted = await users_api.submit(chain("ui-lineage-cut", 5), user="alice")
    top = (await users_api.wait(submitted["id"]))["actions"][0]["datasetId"]
    await sign_in(users_api, "alice")
    page = await (await users_api.client.get(f"/datasets/{top}")).text()
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert svg.count("<circle") == 3
    assert "Only the nearest 3 datasets are drawn." in page


async def test_another_users_private_dataset_pages_are_404(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = create_app(make_settings(tmp_path, sharing_scope="user"))
    api = Api(client=await aiohttp_client(app), app=app, tokens={"admin": ADMIN_TOKEN})
    await api.add_user("alice")
    await api.add_user("bob")
    finished = await api.wait((await api.submit(chain("ui-private", 2), user="alice"))["id"])
    first, end = finished["actions"][0]["datasetId"], finished["endDatasetId"]
    csrf = await sign_in(api, "bob")
    for path in (f"/datasets/{first}", f"/datasets/{end}", f"/datasets/{first[:12]}"):
        response = await api.client.get(path)
        assert response.status == 404, path
        # The message names only the id asked for, nothing of alice's.
        assert "step1" not in await response.text() and finished["id"] not in await response.text()
    for change in ("pin", "unpin", "delete"):
        response = await api.client.post(f"/datasets/{first}/{change}", data={"csrf": csrf})
        assert response.status == 404, change
    listing = await (await api.client.get("/datasets")).text()
    assert first[:16] not in listing and end[:16] not in listing
    await sign_in(api, "alice")
    assert (await api.client.get(f"/datasets/{first}")).status == 200


async def test_bad_bytes_in_every_field_of_every_form(users_api: Api) -> None:
    """Undecodable bytes, NULs and markup in each field of each form: a 4xx, never a 500."""
    submitted = await users_api.submit(chain("ui-bad-bytes", 1), user="alice")
    end = (await users_api.wait(submitted["id"]))["endDatasetId"]
    csrf = await sign_in(users_api, "admin")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    bodies = [
        f"csrf={csrf}&name=%FF%FE%00".encode(),
        f"csrf={csrf}&name=a&admin=%FF".encode(),
        f"csrf={csrf}&force=%00%FF".encode(),
        b"csrf=%FF%FE&name=x",
        f"csrf={csrf}&name=\xff\xfe".encode("latin-1"),
        b"\xff\xfe\x00garbage",
    ]
    paths = [
        "/users",
        f"/datasets/{end}/pin",
        f"/datasets/{end}/delete",
        "/users/%FF%FE/revoke",
        "/users/%3Cscript%3E/revoke",
        "/datasets/%FF%00/pin",
        "/datasets/%3Cscript%3E/unpin",
        f"/workflows/{submitted['id']}/kill",
        f"/workflows/{submitted['id']}/rerun",
        "/login",
    ]
    for path in paths:
        for body in bodies:
            response = await users_api.client.post(path, data=body, headers=form)
            text = await response.text()
            assert 400 <= response.status < 500 or response.status in (200, 201, 303), (
                path,
                body,
                response.status,
            )
            assert "<script>" not in text, (path, body)
    # Only the one well-formed add went through ("a", its odd admin box read as unticked).
    users = await users_api.client.get("/api/v1/users", headers=users_api.auth("admin"))
    found = {u["name"]: u["admin"] for u in (await users.json())["items"]}
    assert found == {"a": False, "admin": True, "alice": False, "bob": False}
    assert (await _dataset(users_api, "alice", end))["state"] == "LEAF"
