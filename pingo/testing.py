"""Test support shipped with the package: a MongoDB wire server for the Mongo backend's tests.

`start_wire_server` runs `nx-27017` (MongoDB's wire protocol on SQLite, from the
dev dependency group) as a subprocess of the current virtual environment, on a
free loopback port, with its files under a directory the caller owns. It is a
real server in a real process, so the contract suite and the multi-process
claim races exercise the Mongo backend through PyMongo's actual network path.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

#: How long the server gets to accept connections before it counts as failed.
START_TIMEOUT_S = 15.0
#: How long `stop` waits after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 5.0


class WireServerError(RuntimeError):
    """The wire server could not be started."""


@dataclass(slots=True)
class WireServer:
    """A running `nx-27017` process; `stop()` it (or use `wire_server()`)."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    data_dir: Path
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        """The MongoDB URL to connect to (no database: the store defaults to `pingo`)."""
        return f"mongodb://{self.host}:{self.port}"

    def log(self) -> str:
        """The server's output so far (for failure messages)."""
        return _read_log(self.log_path)

    def stop(self) -> None:
        """Terminate the server, then kill it if it does not exit in time (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        logger.debug(
            "wire server on port %d stopped",
            self.port,
            extra={"event": "wire_server_stopped", "port": self.port},
        )


def wire_server_command() -> Path:
    """The `nx-27017` console script of the running interpreter's environment."""
    return Path(sys.executable).parent / "nx-27017"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def start_wire_server(
    data_dir: Path, *, host: str = "127.0.0.1", timeout_s: float = START_TIMEOUT_S
) -> WireServer:
    """Start `nx-27017` on a free port of `host`, storing its files under `data_dir`.

    Returns once the port accepts connections; raises `WireServerError` with the
    server's log when it exits or does not listen within `timeout_s`.
    """
    command = wire_server_command()
    if not command.exists():
        raise WireServerError(
            f"{command} not found: install the dev dependency group "
            "(uv sync --frozen --all-extras --all-groups)"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    databases = data_dir / "databases"
    databases.mkdir(exist_ok=True)
    log_path = data_dir / "nx-27017.log"
    # A port picked then released could be taken by someone else before the server
    # binds it; the server then exits at once, and we try another port.
    last_error = "no attempt made"
    for _ in range(3):
        port = free_port(host)
        argv = [
            str(command),
            "--host",
            host,
            "--port",
            str(port),
            # One SQLite file per logical database, created on demand.
            "--data-dir",
            str(databases),
            # Its own log and pid files: the defaults are shared paths under /tmp.
            "--log-file",
            str(log_path),
            "--pid-file",
            str(data_dir / "nx-27017.pid"),
        ]
        with open(log_path, "ab") as out:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=data_dir,
                # In the caller's process group (no new session): whatever stops the
                # test run as a group (Ctrl-C, CI's timeout) stops the server too.
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        server = WireServer(
            process=process, host=host, port=port, data_dir=data_dir, log_path=log_path
        )
        try:
            _wait_listening(server, timeout_s)
        except _Exited as exc:
            last_error = str(exc)
            server.stop()
            continue
        except BaseException:
            server.stop()
            raise
        # A backstop for an interpreter that exits without stopping it (idempotent).
        atexit.register(server.stop)
        logger.debug(
            "wire server listening on %s",
            server.url,
            extra={"event": "wire_server_started", "port": port},
        )
        return server
    raise WireServerError(
        f"nx-27017 did not start: {last_error}\n--- log ---\n{_read_log(log_path)}"
    )


@contextlib.contextmanager
def wire_server(data_dir: Path, *, host: str = "127.0.0.1") -> Iterator[WireServer]:
    """`start_wire_server` as a context manager that always stops the server."""
    server = start_wire_server(data_dir, host=host)
    try:
        yield server
    finally:
        server.stop()


class _Exited(Exception):
    """The server process exited before listening."""


def _wait_listening(server: WireServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        code = server.process.poll()
        if code is not None:
            raise _Exited(f"nx-27017 exited with status {code} before listening")
        try:
            with socket.create_connection((server.host, server.port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise WireServerError(
                f"nx-27017 did not accept connections on {server.host}:{server.port} "
                f"within {timeout_s:.0f} s\n--- log ---\n{server.log()}"
            )
        time.sleep(0.05)


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"
