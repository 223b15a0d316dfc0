"""The ``__consumer_offsets`` log: segments, recovery, compaction, and the append component."""

from .offsets_log import OffsetsLog
from .segments import CorruptLogError

__all__ = ["CorruptLogError", "OffsetsLog"]
