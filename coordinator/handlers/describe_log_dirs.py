"""DescribeLogDirs (35), v1-4 (docs/configs.md, "Cluster and topic descriptions").

One log directory: the broker's data directory.  Its topics (all of them when the request names
none; unknown topics and partitions are left out, as Kafka leaves out what the directory does
not hold) with each partition's size — the bytes of its batches held in memory — offset lag 0
and no future replica; from v4 the file system's total and usable bytes of the data directory.
"""

from __future__ import annotations

import os
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 35


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    wanted: dict[str, list[int] | None]
    if request.topics is None:
        wanted = {t.name: None for t in store.all()}
    else:
        wanted = {}
        for t in request.topics:
            wanted.setdefault(t.topic, []).extend(int(p) for p in t.partitions)  # type: ignore[union-attr]
    topics = []
    for name in sorted(wanted):
        topic = store.get(name)
        if topic is None:
            continue
        indexes = wanted[name]
        chosen = range(topic.num_partitions) if indexes is None else sorted(set(indexes))
        partitions = []
        for i in chosen:
            log = topic.partition(i)
            if log is not None:
                partitions.append(
                    {"partition_index": i, "partition_size": log.size_bytes, "offset_lag": 0, "is_future_key": False}
                )
        if partitions:
            topics.append({"name": name, "partitions": partitions})
    total = usable = -1
    try:
        st = os.statvfs(ctx.broker.data_dir)
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        pass
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "results": [
            {
                "error_code": ErrorCode.NONE,
                "log_dir": str(ctx.broker.data_dir.resolve()),
                "topics": topics,
                "total_bytes": total,
                "usable_bytes": usable,
            }
        ],
    }
