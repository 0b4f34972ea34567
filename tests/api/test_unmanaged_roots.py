"""Where a non-admin's unmanaged output may land, over real HTTP (`PINGO_UNMANAGED_ROOTS`).

The server moves an unmanaged output onto the user's `outputPath` with its own rights:
without roots, a user could write wherever the server's OS user may, its code and its
home included. So a non-admin's local unmanaged output must lie under one of the roots
(none by default), at submission, dry run, re-run and schedule alike; an admin's may go
anywhere but Pingo's own files (tests/integration/test_sandbox.py), and a remote one
(hdfs://, s3://) is the job's to write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pingo import errors
from pingo.api import runtime
from pingo.config import Settings
from tests.api.conftest import Api, command_workflow, make_settings

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    (tmp_path / "shared").mkdir()
    return make_settings(tmp_path, unmanaged_roots=(str(tmp_path / "shared"),))


def _unmanaged(path: str) -> dict[str, Any]:
    return command_workflow(
        {1: ["sh", "-c", 'echo out > "$PINGO_OUTPUT"']},
        extra={1: {"isManaged": False, "outputPath": path}},
    )


async def _status(api: Api, url: str, user: str, body: Any) -> tuple[int, str]:
    response = await api.client.post(url, json=body, headers=api.auth(user))
    return response.status, await response.text()


async def test_a_non_admins_unmanaged_output_must_lie_under_a_root(
    users_api: Api, tmp_path: Path
) -> None:
    api = users_api
    target = tmp_path / "elsewhere" / "out"
    outside = str(target)
    escaping = str(tmp_path / "shared" / ".." / "elsewhere" / "out")
    for path in (outside, escaping, f"file://{outside}", str(Path.home() / ".bashrc")):
        for url in ("/api/v1/workflows", "/api/v1/workflows?dryRun=true"):
            status, text = await _status(api, url, "bob", _unmanaged(path))
            assert status == 403 and "PINGO_UNMANAGED_ROOTS" in text, (path, url, text)
        schedule = {"name": "nightly", "cron": "0 3 * * *", "workflow": _unmanaged(path)}
        assert (await _status(api, "/api/v1/schedules", "bob", schedule))[0] == 403
    assert not (tmp_path / "elsewhere").exists()
    inside = tmp_path / "shared" / "bob" / "out"
    finished = await api.wait((await api.submit(_unmanaged(str(inside)), user="bob"))["id"])
    assert finished["state"] == "SUCCEEDED" and inside.read_text() == "out\n"
    remote = await _status(api, "/api/v1/workflows?dryRun=true", "bob", _unmanaged("hdfs:///x"))
    assert remote[0] != 403, remote
    # An admin's may go elsewhere.
    done = await api.wait((await api.submit(_unmanaged(outside), user="admin"))["id"])
    assert done["state"] == "SUCCEEDED" and target.read_text() == "out\n"


async def test_work_that_did_not_pass_this_apis_check_is_refused_at_the_spawn(
    users_api: Api, tmp_path: Path
) -> None:
    """Another node with other roots, a schedule's tick, a workflow accepted before the
    roots changed: stored without this node's API check, it is refused by the submitter."""
    api = users_api
    node = api.app[runtime.STATE_KEY].node
    assert node is not None
    target = tmp_path / "elsewhere" / "out"
    document = _unmanaged(str(target))
    document["actions"][0]["maxAttempts"] = 1
    stored = await node.workflows.submit(document, owner="bob")
    assert (await api.wait(stored.id))["state"] == "FAILED"
    action = await api.wait_action(stored.id, 1, {"FAILED"})
    assert "PINGO_UNMANAGED_ROOTS" in action["error"]
    assert not target.parent.exists()
    # An admin's is run.
    document["name"] = "admins"
    admins = await node.workflows.submit(document, owner="admin")
    assert (await api.wait(admins.id))["state"] == "SUCCEEDED"


async def test_a_user_may_not_land_an_output_in_another_users_directory(
    users_api: Api, tmp_path: Path
) -> None:
    """A red-team review's poisoning: Bob's output, moved with the server's rights onto
    Alice's file under a root, replaced her data and what her managed actions computed
    from it. Each user has their own directory of every root."""
    api = users_api
    alices = tmp_path / "shared" / "alice" / "customers.csv"
    done = await api.wait((await api.submit(_unmanaged(str(alices)), user="alice"))["id"])
    assert done["state"] == "SUCCEEDED" and alices.read_text() == "out\n"
    for path in (
        str(alices),
        str(tmp_path / "shared" / "bob" / ".." / "alice" / "customers.csv"),
        str(tmp_path / "shared" / "customers.csv"),
    ):
        status, text = await _status(api, "/api/v1/workflows", "bob", _unmanaged(path))
        assert status == 403 and "own directory" in text, (path, text)
        assert str(tmp_path / "shared" / "bob") in text
    # The same stored without this node's check (a tick, another node) fails at the spawn.
    node = api.app[runtime.STATE_KEY].node
    assert node is not None
    document = _unmanaged(str(alices))
    document["actions"][0]["maxAttempts"] = 1
    document["actions"][0]["command"] = ["sh", "-c", 'echo evil > "$PINGO_OUTPUT"']
    stored = await node.workflows.submit(document, owner="bob")
    assert (await api.wait(stored.id))["state"] == "FAILED"
    assert alices.read_text() == "out\n"


async def test_an_output_may_not_be_a_users_directory_itself(
    users_api: Api, tmp_path: Path
) -> None:
    """The server makes and removes `<path>.box` and `<path>.collecting` beside an output:
    for `<root>/bob` that is user `bob.box`'s directory (a red-team review removed one)."""
    api = users_api
    await api.add_user("bob.box")
    kept = tmp_path / "shared" / "bob.box" / "keep.txt"
    done = await api.wait((await api.submit(_unmanaged(str(kept)), user="bob.box"))["id"])
    assert done["state"] == "SUCCEEDED" and kept.read_text() == "out\n"
    for path in (tmp_path / "shared" / "bob", f"{tmp_path / 'shared' / 'bob'}/"):
        status, text = await _status(api, "/api/v1/workflows", "bob", _unmanaged(str(path)))
        assert status == 403 and "own directory" in text, (path, text)
    assert kept.read_text() == "out\n"


async def test_an_output_may_not_lie_in_a_directory_the_server_makes_beside_one(
    users_api: Api, tmp_path: Path
) -> None:
    """A box is bound writable into its running action: an output inside one got its own
    box made there, which that action swapped for a link to `$PINGO_HOME`, and bwrap
    mounted the home writable into the second action (a red-team review)."""
    api = users_api
    own = tmp_path / "shared" / "bob"
    for inside in ("aT.box/b", "aT.collecting/b", "x/aT.box/deeper/b"):
        status, text = await _status(api, "/api/v1/workflows", "bob", _unmanaged(str(own / inside)))
        assert status == 403 and "own directory" in text, (inside, text)
    # A name that merely contains the suffix is fine, and so is a user's name ending in it.
    done = await api.wait((await api.submit(_unmanaged(str(own / "a.boxes")), user="bob"))["id"])
    assert done["state"] == "SUCCEEDED"


def test_a_root_may_not_be_the_whole_machine() -> None:
    """Every sandbox covers each root: a root of / would leave actions nothing to run."""
    with pytest.raises(errors.ConfigurationError, match="may not hold /"):
        Settings(unmanaged_roots=("/srv", "file:///"))
