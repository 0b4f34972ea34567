"""`$PINGO_HOME` planted by another user is refused; links there are never followed.

The tests run as root (here and in CI): files of another user are made with `os.chown`
to uid 65534 (nobody).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pingo import errors
from pingo.api import auth
from pingo.callbacks import tokens
from pingo.config import Settings
from pingo.node import running_node
from tests.conftest import server_environ

REPO = Path(__file__).resolve().parents[2]
PINGO = str(Path(sys.executable).parent / "pingo")
OTHER = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")


def _settings(home: Path) -> Settings:
    return Settings(home=home, admin_token="admin-token-for-tests", poll_interval_s=0.05)


async def _start(home: Path) -> None:
    async with running_node(_settings(home)):
        pass


def _foreign_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, OTHER, OTHER)
    return home


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.conf"
    victim.write_text("precious root config\n")
    victim.chmod(0o644)
    return victim


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_pingo_server_refuses_a_home_owned_by_another_user(tmp_path: Path) -> None:
    home = _foreign_home(tmp_path)
    env = server_environ()
    env.update({"PINGO_HOME": str(home), "PINGO_HOST": "127.0.0.1",
                "PINGO_PORT": str(_free_port())})  # fmt: skip
    process = subprocess.Popen(
        [PINGO, "server"], env=env, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _, stderr = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail("the server started on another user's home")
    assert process.returncode == 1, stderr
    assert f"{home}" in stderr
    assert f"owned by uid {OTHER}" in stderr
    assert "chown" in stderr  # what to do
    # Nothing of the server's was written there, and the mode is as the owner left it.
    assert sorted(os.listdir(home)) == []


async def test_a_home_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    home = _foreign_home(tmp_path)
    (home / tokens.SECRET_FILE).write_text("00" * 32)
    os.chown(home / tokens.SECRET_FILE, OTHER, OTHER)
    with pytest.raises(errors.ConfigurationError, match=f"owned by uid {OTHER}"):
        await _start(home)
    assert (home / tokens.SECRET_FILE).read_text() == "00" * 32
    assert sorted(os.listdir(home)) == [tokens.SECRET_FILE]


async def test_a_home_others_may_write_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    with pytest.raises(errors.ConfigurationError, match="writable by its group or others"):
        await _start(home)


async def test_a_link_planted_at_admin_token_is_refused_and_not_followed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    victim = _victim(tmp_path)
    os.symlink(victim, home / auth.ADMIN_TOKEN_FILE)
    with pytest.raises(errors.ConfigurationError, match="symbolic link"):
        await _start(home)
    assert victim.read_text() == "precious root config\n"
    assert victim.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("name", [auth.ADMIN_TOKEN_FILE, tokens.SECRET_FILE, "pingo.db"])
async def test_a_file_of_another_user_in_the_home_is_refused(tmp_path: Path, name: str) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / name).write_text("00" * 32)
    os.chown(home / name, OTHER, OTHER)
    with pytest.raises(errors.ConfigurationError, match=f"{name} is owned by uid {OTHER}"):
        await _start(home)


async def test_a_link_as_the_home_is_followed_when_its_target_is_the_servers(
    tmp_path: Path,
) -> None:
    target = tmp_path / "disk" / "pingo"
    target.mkdir(parents=True, mode=0o700)
    home = tmp_path / "home"
    os.symlink(target, home)
    await _start(home)
    assert (target / tokens.SECRET_FILE).exists()

    # A link another user owns could be re-pointed: refused though its target is fine.
    os.lchown(home, OTHER, OTHER)
    with pytest.raises(errors.ConfigurationError, match=f"symbolic link owned by uid {OTHER}"):
        await _start(home)

    (tmp_path / "other").mkdir()
    foreign = _foreign_home(tmp_path / "other")
    os.unlink(home)
    os.symlink(foreign, home)
    with pytest.raises(errors.ConfigurationError, match=f"owned by uid {OTHER}"):
        await _start(home)


async def test_the_admin_token_is_written_through_no_link(tmp_path: Path) -> None:
    """A link planted after start-up's check: `ensure_admin` replaces it, the target stays."""
    home = tmp_path / "home"
    victim = _victim(tmp_path)
    settings = _settings(home)
    async with running_node(settings) as node:
        os.symlink(victim, home / auth.ADMIN_TOKEN_FILE)
        token = await auth.ensure_admin(node.store, settings)
    assert token == settings.admin_token
    assert victim.read_text() == "precious root config\n"
    assert victim.stat().st_mode & 0o777 == 0o644
    written = home / auth.ADMIN_TOKEN_FILE
    assert not written.is_symlink()
    assert written.read_text() == f"{token}\n"
    assert written.stat().st_mode & 0o777 == 0o600


def test_a_callback_secret_of_another_user_is_not_adopted(tmp_path: Path) -> None:
    (tmp_path / tokens.SECRET_FILE).write_text("00" * 32)
    os.chown(tmp_path / tokens.SECRET_FILE, OTHER, OTHER)
    with pytest.raises(errors.ConfigurationError, match=f"owned by uid {OTHER}"):
        tokens.load_or_create_secret(tmp_path)


def test_a_link_at_callback_secret_is_not_followed(tmp_path: Path) -> None:
    known = tmp_path / "known"
    known.write_text("00" * 32)
    home = tmp_path / "home"
    home.mkdir()
    os.symlink(known, home / tokens.SECRET_FILE)
    with pytest.raises(errors.ConfigurationError, match="symbolic link"):
        tokens.load_or_create_secret(home)
