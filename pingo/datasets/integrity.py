"""Dataset content digests: what is recorded at commit and what verification recomputes.

A digest is `sha256:<hex>` over a *manifest* of the output, never the output
streamed as-is, so a file and a directory can never share a digest and a
rename inside a directory changes it. The manifest lists every entry of the
output: the output itself first (as the empty path), then directory by
directory, each directory's entries in byte order of their names, and each
entry framed with lengths so no two outputs frame alike:

- a directory: `d`, its path;
- a regular file: `f`, its path, its size, the SHA-256 of its content;
- a symbolic link: `l`, its path, the link's target string. Links are never
  followed: a link to a secret hashes as the string, not the secret;
- anything else (a FIFO, a socket, a device): `o`, its path, its file type.
  It is never opened (a FIFO would block the hasher).

Paths are relative to the output, `/`-separated, as raw bytes.

The size that goes with a digest counts the bytes of regular files and the
length of each link's target (what `lstat` says), never what a link points to.

Everything here is blocking file I/O: callers run it in a worker thread
(`hashlib` releases the GIL while it hashes large chunks).
"""

from __future__ import annotations

import enum
import hashlib
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "sha256:"
#: The planning reason of an action recomputing a copy that failed its check.
MISMATCH_REASON = "digest-mismatch"
#: Read size while hashing a file: large enough that hashlib drops the GIL.
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Measure:
    """What a commit records about an output, and the fingerprint it was hashed at."""

    size_bytes: int
    digest: str
    #: SHA-256 of the stat-level fingerprint (`fingerprint`) taken in the same walk.
    fingerprint: bytes


class Status(enum.StrEnum):
    """The outcome of checking a dataset against its recorded digest."""

    #: The content hashes to the recorded digest.
    MATCH = "match"
    #: It does not: the files changed since they were committed.
    MISMATCH = "mismatch"
    #: Nothing is at the dataset's path.
    MISSING = "missing"
    #: No digest to compare with (unmanaged, remote, or stored before digests existed).
    UNVERIFIABLE = "unverifiable"


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    #: The digest and size found now (None when missing or unverifiable).
    digest: str | None = None
    size_bytes: int | None = None
    #: Whether the content was hashed (False: an unchanged fingerprint vouched for it).
    hashed: bool = False

    @property
    def bad(self) -> bool:
        """Whether the copy must never be reused."""
        return self.status in (Status.MISMATCH, Status.MISSING)


def measure(path: str) -> Measure | None:
    """Size, digest and fingerprint of the output at `path`; None when nothing is there."""
    root = os.fsencode(path)
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return None
    manifest = hashlib.sha256()
    prints = hashlib.sha256()
    size = 0
    for rel, st in _walk(root, top):
        prints.update(_stat_line(rel, st))
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            manifest.update(b"d" + _framed(rel))
        elif stat.S_ISREG(mode):
            content, length = _hash_file(root + b"/" + rel if rel else root)
            size += length
            manifest.update(b"f" + _framed(rel) + length.to_bytes(8, "big") + content)
        elif stat.S_ISLNK(mode):
            target = os.readlink(root + b"/" + rel if rel else root)
            size += len(target)
            manifest.update(b"l" + _framed(rel) + _framed(target))
        else:
            manifest.update(b"o" + _framed(rel) + stat.S_IFMT(mode).to_bytes(4, "big"))
    return Measure(size, PREFIX + manifest.hexdigest(), prints.digest())


def fingerprint(path: str) -> bytes | None:
    """SHA-256 of the stat-level fingerprint of the output at `path`, or None when absent.

    Per entry: path, type and mode, size, inode, mtime and ctime (one lstat
    each, no content read). Any write, rename or chmod changes some entry's
    ctime, which an unprivileged user cannot set back.
    """
    root = os.fsencode(path)
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return None
    prints = hashlib.sha256()
    for rel, st in _walk(root, top):
        prints.update(_stat_line(rel, st))
    return prints.digest()


class DigestCache:
    """Per node: the digest last computed for a path, and the fingerprint it was computed at.

    Bounded (least recently used goes first). A hit needs the fingerprint of the
    files now to equal the cached one; anything else hashes the content again.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[bytes, str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, path: str, measured: Measure) -> None:
        with self._lock:
            self._entries[path] = (measured.fingerprint, measured.digest, measured.size_bytes)
            self._entries.move_to_end(path)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def check(self, path: str, expected: str) -> Verdict:
        """Verify `path` against `expected`; hash only if its fingerprint changed (blocking)."""
        with self._lock:
            cached = self._entries.get(path)
        if cached is not None:
            try:
                now = fingerprint(path)
            except OSError:
                return self.verify(path, expected)
            if now is None:
                return Verdict(Status.MISSING)
            if now == cached[0]:
                return _verdict(expected, cached[1], cached[2], hashed=False)
        return self.verify(path, expected)

    def verify(self, path: str, expected: str) -> Verdict:
        """Hash `path` again and compare with `expected` (blocking); the result is cached."""
        try:
            measured = measure(path)
        except OSError:
            # Changed under the walk, or made unreadable: not the files that were stored.
            return Verdict(Status.MISMATCH)
        if measured is None:
            return Verdict(Status.MISSING)
        self.put(path, measured)
        return _verdict(expected, measured.digest, measured.size_bytes, hashed=True)


def _verdict(expected: str, digest: str, size: int, *, hashed: bool) -> Verdict:
    status = Status.MATCH if digest == expected else Status.MISMATCH
    return Verdict(status, digest, size, hashed)


def _stat_line(rel: bytes, st: os.stat_result) -> bytes:
    numbers = (st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    return _framed(rel) + b"".join(n.to_bytes(16, "big", signed=True) for n in numbers)


def _walk(root: bytes, top: os.stat_result) -> Iterator[tuple[bytes, os.stat_result]]:
    """Every entry under `root` (itself first, as b"", `top` its lstat), in a stable order;
    no link followed."""
    yield b"", top
    if not stat.S_ISDIR(top.st_mode):
        return
    stack: list[bytes] = [b""]
    while stack:
        rel_dir = stack.pop()
        directory = root + b"/" + rel_dir if rel_dir else root
        with os.scandir(directory) as scan:
            names = sorted(entry.name for entry in scan)
        children: list[bytes] = []
        for name in names:
            rel = rel_dir + b"/" + name if rel_dir else name
            try:
                st = os.lstat(root + b"/" + rel)
            except FileNotFoundError:
                continue
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                children.append(rel)
        # Reversed so the stack pops them in byte order: the walk is stable.
        stack.extend(reversed(children))


def _hash_file(path: bytes) -> tuple[bytes, int]:
    """SHA-256 and length of a regular file's content, refusing to follow a link or open a FIFO.

    The entry was a regular file when listed; O_NOFOLLOW and O_NONBLOCK keep a
    swap to a link or a FIFO in between from making the hasher read a secret or block.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return hashlib.sha256(b"").digest(), 0
        content = hashlib.sha256()
        length = 0
        # Sized to the file (plus one byte to see the end in one read): a fresh
        # 1 MiB buffer per small file would cost more than hashing it.
        buffer = bytearray(min(_CHUNK, st.st_size + 1))
        view = memoryview(buffer)
        while read := os.readv(fd, [buffer]):
            content.update(view[:read])
            length += read
        return content.digest(), length
    finally:
        os.close(fd)


def _framed(value: bytes) -> bytes:
    return len(value).to_bytes(8, "big") + value
