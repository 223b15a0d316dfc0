"""The one table of APIs and version ranges rallypoint serves.

Dispatch (``coordinator/server.py``) and the ApiVersions answer both read this table,
so we never advertise a version we cannot decode and handle.  A test keeps the README's
API table in sync with it.
"""

from __future__ import annotations

from typing import Final

from msgspec import Struct


class ApiRange(Struct, frozen=True):
    """One served API: its key, name and the versions rallypoint handles."""

    key: int
    name: str
    min_version: int
    max_version: int

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


# key -> served range.  Add a line here only together with a handler module.
SERVED_APIS: Final[dict[int, ApiRange]] = {
    a.key: a
    for a in (
        ApiRange(18, "ApiVersions", 0, 4),
        ApiRange(3, "Metadata", 0, 13),
        ApiRange(0, "Produce", 3, 13),
        ApiRange(1, "Fetch", 4, 18),
        ApiRange(2, "ListOffsets", 1, 11),
        ApiRange(19, "CreateTopics", 2, 7),
        ApiRange(20, "DeleteTopics", 1, 6),
        ApiRange(22, "InitProducerId", 0, 6),
        ApiRange(23, "OffsetForLeaderEpoch", 2, 4),
        ApiRange(37, "CreatePartitions", 0, 3),
        ApiRange(8, "OffsetCommit", 2, 10),
        ApiRange(9, "OffsetFetch", 1, 10),
        ApiRange(10, "FindCoordinator", 0, 6),
        ApiRange(11, "JoinGroup", 0, 9),
        ApiRange(12, "Heartbeat", 0, 4),
        ApiRange(13, "LeaveGroup", 0, 5),
        ApiRange(14, "SyncGroup", 0, 5),
        ApiRange(15, "DescribeGroups", 0, 6),
        ApiRange(16, "ListGroups", 0, 5),
        ApiRange(42, "DeleteGroups", 0, 2),
        ApiRange(47, "OffsetDelete", 0, 0),
        ApiRange(68, "ConsumerGroupHeartbeat", 0, 1),
        ApiRange(69, "ConsumerGroupDescribe", 0, 1),
        ApiRange(76, "ShareGroupHeartbeat", 1, 1),
        ApiRange(77, "ShareGroupDescribe", 1, 1),
        ApiRange(78, "ShareFetch", 1, 1),
        ApiRange(79, "ShareAcknowledge", 1, 1),
        ApiRange(17, "SaslHandshake", 0, 1),
        ApiRange(36, "SaslAuthenticate", 0, 2),
        ApiRange(50, "DescribeUserScramCredentials", 0, 0),
        ApiRange(51, "AlterUserScramCredentials", 0, 0),
        ApiRange(32, "DescribeConfigs", 1, 4),
        ApiRange(33, "AlterConfigs", 0, 2),
        ApiRange(44, "IncrementalAlterConfigs", 0, 1),
        ApiRange(21, "DeleteRecords", 0, 2),
        ApiRange(60, "DescribeCluster", 0, 2),
        ApiRange(75, "DescribeTopicPartitions", 0, 0),
        ApiRange(35, "DescribeLogDirs", 1, 4),
        ApiRange(43, "ElectLeaders", 0, 2),
        ApiRange(24, "AddPartitionsToTxn", 0, 5),
        ApiRange(25, "AddOffsetsToTxn", 0, 3),
        ApiRange(26, "EndTxn", 0, 4),
        ApiRange(28, "TxnOffsetCommit", 0, 4),
        ApiRange(61, "DescribeProducers", 0, 0),
        ApiRange(65, "DescribeTransactions", 0, 0),
        ApiRange(66, "ListTransactions", 0, 2),
    )
}

API_VERSIONS_KEY: Final = 18


def served(api_key: int) -> ApiRange | None:
    return SERVED_APIS.get(api_key)
