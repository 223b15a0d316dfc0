"""Build the broker and wire its parts together: each part gets what it needs, explicitly.

    topics       TopicStore      data plane: topics, partitions, producer ids (data.dir/topics.json)
    groups       GroupsRuntime   classic group coordinator; writes its records to offsets_log
    offsets_log  OffsetsLog      __consumer_offsets segments; at start it replays them into groups

Start order is registration order (topics, groups, offsets_log: the log's start() loads the
groups it replays into the already started runtime); stop order is the reverse.
"""

from __future__ import annotations

from functools import partial

from rallypoint.protocol.share_group_records import is_share_record_type

from .broker import Broker, data_dir
from .clock import Clock, SystemClock
from .config import Config
from .groups.consumer_runtime import ConsumerGroupsRuntime
from .groups.runtime import GroupsRuntime
from .share.runtime import ShareGroupsRuntime, ShareSettings
from .storage import OffsetsLog
from .topics import TopicStore
from .topics import configs as topic_configs
from .transactions.machine import TxnConfig
from .transactions.runtime import TransactionsRuntime


def build_topics(cfg: Config, clock: Clock | None = None) -> TopicStore:
    return TopicStore(
        default_partitions=cfg["num.partitions"],
        auto_create=cfg["auto.create.topics.enable"],
        data_dir=data_dir(cfg),
        retention_bytes=cfg["log.retention.bytes"],
        max_message_bytes=cfg["message.max.bytes"],
        max_partitions=cfg["rallypoint.max.broker.partitions"],
        log_defaults={key: cfg[key] for key in topic_configs.BROKER_DEFAULTS.values()},
        clock=clock,
        cleaner_backoff_ms=cfg["log.cleaner.backoff.ms"],
        retention_check_interval_ms=cfg["log.retention.check.interval.ms"],
        max_uncompressed=cfg["rallypoint.max.uncompressed.batch.bytes"],
        log_storage=cfg["rallypoint.log.storage"],
    )


def _load_modern_groups(
    consumer: ConsumerGroupsRuntime,
    share: ShareGroupsRuntime,
    partition: int,
    records: list[tuple[bytes, bytes | None]],
) -> None:
    """Hand a ``__consumer_offsets`` partition's consumer-group and share-group records, each in
    log order, to their coordinators."""
    mine: list[tuple[bytes, bytes | None]] = []
    shared: list[tuple[bytes, bytes | None]] = []
    for r in records:
        (shared if is_share_record_type(int.from_bytes(r[0][:2], "big", signed=True)) else mine).append(r)
    consumer.load_raw(partition, mine)
    share.load_raw(partition, shared)


def build_broker(cfg: Config, clock: Clock | None = None) -> Broker:
    clock = clock or SystemClock()
    topics = build_topics(cfg, clock)
    groups = GroupsRuntime.from_config(cfg, clock)
    offsets_log = OffsetsLog.from_config(cfg, data_dir(cfg), clock, loader=groups.load)
    groups.offsets_log = offsets_log
    # KIP-848 consumer groups: their own coordinator on the same offsets log
    consumer_groups = ConsumerGroupsRuntime.from_config(cfg, clock, topics)
    consumer_groups.offsets_log = offsets_log
    consumer_groups.machine.classic_members = lambda gid: (
        len(g.members) if (g := groups.machine.groups.get(gid)) is not None else None
    )
    # online upgrade of a live classic group (docs/consumer-groups.md, "Classic groups")
    consumer_groups.machine.classic_snapshot = groups.upgrade_snapshot
    consumer_groups.convert_classic = groups.convert_to_consumer
    consumer_groups.downgrade_classic = groups.install_downgraded
    offsets_log.pending_loader = groups.load_pending  # transactional offsets awaiting a marker
    transactions = TransactionsRuntime(
        TxnConfig(
            max_timeout_ms=cfg["transaction.max.timeout.ms"],
            id_expiration_ms=cfg["transactional.id.expiration.ms"],
            num_partitions=cfg["transaction.state.log.num.partitions"],
            max_ids=cfg["rallypoint.max.transactional.ids"],
        ),
        clock,
        topics,
        data_dir=data_dir(cfg),
        abort_interval_ms=cfg["transaction.abort.timed.out.transaction.cleanup.interval.ms"],
        remove_interval_ms=cfg["transaction.remove.expired.transaction.cleanup.interval.ms"],
        fsync=cfg["rallypoint.offsets.flush"] == "always",
    )
    transactions.offsets_marker = groups.complete_transaction
    # share groups (KIP-932): a group id is one kind of group only
    share_groups = ShareGroupsRuntime(
        ShareSettings.from_config(cfg.get),
        clock,
        topics,
        lambda g, name: broker.group_configs.get(g, name),  # per-group share.* configs
        data_dir=data_dir(cfg),
        fsync=cfg["rallypoint.offsets.flush"] == "always",
        other_group=lambda gid: gid in groups.machine.groups or consumer_groups.is_consumer_group(gid),
        offsets_log=offsets_log,
        partition_for=groups.partition_for,
    )
    offsets_log.consumer_loader = partial(_load_modern_groups, consumer_groups, share_groups)
    broker = Broker(
        cfg,
        clock=clock,
        topics=topics,
        groups=groups,
        consumer_groups=consumer_groups,
        offsets_log=offsets_log,
        transactions=transactions,
        share_groups=share_groups,
    )
    consumer_groups.machine.group_setting = broker.group_configs.get  # per-group session/heartbeat settings
    share_groups.cluster = broker.cluster
    broker.add_component(broker.topics)
    broker.add_component(groups)
    broker.add_component(consumer_groups)
    broker.add_component(offsets_log)  # after the groups runtime: its start() loads into it
    broker.add_component(transactions)  # after the offsets log: its markers may go there
    broker.add_component(share_groups)
    return broker
