"""Content digests on real files: what changes a digest, what never gets followed or opened."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from pingo.datasets import integrity
from pingo.datasets.storage import DatasetStorage


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root


def _digest(path: Path) -> str:
    measured = integrity.measure(str(path))
    assert measured is not None
    return measured.digest


def test_a_digest_is_stable_and_names_its_algorithm(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one", {"a": b"x", "sub/b": b"y", "sub/deeper/c": b"z"})
    # The same tree made in another order hashes the same: the walk sorts names.
    two = _tree(tmp_path / "two", {"sub/deeper/c": b"z", "sub/b": b"y", "a": b"x"})
    assert _digest(one) == _digest(two)
    assert _digest(one).startswith("sha256:") and len(_digest(one)) == len("sha256:") + 64


@pytest.mark.parametrize(
    "change",
    ["content", "rename", "move", "new empty file", "new empty directory", "one byte more"],
)
def test_any_change_changes_the_digest(tmp_path: Path, change: str) -> None:
    root = _tree(tmp_path / "d", {"a": b"hello", "sub/b": b"world"})
    before = _digest(root)
    if change == "content":
        (root / "a").write_bytes(b"HELLO")  # same size
    elif change == "rename":
        (root / "a").rename(root / "a2")
    elif change == "move":
        (root / "a").rename(root / "sub" / "a")
    elif change == "new empty file":
        (root / "empty").write_bytes(b"")
    elif change == "new empty directory":
        (root / "nothing").mkdir()
    else:
        (root / "sub" / "b").write_bytes(b"world!")
    assert _digest(root) != before


def test_a_file_and_a_directory_holding_its_manifest_never_collide(tmp_path: Path) -> None:
    """Framing: a file whose bytes are a directory's manifest hashes differently from it."""
    directory = _tree(tmp_path / "d", {"a": b"x"})
    content = hashlib.sha256(b"x").digest()
    framed_a = (1).to_bytes(8, "big") + b"a"
    manifest = b"d" + (0).to_bytes(8, "big") + b"f" + framed_a + (1).to_bytes(8, "big") + content
    forged = tmp_path / "f"
    forged.write_bytes(manifest)
    assert _digest(forged) != _digest(directory)


def test_links_are_hashed_as_their_target_string_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cr3t")
    root = _tree(tmp_path / "d", {"a": b"x"})
    (root / "l").symlink_to(secret)
    measured = integrity.measure(str(root))
    assert measured is not None
    # Size counts the link's target string, not the 6 bytes behind it.
    assert measured.size_bytes == 1 + len(str(secret))
    secret.write_bytes(b"another secret, longer")
    assert _digest(root) == measured.digest  # the target's content plays no part
    (root / "l").unlink()
    (root / "l").symlink_to(tmp_path / "elsewhere")
    assert _digest(root) != measured.digest


def test_an_output_that_is_itself_a_link_is_not_followed(tmp_path: Path) -> None:
    big = _tree(tmp_path / "big", {"a": b"x" * 10_000})
    link = tmp_path / "out"
    link.symlink_to(big)
    measured = integrity.measure(str(link))
    assert measured is not None and measured.size_bytes == len(str(big))


def test_a_fifo_is_recorded_never_opened(tmp_path: Path) -> None:
    root = _tree(tmp_path / "d", {"a": b"x"})
    os.mkfifo(root / "pipe")
    done: list[str] = []
    worker = threading.Thread(target=lambda: done.append(_digest(root)), daemon=True)
    worker.start()
    worker.join(10)
    assert done, "hashing blocked on a FIFO"


def test_absent_is_none(tmp_path: Path) -> None:
    assert integrity.measure(str(tmp_path / "nothing")) is None
    assert integrity.fingerprint(str(tmp_path / "nothing")) is None


async def test_storage_size_never_follows_links(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    big = _tree(tmp_path / "big", {"a": b"x" * 5_000})
    out = tmp_path / "data" / "out"
    out.parent.mkdir(parents=True)
    out.symlink_to(big)
    assert await storage.size(str(out)) == len(str(big))
    # A link to a directory inside a deep tree (the walk path) counts its string too.
    tree = _tree(tmp_path / "data" / "tree", {f"d{i}/f": b"y" for i in range(80)})
    (tree / "link").symlink_to(big)
    measured = integrity.measure(str(tree))
    assert measured is not None
    assert await storage.size(str(tree)) == measured.size_bytes == 80 + len(str(big))


async def test_the_cache_hashes_again_only_when_files_changed(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    root = _tree(tmp_path / "data" / "ds", {"a": b"x", "sub/b": b"y"})
    measured = await storage.measure(str(root))
    assert measured is not None
    unchanged = await storage.verify(str(root), measured.digest, full=False)
    assert (unchanged.status, unchanged.hashed) == (integrity.Status.MATCH, False)
    full = await storage.verify(str(root), measured.digest, full=True)
    assert (full.status, full.hashed) == (integrity.Status.MATCH, True)
    # Same size, mtime put back: ctime still moves, so the content is hashed again.
    stat = os.stat(root / "a")
    (root / "a").write_bytes(b"X")
    os.utime(root / "a", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    poisoned = await storage.verify(str(root), measured.digest, full=False)
    assert (poisoned.status, poisoned.hashed) == (integrity.Status.MISMATCH, True)
    assert poisoned.bad
    # Still a mismatch from the cache, without hashing.
    again = await storage.verify(str(root), measured.digest, full=False)
    assert (again.status, again.hashed) == (integrity.Status.MISMATCH, False)
    (root / "a").unlink()
    (root / "sub" / "b").unlink()
    (root / "sub").rmdir()
    root.rmdir()
    gone = await storage.verify(str(root), measured.digest, full=False)
    assert gone.status is integrity.Status.MISSING and gone.bad
    no_digest = await storage.verify(str(root), None)
    assert no_digest.status is integrity.Status.UNVERIFIABLE and not no_digest.bad


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    cache = integrity.DigestCache(max_entries=2)
    paths = [_tree(tmp_path / f"d{i}", {"a": bytes([i])}) for i in range(3)]
    for path in paths:
        measured = integrity.measure(str(path))
        assert measured is not None
        cache.put(str(path), measured)
    assert len(cache._entries) == 2 and str(paths[0]) not in cache._entries


async def test_remote_roots_record_no_digest() -> None:
    storage = DatasetStorage("memory://pingo-integrity-test")
    assert await storage.measure("memory://pingo-integrity-test/x") is None
    verdict = await storage.verify("memory://pingo-integrity-test/x", "sha256:" + "0" * 64)
    assert verdict.status is integrity.Status.UNVERIFIABLE
