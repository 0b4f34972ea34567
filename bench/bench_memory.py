"""Server memory after many finished workflows: state lives in the store, not in the process.

rss_mb_idle_10k  VmRSS (MiB) of a real `pingo server` after 10,000 finished workflows
rss_mb_idle_20k  the same server after 20,000 (the two should be close)

The server is the real one (`pingo server` in a subprocess: embedded SQLite in a temporary
PINGO_HOME, a free loopback port, PINGO_ADMIN_TOKEN set). Every workflow is one
`command-line` action `["true", "<n>"]`, distinct so nothing is reused, submitted over
HTTP with the admin's bearer token by a few concurrent clients. After each batch the
harness waits until no workflow is RUNNING, lets the server idle, and reads VmRSS from
/proc/<pid>/status. The server runs its default executor, so each action really spawns
`true` (see bench/README.md for how long that takes).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import _workloads

#: One run submits 20,000 workflows and takes minutes: once is enough.
RUNS = 1
BATCHES = (("rss_mb_idle_10k", 10_000), ("rss_mb_idle_20k", 20_000))
#: Concurrent HTTP clients submitting workflows.
CLIENTS = 8
#: How long the server idles before its RSS is read.
IDLE_S = 5.0
START_TIMEOUT_S = 60.0
#: Longest wait for one batch to finish after its last submission.
FINISH_TIMEOUT_S = 300.0
HOST = "127.0.0.1"
API = "/api/v1"


def _pingo_bin() -> str:
    beside = Path(sys.executable).parent / "pingo"
    if not beside.exists():
        raise FileNotFoundError(f"{beside} is missing: is the package installed in .venv?")
    return str(beside)


def rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MiB (VmRSS is in kB, i.e. KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Server:
    """A `pingo server` subprocess on a free port, with its own home and admin token."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = _workloads.free_port(HOST)
        self.token = secrets.token_urlsafe(32)
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = home / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(
            os.environ,
            PINGO_HOME=str(self.home),
            PINGO_HOST=HOST,
            PINGO_ADMIN_TOKEN=self.token,
            PINGO_LOG_LEVEL="WARNING",
            # One user submits 20,000 workflows as fast as the server takes them: the
            # per-user limits (docs/limits.md) would refuse most of them, by design.
            PINGO_USER_SUBMISSIONS_PER_MINUTE="unlimited",
            PINGO_USER_MAX_WORKFLOWS="unlimited",
        )
        # Not inherited from the caller: the server must use its embedded defaults.
        for name in ("PINGO_STORE_URL", "PINGO_DATA_ROOT", "PINGO_PUBLIC_URL"):
            env.pop(name, None)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [_pingo_bin(), "server", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(
                f"pingo server exited with status {self.process.returncode}: {self.log_tail()}"
            )

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def store_mb(self) -> float:
        """Size of the SQLite database and its WAL, in MiB."""
        files = [self.home / "pingo.db", self.home / "pingo.db-wal"]
        return sum(f.stat().st_size for f in files if f.exists()) / 2**20

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _wait_ready(session: aiohttp.ClientSession, server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            async with session.get(f"{server.url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise TimeoutError(
        f"pingo server not ready within {START_TIMEOUT_S:.0f} s: {server.log_tail()}"
    )


async def _submit(session: aiohttp.ClientSession, server: Server, numbers: range) -> None:
    """POST one small workflow per number, `CLIENTS` at a time."""
    pending = iter(numbers)

    async def client() -> None:
        for n in pending:  # the iterator is shared: each number is taken once
            body = _workloads.small_workflow(n)
            async with session.post(f"{server.url}{API}/workflows", json=body) as response:
                if response.status != 201:
                    text = await response.text()
                    raise RuntimeError(f"POST workflow {n}: {response.status} {text[:500]}")
                await response.read()

    await asyncio.gather(*(client() for _ in range(CLIENTS)))


async def _count(session: aiohttp.ClientSession, server: Server, state: str) -> int:
    """1 when some workflow is in `state`, else 0 (one page of one item is enough)."""
    params = {"state": state, "limit": "1"}
    async with session.get(f"{server.url}{API}/workflows", params=params) as response:
        response.raise_for_status()
        page: dict[str, Any] = await response.json()
    return len(page["items"])


async def _wait_finished(session: aiohttp.ClientSession, server: Server) -> None:
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while await _count(session, server, "RUNNING"):
        server.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflows still RUNNING after {FINISH_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.5)
    if await _count(session, server, "FAILED"):
        raise RuntimeError(f"some small workflows FAILED: {server.log_tail()}")


async def _drive(server: Server) -> dict[str, float]:
    figures: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {server.token}"}
    connector = aiohttp.TCPConnector(limit=CLIENTS + 2)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        headers=headers, connector=connector, timeout=timeout
    ) as session:
        await _wait_ready(session, server)
        baseline_mb = rss_mb(server.pid)
        done = 0
        for name, total in BATCHES:
            started = time.perf_counter()
            await _submit(session, server, range(done, total))
            await _wait_finished(session, server)
            elapsed = time.perf_counter() - started
            done = total
            await asyncio.sleep(IDLE_S)
            server.check_alive()
            figures[name] = rss_mb(server.pid)
            # Context for the reader of the run's log, not figures of issue 8.
            print(
                f"bench_memory: {total} workflows finished, batch took {elapsed:.1f} s, "
                f"RSS {figures[name]:.1f} MiB (at start {baseline_mb:.1f} MiB), "
                f"store file {server.store_mb():.1f} MiB",
                file=sys.stderr,
            )
    return figures


def measure() -> dict[str, float]:
    """RSS of a real server after 10,000 and 20,000 finished one-action workflows."""
    # PINGO_HOME in RAM when possible: 20,000 workflows leave ~60,000 files (logs, datasets)
    # whose deletion alone takes minutes on the VM's disk. tmpfs pages are not part of the
    # server's RSS, so the figure is unchanged.
    scratch = _workloads.scratch_dir()
    with tempfile.TemporaryDirectory(prefix="pingo-bench-memory-", dir=scratch) as tmp:
        server = Server(Path(tmp))
        server.start()
        try:
            return asyncio.run(_drive(server))
        finally:
            server.stop()


if __name__ == "__main__":
    print(measure())
