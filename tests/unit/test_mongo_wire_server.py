"""pingo.testing's nx-27017 launcher: a real server process on a free loopback port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from pingo import testing


def test_starts_listens_and_stops(tmp_path: Path) -> None:
    server = testing.start_wire_server(tmp_path / "wire")
    try:
        assert server.url == f"mongodb://127.0.0.1:{server.port}"
        with socket.create_connection((server.host, server.port), timeout=2):
            pass
        assert server.process.poll() is None
        # Its files stay under the directory it was given, not in shared /tmp paths.
        assert (tmp_path / "wire" / "nx-27017.log").exists()
    finally:
        server.stop()
    assert server.process.poll() is not None
    with pytest.raises(OSError), socket.create_connection((server.host, server.port), timeout=1):
        pass
    server.stop()  # idempotent


def test_context_manager_stops_the_server(tmp_path: Path) -> None:
    with testing.wire_server(tmp_path) as server:
        process = server.process
        assert process.poll() is None
    assert process.poll() is not None


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port bound (not listening) by this process: the server cannot bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_a_server_that_cannot_start_raises_with_its_log(
    tmp_path: Path, busy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(testing, "free_port", lambda host="127.0.0.1": busy_port)
    with pytest.raises(testing.WireServerError) as failure:
        testing.start_wire_server(tmp_path, timeout_s=10)
    message = str(failure.value)
    assert "did not start" in message
    assert "--- log ---" in message
    assert str(busy_port) in message  # the log says which port it tried
