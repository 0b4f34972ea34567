"""Trees that users' actions wrote: walked, copied and removed without recursion.

Python 3.11's `shutil.rmtree`, `shutil.copytree` and `os.walk` recurse once or twice per
directory level, so a tree an action nests 1,000 levels deep raises `RecursionError` in
them. A red-team review's 1,200 nested directories did that in the reaper's staging
sweep: the node stopped, and every restart stopped again on the same leftover. What
is stored is also bounded: an output deeper than `MAX_DEPTH` levels, or with more than
`MAX_HOLE_BYTES` of holes, is refused, so nothing later (digests, sizes, the storage
budget, readers) meets such a tree in the data root. A copy (`copy_fresh`) goes by
descriptor, as the tree may change under it.
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
from dataclasses import dataclass

logger = logging.getLogger(__name__)

#: Directory levels an output may have below its top: Hadoop-style datasets nest a
#: few partition levels; hundreds mean an attack or a bug.
MAX_DEPTH = 128
#: Bytes of holes (sparse files) an output may hold: the digest reads a hole as zeros
#: and the storage budget counts it as data, so a file `truncate` made 2 TiB long in no
#: time would take the server's threads for half an hour and evict everyone's datasets.
MAX_HOLE_BYTES = 1 << 30
#: Bytes copied per call when the kernel cannot copy a range itself.
_CHUNK = 1 << 20
#: How long `rm -rf` may take on a tree `shutil.rmtree` could not remove.
_RM_TIMEOUT_S = 600.0


class UnstorableOutput(Exception):
    """An output that cannot be stored as it is (too deep, too sparse, a link where
    none may be); the attempt fails."""


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


def check(top: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise UnstorableOutput when the tree or file at `top` nests deeper than
    `max_depth`, holds more than `MAX_HOLE_BYTES` of holes or a file of several names
    (what `copy_fresh` refuses, for an output stored as it is), or is or holds a FIFO,
    socket or device (which `copy_fresh` leaves out). Walked by path: only for
    a tree nobody else can change meanwhile."""
    limits = _Limits(max_depth, links=True)
    st = os.lstat(top)
    if stat.S_ISREG(st.st_mode):
        _single_name(top, st)
        limits.add_holes(_holes(top))
    elif stat.S_ISDIR(st.st_mode):
        for path, entry in entries(top, max_depth):
            if stat.S_ISREG(entry.st_mode):
                _single_name(path, entry)
                limits.add_holes(_holes(path))
            elif not stat.S_ISDIR(entry.st_mode) and not stat.S_ISLNK(entry.st_mode):
                _no_special(path)
    elif not stat.S_ISLNK(st.st_mode):
        _no_special(top)


def _no_special(path: str) -> None:
    """Refuse a FIFO, socket or device in an output stored as it is (`copy_fresh` leaves
    them out): moved beside a user's path, a FIFO held the server's thread that opened
    it (a red-team review named one `<path>.exit`, the server's exit status file)."""
    raise UnstorableOutput(f"it is or holds a FIFO, socket or device ({path})")


def _single_name(path: str, st: os.stat_result) -> None:
    """Refuse a file of several names (hard links): stored, size and digest count each
    name as a file of its own (a red-team review's 3,000 names of one 1 MiB file were
    3 GB of the storage budget, and as many bytes to hash)."""
    if st.st_nlink > 1:
        raise UnstorableOutput(
            f"it holds a file with {st.st_nlink} names (hard links, {path}): the server"
            " would store and count each name as a file of its own"
        )


def _holes(path: str) -> int:
    """Bytes of the file at `path` that are holes."""
    fd = os.open(path, _FILE)
    try:
        length = os.fstat(fd).st_size
        return length - sum(end - start for start, end in _data_ranges(fd, length))
    finally:
        os.close(fd)


def size(top: str) -> int:
    """Bytes of the files and links at or below `top` (apparent sizes)."""
    st = os.lstat(top)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    return sum(s.st_size for _, s in entries(top) if not stat.S_ISDIR(s.st_mode))


def copy_fresh(source: str, target: str, max_depth: int = MAX_DEPTH, *, links: bool = True) -> None:
    """Copy the file, link or tree at `source` to `target` (which must not exist) into
    new inodes: links as links (refused when not `links`), files with their holes,
    modes and times kept; FIFOs, sockets and devices left out (logged).

    The walk goes by descriptor, each directory opened below its parent without
    following links: the tree may change while it is copied (an action of the same user
    holding a descriptor of it), and a directory swapped for a link must not make the
    server copy what the link points at, with its rights, into the dataset (a red-team
    review had `$PINGO_HOME` copied that way).

    Raises UnstorableOutput for a tree deeper than `max_depth`, too sparse
    (`MAX_HOLE_BYTES`), holding a file of several names (hard links) or a link when not
    `links`; OSError for what the
    filesystem refuses (a directory swapped for a link, a full disk). What was copied is
    removed then.
    """
    try:
        _copy(source, target, _Limits(max_depth, links))
    except BaseException:
        remove(target)
        raise


@dataclass(slots=True)
class _Limits:
    """What a copy may meet, and what it met so far."""

    max_depth: int
    links: bool
    holes: int = 0

    def add_holes(self, count: int) -> None:
        self.holes += count
        if self.holes > MAX_HOLE_BYTES:
            raise UnstorableOutput(
                f"its files hold more than {MAX_HOLE_BYTES} bytes of holes (sparse files):"
                " the server would read and count them as data"
            )


@dataclass(slots=True)
class _Frame:
    """A directory being copied: both descriptors, the names left, its depth and path."""

    source: int
    target: int
    names: list[str]
    depth: int
    path: str


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _copy(source: str, target: str, limits: _Limits) -> None:
    mode = os.lstat(source).st_mode
    if stat.S_ISLNK(mode):
        _copy_link(source, target, None, None, limits, os.path.basename(source))
    elif stat.S_ISREG(mode):
        _copy_file(source, target, None, None, limits)
    elif stat.S_ISDIR(mode):
        top = os.open(source, _DIRECTORY)
        try:
            os.mkdir(target, 0o700)
            copy = os.open(target, _DIRECTORY)
        except BaseException:
            os.close(top)
            raise
        _copy_tree(_Frame(top, copy, _names(top), 1, ""), limits)
    else:
        _special(target)


def _copy_tree(top: _Frame, limits: _Limits) -> None:
    """Copy `top`'s directory depth first, holding descriptors only along the current
    path (at most `max_depth` pairs), and closing every one it opened."""
    stack = [top]
    try:
        while stack:
            frame = stack[-1]
            if not frame.names:
                _copy_stat(os.fstat(frame.source), frame.target)
                stack.pop()
                os.close(frame.source)
                os.close(frame.target)
                continue
            name = frame.names.pop()
            try:
                st = os.stat(name, dir_fd=frame.source, follow_symlinks=False)
            except FileNotFoundError:
                continue
            path = f"{frame.path}/{name}" if frame.path else name
            if stat.S_ISDIR(st.st_mode):
                stack.append(_entered(frame, name, path, limits))
            elif stat.S_ISLNK(st.st_mode):
                _copy_link(name, name, frame.source, frame.target, limits, path)
            elif stat.S_ISREG(st.st_mode):
                _copy_file(name, name, frame.source, frame.target, limits)
            else:
                _special(path)
    finally:
        for frame in stack:
            os.close(frame.source)
            os.close(frame.target)


def _entered(parent: _Frame, name: str, path: str, limits: _Limits) -> _Frame:
    """The frame of `parent`'s subdirectory `name`, its copy made."""
    if parent.depth >= limits.max_depth:
        raise UnstorableOutput(f"it nests directories deeper than {limits.max_depth} levels")
    # O_NOFOLLOW: a directory swapped for a link since it was listed fails the copy.
    source = os.open(name, _DIRECTORY, dir_fd=parent.source)
    try:
        os.mkdir(name, 0o700, dir_fd=parent.target)
        target = os.open(name, _DIRECTORY, dir_fd=parent.target)
    except BaseException:
        os.close(source)
        raise
    try:
        names = _names(source)
    except BaseException:
        os.close(source)
        os.close(target)
        raise
    return _Frame(source, target, names, parent.depth + 1, path)


def _names(directory: int) -> list[str]:
    with os.scandir(directory) as scan:
        return [entry.name for entry in scan]


def _copy_link(
    source: str,
    target: str,
    source_dir: int | None,
    target_dir: int | None,
    limits: _Limits,
    path: str,
) -> None:
    if not limits.links:
        raise UnstorableOutput(f"it is or holds a symbolic link ({path})")
    os.symlink(os.readlink(source, dir_fd=source_dir), target, dir_fd=target_dir)


def _copy_file(
    source: str, target: str, source_dir: int | None, target_dir: int | None, limits: _Limits
) -> None:
    """The bytes of `source` into a new file `target`, holes kept as holes: a sparse
    file the action made in no time must not take its whole length on disk here."""
    src = os.open(source, _FILE, dir_fd=source_dir)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):  # swapped since it was listed
            _special(target)
            return
        _single_name(source, st)
        dst = os.open(target, _NEW_FILE, 0o600, dir_fd=target_dir)
        try:
            data = 0
            for start, end in _data_ranges(src, st.st_size):
                _copy_range(src, dst, start, end)
                data += end - start
            limits.add_holes(st.st_size - data)
            os.ftruncate(dst, st.st_size)
            _copy_stat(st, dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_stat(st: os.stat_result, target: int) -> None:
    """`st`'s permission bits and times onto the copy open at `target`."""
    os.fchmod(target, stat.S_IMODE(st.st_mode))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _special(path: str) -> None:
    # No bytes to store, and opening a FIFO to copy it would wait for a writer.
    logger.warning(
        "left out of the output: %s is neither a file, a directory nor a link",
        path,
        extra={"event": "output_special_file", "path": path},
    )


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
