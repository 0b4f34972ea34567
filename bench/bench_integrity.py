"""Dataset digests: the cost of hashing at commit and of checking a dataset before reuse.

digest_100mib_ms          hashing one 100 MiB file (`integrity.measure`, page cache warm)
digest_10k_files_ms       hashing a 10,000-file tree of 1 KiB files (metadata-bound)
commit_digest_small_ms    `DatasetStorage.measure` of a one-line output, worker thread
                          hop included: what every local action's commit now adds
reuse_check_100mib_ms     the planner's check of an unchanged 100 MiB dataset (a stat
                          fingerprint matched against the cache: no content read)
reuse_check_10k_files_ms  the same for the 10,000-file tree (one lstat per file)
verify_100mib_ms          `?verify=true` / `pingo datasets verify` of the 100 MiB file
                          (always hashes)
collect_fresh_100mib_ms   taking a sandboxed 100 MiB output out of its box as a fresh
                          copy (`sandbox.collect(fresh=True)`, the default with the
                          network on) rather than renaming it
collect_fresh_10k_files_ms  the same for the 10,000-file tree

The files are written once per process in a temporary directory and are read
from the page cache, as a dataset just committed is: a cold read of a large
dataset is bounded by the disk instead.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from pingo.actions.executors import sandbox
from pingo.datasets import integrity
from pingo.datasets.storage import DatasetStorage

MIB = 1 << 20
#: Repetitions of the sub-millisecond figures inside one run (their median is reported).
_SMALL_REPEATS = 200


@functools.cache
def _fixtures() -> tuple[Path, Path, Path]:
    root = Path(tempfile.mkdtemp(prefix="pingo-bench-integrity-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    big = root / "big"
    block = os.urandom(MIB)
    with big.open("wb") as f:
        for _ in range(100):
            f.write(block)
    tree = root / "tree"
    for i in range(10_000):
        directory = tree / f"part-{i // 100:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f-{i:05d}").write_bytes(block[:1024])
    small = root / "small"
    small.write_text("one line of output\n")
    return big, tree, small


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def _async_figures(big: Path, tree: Path, small: Path) -> dict[str, float]:
    storage = DatasetStorage(str(big.parent))
    commits = []
    for _ in range(_SMALL_REPEATS):
        started = time.perf_counter()
        await storage.measure(str(small))
        commits.append(_ms(started))
    big_digest = await storage.measure(str(big))
    tree_digest = await storage.measure(str(tree))
    assert big_digest is not None and tree_digest is not None
    checks_big, checks_tree = [], []
    for _ in range(20):
        started = time.perf_counter()
        verdict = await storage.verify(str(big), big_digest.digest, full=False)
        checks_big.append(_ms(started))
        assert verdict.status is integrity.Status.MATCH and not verdict.hashed
    for _ in range(5):
        started = time.perf_counter()
        verdict = await storage.verify(str(tree), tree_digest.digest, full=False)
        checks_tree.append(_ms(started))
        assert verdict.status is integrity.Status.MATCH and not verdict.hashed
    started = time.perf_counter()
    verdict = await storage.verify(str(big), big_digest.digest, full=True)
    verify_ms = _ms(started)
    assert verdict.hashed
    return {
        "commit_digest_small_ms": _median(commits),
        "reuse_check_100mib_ms": _median(checks_big),
        "reuse_check_10k_files_ms": _median(checks_tree),
        "verify_100mib_ms": verify_ms,
    }


def _collect_fresh_ms(source: Path, repeats: int = 3) -> float:
    """Median time of `sandbox.collect(fresh=True)` of a copy of `source` in a box."""
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(dir=source.parent) as tmp:
            output = os.path.join(tmp, "out")
            os.mkdir(sandbox.box_for(output))
            written = os.path.join(sandbox.box_for(output), "out")
            if source.is_dir():
                shutil.copytree(source, written)
            else:
                shutil.copyfile(source, written)
            started = time.perf_counter()
            sandbox.collect(output, fresh=True)
            times.append(_ms(started))
    return _median(times)


def measure() -> dict[str, float]:
    """One run of every figure."""
    big, tree, small = _fixtures()
    integrity.measure(str(big))  # warm the page cache, not timed
    started = time.perf_counter()
    integrity.measure(str(big))
    digest_big = _ms(started)
    started = time.perf_counter()
    integrity.measure(str(tree))
    digest_tree = _ms(started)
    figures = asyncio.run(_async_figures(big, tree, small))
    return {
        "digest_100mib_ms": digest_big,
        "digest_10k_files_ms": digest_tree,
        "collect_fresh_100mib_ms": _collect_fresh_ms(big),
        # Seconds on a slow disk: once per run (the harness takes the median of runs).
        "collect_fresh_10k_files_ms": _collect_fresh_ms(tree, repeats=1),
        **figures,
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
