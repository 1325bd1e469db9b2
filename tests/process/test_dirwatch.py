"""The folder watch every part of the daemon relies on (the plugin folder, device
folders, the config file): real inotify events on real folders."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from devplug.ground.dirwatch import ENTRY_EVENTS, DirWatcher, Mask

Seen = asyncio.Queue[tuple[Path, str]]


@asynccontextmanager
async def watching(mask: int = ENTRY_EVENTS) -> AsyncIterator[tuple[DirWatcher, Seen]]:
    seen: Seen = asyncio.Queue()
    watcher = DirWatcher(lambda folder, name: seen.put_nowait((folder, name)), mask)
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher, seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        watcher.close()


async def next_event(seen: Seen) -> tuple[Path, str]:
    return await asyncio.wait_for(seen.get(), 10)


async def test_entries_created_renamed_and_removed_are_told_by_name(tmp_path: Path) -> None:
    async with watching() as (watcher, seen):
        assert watcher.watch(tmp_path)
        (tmp_path / "a.sock").write_text("")
        assert await next_event(seen) == (tmp_path, "a.sock")
        (tmp_path / "a.sock").rename(tmp_path / "b.sock")
        assert await next_event(seen) == (tmp_path, "a.sock")
        assert await next_event(seen) == (tmp_path, "b.sock")
        (tmp_path / "b.sock").unlink()
        assert await next_event(seen) == (tmp_path, "b.sock")


async def test_a_folder_that_goes_away_is_told_with_no_name_and_can_be_watched_again(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "plugins"
    folder.mkdir()

    async with watching() as (watcher, seen):
        assert watcher.watch(folder)
        folder.rmdir()
        assert await next_event(seen) == (folder, "")
        assert folder not in watcher.folders
        folder.mkdir()
        assert watcher.watch(folder)
        (folder / "kubelet.sock").write_text("")
        while (event := await next_event(seen)) == (folder, ""):
            pass  # the old watch's IGNORED, after its DELETE_SELF
        assert event == (folder, "kubelet.sock")


async def test_only_watched_folders_and_asked_events_are_told(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()

    async with watching(ENTRY_EVENTS | Mask.CLOSE_WRITE) as (watcher, seen):
        watcher.set_folders({one, two})
        assert watcher.folders == {one, two}
        watcher.set_folders({two})
        assert watcher.folders == {two}
        (one / "quiet").write_text("")
        (two / "config.yaml").write_text("x")  # CREATE, then CLOSE_WRITE
        told = [await next_event(seen) for _ in range(2)]
        unwatched = [e for e in told if e[0] == one and e[1]]
        assert told[-1] == (two, "config.yaml"), told
        assert not unwatched


async def test_a_missing_folder_or_a_file_is_not_watched(tmp_path: Path) -> None:
    async with watching() as (watcher, _):
        assert not watcher.watch(tmp_path / "missing")
        (tmp_path / "file").write_text("")
        assert not watcher.watch(tmp_path / "file")
        assert watcher.folders == set()


def test_a_closed_watcher_holds_no_descriptor(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    watcher = DirWatcher(lambda folder, name: None)
    assert watcher.watch(tmp_path)
    watcher.close()
    watcher.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert not watcher.watch(tmp_path / "x")


async def test_a_watcher_closed_while_it_runs_leaves_the_loop_clean(tmp_path: Path) -> None:
    """The loop forgets the descriptor before it is closed: a descriptor of the same
    number made next can be read by the loop."""

    watcher = DirWatcher(lambda folder, name: None)
    assert watcher.watch(tmp_path)
    task = asyncio.create_task(watcher.run())
    await asyncio.sleep(0)  # run() registers its reader
    watcher.close()
    read, write = os.pipe()
    try:
        readable = asyncio.Event()
        asyncio.get_running_loop().add_reader(read, readable.set)
        os.write(write, b"x")
        await asyncio.wait_for(readable.wait(), 10)
        asyncio.get_running_loop().remove_reader(read)
    finally:
        os.close(read)
        os.close(write)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
