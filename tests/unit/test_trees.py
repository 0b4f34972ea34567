"""Trees actions wrote, taken apart by the server without recursion (`pingo.datasets.trees`):
any depth removed, too deep refused, holes kept, and a copy cut short never left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pingo.datasets import trees


def _nest(top: Path, levels: int) -> Path:
    """`levels` directories nested under `top`, built through descriptors so that no path
    the test opens grows with the depth; the deepest one's path."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as leaf:
            leaf.write("deep")
    finally:
        os.close(fd)
    return top


def test_a_tree_deeper_than_pythons_recursion_is_removed(tmp_path: Path) -> None:
    # 1,200 levels: Python 3.11's shutil.rmtree raises RecursionError about 1,000 down.
    top = _nest(tmp_path / "deep", 1_200)
    assert trees.remove(str(top))
    assert not top.exists()


def test_a_tree_with_paths_past_path_max_is_removed(tmp_path: Path) -> None:
    top = tmp_path / "long"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(40):  # 40 x 200 characters: past PATH_MAX (4,096)
            os.mkdir("n" * 200, dir_fd=fd)
            deeper = os.open("n" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    assert trees.remove(str(top))
    assert not top.exists()


def test_removing_nothing_or_a_file_or_a_link_never_follows_it(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "precious").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(kept)
    assert trees.remove(str(link)) and trees.remove(str(tmp_path / "absent"))
    assert (kept / "precious").read_text() == "x"


def test_an_output_deeper_than_the_limit_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    source = _nest(tmp_path / "deep", trees.MAX_DEPTH + 5)
    target = tmp_path / "copy"
    with pytest.raises(trees.UnstorableOutput, match="deeper than"):
        trees.copy_fresh(str(source), str(target))
    assert not target.exists()
    with pytest.raises(trees.UnstorableOutput):
        trees.check(str(source))
    trees.check(str(_nest(tmp_path / "shallow", 10)))


def test_a_copy_keeps_holes_content_links_and_modes(tmp_path: Path) -> None:
    source = tmp_path / "out"
    (source / "sub").mkdir(parents=True)
    sparse = source / "sparse"
    with sparse.open("wb") as f:
        f.truncate(1 << 30)  # 1 GiB of hole: no block on disk
        f.seek(1 << 20)
        f.write(b"middle")
    (source / "sub" / "tool").write_text("#!/bin/sh\n")
    (source / "sub" / "tool").chmod(0o755)
    (source / "to-tool").symlink_to("sub/tool")
    os.mkfifo(source / "fifo")
    target = tmp_path / "copy"
    trees.copy_fresh(str(source), str(target))
    copied = target / "sparse"
    assert copied.stat().st_size == 1 << 30
    assert copied.stat().st_blocks * 512 < 1 << 24, "the hole was written out"
    with copied.open("rb") as f:
        f.seek(1 << 20)
        assert f.read(6) == b"middle"
        f.seek(0)
        assert f.read(16) == bytes(16)
    assert os.readlink(target / "to-tool") == "sub/tool"
    assert (target / "sub" / "tool").stat().st_mode & 0o777 == 0o755
    assert not (target / "fifo").exists()
    assert copied.stat().st_ino != sparse.stat().st_ino


def test_a_copy_cut_short_leaves_nothing(tmp_path: Path) -> None:
    """A file size limit stands in for a full disk: the write fails part-way (EFBIG)."""
    source = tmp_path / "out"
    source.mkdir()
    (source / "a").write_bytes(os.urandom(1 << 20))
    (source / "b").write_bytes(os.urandom(4 << 20))
    target = tmp_path / "copy"
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from pingo.datasets import trees
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 << 20, 2 << 20))
        try:
            trees.copy_fresh({str(source)!r}, {str(target)!r})
        except OSError as exc:
            print("refused", exc.errno)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.startswith("refused"), done.stdout + done.stderr
    assert not target.exists()


def test_a_directory_swapped_for_a_link_while_copied_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red-team review's race: another action of the user, holding a descriptor of the
    output, swaps a listed directory for a link to the server's files before the copy
    enters it. The copy must fail rather than copy what the link points at."""
    secret = tmp_path / "home"
    secret.mkdir()
    (secret / "admin.token").write_text("SECRET")
    source = tmp_path / "out"
    (source / "d").mkdir(parents=True)
    (source / "d" / "part").write_text("rows")
    looked = os.stat

    def looked_then_swapped(path: object, *args: object, **kwargs: object) -> os.stat_result:
        # Between the copy's lstat of `d` (a directory) and its opening `d`.
        st = looked(path, *args, **kwargs)  # type: ignore[call-overload]
        if path == "d" and not (source / "d").is_symlink():
            (source / "d").rename(tmp_path / "moved")
            (source / "d").symlink_to(secret)
        return st  # type: ignore[no-any-return]

    monkeypatch.setattr(trees.os, "stat", looked_then_swapped)
    target = tmp_path / "copy"
    with pytest.raises(OSError):
        trees.copy_fresh(str(source), str(target))
    assert not target.exists()
    assert not any(
        "SECRET" in p.read_text() for p in tmp_path.rglob("*") if p.is_file() and p.parent != secret
    )


def _sparse(path: Path, length: int) -> Path:
    with path.open("wb") as f:
        f.truncate(length)
    return path


def test_an_output_of_mostly_holes_is_refused(tmp_path: Path) -> None:
    """Holes cost the action nothing and the server a read of every byte and room in
    the storage budget: past `MAX_HOLE_BYTES` the output is refused, copied or not."""
    source = tmp_path / "out"
    source.mkdir()
    _sparse(source / "a", trees.MAX_HOLE_BYTES // 2 + 1)
    _sparse(source / "b", trees.MAX_HOLE_BYTES // 2 + 1)
    with pytest.raises(trees.UnstorableOutput, match="holes"):
        trees.copy_fresh(str(source), str(tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()
    with pytest.raises(trees.UnstorableOutput, match="holes"):
        trees.check(str(source))
    with pytest.raises(trees.UnstorableOutput, match="holes"):
        trees.check(str(_sparse(tmp_path / "one", trees.MAX_HOLE_BYTES + 1)))
    (source / "b").unlink()
    trees.check(str(source))


def test_a_copy_that_may_not_hold_links_refuses_one(tmp_path: Path) -> None:
    source = tmp_path / "out"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "link").symlink_to("/etc")
    with pytest.raises(trees.UnstorableOutput, match=r"symbolic link \(sub/link\)"):
        trees.copy_fresh(str(source), str(tmp_path / "copy"), links=False)
    assert not (tmp_path / "copy").exists()


def test_an_output_holding_hard_links_is_refused(tmp_path: Path) -> None:
    """Each name would be stored and counted as a file of its own: 3,000 names of one
    1 MiB file were 3 GB on disk and in the storage budget (a red-team review)."""
    source = tmp_path / "out"
    source.mkdir()
    (source / "one").write_bytes(b"x" * 1024)
    for i in range(3):
        os.link(source / "one", source / f"name{i}")
    with pytest.raises(trees.UnstorableOutput, match="hard links"):
        trees.copy_fresh(str(source), str(tmp_path / "copy"))
    assert not (tmp_path / "copy").exists()
    with pytest.raises(trees.UnstorableOutput, match="hard links"):
        trees.check(str(source))
    with pytest.raises(trees.UnstorableOutput, match="hard links"):
        trees.check(str(source / "one"))
    for i in range(3):
        (source / f"name{i}").unlink()
    trees.check(str(source))
    trees.copy_fresh(str(source), str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "one").read_bytes() == b"x" * 1024


def test_an_output_stored_as_it_is_may_not_be_or_hold_a_fifo(tmp_path: Path) -> None:
    """Renamed beside a user's path as `<path>.exit`, a FIFO held the server's thread
    that opened it (a red-team review); `copy_fresh` leaves such files out."""
    source = tmp_path / "out"
    source.mkdir()
    os.mkfifo(source / "pipe")
    with pytest.raises(trees.UnstorableOutput, match="FIFO"):
        trees.check(str(source))
    with pytest.raises(trees.UnstorableOutput, match="FIFO"):
        trees.check(str(source / "pipe"))
