"""The client never carries its token across a redirect, and sends the local admin
token file only to a loopback server. Two real HTTP servers on 127.0.0.1: one redirects,
the other records what reaches it."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from pingo import client as pingo_client

SECRET = "SECRET-ADMIN-TOKEN"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def _answer(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"items": [], "next": null}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def target() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """Where the redirects point, and what reached it (path, Authorization)."""
    seen: ClassVar[list[tuple[str, str | None]]] = []
    handler = type("Target", (_Recorder,), {"seen": seen})
    for url in _serve(handler):
        yield url, seen


@pytest.fixture
def redirector(target: tuple[str, list[tuple[str, str | None]]]) -> Iterator[str]:
    """A server whose every answer redirects to `target` (same path), 302 or 307."""
    where = target[0]

    class Redirector(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            status = 307 if self.command == "POST" else 302
            self.send_response(status)
            self.send_header("Location", f"{where}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    yield from _serve(Redirector)


def test_a_redirect_is_an_error_and_the_token_stays_home(
    redirector: str, target: tuple[str, list[tuple[str, str | None]]]
) -> None:
    where, seen = target
    client = pingo_client.Client(base_url=redirector, token=SECRET, timeout_s=10)
    with pytest.raises(pingo_client.ApiError) as listed:
        client.workflows()
    assert (listed.value.status, listed.value.code) == (302, "REDIRECT")
    assert f"{where}/api/v1/workflows" in listed.value.detail
    assert "PINGO_URL" in listed.value.detail
    with pytest.raises(pingo_client.ApiError) as submitted:
        client.submit({"name": "x", "actions": []})
    assert (submitted.value.status, submitted.value.code) == (307, "REDIRECT")
    assert seen == []
    # The target itself works, and is sent the token when asked directly.
    direct = pingo_client.Client(base_url=where, token=SECRET, timeout_s=10)
    assert direct.workflows()["items"] == []
    assert seen == [("/api/v1/workflows", f"Bearer {SECRET}")]


def test_the_cli_configuration_does_not_follow_a_redirect_with_the_token_file(
    tmp_path: Path, redirector: str, target: tuple[str, list[tuple[str, str | None]]]
) -> None:
    (tmp_path / "admin.token").write_text(SECRET + "\n")
    client = pingo_client.Client.from_env({"PINGO_HOME": str(tmp_path), "PINGO_URL": redirector})
    assert client.token == SECRET  # a loopback URL: the home's token is used
    with pytest.raises(pingo_client.ApiError, match="REDIRECT"):
        client.workflows()
    assert target[1] == []


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8642", True),
        ("http://127.9.8.7:1", True),
        ("http://[::1]:8642", True),
        ("http://localhost:8642", True),
        ("http://LOCALHOST.", True),
        ("https://pingo.example", False),
        ("http://10.0.0.5:8642", False),
        ("http://[::ffff:10.0.0.5]:1", False),
        ("http://localhost.evil.example", False),
        ("http://127.0.0.1.evil.example", False),
        ("http://0.0.0.0:8642", False),
        ("not a url", False),
    ],
)
def test_which_urls_are_loopback(url: str, loopback: bool) -> None:
    assert pingo_client.is_loopback(url) is loopback


def test_the_token_file_goes_only_to_a_loopback_server(tmp_path: Path) -> None:
    (tmp_path / "admin.token").write_text(SECRET + "\n")
    home = {"PINGO_HOME": str(tmp_path)}
    for url in ("http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9"):
        assert pingo_client.Client.from_env({**home, "PINGO_URL": url}).token == SECRET
    assert pingo_client.Client.from_env({**home, "PINGO_PORT": "9"}).token == SECRET
    remote = pingo_client.Client.from_env({**home, "PINGO_URL": "https://pingo.example"})
    assert remote.token is None and remote.token_file is None
    assert pingo_client.default_token({**home, "PINGO_HOST": "pingo.example"}) is None
    # An explicit PINGO_TOKEN is the user's choice, whatever the URL.
    told = {**home, "PINGO_URL": "https://pingo.example", "PINGO_TOKEN": "mine"}
    assert pingo_client.Client.from_env(told).token == "mine"


def test_a_client_built_for_another_url_sends_no_token_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment's token and the home's admin token file belong to the
    environment's (loopback) URL: `Client(base_url=...)` must not carry them elsewhere."""
    (tmp_path / "admin.token").write_text(SECRET + "\n")
    monkeypatch.setenv("PINGO_HOME", str(tmp_path))
    monkeypatch.delenv("PINGO_TOKEN", raising=False)
    monkeypatch.delenv("PINGO_URL", raising=False)
    assert pingo_client.Client(base_url="https://pingo.example").token is None
    monkeypatch.setenv("PINGO_TOKEN", "mine")
    assert pingo_client.Client(base_url="https://pingo.example").token is None
    assert pingo_client.Client(base_url="https://pingo.example", token="mine").token == "mine"
