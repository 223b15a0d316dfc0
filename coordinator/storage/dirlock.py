"""The exclusive lock a process holds on a data directory while it runs (Kafka locks its log
dirs the same way): two brokers writing one directory's files would corrupt them."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def lock_exclusive(path: Path) -> int | None:
    """Open (creating) ``path`` and take an exclusive ``flock`` on it without waiting: the
    descriptor (closing it releases the lock), or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
