"""The transaction coordinator's runtime: asyncio around the sans-IO :mod:`.machine`.

It parks requests until the machine answers them, saves the state file
(``<data.dir>/transactions.json``, written to a temporary file, fsynced and renamed over the old
one; docs/transactions.md, "Durability") whenever the machine asks, writes markers (data
partitions through the topic store, ``__consumer_offsets`` partitions through the group
coordinator) and runs the timers: timed-out transactions every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, expired transactional ids every
``transaction.remove.expired.transaction.cleanup.interval.ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, Final

from rallypoint.protocol.errors import ErrorCode

from ..clock import Clock
from ..logger import get as get_logger
from ..topics.log_validator import BatchError
from ..topics.store import OFFSETS_TOPIC, TopicStore
from .machine import Effect, Note, Persist, Respond, TopicPartition, TxnConfig, TxnMachine, WriteMarkers

log = get_logger("rallypoint.transactions")

STATE_FILE: Final = "transactions.json"
MARKER_RETRY_S: Final = 0.1
INLINE_SAVE_IDS: Final = 1000  # a state of more ids is encoded in a worker thread

OffsetsMarker = Callable[[int, int, int, bool], Awaitable[ErrorCode]]


class TransactionsRuntime:
    def __init__(
        self,
        config: TxnConfig,
        clock: Clock,
        topics: TopicStore,
        *,
        data_dir: Path | None = None,
        abort_interval_ms: int = 10000,
        remove_interval_ms: int = 3600000,
        fsync: bool = True,
    ) -> None:
        self.clock = clock
        self.topics = topics
        self.machine = TxnMachine(config, topics.next_producer_id)
        self.data_dir = data_dir
        self.abort_interval_ms = abort_interval_ms
        self.remove_interval_ms = remove_interval_ms
        self.fsync = fsync  # rallypoint.offsets.flush=always (the default): fsync every save
        # Wired by the broker: writes a marker to __consumer_offsets-<partition> (group coordinator)
        self.offsets_marker: OffsetsMarker | None = None
        self._tokens = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._answers: dict[int, Any] = {}
        self._calling: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.Task[None] | None = None
        self._saving = False
        self._save_waiting: list[int] = []
        self._loaded: dict[str, dict[str, object]] = {}
        if data_dir is not None:
            path = data_dir / STATE_FILE
            if path.exists():
                with open(path, encoding="utf-8") as f:
                    self._loaded = json.load(f)

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        self._apply(self.machine.load(self._loaded, self.clock.now_ms()))
        if self._loaded:
            log.info("transactions loaded", transactional_ids=len(self._loaded))
        self._timer = asyncio.create_task(self._timers(), name="transaction-timers")

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for fut in self._futures.values():
            if not fut.done():
                fut.set_result(ErrorCode.COORDINATOR_NOT_AVAILABLE)

    async def _timers(self) -> None:
        loop = asyncio.get_running_loop()
        next_abort = loop.time() + self.abort_interval_ms / 1000
        next_remove = loop.time() + self.remove_interval_ms / 1000
        while True:
            await asyncio.sleep(max(0.001, min(next_abort, next_remove) - loop.time()))
            now = loop.time()
            if now >= next_abort:
                next_abort = now + self.abort_interval_ms / 1000
                self._apply(self.machine.abort_timed_out(self.clock.now_ms()))
            if now >= next_remove:
                next_remove = now + self.remove_interval_ms / 1000
                self._apply(self.machine.expire_ids(self.clock.now_ms()))

    def abort_timed_out_now(self) -> None:
        """Run the timeout sweep now (the control plane's clock advance, tests)."""
        self._apply(self.machine.abort_timed_out(self.clock.now_ms()))

    # ------------------------------------------------------------------ requests

    async def call(self, event: Callable[[int, int], list[Effect]]) -> Any:
        token = next(self._tokens)
        self._calling = token
        try:
            self._apply(event(token, self.clock.now_ms()))
        finally:
            self._calling = None
        if token in self._answers:
            return self._answers.pop(token)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        return await fut

    def _apply(self, effects: Iterable[Effect]) -> None:
        for e in effects:
            if isinstance(e, Respond):
                if e.token == self._calling:
                    self._answers[e.token] = e.result
                else:
                    fut = self._futures.pop(e.token, None)
                    if fut is not None and not fut.done():
                        fut.set_result(e.result)
            elif isinstance(e, Persist):
                self._save_waiting.append(e.write_id)
                if not self._saving:
                    self._spawn(self._save())
            elif isinstance(e, WriteMarkers):
                self._spawn(self._write_markers(e))
            elif isinstance(e, Note):
                log.info(e.event, **e.fields)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ persistence

    async def _save(self) -> None:
        """Group commit: every transition waiting when a write starts is covered by it."""
        self._saving = True
        try:
            while self._save_waiting:
                batch, self._save_waiting = self._save_waiting, []
                error: ErrorCode | None = None
                if self.data_dir is not None:
                    snapshot = self.machine.snapshot()
                    try:
                        if self.fsync or len(snapshot) > INLINE_SAVE_IDS:
                            await asyncio.get_running_loop().run_in_executor(None, self._write, snapshot)
                        else:  # small and no fsync to wait for: quicker than a thread hop
                            self._write(snapshot)
                    except OSError as e:
                        log.error("could not save transaction state", error=str(e))
                        error = ErrorCode.KAFKA_STORAGE_ERROR
                for write_id in batch:
                    self._apply(self.machine.persisted(write_id, error, self.clock.now_ms()))
        finally:
            self._saving = False

    def _write(self, snapshot: dict[str, dict[str, object]]) -> None:
        assert self.data_dir is not None
        path = self.data_dir / STATE_FILE
        tmp = path.with_name(STATE_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(snapshot, f, separators=(",", ":"))
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)

    # ------------------------------------------------------------------ markers

    async def _write_markers(self, m: WriteMarkers) -> None:
        """One marker per partition, retried until written (Kafka's marker channel retries too);
        a partition that no longer exists is skipped."""
        remaining: set[TopicPartition] = set(m.partitions)
        while remaining:
            for tp in sorted(remaining):
                if await self._write_marker(tp, m):
                    remaining.discard(tp)
            if remaining:
                await asyncio.sleep(MARKER_RETRY_S)
        log.info(
            "transaction markers written",
            transactional_id=m.transactional_id,
            producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
            result="COMMIT" if m.commit else "ABORT",
            partitions=len(m.partitions),
        )
        self._apply(self.machine.markers_written(m.transactional_id, self.clock.now_ms()))

    async def _write_marker(self, tp: TopicPartition, m: WriteMarkers) -> bool:
        topic, partition = tp
        if topic == OFFSETS_TOPIC:
            if self.offsets_marker is None:
                return True
            err = await self.offsets_marker(partition, m.producer_id, m.producer_epoch, m.commit)
            if err != ErrorCode.NONE:
                log.warning("transaction marker not written", topic=topic, partition=partition, error=err.name)
            return err == ErrorCode.NONE
        plog = self.topics.partition(topic, partition)
        if plog is None or plog.deleted:
            return True
        try:
            plog.write_marker(m.producer_id, m.producer_epoch, m.commit, self.clock.now_ms())
        except BatchError as e:
            log.warning("transaction marker refused", topic=topic, partition=partition, error=e.code.name)
            return e.code != ErrorCode.KAFKA_STORAGE_ERROR
        return True
