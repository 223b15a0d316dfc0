# Types of the compiled record walk (protocol/_recwalk.pyx), for mypy.

import mmap
from collections.abc import Callable

def walk_times(
    data: bytes,
    pos: int,
    records: int,
    base_ts: int,
    log_append_time: bool,
    max_timestamp: int,
    best_ts: int,
    best_delta: int,
) -> tuple[int, int, int] | None: ...
def scan_offsets_batches(
    segment: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    expected: int,
    last: dict[bytes, tuple[int, bytes | None, bool]],
    others: list[tuple[bytes, bytes | None]],
    crc: Callable[[memoryview], int],
) -> tuple[int, int, int, int]: ...
def offset_commit_key_parts(raw: bytes) -> tuple[str, str, int, bool] | None: ...
def offset_commit_value_v3_parts(raw: bytes) -> tuple[int, str, int, int] | None: ...

class OffsetRows:
    rows: int
    first_offset: int
    def take(self) -> tuple[int, dict[str, bytes]]: ...
    def scan(
        self,
        segment: bytes | bytearray | memoryview | mmap.mmap,
        pos: int,
        expected: int,
        crc: Callable[[memoryview], int],
        rest: list[tuple[int, int, int, int, bytes, bytes | None]],
        max_rows: int,
    ) -> tuple[int, int, int, int]: ...

def build_plain_batch(
    base_offset: int,
    entries: list[tuple[bytes | None, bytes | None]],
    timestamp: int,
    leader_epoch: int,
    crc: Callable[[memoryview], int],
) -> bytes | None: ...
