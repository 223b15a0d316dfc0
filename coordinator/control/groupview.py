"""Groups as the control plane shows them (``GET /v1/groups[/{group}]``), their events, and waits.

The group state is read only through the group runtime's public API (``describe``,
``list_groups``, ``fetch_offsets``) and its listener (transitions and notes).  What those do not
carry is learnt on the way:

* ``generation`` and ``leader`` from each transition and each successful JoinGroup answer;
* a member's ``session_timeout_ms`` / ``rebalance_timeout_ms`` from its successful JoinGroup
  (request and answer, seen by the request hook).

So after a restart these are null until the group's next rebalance (docs/control.md, "Groups").

Consumer (KIP-848) and share (KIP-932) groups are read from their own runtimes, which know their
epochs and members; a share group also shows each share partition's in-flight record counts.
Share-group membership changes arrive through the share runtime's listener and become the same
``member`` and ``group`` events (docs/control.md, "Share groups").
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from rallypoint.protocol.consumer_protocol import ConsumerProtocolError, decode_assignment
from rallypoint.protocol.errors import ErrorCode

from ..groups.events import Note, OffsetFetchGroupRequest, OffsetFetchRequest, Transition
from .events import EventHub

if TYPE_CHECKING:
    from ..broker import Broker
    from ..share.membership import Change
    from ..share.runtime import ShareGroupsRuntime

TRANSITIONS_KEPT: Final = 50  # per group
GROUPS_TRACKED: Final = 10000  # groups whose transitions are remembered (least recent dropped)
RECHECK_S: Final = 0.5  # a wait re-reads the group at least this often

# One remembered transition: (time_ms, from, to, reason, generation).  Kept as a tuple, made a
# JSON object only when a view is read: a broker with many groups remembers some of each.
_Transition = tuple[int, str, str, str, int]


def _transitions_json(ring: list[_Transition] | None) -> list[dict[str, Any]]:
    return [
        {"time_ms": t, "from": frm, "to": to, "reason": reason, "generation": gen}
        for t, frm, to, reason, gen in ring or ()
    ]


GROUP_STATES: Final = {
    s.lower(): s
    for s in (
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
        "Assigning",  # consumer (KIP-848) groups
        "Reconciling",
    )
}


class Unavailable(Exception):
    """The coordinator cannot answer about the group now (loading, shutting down)."""


def _note_kind(event: str) -> str | None:
    """A runtime note's name → the ``member`` event kind it is, if any.  Names are compared
    without case or separators so a rename from "member added" to ``member_added`` keeps working."""
    words = event.lower().replace("_", " ").replace(".", " ").replace("-", " ").split()
    if "member" not in words:
        return None
    if "added" in words or "joined" in words:
        return "joined"
    if "left" in words:
        return "left"
    if "replaced" in words or "fenced" in words:
        return "fenced"
    if "expired" in words or "removed" in words:
        return "expired"
    return None


class GroupTracker:
    def __init__(self, broker: Broker, events: EventHub) -> None:
        self.broker = broker
        self.events = events
        self._transitions: OrderedDict[str, list[_Transition]] = OrderedDict()
        self._generation: dict[str, int] = {}
        self._leader: dict[str, str | None] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def now_ms(self) -> int:
        return self.broker.clock.now_ms()

    # ------------------------------------------------------------------ what we learn

    def on_group_event(self, e: Transition | Note) -> None:
        """The runtime's listener (transitions and notes, as they happen)."""
        if isinstance(e, Transition):
            self._on_transition(e)
        else:
            self._on_note(e)

    def _on_transition(self, e: Transition) -> None:
        now = self.now_ms()
        gid = e.group_id
        ring = self._transitions.get(gid)
        if ring is None:
            ring = self._transitions[gid] = []  # a list: a deque's first block is 500+ bytes a group
            while len(self._transitions) > GROUPS_TRACKED:
                old, _ = self._transitions.popitem(last=False)
                self._forget(old)
        else:
            self._transitions.move_to_end(gid)
        ring.append((now, e.from_state, e.to_state, e.reason, e.generation))
        if len(ring) > TRANSITIONS_KEPT:
            del ring[0]
        self._generation[gid] = e.generation
        self._leader[gid] = e.leader
        self.events.publish(
            "group",
            {
                "group_id": gid,
                "time_ms": now,
                "from": e.from_state,
                "to": e.to_state,
                "reason": e.reason,
                "generation": e.generation,
                "leader": e.leader,
                "members": e.members,
            },
        )
        self._wake(gid)

    def _on_note(self, e: Note) -> None:
        f = e.fields
        gid = f.get("group")
        if not isinstance(gid, str):
            return
        words = e.event.lower().replace("_", " ").replace(".", " ")
        if "loaded" in words and isinstance(f.get("generation"), int):
            self._generation[gid] = int(f["generation"])  # type: ignore[call-overload]
            state = f.get("state")
            if e.event == "group loaded" and isinstance(state, str) and gid in self._transitions:
                # a group this view saw unloaded comes back (its coordinator moved here): shown
                # as a transition out of Dead, the state the unload left it in (a group loaded
                # at start-up is not: its history starts empty)
                members = f.get("members")
                self._on_transition(
                    Transition(
                        group_id=gid,
                        partition=int(f.get("partition", -1)),  # type: ignore[call-overload]
                        from_state="Dead",
                        to_state=state,
                        generation=int(f["generation"]),  # type: ignore[call-overload]
                        leader=self._leader.get(gid),
                        members=members if isinstance(members, int) else 0,
                        reason="loaded",
                    )
                )
        kind = _note_kind(e.event)
        if kind is not None:
            now = self.now_ms()
            if kind == "fenced":
                old, new = f.get("old"), f.get("new")
                self._publish_member(gid, str(old), "fenced", now, f)
                if isinstance(old, str) and isinstance(new, str):
                    self._publish_member(gid, new, "joined", now, f)
            else:
                member = f.get("member")
                if isinstance(member, str):
                    self._publish_member(gid, member, kind, now, f)
        self._wake(gid)

    def on_share_change(self, c: Change) -> None:
        """The share runtime's listener: a member joined, left or expired.  It becomes a
        ``member`` event, and a ``group`` transition when the group goes between Empty and
        Stable (a share group has no other states)."""
        share: ShareGroupsRuntime | None = getattr(self.broker, "share_groups", None)
        group = share.machine.groups.get(c.group_id) if share is not None else None
        member = group.members.get(c.member_id) if group is not None else None
        fields: dict[str, object] = {"group": c.group_id, "member": c.member_id, "reason": None}
        if member is not None:
            fields["client"] = member.client_id
        self._on_note(Note(c.event, fields))
        kind = _note_kind(c.event)
        if (kind == "joined" and c.members == 1) or (kind in ("left", "expired") and c.members == 0):
            joined = kind == "joined"
            self._on_transition(
                Transition(
                    group_id=c.group_id,
                    partition=-1,  # share-group membership is not kept in a log partition
                    from_state="Empty" if joined else "Stable",
                    to_state="Stable" if joined else "Empty",
                    generation=group.epoch if group is not None else c.epoch,
                    leader=None,
                    members=c.members,
                    reason=f"member {c.member_id} {kind}",
                )
            )

    def _publish_member(self, gid: str, member: str, kind: str, now: int, f: dict[str, object]) -> None:
        data: dict[str, Any] = {"group_id": gid, "member_id": member, "kind": kind, "time_ms": now}
        for src, dst in (("reason", "reason"), ("client", "client_id"), ("instance", "instance_id")):
            value = f.get(src)
            if value is None or isinstance(value, str | int | float | bool):
                data[dst] = value
        self.events.publish("member", data)

    def on_join_answer(self, request: Any, response: Any) -> None:
        """A JoinGroup answered: remember the generation and leader (a member's timeouts are
        read from the coordinator's own member when the group is viewed)."""
        get = response.get if isinstance(response, dict) else lambda k, d=None: getattr(response, k, d)
        if int(get("error_code", 0) or 0) != 0:
            return
        member = get("member_id", "")
        gid = getattr(request, "group_id", None)
        if not member or not isinstance(gid, str):
            return
        generation = get("generation_id", None)
        if isinstance(generation, int) and generation >= 0:
            self._generation[gid] = generation
        leader = get("leader", None)
        if isinstance(leader, str) and leader:
            self._leader[gid] = leader

    def _forget(self, gid: str) -> None:
        self._generation.pop(gid, None)
        self._leader.pop(gid, None)

    # ------------------------------------------------------------------ waiting

    def _wake(self, gid: str) -> None:
        for fut in self._waiters.pop(gid, ()):
            if not fut.done():
                fut.set_result(None)

    async def changed(self, gid: str, timeout_s: float) -> None:
        """Return when something happens to ``gid`` or after ``timeout_s``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(gid, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(gid)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[gid]

    async def wait(
        self, gid: str, check: Callable[[dict[str, Any] | None], bool], timeout_ms: int
    ) -> tuple[bool, dict[str, Any] | None]:
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            try:
                view = await self.view(gid)
            except Unavailable:
                view = None
            if check(view):
                return True, view
            left = deadline - time.monotonic()
            if left <= 0:
                return False, view
            await self.changed(gid, min(left, RECHECK_S))

    # ------------------------------------------------------------------ views

    async def list_ids(self) -> list[tuple[str, str]]:
        """(group id, group type) of every group the coordinator knows (a consumer group's id
        also names the offsets the classic coordinator keeps for it: listed once, as consumer)."""
        result = await self.broker.groups.list_groups((), ())
        if result.error != ErrorCode.NONE:
            raise Unavailable(ErrorCode(result.error).name)
        types = {g.group_id: g.group_type for g in result.groups}
        consumer = getattr(self.broker, "consumer_groups", None)
        if consumer is not None:
            types.update((g.group_id, g.group_type) for g in consumer.list_groups((), ()))
        share = getattr(self.broker, "share_groups", None)
        if share is not None:
            types.update((g.group_id, "share") for g in share.machine.all())
        return list(types.items())

    async def views(self) -> list[dict[str, Any]]:
        out = []
        for gid, gtype in sorted(await self.list_ids()):
            v = await self.view(gid, gtype)
            if v is not None:
                out.append(v)
        return out

    async def view(self, gid: str, group_type: str | None = None) -> dict[str, Any] | None:
        """The group's JSON shape, or None when there is no such group (or it is Dead)."""
        consumer = getattr(self.broker, "consumer_groups", None)
        if consumer is not None and consumer.is_consumer_group(gid):
            return await self._consumer_view(gid)
        share = getattr(self.broker, "share_groups", None)
        if share is not None and share.machine.is_share_group(gid):
            return self._share_view(share, gid)
        runtime = self.broker.groups
        described = (await runtime.describe([gid], 6)).groups[0]
        if described.error == ErrorCode.GROUP_ID_NOT_FOUND or described.state == "Dead":
            return None
        if described.error != ErrorCode.NONE:
            raise Unavailable(ErrorCode(described.error).name)
        if group_type is None:
            group_type = dict(await self.list_ids()).get(gid, "classic")
        offsets = await self._offsets(gid)
        members = []
        group = runtime.machine.groups.get(gid)
        for m in described.members:
            member = group.members.get(m.member_id) if group is not None else None
            members.append(
                {
                    "member_id": m.member_id,
                    "instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "session_timeout_ms": member.session_timeout_ms if member is not None else None,
                    "rebalance_timeout_ms": member.rebalance_timeout_ms if member is not None else None,
                    "assignment": _assignment(described.protocol_type, m.assignment),
                }
            )
        view: dict[str, Any] = {"group_id": gid, "type": group_type, "state": described.state}
        if group_type == "classic":
            view["generation"] = self._generation.get(gid)
        else:
            view["epoch"] = self._generation.get(gid)
        view.update(
            {
                "protocol_type": described.protocol_type,
                "protocol": described.protocol_data or None,
                "leader": self._leader.get(gid) if members else None,
                "members": members,
                "offsets": offsets,
                "transitions": _transitions_json(self._transitions.get(gid)),
            }
        )
        return view

    async def _consumer_view(self, gid: str) -> dict[str, Any] | None:
        """A consumer (KIP-848) group: its epochs, and each member's epoch, type and partitions
        (current and target), from the consumer coordinator's describe (docs/control.md,
        "Consumer groups")."""
        [d] = self.broker.consumer_groups.describe([gid])
        if d.error != ErrorCode.NONE or d.state == "Dead":
            return None

        def parts(tps: Any) -> list[dict[str, Any]]:
            return sorted(
                ({"topic": tp.topic_name, "partitions": sorted(tp.partitions)} for tp in tps),
                key=lambda x: x["topic"],
            )

        members = [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_type": "classic" if m.member_type == 0 else "consumer",
                "member_epoch": m.member_epoch,
                "subscribed_topics": sorted(m.subscribed_topic_names),
                "subscribed_topic_regex": m.subscribed_topic_regex,
                "assignment": parts(m.assignment),
                "target_assignment": parts(m.target_assignment),
            }
            for m in d.members
        ]
        return {
            "group_id": gid,
            "type": "consumer",
            "state": d.state,
            "epoch": d.group_epoch,
            "assignment_epoch": d.assignment_epoch,
            "assignor": d.assignor_name or None,
            "protocol_type": "consumer",
            "protocol": None,
            "leader": None,
            "members": members,
            "offsets": await self._offsets(gid),
            "transitions": _transitions_json(self._transitions.get(gid)),
        }

    def _share_view(self, share: ShareGroupsRuntime, gid: str) -> dict[str, Any] | None:
        """A share (KIP-932) group: its epochs, members with their subscriptions and partitions,
        and every share partition of the group with its window and in-flight record counts
        (docs/control.md, "Share groups")."""
        g = share.machine.groups.get(gid)
        if g is None:
            return None
        topics = self.broker.topics

        def name(tid: uuid.UUID) -> str | None:
            t = topics.by_id(tid)
            return t.name if t is not None else None

        def parts(assignment: dict[uuid.UUID, frozenset[int]]) -> list[dict[str, Any]]:
            named = ({"topic": name(tid), "partitions": sorted(ps)} for tid, ps in assignment.items())
            return sorted(named, key=lambda x: x["topic"] or "")

        members = [
            {
                "member_id": m.member_id,
                "instance_id": None,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "rack_id": m.rack_id,
                "member_epoch": m.epoch,
                "subscribed_topics": sorted(m.subscribed),
                "assignment": parts(m.assignment),
            }
            for m in sorted(g.members.values(), key=lambda m: m.member_id)
        ]
        partitions = []
        for (_, tid, p), sp in share.describe_partitions(gid):
            topic = name(tid)
            plog = topics.partition(topic, p) if topic is not None else None
            partitions.append(
                {
                    "topic": topic,
                    "topic_id": str(tid),
                    "partition": p,
                    "start_offset": sp.start_offset,
                    "end_offset": sp.end_offset,
                    "log_end_offset": plog.high_watermark if plog is not None else None,
                    "in_flight": sp.counts(),
                }
            )
        partitions.sort(key=lambda x: (x["topic"] or "", x["topic_id"], x["partition"]))
        return {
            "group_id": gid,
            "type": "share",
            "state": g.state,
            "epoch": g.epoch,
            "assignment_epoch": g.assignment_epoch,
            "assignor": "simple",
            "protocol_type": "share",
            "protocol": None,
            "leader": None,
            "members": members,
            "offsets": [],
            "share_partitions": partitions,
            "transitions": _transitions_json(self._transitions.get(gid)),
        }

    async def _offsets(self, gid: str) -> list[dict[str, Any]]:
        """The group's committed offsets with each partition's end and the lag."""
        fetched = await self.broker.groups.fetch_offsets(OffsetFetchRequest((OffsetFetchGroupRequest(gid, None),)))
        offsets = []
        for g in fetched.groups:
            for t in g.topics:
                for p in t.partitions:
                    if p.error != ErrorCode.NONE or p.offset < 0:
                        continue
                    part = self.broker.topics.partition(t.name, p.partition)
                    leo = part.high_watermark if part is not None else None
                    offsets.append(
                        {
                            "topic": t.name,
                            "partition": p.partition,
                            "offset": p.offset,
                            "metadata": p.metadata,
                            "log_end_offset": leo,
                            "lag": max(0, leo - p.offset) if leo is not None else None,
                        }
                    )
        offsets.sort(key=lambda o: (o["topic"], o["partition"]))
        return offsets


def _assignment(protocol_type: str, data: bytes) -> list[dict[str, Any]]:
    """A member's partitions, from its consumer-protocol assignment (empty unless Stable)."""
    if protocol_type != "consumer" or not data:
        return []
    try:
        a = decode_assignment(data)
    except ConsumerProtocolError:
        return []
    return [{"topic": tp.topic, "partitions": sorted(tp.partitions)} for tp in a.partitions]
