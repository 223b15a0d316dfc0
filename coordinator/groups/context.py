"""The plumbing every part of the group coordinator shares: the clock reading of the current
event, the effects it produces, armed timers, writes in flight and the one place a group's
state changes.

Each event (a request, a timer, a write's answer) runs as ``begin(now)`` ... ``end()``; the
managers (``registry.py``, ``classic.py``, ``offsets.py``) call the helpers below, which record
effects (``events.py``) for the runtime.  Kafka's counterpart is the coordinator runtime
(``CoordinatorRuntime.java``) with its timer and snapshot registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from .events import ArmTimer, CancelTimer, Effect, Note, Persist, Respond, TimerKey, Transition
from .model import ClassicGroup, GroupConfig, GroupState
from .persist import Record, response_error
from .timeline import Timeline

Done = Callable[[ErrorCode | None], None]


class Context:
    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.timeline = Timeline()
        self.now = 0
        self.active = False  # the coordinator is started and not shutting down
        self.loading: set[int] = set()  # __consumer_offsets partitions being loaded
        self.timers: dict[TimerKey, int] = {}  # armed deadlines; a timer firing for another is ignored
        self.touched: set[str] = set()  # groups whose state this event changed
        self.settled_hooks: list[Callable[[int], None]] = []  # run after each write is answered
        self._fx: list[Effect] = []
        self._continuations: dict[int, Done] = {}
        self._write_groups: dict[int, tuple[str, ...]] = {}
        self._write_ids = 0

    # ----------------------------------------------------------------------- events

    def begin(self, now_ms: int) -> None:
        self.now = now_ms
        self._fx = []
        self.touched = set()

    def end(self) -> list[Effect]:
        fx, self._fx = self._fx, []
        return fx

    def emit(self, effect: Effect) -> None:
        self._fx.append(effect)

    def answered(self, token: int) -> bool:
        """Whether this event already answered ``token``."""
        return any(isinstance(e, Respond) and e.token == token for e in self._fx)

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    # ---------------------------------------------------------------------- effects

    def respond(self, token: int, result: object) -> None:
        self._fx.append(Respond(token, result))

    def note(self, event: str, **fields: object) -> None:
        self._fx.append(Note(event, fields))

    def arm(self, key: TimerKey, delay_ms: int) -> None:
        self.arm_at(key, self.now + max(0, delay_ms))

    def arm_at(self, key: TimerKey, deadline: int) -> None:
        previous = self.timers.get(key)
        self.timers[key] = deadline
        self._fx.append(ArmTimer(key, deadline, previous))

    def arm_by(self, key: TimerKey, deadline: int) -> None:
        """Armed for ``deadline`` unless it is armed for earlier already (then nothing)."""
        previous = self.timers.get(key)
        if previous is None or deadline < previous:
            self.timers[key] = deadline
            self._fx.append(ArmTimer(key, deadline, previous))

    def cancel(self, key: TimerKey) -> None:
        if self.timers.pop(key, None) is not None:
            self._fx.append(CancelTimer(key))

    def transition(self, group: ClassicGroup, to: GroupState, reason: str) -> None:
        """The only place a group's state changes (the table in model.py)."""
        frm = group.transition_to(to, self.now)
        self.touched.add(group.group_id)
        self._fx.append(
            Transition(
                group.group_id,
                group.partition,
                frm.value,
                to.value,
                group.generation,
                group.leader_id,
                len(group.members),
                reason,
            )
        )

    # ----------------------------------------------------------------------- writes

    def append(
        self,
        partition: int,
        records: Sequence[Record],
        done: Done,
        *,
        groups: Sequence[str] = (),
        producer: tuple[int, int] | None = None,
        marker: bool | None = None,
    ) -> int:
        """Write ``records`` as one batch and call ``done(error)`` once the log answered.

        The records are replayed into the timeline now (docs/groups.md,
        "Records are applied when appended"), except a transactional batch (``producer``),
        whose offsets stay pending in the offsets manager until the transaction's marker;
        ``marker``: the batch is that COMMIT/ABORT control batch.  ``groups`` names the groups
        ``done`` may change (for "Internal errors").
        """
        self._write_ids += 1
        wid = self._write_ids
        self.timeline.append(wid, () if producer is not None else records)
        self._continuations[wid] = done
        self._write_groups[wid] = tuple(groups)
        self._fx.append(Persist(wid, partition, tuple(records), producer, marker))
        return wid

    def append_then_respond(
        self,
        partition: int,
        records: Sequence[Record],
        token: int,
        result: object,
        failed: Callable[[ErrorCode], object],
        *,
        after: Callable[[ErrorCode | None], None] | None = None,
        groups: Sequence[str] = (),
    ) -> int:
        """Acknowledge after the write: answer ``result``, or ``failed(code)`` with the code a
        client sees for the write's error (``persist.response_error``)."""

        def done(error: ErrorCode | None) -> None:
            if after is not None:
                after(error)
            self.respond(token, result if error is None else failed(response_error(error)))

        return self.append(partition, records, done, groups=groups)

    def append_logged(
        self,
        partition: int,
        records: Sequence[Record],
        what: str,
        *,
        after: Callable[[ErrorCode | None], None] | None = None,
        groups: Sequence[str] = (),
        **fields: object,
    ) -> int:
        """A write no request waits for: a failure is logged as ``failed to write <what>``."""

        def done(error: ErrorCode | None) -> None:
            if error is not None:
                self.note(f"failed to write {what}", partition=partition, error=error.name, **fields)
            if after is not None:
                after(error)

        return self.append(partition, records, done, groups=groups)

    def write_answered(self, write_id: int, error: ErrorCode | None) -> None:
        """The log answered write ``write_id``: settle the timeline, run its continuation."""
        self.timeline.settle(write_id, error is None)
        self.touched.update(self._write_groups.pop(write_id, ()))
        done = self._continuations.pop(write_id, None)
        if done is not None:
            done(error)
        for hook in self.settled_hooks:
            hook(write_id)

    @property
    def writes_appended(self) -> int:
        """How many writes were appended so far (an event compares it before and after)."""
        return self._write_ids

    def writes_in_flight(self) -> int:
        return len(self._continuations)

    def drop_event_writes(self) -> None:
        """Take back the writes the current event appended (it failed: like a Kafka operation
        that throws, it appends nothing); their records leave the timeline."""
        kept: list[Effect] = []
        for e in self._fx:
            if isinstance(e, Persist):
                self.timeline.settle(e.persist_id, False)
                self._continuations.pop(e.persist_id, None)
                self._write_groups.pop(e.persist_id, None)
            else:
                kept.append(e)
        self._fx = kept
