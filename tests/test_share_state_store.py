"""Durable share-partition state (docs/share-groups.md, "Durable state")."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from rallypoint.share import state_store
from rallypoint.share.partition import RecordState, StateBatch
from rallypoint.share.state_store import FILE_NAME, SavedState, ShareStateStore

pytestmark = pytest.mark.unit

T = uuid.UUID(int=7)


def state(start: int, *runs: tuple[int, int, RecordState, int]) -> SavedState:
    return SavedState(start, tuple(StateBatch(*r) for r in runs))


def test_last_snapshot_wins_deletes_forget_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    async def write() -> None:
        s = ShareStateStore(tmp_path)
        assert s.load() == {}
        s.save_later(("g", T, 0), state(0, (0, 4, RecordState.AVAILABLE, 1)))
        await s.save(("g", T, 0), state(3, (3, 4, RecordState.ACKNOWLEDGED, 1)))
        await s.save(("g", T, 1), state(9))
        await s.save(("h", T, 0), state(1))
        await s.save(("h", T, 0), None)
        await s.close()

    asyncio.run(write())
    path = tmp_path / FILE_NAME
    good = path.read_bytes()
    path.write_bytes(good + b"\x00\x00\x01\x00garbage")  # a frame cut short by a crash
    s = ShareStateStore(tmp_path)
    loaded = s.load()
    assert loaded == {
        ("g", T, 0): state(3, (3, 4, RecordState.ACKNOWLEDGED, 1)),
        ("g", T, 1): state(9),
    }
    assert path.read_bytes() == good
    asyncio.run(s.close())


def test_a_corrupt_frame_ends_the_file(tmp_path: Path) -> None:
    async def write() -> None:
        s = ShareStateStore(tmp_path)
        s.load()
        await s.save(("g", T, 0), state(1))
        await s.save(("g", T, 1), state(2))
        await s.close()

    asyncio.run(write())
    path = tmp_path / FILE_NAME
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # flip a byte of the second frame's body: its CRC no longer matches
    path.write_bytes(bytes(data))
    s = ShareStateStore(tmp_path)
    assert s.load() == {("g", T, 0): state(1)}
    asyncio.run(s.close())


def test_a_mostly_dead_file_is_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_store, "REWRITE_MIN_BYTES", 2000)

    async def churn() -> int:
        s = ShareStateStore(tmp_path)
        s.load()
        for i in range(200):
            await s.save(("g", T, 0), state(i, (i, i + 3, RecordState.AVAILABLE, 1)))
        size = s.size
        await s.close()
        return size

    size = asyncio.run(churn())
    assert size < 2000 * 2  # rewritten along the way, not 200 frames
    s = ShareStateStore(tmp_path)
    assert s.load() == {("g", T, 0): state(199, (199, 202, RecordState.AVAILABLE, 1))}
    asyncio.run(s.close())
