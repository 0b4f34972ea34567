"""Trees that users' actions wrote: walked, copied and removed without recursion.

Python 3.11's `shutil.rmtree`, `shutil.copytree` and `os.walk` recurse once or twice per
directory level, so a tree an action nests 1,000 levels deep raises `RecursionError` in
them. A red-team review's 1,200 nested directories did that in the reaper's staging
sweep: the node stopped, and every restart stopped again on the same leftover. What
is stored is also bounded: an output deeper than `MAX_DEPTH` levels is refused, so
nothing later (digests, sizes, readers) meets such a tree in the data root.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator

logger = logging.getLogger(__name__)

#: Directory levels an output may have below its top: Hadoop-style datasets nest a
#: few partition levels; hundreds mean an attack or a bug.
MAX_DEPTH = 128
#: Bytes copied per call when the kernel cannot copy a range itself.
_CHUNK = 1 << 20
#: How long `rm -rf` may take on a tree `shutil.rmtree` could not remove.
_RM_TIMEOUT_S = 600.0


class UnstorableOutput(Exception):
    """An output that cannot be stored as it is (too deep); the attempt fails."""


def entries(top: str, max_depth: int | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry below the directory `top` with its lstat, directories before their
    contents; no link followed. Raises UnstorableOutput past `max_depth` levels."""
    stack: list[tuple[str, int]] = [(top, 1)]
    while stack:
        directory, depth = stack.pop()
        if max_depth is not None and depth > max_depth:
            raise UnstorableOutput(f"it nests directories deeper than {max_depth} levels")
        try:
            with os.scandir(directory) as scan:
                found = list(scan)
        except FileNotFoundError:  # removed meanwhile
            continue
        for entry in found:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield entry.path, st
            if stat.S_ISDIR(st.st_mode):
                stack.append((entry.path, depth + 1))


def check_depth(top: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise UnstorableOutput when the tree at `top` nests deeper than `max_depth`."""
    if os.path.isdir(top) and not os.path.islink(top):
        for _ in entries(top, max_depth):
            pass


def size(top: str) -> int:
    """Bytes of the files and links at or below `top` (apparent sizes)."""
    st = os.lstat(top)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    return sum(s.st_size for _, s in entries(top) if not stat.S_ISDIR(s.st_mode))


def copy_fresh(source: str, target: str, max_depth: int = MAX_DEPTH) -> None:
    """Copy the file, link or tree at `source` to `target` (which must not exist) into
    new inodes: links as links, files with their holes, modes and times kept; FIFOs,
    sockets and devices left out (logged).

    Raises UnstorableOutput for a tree deeper than `max_depth`, OSError for what the
    filesystem refuses (a path past PATH_MAX, a full disk); what was copied is removed.
    """
    try:
        _copy(source, target, max_depth)
    except BaseException:
        remove(target)
        raise


def _copy(source: str, target: str, max_depth: int) -> None:
    mode = os.lstat(source).st_mode
    if not stat.S_ISDIR(mode):
        _copy_entry(source, target, mode)
        return
    os.mkdir(target, 0o700)
    directories = [(source, target)]
    prefix = len(source)
    for path, st in entries(source, max_depth):
        copied = target + path[prefix:]
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(copied, 0o700)
            directories.append((path, copied))
        else:
            _copy_entry(path, copied, st.st_mode)
    # Last, and deepest first: a directory's own mode may forbid writing into it, and
    # writing into it would change its times.
    for path, copied in reversed(directories):
        shutil.copystat(path, copied, follow_symlinks=False)


def _copy_entry(source: str, target: str, mode: int) -> None:
    if stat.S_ISLNK(mode):
        os.symlink(os.readlink(source), target)
    elif stat.S_ISREG(mode):
        _copy_file(source, target)
        shutil.copystat(source, target, follow_symlinks=False)
    else:
        # No bytes to store, and opening a FIFO to copy it would wait for a writer.
        logger.warning(
            "left out of the output: %s is neither a file, a directory nor a link",
            target,
            extra={"event": "output_special_file", "path": target},
        )


def _copy_file(source: str, target: str) -> None:
    """The bytes of `source` into a new file `target`, holes kept as holes: a sparse
    file the action made in no time must not take its whole length on disk here."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    src = os.open(source, flags)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            length = os.fstat(src).st_size
            for start, end in _data_ranges(src, length):
                _copy_range(src, dst, start, end)
            os.ftruncate(dst, length)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _data_ranges(fd: int, length: int) -> Iterator[tuple[int, int]]:
    """The ranges of `fd` that hold data (`SEEK_DATA`/`SEEK_HOLE`), or the whole file
    where the filesystem cannot tell."""
    offset = 0
    while offset < length:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            if exc.errno == errno.EINVAL:  # no hole support: all data
                yield offset, length
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), length)
        yield start, end
        offset = end


def _copy_range(src: int, dst: int, start: int, end: int) -> None:
    offset = start
    while offset < end:
        try:
            done = os.copy_file_range(src, dst, end - offset, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = _copy_by_hand(src, dst, offset, min(end, offset + _CHUNK))
        if done == 0:  # the file shrank under us: what is there is what is stored
            return
        offset += done


def _copy_by_hand(src: int, dst: int, start: int, end: int) -> int:
    data = os.pread(src, end - start, start)
    view = memoryview(data)
    written = 0
    while written < len(data):
        written += os.pwrite(dst, view[written:], start + written)
    return len(data)


def remove(path: str) -> bool:
    """Remove the file, link or tree at `path` (links never followed); whether nothing is
    left there. A tree `shutil.rmtree` cannot remove (too deep for its recursion, or
    with paths past PATH_MAX) goes to `rm -rf`, which walks any depth by descriptor.
    What even that leaves is logged: removals are cleanup, and the sweeps try again.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return True
    with contextlib.suppress(RecursionError):
        shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
        return True
    done = subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", path],
        capture_output=True,
        timeout=_RM_TIMEOUT_S,
        check=False,
    )
    if not os.path.lexists(path):
        return True
    logger.error(
        "could not remove %s: %s",
        path,
        done.stderr.decode(errors="replace").strip() or f"rm exited {done.returncode}",
        extra={"event": "remove_failed", "path": path},
    )
    return False
