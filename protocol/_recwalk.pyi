# Types of the compiled record walk (protocol/_recwalk.pyx), for mypy.

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
