"""Dataset files under a data root, through fsspec (a local directory, hdfs://, s3://, memory://).

Every dataset has one path derived from its id. Executors write into a staging
path per attempt; success promotes the staging path onto the dataset path, so a
partial output never looks stored. Local filesystems take fast paths (an
`os.rename` is atomic and cheap); only what can be slow (removing or measuring
a tree, any remote call) runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import fsspec.core
from fsspec.implementations.local import LocalFileSystem

from pingo import errors, metrics
from pingo.datasets import integrity, trees

logger = logging.getLogger(__name__)

STAGING_DIR = ".staging"
#: Beside a local staging output, written by the node once its attempt's command exited 0
#: and the output is whole, before the success is reported (see `record_completion`).
COMPLETED_SUFFIX = ".completed"
#: Beside a sandboxed attempt's staging output: bubblewrap's status as JSON documents,
#: `{"exit-code": N}` written by bwrap itself the moment the command exits.
EXIT_STATUS_SUFFIX = ".exit"
#: How a spare evidence file in a staging directory is named (`SpareFiles`): three
#: dot-separated parts, never an attempt's four, so the reaper's sweep removes one left
#: idle for a lease.
SPARE_PREFIX = "spare."


@dataclass(frozen=True, slots=True)
class Completion:
    """An attempt's own evidence that its command completed (exit 0)."""

    #: None when only the sandbox's exit status says so (it does not time the command).
    runtime_s: float | None


def record_completion(staging: str, runtime_s: float) -> None:
    """Note beside a local staging output that its attempt completed, in `runtime_s`.

    Written by the node that ran the attempt before it reports the success. If that
    node dies before the success is in the store, the node that reaps the attempt
    finds the note (or, for a sandboxed attempt, bwrap's exit status, written as the
    command exits) and records the success instead of running the work again.
    """
    with os.fdopen(open_evidence(staging + COMPLETED_SUFFIX), "w") as f:
        f.write(f"{runtime_s:.6f}\n")


class SpareFiles:
    """Evidence files (`.completed`, `.exit`) kept for reuse in staging directories.

    Every attempt creates its evidence and removes it once its outcome is stored. On
    ext4 without a journal, each new inode costs a scan past every inode freed in the
    last minutes, which at a hundred attempts a second took a third of a
    sandboxed node's CPU (bench/README.md, "Issue 15, fourteenth pass"). A file
    renamed into place allocates no inode. Only the staging directories of the data
    roots this process uses hold spares (`allow`; beside an unmanaged output the
    directory is the user's), at most `limit` each. One left idle for a lease is
    removed by the reaper's sweep, and taking it then falls back to creating the file.
    Safe to reuse because nothing holds an evidence file once its outcome is stored:
    the sandboxed command never sees bwrap's status descriptor, and bwrap has exited.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        # Several nodes may share one data root: each names (and takes) only its own.
        self._prefix = f"{SPARE_PREFIX}{secrets.token_hex(6)}."
        self._numbers = itertools.count()
        self._free: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def allow(self, directory: str) -> None:
        """Keep spares in `directory`, a data root's staging directory (`DatasetStorage`)."""
        with self._lock:
            self._free.setdefault(directory, [])

    def take(self, directory: str) -> str | None:
        """A spare file's path in `directory`, no longer offered to anyone else; or None."""
        with self._lock:
            free = self._free.get(directory)
            return free.pop() if free else None

    def keep(self, path: str) -> bool:
        """Move the evidence file at `path` aside as a spare; whether nothing is left at
        `path` (False: not kept, for the caller to remove)."""
        directory, _, _ = path.rpartition("/")
        with self._lock:
            free = self._free.get(directory)
            if free is None or len(free) >= self.limit:
                return False
            spare = f"{directory}/{self._prefix}{next(self._numbers)}"
        try:
            os.rename(path, spare)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        with self._lock:
            free.append(spare)
        return True


#: This process's spares (`open_evidence`, `forget_completion`).
SPARES = SpareFiles()


def open_evidence(path: str) -> int:
    """`open_own(path)`, emptied, from a spare file when its directory has one (`SpareFiles`)."""
    directory, _, _ = path.rpartition("/")
    spare = SPARES.take(directory)
    if spare is not None:
        try:
            fd = os.open(spare, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            pass  # swept meanwhile
        else:
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", spare)
                # Emptied before it takes the name: an earlier attempt's `{"exit-code": 0}`
                # must never stand, not even for a node dying in between, as this one's.
                os.ftruncate(fd, 0)
                # The descriptor keeps the inode taken here, whatever the path names later.
                os.rename(spare, path)
                os.set_blocking(fd, True)
                return fd
            except OSError:
                os.close(fd)
    return open_own(path)


def open_own(path: str) -> int:
    """Create or truncate `path` for writing (mode 0600): a regular file, never through
    a link, never blocking.

    Beside an unmanaged output the path is the user's: a link planted there would make
    the server truncate whatever it named, and a FIFO would hold the server's thread in
    `open` until someone reads it (a red-team review stopped dispatch so). Anything but
    a regular file found there is removed, and the file created anew (`O_EXCL`: one
    planted again meanwhile fails it).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        # ELOOP: a link; ENXIO: a FIFO nobody reads.
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            raise
    else:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.ftruncate(fd, 0)
            os.set_blocking(fd, True)
            return fd
        os.close(fd)  # a FIFO someone reads, a device
    os.unlink(path)
    fd = os.open(path, flags | os.O_EXCL, 0o600)
    os.set_blocking(fd, True)
    return fd


def _read_own(path: str, size: int) -> str:
    """Up to `size` characters of the regular file at `path`, never through a link nor
    blocking: FileNotFoundError for anything else (a FIFO planted beside a user's path
    would hold the reading thread, `open_own`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileNotFoundError(path) from exc
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileNotFoundError(path)
        return f.read(size).decode(errors="replace")


def forget_completion(staging: str) -> None:
    """Remove an attempt's completion evidence once its outcome is recorded (into the
    spares, `SpareFiles`, where it may be reused)."""
    for suffix in (COMPLETED_SUFFIX, EXIT_STATUS_SUFFIX):
        if not SPARES.keep(staging + suffix):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging + suffix)


def read_completion(staging: str) -> Completion | None:
    """What says the attempt writing `staging` completed: the node's note, else an exit
    status of 0 from the sandbox; None when neither does (it failed, or nobody knows)."""
    try:
        text = _read_own(staging + COMPLETED_SUFFIX, 64)
    except FileNotFoundError:
        return _sandbox_completion(staging)
    try:
        return Completion(max(0.0, float(text)))
    except ValueError:  # its node died while writing it
        return Completion(None)


def _sandbox_completion(staging: str) -> Completion | None:
    try:
        text = _read_own(staging + EXIT_STATUS_SUFFIX, 4096)
    except FileNotFoundError:
        return None
    # One JSON document a line; the exit code comes last, once the command exited.
    for line in reversed(text.splitlines()):
        try:
            status = json.loads(line)
        except ValueError:
            continue
        if isinstance(status, dict) and "exit-code" in status:
            return Completion(None) if status["exit-code"] == 0 else None
    return None


#: Where a replaced directory copy waits, under the data root, while readers that
#: started on it still hold claims (`promote(..., readers=True)`, the reaper's sweep).
REPLACED_DIR = ".replaced"
#: Threads that hash for `verify`, apart from asyncio's default pool: a flood of
#: `?verify=true` then queues behind these alone, never behind (or in front of) the
#: log reads, promotions and planning checks the default pool runs. Two keep a
#: verification going while another user's holds a thread (the API caps each user
#: below this: `PINGO_USER_MAX_VERIFICATIONS`), and bound the disk and CPU spent on it.
VERIFY_THREADS = 2
#: The names of those threads (`pingo-verify_0`, …), for logs and profilers.
VERIFY_THREAD_PREFIX = "pingo-verify"


class DatasetStorage:
    """Paths, promotion, measurement and removal of dataset files."""

    def __init__(self, data_root: str) -> None:
        try:
            fs, root = fsspec.core.url_to_fs(data_root)
        except (ImportError, ValueError) as exc:
            # e.g. hdfs:// without pyarrow, or an unknown protocol.
            raise errors.ConfigurationError(
                f"data root {data_root!r} cannot be opened: {exc}"
            ) from exc
        self._fs: Any = fs
        self._local = isinstance(fs, LocalFileSystem)
        if self._local:
            # Plain absolute paths locally, so executors can hand them to programs as-is.
            self.root = os.path.abspath(os.path.expanduser(root)).rstrip("/") or "/"
        else:
            # Keep the URL (hdfs://nn/…, s3://bucket/…): paths go to cluster jobs verbatim.
            self.root = data_root.rstrip("/")
        self._staging_ready = False
        #: What this node last hashed, so reuse checks need not hash unchanged files again.
        self.digests = integrity.DigestCache()
        #: Made on the first verification, so a node that never verifies has no threads;
        #: `close` shuts it down.
        self._verifying: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Stop the verification threads: those running finish their file, queued ones
        are cancelled. A later verification starts them again."""
        pool, self._verifying = self._verifying, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    @property
    def is_local(self) -> bool:
        """Whether dataset paths are paths of this machine's filesystem."""
        return self._local

    def path_for(self, dataset_id: str) -> str:
        """Where the dataset's files live."""
        return f"{self.root}/{dataset_id[:2]}/{dataset_id}"

    def staging_path(self, dataset_id: str, workflow_id: str, action_id: int, attempt: int) -> str:
        """Where one attempt of an action writes its output before promotion.

        Creates the staging directory itself on first use on a local root (a
        single cheap mkdir), so programs can write straight to the path.
        """
        if self._local and not self._staging_ready:
            os.makedirs(f"{self.root}/{STAGING_DIR}", exist_ok=True)
            SPARES.allow(f"{self.root}/{STAGING_DIR}")
            self._staging_ready = True
        return f"{self.root}/{STAGING_DIR}/{dataset_id}.{workflow_id}.{action_id}.{attempt}"

    async def promote(
        self, staging: str, final: str, *, replace: bool = False, readers: bool = False
    ) -> int:
        """Move `staging` onto `final` and return the size of `final` in bytes.

        When `final` already exists, the same provenance was stored by someone
        else: the staging copy is removed and `final` kept, unless `replace` (a
        forced recompute: the new output must win). An attempt that wrote
        nothing stores an empty dataset (a directory).

        `readers`: actions holding claims on the dataset may be reading the old
        copy. A sandboxed reader has it bound at the path it was given, so it keeps
        reading the old files whatever is renamed; a replaced directory is therefore
        not removed but moved under `REPLACED_DIR`, for the reaper to remove once
        the dataset has no claims (`replaced_entries`). A replaced file needs
        nothing: its reader's bind (or open descriptor) holds the old inode.
        """
        # The plain promotion is the hot path; only an existing copy needs the swap.
        if replace and await self.exists(final):
            if self._local:
                aside = f"{self.root}/{REPLACED_DIR}" if readers else None
                await asyncio.to_thread(_replace_local, staging, final, aside)
            else:
                await asyncio.to_thread(self._replace_remote, staging, final)
            return await self.size(final)
        if self._local:
            return await self._promote_local(staging, final)
        return await asyncio.to_thread(self._promote_remote, staging, final)

    def _replace_remote(self, staging: str, final: str) -> None:
        fs = self._fs
        src, dst = fs._strip_protocol(staging), fs._strip_protocol(final)
        if not fs.exists(src):
            fs.makedirs(src, exist_ok=True)
        # Object stores have no atomic rename: the old copy goes first.
        if fs.exists(dst):
            fs.rm(dst, recursive=True)
        fs.mv(src, dst, recursive=True)

    async def _promote_local(self, staging: str, final: str) -> int:
        # The common cases cost a few syscalls and no thread: this runs once per action.
        try:
            staged: os.stat_result | None = os.lstat(staging)
        except FileNotFoundError:
            staged = None
        if staged is None:
            try:
                _mkdir(final)
            except FileExistsError:
                return await self.size(final)
            logger.debug(
                "no output at %s: stored an empty dataset",
                staging,
                extra={"event": "dataset_empty", "path": final},
            )
            return 0
        if _lexists(final):
            # Another action stored the same provenance first. Keep theirs.
            await self.remove(staging)
            return await self.size(final)
        if stat.S_ISDIR(staged.st_mode):
            try:
                # rename is atomic: the whole tree appears under `final` or none of it;
                # it fails onto a non-empty directory, so nobody's output is clobbered.
                _with_parent(os.rename, staging, final)
            except OSError:
                if not _lexists(final):
                    raise
                await self.remove(staging)
            return await self.size(final)
        # A file: link (never overwrites) rather than rename (would clobber a twin's file).
        try:
            _with_parent(os.link, staging, final)
        except FileExistsError:
            pass
        except OSError:
            # No hard links here (some mounted filesystems): rename instead.
            _with_parent(os.replace, staging, final)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)
        return await self.size(final)

    def _promote_remote(self, staging: str, final: str) -> int:
        fs = self._fs
        src, dst = fs._strip_protocol(staging), fs._strip_protocol(final)
        if fs.exists(dst):
            if fs.exists(src):
                fs.rm(src, recursive=True)
        elif fs.exists(src):
            fs.mv(src, dst, recursive=True)
        else:
            fs.makedirs(dst, exist_ok=True)
            return 0
        return int(fs.du(dst, total=True))

    async def size(self, path: str) -> int:
        """Bytes under `path` (a file, or every file of a tree); 0 when absent.

        Links are never followed: a link counts the length of its target string
        (as in `integrity.measure`), whatever it points to.
        """
        if self._local:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return 0
            if not stat.S_ISDIR(st.st_mode):
                return st.st_size
            flat = _flat_dir_size(path)
            if flat is not None:
                return flat
            return await asyncio.to_thread(trees.size, path)
        return await asyncio.to_thread(self._size_remote, path)

    async def measure(self, path: str) -> integrity.Measure | None:
        """Size and content digest of a local dataset, hashed in a worker thread.

        None on remote roots (hdfs://, s3://): their own checksums are not
        SHA-256 of the content, and reading a cluster's output back to hash it
        would cost a second pass over it. Also None when nothing is at `path`.
        """
        if not self._local:
            return None
        started = time.perf_counter()
        try:
            measured = await asyncio.to_thread(integrity.measure, path)
        except OSError as exc:
            # Changed or made unreadable while being hashed: store it without a
            # digest (unverifiable) rather than fail the action that made it.
            logger.warning(
                "could not hash %s: %s",
                path,
                exc,
                extra={"event": "dataset_digest_failed", "path": path},
            )
            return None
        metrics.DIGEST_SECONDS.observe(time.perf_counter() - started)
        if measured is not None:
            self.digests.put(path, measured)
        return measured

    async def verify(
        self, path: str, expected: str | None, *, full: bool = True
    ) -> integrity.Verdict:
        """Check the files at `path` against the digest recorded for them, on one of the
        `VERIFY_THREADS` threads kept for verifications (never asyncio's default pool).

        `full` hashes the content again; otherwise an unchanged stat fingerprint
        since this node last hashed it vouches for it (`integrity.DigestCache`).
        """
        if expected is None or not self._local:
            return integrity.Verdict(integrity.Status.UNVERIFIABLE)
        started = time.perf_counter()
        check = self.digests.verify if full else self.digests.check
        loop = asyncio.get_running_loop()
        if self._verifying is None:
            self._verifying = ThreadPoolExecutor(
                VERIFY_THREADS, thread_name_prefix=VERIFY_THREAD_PREFIX
            )
        verdict = await loop.run_in_executor(self._verifying, check, path, expected)
        if verdict.hashed:
            metrics.DIGEST_SECONDS.observe(time.perf_counter() - started)
        return verdict

    async def check_before_reuse(
        self, datasets: Sequence[tuple[str, str]]
    ) -> list[integrity.Verdict]:
        """`verify(path, digest, full=False)` for each (path, digest), in one worker-thread hop.

        Planning checks a whole generation of reused datasets at once: most are
        unchanged, and their fingerprints cost a few lstat calls each.
        """
        if not self._local:
            return [integrity.Verdict(integrity.Status.UNVERIFIABLE) for _ in datasets]
        return await asyncio.to_thread(
            lambda: [self.digests.check(path, digest) for path, digest in datasets]
        )

    def _size_remote(self, path: str) -> int:
        p = self._fs._strip_protocol(path)
        if not self._fs.exists(p):
            return 0
        return int(self._fs.du(p, total=True))

    def replaced_entries(self) -> list[tuple[str, str]]:
        """Replaced copies kept for their readers, as (path, dataset id) pairs (blocking)."""
        if not self._local:
            return []
        try:
            with os.scandir(f"{self.root}/{REPLACED_DIR}") as entries:
                return [(e.path, e.name.split(".", 1)[0]) for e in entries]
        except FileNotFoundError:
            return []

    async def remove(self, path: str) -> bool:
        """Remove the file or tree at `path`; whether nothing is left there (what is left
        on a local root is logged, `trees.remove`)."""
        if self._local:
            return await asyncio.to_thread(trees.remove, path)
        await asyncio.to_thread(self._remove_remote, path)
        return True

    def _remove_remote(self, path: str) -> None:
        p = self._fs._strip_protocol(path)
        with contextlib.suppress(FileNotFoundError):
            if self._fs.exists(p):
                self._fs.rm(p, recursive=True)

    async def modified_at(self, relative: str) -> datetime | None:
        """When the file or directory at `relative` (under the root) last changed, in UTC;
        None when nothing is there (or the filesystem cannot tell)."""
        path = f"{self.root}/{relative}"
        if self._local:
            try:
                # lstat: a symlink is not followed out of the data root.
                return datetime.fromtimestamp(os.lstat(path).st_mtime, UTC)
            except OSError:
                return None
        return await asyncio.to_thread(self._modified_remote, path)

    def _modified_remote(self, path: str) -> datetime | None:
        try:
            at: datetime = self._fs.modified(self._fs._strip_protocol(path))
        except (FileNotFoundError, NotImplementedError, OSError):
            return None
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)

    async def completion(self, staging: str) -> Completion | None:
        """`read_completion` of a staging output (None on a remote root: never noted)."""
        if not self._local:
            return None
        return await asyncio.to_thread(read_completion, staging)

    async def exists(self, path: str) -> bool:
        """Whether anything is at `path`."""
        if self._local:
            return _lexists(path)
        return bool(await asyncio.to_thread(self._fs.exists, self._fs._strip_protocol(path)))


#: A directory with no subdirectory and at most this many entries is measured inline.
_INLINE_ENTRIES = 64


def _flat_dir_size(path: str) -> int | None:
    """The size of a small flat directory (one scandir), or None when it needs a real walk."""
    total = 0
    with os.scandir(path) as entries:
        for count, entry in enumerate(entries):
            if count >= _INLINE_ENTRIES or entry.is_dir(follow_symlinks=False):
                return None
            with contextlib.suppress(FileNotFoundError):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def _replace_local(staging: str, final: str, keep_in: str | None = None) -> None:
    """Put `staging` at `final`, whatever `final` held (a forced recompute).

    A file replacing a file is one atomic `os.replace`. Otherwise the old copy
    is renamed aside first, the new one renamed in, and the old one removed:
    both renames are atomic, so a reader opening `final` sees the old or the new
    tree, never a mix, and files it already has open keep the old content
    (their inodes live until closed). With `keep_in`, a replaced directory is
    kept there (named `<dataset id>.<pid>.<ns>`) instead of removed: readers
    that have it bound read it whole until they end.
    """
    if not _lexists(staging):
        os.makedirs(staging, exist_ok=True)
    if not _is_real_dir(staging) and _lexists(final) and not _is_real_dir(final):
        _with_parent(os.replace, staging, final)
        return
    keep = keep_in is not None and _is_real_dir(final)
    tag = f"{os.getpid()}.{time.monotonic_ns()}"
    if keep:
        assert keep_in is not None
        os.makedirs(keep_in, exist_ok=True)
        aside = f"{keep_in}/{os.path.basename(final)}.{tag}"
    else:
        aside = f"{final}.replaced.{tag}"
    moved = False
    with contextlib.suppress(FileNotFoundError):
        os.rename(final, aside)
        moved = True
    _with_parent(os.rename, staging, final)
    if moved and not keep:
        trees.remove(aside)


def _lexists(path: str) -> bool:
    """Whether anything (even a dangling link) is at `path`: one cheap lstat."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _is_real_dir(path: str) -> bool:
    """A directory, not a link to one (a link is removed, never what it points to)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _mkdir(path: str) -> None:
    """Create the directory `path` (and its parents); FileExistsError if anything is there."""
    try:
        os.mkdir(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path)


def _with_parent(move: Callable[[str, str], None], src: str, dst: str) -> None:
    """`move(src, dst)`, creating `dst`'s parent directory the first time it is missing."""
    try:
        move(src, dst)
    except FileNotFoundError:
        if not _lexists(src):
            raise
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        move(src, dst)
