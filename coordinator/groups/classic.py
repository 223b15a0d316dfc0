"""Classic group membership: JoinGroup, SyncGroup, Heartbeat, LeaveGroup and their timers.

The classic-protocol half of Kafka's ``GroupMetadataManager.java`` (``classicGroupJoin`` ...
``completeClassicGroupJoin``), sans-IO: every method runs inside an event of ``context.py``
and acts through it.  The rules are described in docs/groups.md ("JoinGroup", "SyncGroup",
"Heartbeat and sessions", "LeaveGroup", "Timers", "Static membership"); where Kafka's Scala
and Java coordinators differ, this follows the Java one and says so.

Unlike offsets, classic membership changes are not replayed from records: as in Kafka (which
appends these records with ``replayRecords = false``) the group is changed directly and the
responses that depend on a record wait for it to be written.
"""

from __future__ import annotations

from collections.abc import Callable

from msgspec.structs import replace
from rallypoint.protocol.errors import ErrorCode

from . import checks, records
from .context import Context
from .events import (
    HeartbeatKey,
    HeartbeatRequest,
    HeartbeatResult,
    JoinKey,
    JoinRequest,
    JoinResult,
    LeaveMemberResult,
    LeaveRequest,
    LeaveResult,
    SessionsKey,
    SyncKey,
    SyncRequest,
    SyncResult,
)
from .model import COMPLETING, DEAD, EMPTY, PREPARING, STABLE, ClassicGroup, Member, discard
from .persist import response_error
from .registry import GroupRegistry

E = ErrorCode


def _inconsistent(requested: str | None, current: str | None) -> bool:
    """``isProtocolInconsistent``: both known and different."""
    return requested is not None and current is not None and requested != current


def _repeats_a_protocol(req: JoinRequest) -> bool:
    names = [p.name for p in req.protocols]
    return len(set(names)) != len(names)


class ClassicGroups:
    def __init__(self, ctx: Context, registry: GroupRegistry, new_uuid: Callable[[], str]) -> None:
        self.ctx = ctx
        self.registry = registry
        self._new_uuid = new_uuid

    # ------------------------------------------------------------ member bookkeeping

    def _complete_join(self, group: ClassicGroup, member: Member, result: JoinResult) -> bool:
        token = group.finish_join(member)
        if token is None:
            return False
        self.ctx.respond(token, result)
        return True

    def _complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.sync_token is None:
            return False
        self.ctx.respond(member.sync_token, result)
        member.sync_token = None
        return True

    def _remove_member(self, group: ClassicGroup, member_id: str) -> None:
        """Remove a member or pending member; a request it still has parked is answered
        UNKNOWN_MEMBER_ID (Kafka leaves a parked SyncGroup to time out on the client; we answer
        it so that nothing stays parked)."""
        member = group.members.get(member_id)
        if member is not None:
            self._complete_join(group, member, JoinResult(E.UNKNOWN_MEMBER_ID))
            self._complete_sync(member, SyncResult(E.UNKNOWN_MEMBER_ID))
        group.remove(member_id)
        self.ctx.cancel(HeartbeatKey(group.group_id, member_id))  # a pending member's
        if not group.members:
            self.ctx.cancel(SessionsKey(group.group_id))

    def _update_member(self, group: ClassicGroup, member: Member, req: JoinRequest, token: int) -> None:
        replaced = group.update_member(member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, token)
        if replaced is not None:
            # The same member joined again while its JoinGroup is parked (a client retrying on
            # a new connection).  Kafka silently replaces the callback and never answers the
            # old request; we answer it so that it does not stay parked forever.
            self.ctx.respond(replaced, JoinResult(E.REBALANCE_IN_PROGRESS, member_id=member.member_id))

    def _replace_static_member(self, group: ClassicGroup, instance_id: str, old_id: str, new_id: str) -> Member:
        """Fence the old id's parked requests, then hand its place to ``new_id``."""
        old = group.members[old_id]
        self._complete_join(
            group, old, JoinResult(E.FENCED_INSTANCE_ID, member_id=old_id, protocol_type=None, protocol_name=None)
        )
        self._complete_sync(old, SyncResult(E.FENCED_INSTANCE_ID))
        # The new member starts without a session deadline (the old one's is gone with it)
        # until the caller reschedules it.
        return group.replace_static_member(instance_id, old_id, new_id)

    def _generation_result(self, group: ClassicGroup, member_id: str, *, with_members: bool) -> JoinResult:
        return JoinResult(
            E.NONE,
            member_id=member_id,
            generation_id=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or "",
            members=group.current_members() if with_members else (),
        )

    # =================================================================== JoinGroup

    def join(self, token: int, req: JoinRequest) -> None:
        ctx = self.ctx
        err = checks.service(ctx, req.group_id)
        if err is not None:
            ctx.respond(token, JoinResult(err, member_id=req.member_id))
            return
        cfg = ctx.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            ctx.respond(token, JoinResult(E.INVALID_SESSION_TIMEOUT, member_id=req.member_id))
            return
        err = checks.partition(ctx, req.group_id)
        if err is not None:
            ctx.respond(token, JoinResult(err))
            return

        unknown_member = req.member_id == ""
        group = self.registry.get(req.group_id)
        is_new_group = group is None
        if group is None:
            if not unknown_member:
                # Java GMM: UNKNOWN_MEMBER_ID, although its comment says GROUP_ID_NOT_FOUND.
                ctx.respond(token, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=req.member_id))
                return
            group = self.registry.create(req.group_id)
        writes_before = ctx.writes_appended

        if not self._accept_joining_member(group, req.member_id):
            self._remove_member(group, req.member_id)
            ctx.respond(token, JoinResult(E.GROUP_MAX_SIZE_REACHED))
        elif unknown_member:
            self._join_new_member(token, req, group)
        else:
            self._join_existing_member(token, req, group)

        if is_new_group and ctx.writes_appended == writes_before:
            # The Java coordinator writes an empty GroupMetadata record when JoinGroup creates a
            # group, without waiting for it; if the write fails the creation is reverted and a
            # still-parked JoinGroup gets the error (classicGroupJoinToClassicGroup).
            created = group

            def written(error: ErrorCode | None) -> None:
                if error is not None:
                    self.registry.revert_creation(created, response_error(error), "its first record was not written")

            ctx.append_logged(
                group.partition,
                [records.empty_group_metadata(group)],
                "empty metadata for new group",
                after=written,
                groups=(group.group_id,),
                group=group.group_id,
            )

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        """group.max.size (``acceptJoiningMember``)."""
        if group.state in (EMPTY, DEAD):
            return True
        if group.state == PREPARING:
            m = group.members.get(member_id)
            return (m is not None and m.join_token is not None) or group.num_awaiting_join < self.ctx.config.max_size
        return member_id in group.members or len(group.members) < self.ctx.config.max_size

    def _protocols_refused(self, group: ClassicGroup, req: JoinRequest) -> bool:
        """INCONSISTENT_GROUP_PROTOCOL: the group supports none of the protocols, or the list
        names one twice (docs/groups.md, "Where rallypoint differs from Kafka")."""
        return _repeats_a_protocol(req) or not group.supports_protocols(
            req.protocol_type, (p.name for p in req.protocols)
        )

    def _join_new_member(self, token: int, req: JoinRequest, group: ClassicGroup) -> None:
        ctx = self.ctx
        if group.state == DEAD:
            ctx.respond(token, JoinResult(E.COORDINATOR_NOT_AVAILABLE))
            return
        if self._protocols_refused(group, req):
            ctx.respond(token, JoinResult(E.INCONSISTENT_GROUP_PROTOCOL))
            return
        # ClassicGroup.generateMemberId: "<instance id or client id>-<uuid>".
        new_id = f"{req.group_instance_id if req.group_instance_id is not None else req.client_id}-{self._new_uuid()}"
        if req.group_instance_id is not None:
            existing = group.static_members.get(req.group_instance_id)
            if existing is not None:
                self._update_static_member(token, req, group, existing, new_id)
            else:
                self._add_member_and_rebalance(token, req, group, new_id)
        elif req.api_version >= 4:
            # KIP-394: dynamic v4+ members must rejoin with the id we hand out; it stays
            # pending for the session timeout of this request.
            group.pending_members.add(new_id)
            ctx.arm(HeartbeatKey(group.group_id, new_id), req.session_timeout_ms)
            ctx.respond(token, JoinResult(E.MEMBER_ID_REQUIRED, member_id=new_id))
        else:
            self._add_member_and_rebalance(token, req, group, new_id)

    def _join_existing_member(self, token: int, req: JoinRequest, group: ClassicGroup) -> None:
        ctx = self.ctx
        mid = req.member_id
        if group.state == DEAD:
            ctx.respond(token, JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id=mid))
            return
        if self._protocols_refused(group, req):
            ctx.respond(token, JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=mid))
            return
        if mid in group.pending_members:
            if req.group_instance_id is not None:
                # A pending member is never static: Kafka throws IllegalStateException here and
                # answers UNKNOWN_SERVER_ERROR, leaving the group as it was.
                ctx.note("pending member joined with a group.instance.id", group=group.group_id, member=mid)
                ctx.respond(token, JoinResult(E.UNKNOWN_SERVER_ERROR))
                return
            self._add_member_and_rebalance(token, req, group, mid)
            return
        err = group.validate_member(mid, req.group_instance_id)
        if err is not None:
            ctx.respond(token, JoinResult(err, member_id=mid))
            return
        member = group.members[mid]
        if group.state == PREPARING:
            self._update_member_and_rebalance(token, req, group, member, "member rejoins during PreparingRebalance")
        elif group.state == COMPLETING:
            if member.matches(req.protocols):
                # Lost its JoinGroup response: answer with the current generation.
                ctx.respond(token, self._generation_result(group, mid, with_members=group.is_leader(mid)))
            else:
                self._update_member_and_rebalance(
                    token, req, group, member, "member rejoins with new metadata during CompletingRebalance"
                )
        elif group.state == STABLE:
            if group.is_leader(mid):
                # The leader's JoinGroup always rebalances (lets it react to topic changes).
                self._update_member_and_rebalance(token, req, group, member, "leader rejoins during Stable")
            elif not member.matches(req.protocols):
                self._update_member_and_rebalance(token, req, group, member, "member rejoins with new metadata")
            else:
                ctx.respond(token, self._generation_result(group, mid, with_members=False))
        else:  # Empty: a member of an old generation; make it reset and rejoin
            ctx.respond(token, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=mid))

    def _add_member_and_rebalance(self, token: int, req: JoinRequest, group: ClassicGroup, member_id: str) -> None:
        """``addMemberThenRebalanceOrCompleteJoin``."""
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            req.protocols,
            is_new=True,
        )
        # The initial delayed join is extended while new members arrive.  We use the Java
        # coordinator's rule `previousState == EMPTY`, not Scala's `generation == 0`, so every
        # rebalance that starts from Empty is extended.
        if group.state == PREPARING and group.previous_state == EMPTY:
            group.new_member_added = True
        group.add(member, token)
        self.ctx.note(
            "member added",
            group=group.group_id,
            member=member_id,
            instance=req.group_instance_id,
            client=req.client_id,
            reason=req.reason,
        )
        # New members cannot heartbeat while their JoinGroup is parked, so they get the
        # 5-minute new-member timeout instead of the session timeout (which replaces the
        # timeout of the id while it was pending).
        self.ctx.cancel(HeartbeatKey(group.group_id, member_id))
        self.registry.reschedule_heartbeat(group, member, self.ctx.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(group, f"adding new member {member_id}")

    def _update_member_and_rebalance(
        self, token: int, req: JoinRequest, group: ClassicGroup, member: Member, reason: str
    ) -> None:
        self._update_member(group, member, req, token)
        self._maybe_prepare_rebalance_or_complete_join(group, f"{reason} ({member.member_id})")

    def _update_static_member(
        self, token: int, req: JoinRequest, group: ClassicGroup, old_id: str, new_id: str
    ) -> None:
        """A known group.instance.id rejoins with an empty member id
        (``updateStaticMemberThenRebalanceOrCompleteJoin``; docs/groups.md, "Static membership")."""
        ctx = self.ctx
        instance_id = req.group_instance_id
        assert instance_id is not None
        old_leader = group.leader_id
        member = self._replace_static_member(group, instance_id, old_id, new_id)
        self.registry.reschedule_heartbeat(group, member)
        old_protocols = member.protocols
        old_rebalance, old_session = member.rebalance_timeout_ms, member.session_timeout_ms
        self._update_member(group, member, req, token)
        ctx.note("static member replaced", group=group.group_id, instance=instance_id, old=old_id, new=new_id)

        if group.state == STABLE:
            if (group.protocol_name or "") == group.select_protocol():
                # The selected protocol does not change: no rebalance.  Persist the group with
                # the new member id, then answer (KIP-345; KIP-814 for v9).
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                version = req.api_version

                generation = group.generation

                def done(error: ErrorCode | None) -> None:
                    if self.registry.get(group.group_id) is not group or group.members.get(new_id) is not member:
                        return  # unloaded or removed meanwhile: its parked join was answered then
                    if error is not None and (member.join_token != token or group.generation != generation):
                        # A rebalance completed meanwhile and handed out the new id in a newer
                        # generation: the join is answered already (Kafka's responseFuture.complete
                        # is then a no-op) and reverting the id would give that generation two
                        # leaders.  The id stays; the generation's own record persists it
                        # (docs/groups.md, "Static membership").
                        ctx.note(
                            "static member replacement kept after a failed write",
                            group=group.group_id,
                            member=new_id,
                            error=error.name,
                        )
                        return
                    if error is not None:
                        # Revert to the old member id, protocols and timeouts.
                        group.update_member(member, old_protocols, old_rebalance, old_session, None)
                        old = self._replace_static_member(group, instance_id, new_id, old_id)
                        self.registry.reschedule_heartbeat(group, old)
                        ctx.respond(
                            token,
                            JoinResult(
                                response_error(error),
                                member_id="",
                                generation_id=group.generation,
                                protocol_type=group.protocol_type,
                                protocol_name=group.protocol_name,
                                leader=old_leader or "",
                            ),
                        )
                        return
                    if version >= 9:
                        is_leader = group.is_leader(new_id)
                        result = replace(
                            self._generation_result(group, new_id, with_members=is_leader), skip_assignment=is_leader
                        )
                    else:
                        # Before v9 the response names the OLD leader id, so that a rejoining
                        # leader does not think it must compute an assignment.
                        result = JoinResult(
                            E.NONE,
                            member_id=new_id,
                            generation_id=group.generation,
                            protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name,
                            leader=old_leader or "",
                        )
                    self._complete_join(group, member, result)

                ctx.append(group.partition, [records.group_metadata(group, assignment)], done, groups=(group.group_id,))
            else:
                self._maybe_prepare_rebalance_or_complete_join(
                    group, f"static member {new_id} rejoined with a change of the selected protocol"
                )
        elif group.state == COMPLETING:
            # The leader may already hold the old member id: force a new rebalance.
            self.prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        else:  # PreparingRebalance: the join completes normally
            self._maybe_complete_join_phase(group)

    # ------------------------------------------------------- rebalance orchestration

    def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup, reason: str) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join_phase(group)

    def prepare_rebalance(self, group: ClassicGroup, reason: str) -> None:
        """``prepareRebalance`` (docs/groups.md, "JoinGroup")."""
        if group.state == COMPLETING:
            # Parked SyncGroups are told to rejoin.
            self._reset_and_propagate_assignment_with_error(group, E.REBALANCE_IN_PROGRESS)
        self._remove_sync_expiration(group)
        initial = group.state == EMPTY
        if initial:
            # The initial delayed join: a first window of D, then more windows of D while new
            # members keep arriving, capped by remaining = rebalance timeout - D.
            delay = self.ctx.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.initial_join = (delay, remaining)
            self.ctx.arm(JoinKey(group.group_id), delay)
        self.ctx.transition(group, PREPARING, reason)
        if not initial:
            self._maybe_complete_join_else_schedule(group)

    def _maybe_complete_join_else_schedule(self, group: ClassicGroup) -> None:
        if group.has_all_members_joined():
            self._complete_join_phase(group)
        else:
            group.initial_join = None
            self.ctx.arm(JoinKey(group.group_id), group.rebalance_timeout_ms())

    def _maybe_complete_join_phase(self, group: ClassicGroup) -> None:
        if group.state != PREPARING:
            return
        if group.previous_state == EMPTY:
            # The initial rebalance is never completed early (Java: `previousState == EMPTY`;
            # Scala: InitialDelayedJoin.tryComplete is always false).
            return
        if not group.has_all_members_joined():
            return
        self._complete_join_phase(group)

    def _join_timer_fired(self, group: ClassicGroup) -> None:
        if group.initial_join is not None:
            # tryCompleteInitialRebalanceElseSchedule.
            delay, remaining = group.initial_join
            if group.new_member_added and remaining != 0:
                group.new_member_added = False
                new_delay = min(self.ctx.config.initial_rebalance_delay_ms, remaining)
                # Kafka subtracts the *previous* delay from remaining.
                new_remaining = max(remaining - delay, 0)
                group.initial_join = (new_delay, new_remaining)
                self.ctx.arm(JoinKey(group.group_id), new_delay)
                return
        self._complete_join_phase(group)

    def _complete_join_phase(self, group: ClassicGroup) -> None:
        """``completeClassicGroupJoin`` (docs/groups.md, "JoinGroup": join completion)."""
        ctx = self.ctx
        ctx.cancel(JoinKey(group.group_id))
        group.initial_join = None
        for m in [m for m in group.members.values() if m.join_token is None and not m.is_static]:
            self._remove_member(group, m.member_id)
            ctx.note("member removed", group=group.group_id, member=m.member_id, reason="did not rejoin in time")
        if group.state == DEAD:
            return
        if not self._maybe_elect_new_joined_leader(group) and group.members:
            # Nobody rejoined but (static) members remain: wait another rebalance timeout
            # for their sessions to expire.
            ctx.arm(JoinKey(group.group_id), group.rebalance_timeout_ms())
            return
        # initNextGeneration
        group.generation += 1
        group.pending_sync.clear()
        if not group.members:
            group.protocol_name = None
            group.subscribed_topics = group.compute_subscribed_topics()
            ctx.transition(group, EMPTY, "join phase completed with no members")
            ctx.append_logged(
                group.partition,
                [records.group_metadata(group, {})],
                "empty group metadata",
                groups=(group.group_id,),
                group=group.group_id,
            )
            return
        group.protocol_name = group.select_protocol()
        group.subscribed_topics = group.compute_subscribed_topics()
        ctx.transition(group, COMPLETING, "join phase completed")
        for m in list(group.members.values()):
            self._complete_join(
                group, m, self._generation_result(group, m.member_id, with_members=group.is_leader(m.member_id))
            )
            self.registry.reschedule_heartbeat(group, m)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        # The pending-sync expiry (KAFKA-12890).
        group.sync_generation = group.generation
        ctx.arm(SyncKey(group.group_id), group.rebalance_timeout_ms())

    def _maybe_elect_new_joined_leader(self, group: ClassicGroup) -> bool:
        """``ClassicGroup.maybeElectNewJoinedLeader``: keep a leader that rejoined, else
        promote any member that did; False when nobody rejoined or the group is empty."""
        if group.leader_id is None:
            return False
        leader = group.members.get(group.leader_id)
        if leader is not None and leader.join_token is not None:
            return True
        for m in group.members.values():
            if m.join_token is not None:
                group.leader_id = m.member_id
                return True
        return False

    def _reset_and_propagate_assignment_with_error(self, group: ClassicGroup, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == E.NONE
        for m in group.members.values():
            if self._complete_sync(
                m,
                SyncResult(
                    error,
                    protocol_type=group.protocol_type if ok else None,
                    protocol_name=group.protocol_name if ok else None,
                    assignment=m.assignment,
                ),
            ):
                # A session that expired while the member waited is re-armed here.
                self.registry.reschedule_heartbeat(group, m)

    def _remove_sync_expiration(self, group: ClassicGroup) -> None:
        group.pending_sync.clear()
        self.ctx.cancel(SyncKey(group.group_id))

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        discard(group.pending_sync, member_id)
        if group.state in (DEAD, EMPTY, PREPARING) or not group.pending_sync:
            self.ctx.cancel(SyncKey(group.group_id))

    def _remove_member_and_update_group(self, group: ClassicGroup, member: Member, reason: str) -> None:
        """Session expiry (docs/groups.md, "Heartbeat and sessions")."""
        self._remove_member(group, member.member_id)
        self.ctx.note("member removed", group=group.group_id, member=member.member_id, reason=reason)
        if group.state in (STABLE, COMPLETING):
            self._maybe_prepare_rebalance_or_complete_join(group, f"{reason} ({member.member_id})")
        elif group.state == PREPARING and group.has_all_members_joined():
            self._complete_join_phase(group)

    # =================================================================== SyncGroup

    def sync(self, token: int, req: SyncRequest) -> None:
        ctx = self.ctx
        # KafkaApis: SyncGroup v5+ must carry ProtocolType and ProtocolName.
        if req.api_version >= 5 and (req.protocol_type is None or req.protocol_name is None):
            ctx.respond(token, SyncResult(E.INCONSISTENT_GROUP_PROTOCOL))
            return
        # The Java coordinator passes COORDINATOR_LOAD_IN_PROGRESS through (Scala answered
        # REBALANCE_IN_PROGRESS while loading).
        err = checks.request(ctx, req.group_id)
        if err is not None:
            ctx.respond(token, SyncResult(err))
            return
        group = self.registry.get(req.group_id)
        if group is None or group.state == EMPTY:
            ctx.respond(token, SyncResult(E.UNKNOWN_MEMBER_ID))
            return
        err = self._validate_sync(group, req)
        if err is not None:
            ctx.respond(token, SyncResult(err))
        elif group.state == PREPARING:
            ctx.respond(token, SyncResult(E.REBALANCE_IN_PROGRESS))
        elif group.state == COMPLETING:
            member = group.members[req.member_id]
            if member.sync_token is not None:  # a duplicate on another connection: replace it
                self._complete_sync(member, SyncResult(E.REBALANCE_IN_PROGRESS))
            member.sync_token = token
            self._remove_pending_sync_member(group, req.member_id)
            if group.is_leader(req.member_id):
                self._leader_sync(group, req)
        elif group.state == STABLE:
            # Late SyncGroup (or a replaced static member): the stored assignment.  Java does not
            # reset the session here (Scala did).
            self._remove_pending_sync_member(group, req.member_id)
            member = group.members[req.member_id]
            ctx.respond(token, SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment))

    @staticmethod
    def _validate_generation(
        group: ClassicGroup, member_id: str, instance_id: str | None, generation_id: int
    ) -> ErrorCode | None:
        """A known member (fencing included) of the current generation, in a live group."""
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        err = group.validate_member(member_id, instance_id)
        if err is not None:
            return err
        if generation_id != group.generation:
            return E.ILLEGAL_GENERATION
        return None

    def _validate_sync(self, group: ClassicGroup, req: SyncRequest) -> ErrorCode | None:
        err = self._validate_generation(group, req.member_id, req.group_instance_id, req.generation_id)
        if err is not None:
            return err
        if _inconsistent(req.protocol_type, group.protocol_type):
            return E.INCONSISTENT_GROUP_PROTOCOL
        if _inconsistent(req.protocol_name, group.protocol_name):
            return E.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _leader_sync(self, group: ClassicGroup, req: SyncRequest) -> None:
        assignment: dict[str, bytes] = {}
        for mid, data in req.assignments:
            assignment[mid] = data
        missing = [mid for mid in group.members if mid not in assignment]
        for mid in missing:
            assignment[mid] = b""  # members the leader left out get an empty assignment
        if missing:
            self.ctx.note("empty assignments set", group=group.group_id, generation=group.generation, members=missing)
        generation = req.generation_id

        def stored(error: ErrorCode | None) -> None:
            # Another member may have joined meanwhile: act only if still CompletingRebalance
            # in the same generation (and the same group object).
            if self.registry.get(group.group_id) is not group:
                return
            if group.state != COMPLETING or group.generation != generation:
                return
            if error is not None:
                mapped = response_error(error)
                self._reset_and_propagate_assignment_with_error(group, mapped)
                self._maybe_prepare_rebalance_or_complete_join(group, f"error {mapped.name} storing the assignment")
                return
            for m in group.members.values():
                m.assignment = assignment.get(m.member_id, b"")
            self._propagate_assignment(group, E.NONE)
            self.ctx.transition(group, STABLE, "leader's assignment persisted")

        self.ctx.append(group.partition, [records.group_metadata(group, assignment)], stored, groups=(group.group_id,))

    # =================================================================== Heartbeat

    def heartbeat(self, token: int, req: HeartbeatRequest) -> None:
        self.ctx.respond(token, HeartbeatResult(self._heartbeat(req)))

    def _heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        err = checks.service(self.ctx, req.group_id)
        if err is not None:
            return err
        if checks.partition(self.ctx, req.group_id) is not None:
            return E.NONE  # Kafka answers a heartbeat blindly NONE while the partition loads
        group = self.registry.get(req.group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        err = self._validate_generation(group, req.member_id, req.group_instance_id, req.generation_id)
        if err is not None:
            return err
        if group.state == EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self.registry.reschedule_heartbeat(group, group.members[req.member_id])
        if group.state == PREPARING:
            return E.REBALANCE_IN_PROGRESS  # the session was still refreshed
        return E.NONE

    # ================================================================== LeaveGroup

    def leave(self, token: int, req: LeaveRequest) -> None:
        self.ctx.respond(token, self._leave(req))

    def _leave(self, req: LeaveRequest) -> LeaveResult:
        err = checks.request(self.ctx, req.group_id)
        if err is not None:
            return LeaveResult(err)
        group = self.registry.get(req.group_id)
        if group is None:
            return LeaveResult(
                E.NONE,
                tuple(LeaveMemberResult(m.member_id, m.group_instance_id, E.UNKNOWN_MEMBER_ID) for m in req.members),
            )
        if group.state == DEAD:
            return LeaveResult(E.COORDINATOR_NOT_AVAILABLE)
        results: list[LeaveMemberResult] = []
        removed: list[str] = []
        for lm in req.members:
            reason = lm.reason or "not provided"
            if lm.member_id == "":
                # Admin removal by group.instance.id (v3+).
                mid = group.static_members.get(lm.group_instance_id) if lm.group_instance_id is not None else None
                if mid is not None:
                    self._remove_current_member(group, mid, reason)
                    results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, E.NONE))
                    removed.append(mid)
                else:
                    results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, E.UNKNOWN_MEMBER_ID))
            elif lm.member_id in group.pending_members:
                self._remove_member(group, lm.member_id)
                self.ctx.note("pending member left", group=group.group_id, member=lm.member_id, reason=reason)
                results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, E.NONE))
                removed.append(lm.member_id)
            else:
                err = group.validate_member(lm.member_id, lm.group_instance_id)
                if err is None:
                    self._remove_current_member(group, lm.member_id, reason)
                    removed.append(lm.member_id)
                results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, err or E.NONE))
        if removed:
            why = f"members left the group ({', '.join(removed)})"
            if group.state in (STABLE, COMPLETING):
                self._maybe_prepare_rebalance_or_complete_join(group, why)
            elif group.state == PREPARING:
                self._maybe_complete_join_phase(group)
        return LeaveResult(E.NONE, tuple(results))

    def _remove_current_member(self, group: ClassicGroup, member_id: str, reason: str) -> None:
        self._remove_member(group, member_id)
        self.ctx.note("member left", group=group.group_id, member=member_id, reason=reason)

    # ====================================================================== timers

    def timer_fired(self, key: HeartbeatKey | SessionsKey | JoinKey | SyncKey) -> None:
        group = self.registry.get(key.group_id)
        if group is None:
            return
        if isinstance(key, SessionsKey):
            self._sessions_due(group)
        elif isinstance(key, HeartbeatKey):
            self._heartbeat_expired(group, key.member_id)
        elif isinstance(key, JoinKey):
            if group.state == PREPARING:
                self._join_timer_fired(group)
        else:
            self._sync_expired(group)

    def _sessions_due(self, group: ClassicGroup) -> None:
        """The group's sessions timer fired: each member whose deadline has passed expires, in
        deadline order (then by id), as its own timer would have; then the timer is armed for
        the next deadline (docs/groups.md, "Timers")."""
        now = self.ctx.now
        due = sorted((d, mid) for mid, m in group.members.items() if 0 < (d := m.session_deadline) <= now)
        for deadline, mid in due:
            member = group.members.get(mid)
            if member is None or member.session_deadline != deadline:
                continue  # removed or moved by an earlier expiry
            member.session_deadline = 0  # fired: like a timer, it is gone until rescheduled
            self._heartbeat_expired(group, mid)
        if self.registry.get(group.group_id) is group:
            self.registry.rearm_sessions(group)

    def _heartbeat_expired(self, group: ClassicGroup, member_id: str) -> None:
        """``expireClassicGroupMemberHeartbeat``."""
        if group.state == DEAD:
            return
        if member_id in group.pending_members:
            discard(group.pending_members, member_id)
            self.ctx.note("pending member expired", group=group.group_id, member=member_id)
            if group.state == PREPARING and group.has_all_members_joined():
                self._complete_join_phase(group)
            return
        member = group.members.get(member_id)
        if member is None:
            return
        if not member.has_satisfied_heartbeat():
            self._remove_member_and_update_group(group, member, "session timeout expired")

    def _sync_expired(self, group: ClassicGroup) -> None:
        """``expirePendingSync`` (KAFKA-12890): members that did not send SyncGroup within the
        rebalance timeout are removed, static ones included, and the group rebalances."""
        if group.sync_generation != group.generation:
            return
        if group.state not in (COMPLETING, STABLE):
            return
        if group.pending_sync:
            pending = sorted(group.pending_sync)
            for mid in pending:
                self._remove_member(group, mid)
                self.ctx.note("member removed", group=group.group_id, member=mid, reason="no SyncGroup in time")
            self.prepare_rebalance(group, f"members {pending} did not send SyncGroup in time")

    # ===================================================================== loading

    def on_loaded(self, group: ClassicGroup) -> None:
        """A group rebuilt from its record: every member gets a fresh session; a group over
        ``group.max.size`` rebalances at once (Java GMM ``onLoaded``)."""
        for m in group.members.values():
            self.registry.reschedule_heartbeat(group, m)
        if len(group.members) > self.ctx.config.max_size:
            self.prepare_rebalance(
                group, f"freshly loaded group is over capacity ({len(group.members)} > {self.ctx.config.max_size})"
            )
