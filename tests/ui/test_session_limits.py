"""Sign-in limits over real HTTP: sessions per user are capped (the least recently used
is ended), expiry costs no scan, and failed sign-ins are logged and throttled per address."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator

import pytest

from pingo import limits, ui
from tests.api.conftest import Api


async def _sign_in(api: Api, user: str) -> str:
    """A fresh sign-in of `user`; the new session's cookie value."""
    api.client.session.cookie_jar.clear()
    response = await api.client.post(
        "/login", data={"token": api.tokens[user]}, allow_redirects=False
    )
    assert response.status == 303
    return response.cookies[ui.COOKIE].value


async def _works(api: Api, cookie: str) -> bool:
    api.client.session.cookie_jar.clear()
    response = await api.client.get(
        "/workflows", headers={"Cookie": f"{ui.COOKIE}={cookie}"}, allow_redirects=False
    )
    return response.status == 200


async def test_a_sign_in_beyond_the_cap_ends_the_least_recently_used(users_api: Api) -> None:
    sessions = users_api.app[ui.SESSIONS_KEY]
    cap = sessions.per_user
    cookies = [await _sign_in(users_api, "alice") for _ in range(cap)]
    bobs = await _sign_in(users_api, "bob")
    assert all([await _works(users_api, c) for c in cookies])
    # The first is used again: the second is now the least recently used.
    assert await _works(users_api, cookies[0])
    newest = await _sign_in(users_api, "alice")
    assert not await _works(users_api, cookies[1])
    assert await _works(users_api, cookies[0])
    assert await _works(users_api, newest)
    assert all([await _works(users_api, c) for c in cookies[2:]])
    # Another user's sessions do not count against alice's.
    assert await _works(users_api, bobs)


async def test_many_sign_ins_keep_the_sessions_bounded(users_api: Api) -> None:
    sessions = users_api.app[ui.SESSIONS_KEY]
    for _ in range(3 * sessions.per_user):
        await _sign_in(users_api, "alice")
        await _sign_in(users_api, "bob")
    assert len(sessions.by_id) == 2 * sessions.per_user
    assert sum(len(s) for s in sessions.by_user.values()) == 2 * sessions.per_user


class _CountingSessions(OrderedDict[str, "ui.Session"]):
    """Sessions by id that count how many entries a walk over them reads."""

    read = 0

    def items(self) -> Iterator[tuple[str, ui.Session]]:  # type: ignore[override]
        for item in super().items():
            self.read += 1
            yield item


def test_expiry_drops_from_the_front_without_a_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = ui.Sessions(per_user=10**9)
    now = time.time()
    monkeypatch.setattr(ui.time, "time", lambda: now)
    ids = [sessions.open(f"user-{i}")[0] for i in range(5000)]
    counting = _CountingSessions(sessions.by_id)
    sessions.by_id = counting
    # Walking every session on each sign-in was the cost: one sign-in reads one or two.
    monkeypatch.setattr(ui.time, "time", lambda: now + ui.SESSION_TTL_S / 2)
    sessions.open("someone")
    assert len(counting) == 5001
    assert counting.read <= 2
    # Past the first sessions' lifetime, a sign-in drops exactly those.
    monkeypatch.setattr(ui.time, "time", lambda: now + ui.SESSION_TTL_S + 1)
    sessions.open("someone")
    assert ids[0] not in counting and len(counting) == 2
    assert set(sessions.by_user) == {"someone"}


async def test_failed_sign_ins_are_logged_without_the_token_and_throttled(
    users_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pingo.ui")
    throttle = users_api.app[ui.SESSIONS_KEY].throttle
    guesses = [f"guess-{i}-secret" for i in range(throttle.burst)]
    for guess in guesses:
        response = await users_api.client.post(
            "/login", data={"token": guess}, allow_redirects=False
        )
        assert response.status == 401
    failures = [r for r in caplog.records if getattr(r, "event", None) == "ui_login_failed"]
    assert len(failures) == throttle.burst
    assert all(getattr(r, "remote", None) == "127.0.0.1" for r in failures)
    assert all("127.0.0.1" in r.getMessage() for r in failures)
    text = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert not any(g in text for g in guesses)

    refused = await users_api.client.post(
        "/login", data={"token": "guess-more-secret"}, allow_redirects=False
    )
    assert refused.status == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= throttle.refill_s + 1
    assert refused.content_type == "text/html"
    assert ui.COOKIE not in refused.cookies
    # The right token too: a throttled address gets no answer to any guess.
    right = await users_api.client.post(
        "/login", data={"token": users_api.tokens["alice"]}, allow_redirects=False
    )
    assert right.status == 429 and ui.COOKIE not in right.cookies
    throttled = [r for r in caplog.records if getattr(r, "event", None) == "ui_login_throttled"]
    assert len(throttled) == 1
    # The API is not throttled (bearer tokens), and the bucket refills with time.
    me = await users_api.client.get("/api/v1/me", headers=users_api.auth("alice"))
    assert me.status == 200
    later = time.monotonic() + throttle.refill_s + 0.1
    throttle.clock = lambda: later
    again = await users_api.client.post(
        "/login", data={"token": users_api.tokens["alice"]}, allow_redirects=False
    )
    assert again.status == 303


def test_the_throttle_forgets_addresses() -> None:
    now = [0.0]
    throttle = limits.SignInThrottle(burst=3, refill_s=1.0, max_addresses=100, clock=lambda: now[0])
    for i in range(1000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle) == 100
    for _ in range(3):
        throttle.failed("10.9.9.9")
    with pytest.raises(ui.errors.TooManyRequests):
        throttle.check("10.9.9.9")
    now[0] = 10.0
    throttle.failed("10.8.8.8")
    # Every full bucket was forgotten: only the new one is kept.
    assert len(throttle) == 1
    throttle.check("10.9.9.9")
