"""Dataset storage (real files, local and fsspec memory://) and the user-facing dataset service."""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import fsspec
import pytest

from pingo import errors, states
from pingo.config import Settings
from pingo.datasets import storage as dataset_storage
from pingo.datasets.service import DatasetService
from pingo.datasets.storage import DatasetStorage
from pingo.outcomes.service import OutcomeService
from pingo.store import protocol
from pingo.workflows import planner
from tests.unit._engine_support import (
    CHAIN,
    content,
    exists,
    is_dir,
    start_attempt,
    walk_dataset,
    workflow,
    write_output,
)

D = states.DatasetState

DS = "ab" + "0" * 62


def make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


# ----------------------------------------------------------------- local storage


def test_paths(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    assert storage.path_for(DS) == f"{tmp_path}/data/ab/{DS}"
    staging = storage.staging_path(DS, "wf-1", 3, 2)
    assert staging == f"{tmp_path}/data/.staging/{DS}.wf-1.3.2"
    assert is_dir(tmp_path / "data" / ".staging")  # ready for programs to write into
    assert DatasetStorage(f"file://{tmp_path}/data").path_for(DS) == storage.path_for(DS)


async def test_promote_a_tree_and_measure_it(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    staging = storage.staging_path(DS, "wf", 1, 1)
    make_tree(Path(staging), {"part-0": b"abc", "sub/part-1": b"defgh"})
    final = storage.path_for(DS)
    assert await storage.promote(staging, final) == 8
    assert content(Path(final) / "sub" / "part-1") == b"defgh"
    assert not await storage.exists(staging)
    assert await storage.size(final) == 8


async def test_promote_keeps_what_someone_else_stored(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    final = storage.path_for(DS)
    first = storage.staging_path(DS, "wf", 1, 1)
    make_tree(Path(first), {"a": b"first"})
    await storage.promote(first, final)
    second = storage.staging_path(DS, "wf2", 1, 1)
    make_tree(Path(second), {"a": b"second!", "b": b"x"})
    assert await storage.promote(second, final) == 5
    assert content(Path(final) / "a") == b"first"
    assert not exists(second)
    # Files too: a twin's file is never clobbered.
    file_ds = "cd" + "1" * 62
    for wf, data in (("wf", b"one"), ("wf2", b"two!")):
        staging = storage.staging_path(file_ds, wf, 1, 1)
        make_tree(Path(staging).parent, {Path(staging).name: data})
        await storage.promote(staging, storage.path_for(file_ds))
        assert not exists(staging)
    assert content(storage.path_for(file_ds)) == b"one"


async def test_promote_without_output_stores_an_empty_dataset(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    final = storage.path_for(DS)
    assert await storage.promote(storage.staging_path(DS, "wf", 1, 1), final) == 0
    assert is_dir(final)


async def test_remove_and_size_are_safe_on_absent_paths(tmp_path: Path) -> None:
    storage = DatasetStorage(str(tmp_path / "data"))
    tree = make_tree(tmp_path / "data" / "t", {"x/y": b"12", "z": b"3"})
    assert await storage.size(str(tree)) == 3
    await storage.remove(str(tree))
    await storage.remove(str(tree))
    assert not await storage.exists(str(tree))
    assert await storage.size(str(tree)) == 0
    file = tmp_path / "data" / "f"
    file.write_bytes(b"1234")
    assert await storage.size(str(file)) == 4
    await storage.remove(str(file))
    assert not exists(file)


def test_an_unusable_data_root_is_a_configuration_error() -> None:
    with pytest.raises(errors.ConfigurationError):
        DatasetStorage("nosuchprotocol://bucket/pingo")


async def test_fsspec_memory_filesystem() -> None:
    root = f"memory://pingo-{uuid.uuid4().hex}"
    storage = DatasetStorage(root)
    assert not storage.is_local
    final = storage.path_for(DS)
    assert final == f"{root}/ab/{DS}"
    staging = storage.staging_path(DS, "wf", 1, 1)
    fs = fsspec.filesystem("memory")
    fs.pipe({f"{staging}/part-0": b"hello", f"{staging}/part-1": b"!"})
    assert await storage.promote(staging, final) == 6
    assert await storage.exists(final) and not await storage.exists(staging)
    assert fs.cat(f"{final}/part-0") == b"hello"
    assert await storage.size(final) == 6
    await storage.remove(final)
    await storage.remove(final)
    assert not await storage.exists(final)
    assert await storage.size(final) == 0


# -------------------------------------------------------------- dataset service


async def computed_chain(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> list[protocol.ActionRecord]:
    """Plan and run the chain 1 → 2 → 3, writing real files; its actions, by id."""
    manager = planner.WorkflowManager(store, storage, settings)
    callbacks = OutcomeService(store, storage, settings)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    for aid, data in ((1, b"a"), (2, b"bb"), (3, b"ccc")):
        action = await start_attempt(store, record.id, aid)
        write_output(storage, action, data)
        await callbacks.success(action.callback_id, action.attempts)
    return await store.list_actions(record.id)


async def test_mark_for_deletion(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    _, a2, a3 = await computed_chain(store, storage, settings)
    service = DatasetService(store, storage)
    marked = await service.mark_for_deletion(a2.dataset_id)
    assert marked.state is D.STORED_TO_DELETE
    assert (await service.mark_for_deletion(a2.dataset_id)).state is D.STORED_TO_DELETE
    with pytest.raises(errors.Conflict):
        await service.mark_for_deletion(a3.dataset_id)  # a leaf: only with force
    assert (await service.mark_for_deletion(a3.dataset_id, force=True)).state is (
        D.STORED_TO_DELETE
    )
    with pytest.raises(errors.NotFound):
        await service.mark_for_deletion("f" * 64)


async def test_mark_for_deletion_refuses_a_dataset_being_computed(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    manager = planner.WorkflowManager(store, storage, settings)
    record = await manager.submit(workflow(CHAIN), owner="ann")
    action = (await store.list_actions(record.id))[0]
    with pytest.raises(errors.Conflict):
        await DatasetService(store, storage).mark_for_deletion(action.dataset_id)


async def test_lineage(store: protocol.Store, storage: DatasetStorage, settings: Settings) -> None:
    a1, a2, a3 = await computed_chain(store, storage, settings)
    lineage = await DatasetService(store, storage).lineage(a3.dataset_id)
    assert lineage.dataset_id == a3.dataset_id
    assert list(lineage.records) == [a3.dataset_id, a2.dataset_id, a1.dataset_id]
    assert lineage.edges == ((a2.dataset_id, a3.dataset_id), (a1.dataset_id, a2.dataset_id))
    root = lineage.records[a3.dataset_id]
    assert root is not None and root.state is D.LEAF and root.size_bytes == 3
    with pytest.raises(errors.NotFound):
        await DatasetService(store, storage).lineage("f" * 64)


async def test_storage_summary(
    store: protocol.Store, storage: DatasetStorage, settings: Settings
) -> None:
    a1, *_ = await computed_chain(store, storage, settings)
    service = DatasetService(store, storage, capacity_bytes=100)
    await walk_dataset(store, a1.dataset_id, [D.STORED_TO_DELETE])
    summary = await service.storage_summary()
    assert summary == {
        "usedBytes": 6,
        "bytesByState": {"STORED": 2, "LEAF": 3, "STORED_TO_DELETE": 1},
        "capacityBytes": 100,
    }


@pytest.mark.timeout(10)
def test_a_fifo_beside_an_output_never_holds_the_server(tmp_path: Path) -> None:
    """A red-team review planted FIFOs where the server opens `<output>.exit`: each held
    a server thread in `open` until someone read it, and five stopped dispatch."""
    staging = str(tmp_path / "out")
    for suffix in (dataset_storage.EXIT_STATUS_SUFFIX, dataset_storage.COMPLETED_SUFFIX):
        os.mkfifo(staging + suffix)
    assert dataset_storage.read_completion(staging) is None  # read as absent, not waited on
    fd = dataset_storage.open_own(staging + dataset_storage.EXIT_STATUS_SUFFIX)
    try:
        assert stat.S_ISREG(os.fstat(fd).st_mode)
        os.write(fd, b"{}\n")
    finally:
        os.close(fd)
    assert (tmp_path / ("out" + dataset_storage.EXIT_STATUS_SUFFIX)).read_bytes() == b"{}\n"


def _evidence_paths(tmp_path: Path) -> tuple[str, str]:
    """Two attempts' staging paths in a local data root whose staging directory keeps
    spares (the storage allows it on its first staging path)."""
    storage = DatasetStorage(str(tmp_path / "data"))
    return storage.staging_path(DS, "wf", 1, 1), storage.staging_path(DS, "wf", 2, 1)


def test_evidence_is_reused_from_spares_not_created_again(tmp_path: Path) -> None:
    """An attempt's evidence goes to the spares once its outcome is stored, and the next
    attempt's evidence is that same inode (no inode allocated: bench/README.md,
    fourteenth pass), emptied before it takes its name."""
    first, second = _evidence_paths(tmp_path)
    fd = dataset_storage.open_evidence(first + dataset_storage.EXIT_STATUS_SUFFIX)
    os.write(fd, b'{"exit-code": 0}\n')
    os.close(fd)
    inode = os.stat(first + dataset_storage.EXIT_STATUS_SUFFIX).st_ino
    assert dataset_storage.read_completion(first) == dataset_storage.Completion(None)

    dataset_storage.forget_completion(first)
    assert not os.path.lexists(first + dataset_storage.EXIT_STATUS_SUFFIX)
    spares = [
        name
        for name in os.listdir(os.path.dirname(first))
        if name.startswith(dataset_storage.SPARE_PREFIX)
    ]
    assert len(spares) == 1

    fd = dataset_storage.open_evidence(second + dataset_storage.EXIT_STATUS_SUFFIX)
    os.close(fd)
    reused = os.stat(second + dataset_storage.EXIT_STATUS_SUFFIX)
    assert (reused.st_ino, reused.st_size) == (inode, 0)
    # The first attempt's exit code does not stand for the second's.
    assert dataset_storage.read_completion(second) is None
    dataset_storage.record_completion(second, 1.5)
    assert dataset_storage.read_completion(second) == dataset_storage.Completion(1.5)


def test_a_spare_removed_behind_the_pools_back_is_replaced_by_a_new_file(tmp_path: Path) -> None:
    """The reaper's sweep removes spares left idle for a lease: the next evidence is
    created as before."""
    first, second = _evidence_paths(tmp_path)
    dataset_storage.record_completion(first, 1.0)
    dataset_storage.forget_completion(first)
    directory = os.path.dirname(first)
    for name in os.listdir(directory):
        if name.startswith(dataset_storage.SPARE_PREFIX):
            os.unlink(os.path.join(directory, name))
    dataset_storage.record_completion(second, 2.0)
    assert dataset_storage.read_completion(second) == dataset_storage.Completion(2.0)


def test_spares_are_kept_only_in_a_data_roots_staging_directory(tmp_path: Path) -> None:
    """Beside an unmanaged output the directory is the user's, even one named `.staging`:
    evidence there is removed, never kept."""
    users = tmp_path / "home" / dataset_storage.STAGING_DIR
    users.mkdir(parents=True)
    staging = str(users / "out")
    dataset_storage.record_completion(staging, 1.0)
    dataset_storage.forget_completion(staging)
    assert os.listdir(users) == []


def test_spares_are_bounded(tmp_path: Path) -> None:
    spares = dataset_storage.SpareFiles(limit=1)
    directory = tmp_path / dataset_storage.STAGING_DIR
    directory.mkdir()
    spares.allow(str(directory))
    first, second = directory / "a.exit", directory / "b.exit"
    first.write_text("")
    second.write_text("")
    assert spares.keep(str(directory / "gone.exit"))  # nothing there: nothing left
    assert spares.keep(str(first)) and not first.exists()
    assert not spares.keep(str(second)) and second.exists()
    taken = spares.take(str(directory))
    assert taken is not None and os.path.exists(taken)
    assert spares.take(str(directory)) is None
