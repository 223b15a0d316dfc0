"""Injected errors in the exact shape Kafka answers them, for every served API and version.

Kafka builds an error answer with each request class's ``getErrorResponse`` (``AbstractRequest``
and its subclasses in ``clients/src/main/java/org/apache/kafka/common/requests/``).  Read across
the APIs rallypoint serves, they follow one rule with two exceptions (docs/control.md, "Where an
injected error goes"):

* a response with a top-level ``error_code`` gets the error there and nothing else (Heartbeat,
  JoinGroup, SyncGroup, LeaveGroup, FindCoordinator v0-3, ListGroups, OffsetFetch v2-7,
  OffsetDelete, InitProducerId, ApiVersions, Fetch v13+);
* otherwise the response mirrors the request: one entry per topic, partition, group or key the
  request named, the error at the first level of each entry that has an ``error_code``
  (OffsetCommit, Produce, ListOffsets, OffsetForLeaderEpoch, OffsetFetch v1 and v8+,
  DescribeGroups, DeleteGroups, FindCoordinator v4+, CreateTopics, DeleteTopics,
  CreatePartitions);
* Metadata mirrors its topics and leaves the top-level code alone (``MetadataRequest``);
* Fetch before v13 does both, the top-level code and every partition (``FetchRequest``: older
  clients read only the partitions).

All of it is read from the response schema through :mod:`rallypoint.protocol.codec`; the only
per-API knowledge is the pairing of response arrays with the request arrays they mirror
(:data:`MIRRORS`) and the field values Kafka puts beside an error (:data:`SENTINELS`).

A fault rule with ``group`` or ``topic`` may target only part of a request (one group of a
DescribeGroups, one topic of a Produce): then the request minus those entries goes to the real
handler and the targeted entries come back with the error, merged in request order.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from msgspec import Struct
from rallypoint.protocol import codec, response_encoders

FETCH_KEY: Final = 1
METADATA_KEY: Final = 3
PRODUCE_KEY: Final = 0
FIND_COORDINATOR_KEY: Final = 10
DESCRIBE_LOG_DIRS_KEY: Final = 35
ELECT_LEADERS_KEY: Final = 43

# response array -> the request arrays (same level) it mirrors, in order of preference.
MIRRORS: Final[dict[str, tuple[str, ...]]] = {
    "responses": ("topic_data", "topics", "topic_names", "resources"),  # Produce, Fetch, DeleteTopics, AlterConfigs
    "partition_responses": ("partition_data",),  # Produce
    "partitions": ("partitions", "partition_data", "partition_indexes"),
    "topics": ("topics",),
    "groups": ("groups", "group_ids"),  # DescribeGroups (ids), OffsetFetch v8+ (entries), ConsumerGroupDescribe (ids)
    "results": ("groups_names", "topics", "resources"),  # DeleteGroups, CreatePartitions, DescribeConfigs
    "coordinators": ("coordinator_keys",),  # FindCoordinator v4+
    "results_by_topic_v3_and_below": ("v3_and_below_topics",),  # AddPartitionsToTxn v0-3
    "results_by_partition": ("partitions",),
    "transaction_states": ("transactional_ids",),  # DescribeTransactions
}

# response field -> request fields it copies (the entry's identity).
IDENTITY: Final[dict[str, tuple[str, ...]]] = {
    "name": ("name", "topic"),
    "topic": ("topic", "name"),
    "topic_id": ("topic_id",),
    "group_id": ("group_id",),
    "key": ("key",),
    "partition_index": ("partition_index", "partition", "index"),
    "partition": ("partition", "partition_index", "index"),
    "index": ("index", "partition_index", "partition"),
    "resource_type": ("resource_type",),  # DescribeConfigs, AlterConfigs, IncrementalAlterConfigs
    "resource_name": ("resource_name",),
}
# where a bare id from a request list (a group id, a topic name, a partition number) goes
_BARE_TARGETS: Final = ("group_id", "key", "name", "partition_index", "partition", "index", "transactional_id")
# the field an entry's error goes in (AddPartitionsToTxn names it partition_error_code)
_ERROR_FIELDS: Final = ("error_code", "partition_error_code")

# Values Kafka puts beside an error where the schema default differs (INVALID_OFFSET,
# NO_TIMESTAMP, UNDEFINED_EPOCH, Node.noNode(), NO_PRODUCER_ID ...).
SENTINELS: Final[dict[str, int]] = {
    "base_offset": -1,
    "log_start_offset": -1,
    "high_watermark": -1,
    "last_stable_offset": -1,
    "committed_offset": -1,
    "committed_leader_epoch": -1,
    "leader_epoch": -1,
    "end_offset": -1,
    "offset": -1,
    "timestamp": -1,
    "generation_id": -1,
    "producer_id": -1,
    "producer_epoch": -1,
    "node_id": -1,
    "port": -1,
    "low_watermark": -1,  # DeleteRecords (INVALID_LOW_WATERMARK)
    "controller_id": -1,  # DescribeCluster
}

# top-level fields an error answer copies from the request (FetchRequest.getErrorResponse: sessionId)
TOP_COPIED: Final = ("session_id",)

# request lists whose items are group ids (FindCoordinator's keys only for key_type 0)
_GROUP_LISTS: Final = frozenset({"groups", "groups_names", "group_ids", "coordinator_keys"})
_TOPIC_LISTS: Final = frozenset({"topic_names"})
# request arrays that name topics but are not answered per entry
_NOT_MIRRORED: Final = frozenset({"forgotten_topics_data"})

TopicNamer = Callable[[uuid.UUID], str | None]


class Target(Struct, frozen=True):
    """Which entries of a request a rule aims at: None = no constraint on that kind."""

    groups: frozenset[str] | None = None
    topics: frozenset[str] | None = None


# ------------------------------------------------------------------------ schema plumbing


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, str, Any, Any], ...]:
    return codec._field_plan(cls)  # (name, kafka_type, nested entity class or None, default)


@functools.cache
def _fields(cls: type) -> dict[str, tuple[str, Any]]:
    return {name: (kt, nested) for name, kt, nested, _default in _plan(cls)}


def _error_field(cls: type) -> str | None:
    fields = _fields(cls)
    return next((f for f in _ERROR_FIELDS if f in fields), None)


def _has_error_code(cls: type) -> bool:
    return _error_field(cls) is not None


def _is_group_request(request: Any) -> bool:
    """FindCoordinator names groups when key_type is 0 (v0 has no key_type: always groups)."""
    return int(getattr(request, "key_type", 0)) == 0


def _request_list(request: Any, name: str) -> tuple[str, tuple[Any, ...]] | None:
    """The request array (its field name and items) that response array ``name`` mirrors."""
    for candidate in MIRRORS.get(name, ()):
        items = getattr(request, candidate, None)
        if isinstance(items, tuple):
            return candidate, items
    return None


# ------------------------------------------------------------------------ what a request names


def _topic_of(item: Any, namer: TopicNamer) -> str | None:
    if isinstance(item, str):
        return item
    for f in ("name", "topic"):
        value = getattr(item, f, None)
        if isinstance(value, str) and value:
            return value
    tid = getattr(item, "topic_id", None)
    if isinstance(tid, uuid.UUID):
        return namer(tid)
    return None


def _item_kind(list_name: str, request: Any) -> str | None:
    """ "group", "topic" or None for the items of request list ``list_name``."""
    if list_name in _GROUP_LISTS:
        if list_name == "coordinator_keys" and not _is_group_request(request):
            return None
        return "group"
    if list_name in _TOPIC_LISTS or list_name in ("topics", "topic_data", "v3_and_below_topics"):
        return "topic"
    return None


def _entity_kind(list_name: str, item: Any, request: Any) -> str | None:
    if isinstance(item, str):
        return _item_kind(list_name, request)
    if list_name in _NOT_MIRRORED:
        return None
    if list_name == "groups" and hasattr(item, "group_id"):
        return "group"
    if list_name in ("topics", "topic_data", "v3_and_below_topics") and any(
        hasattr(item, f) for f in ("name", "topic", "topic_id")
    ):
        return "topic"
    return None


def groups_named(api_key: int, request: Any) -> tuple[str | None, tuple[str, ...]]:
    """(the group the whole request is about, or None; the groups it lists entry by entry)."""
    top = getattr(request, "group_id", None)
    if api_key == FIND_COORDINATOR_KEY and _is_group_request(request):
        key = getattr(request, "key", None)
        if isinstance(key, str):
            top = key
    listed: list[str] = []
    for name in ("groups", "groups_names", "group_ids", "coordinator_keys"):
        items = getattr(request, name, None)
        if not isinstance(items, tuple):
            continue
        for item in items:
            if isinstance(item, str):
                if _item_kind(name, request) == "group":
                    listed.append(item)
            elif isinstance(getattr(item, "group_id", None), str):
                listed.append(item.group_id)
    return (top if isinstance(top, str) else None), tuple(listed)


def topics_named(request: Any, namer: TopicNamer) -> frozenset[str]:
    """Every topic the request carries (by name, or by id through ``namer``), at any depth."""
    out: set[str] = set()

    def walk(obj: Any) -> None:
        for name, (_kt, nested) in _fields(obj.__class__).items():
            if name in _NOT_MIRRORED:
                continue
            value = getattr(obj, name, None)
            if not isinstance(value, tuple):
                continue
            for item in value:
                kind = _entity_kind(name, item, obj)
                if kind == "topic":
                    t = _topic_of(item, namer)
                    if t is not None:
                        out.add(t)
                elif nested is not None and dataclasses.is_dataclass(item):
                    walk(item)

    walk(request)
    return frozenset(out)


# ------------------------------------------------------------------------ building error answers


def _identity_fields(resp_cls: type, item: Any, namer: TopicNamer) -> dict[str, Any]:
    fields = _fields(resp_cls)
    out: dict[str, Any] = {}
    if not dataclasses.is_dataclass(item):
        for f in _BARE_TARGETS:
            if f in fields and fields[f][1] is None:
                out[f] = item
                break
        return out
    for f, sources in IDENTITY.items():
        if f not in fields:
            continue
        for src in sources:
            if hasattr(item, src):
                out[f] = getattr(item, src)
                break
    if "name" in fields and out.get("name") is None and isinstance(getattr(item, "topic_id", None), uuid.UUID):
        # answers that name topics by name where the request used ids (Metadata v10+)
        named = namer(getattr(item, "topic_id"))  # noqa: B009
        out["name"] = named if named is not None else out.get("name")
    return out


def _sentinels(resp_cls: type) -> dict[str, Any]:
    fields = _fields(resp_cls)
    return {f: v for f, v in SENTINELS.items() if f in fields and fields[f][1] is None}


def _element(
    resp_cls: type,
    item: Any,
    parent: Any,
    list_name: str,
    code: int,
    target: Target | None,
    inside: bool,
    namer: TopicNamer,
) -> dict[str, Any] | None:
    """One response entry for request entry ``item``, or None when nothing in it is targeted."""
    if not inside:
        assert target is not None
        kind = _entity_kind(list_name, item, parent)
        if kind == "group":
            gid = item if isinstance(item, str) else item.group_id
            if target.groups is not None and gid not in target.groups:
                return None
            inside = target.topics is None
        elif kind == "topic":
            t = _topic_of(item, namer)
            if target.topics is not None and t not in target.topics:
                return None
            inside = True
    out = _identity_fields(resp_cls, item, namer)
    if inside:
        out.update(_sentinels(resp_cls))
        field = _error_field(resp_cls)
        if field is not None:
            out[field] = code
            return out
    if not dataclasses.is_dataclass(item):
        return out if inside else None
    arrays = _mirror_arrays(resp_cls, item, code, target, inside, namer)
    if not inside and not any(arrays.values()):
        return None
    out.update(arrays)
    return out


def _mirror_arrays(
    resp_cls: type, request: Any, code: int, target: Target | None, inside: bool, namer: TopicNamer
) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for name, (_kt, nested) in _fields(resp_cls).items():
        if nested is None:
            continue
        src = _request_list(request, name)
        if src is None:
            continue
        list_name, items = src
        entries = []
        for item in items:
            e = _element(nested, item, request, list_name, code, target, inside, namer)
            if e is not None:
                entries.append(e)
        out[name] = entries
    return out


ALTER_USER_SCRAM_CREDENTIALS_KEY = 51


def error_body(
    api_key: int, version: int, request: Any, code: int, target: Target | None, namer: TopicNamer
) -> dict[str, Any]:
    """The response body (a dict for :func:`codec.build_response`) that answers ``request`` with
    error ``code``: the whole request (``target`` None) or only the targeted entries."""
    cls = codec.response_class(api_key, version)
    out: dict[str, Any] = {}
    if target is None and api_key == ALTER_USER_SCRAM_CREDENTIALS_KEY:
        # AlterUserScramCredentialsRequest.getErrorResponse: one result per user named, sorted
        users = sorted({e.name for e in (*request.deletions, *request.upsertions)})
        out["results"] = [{"user": u, "error_code": code, "error_message": None} for u in users]
        return out
    if target is None and api_key == DESCRIBE_LOG_DIRS_KEY:
        # DescribeLogDirsRequest.getErrorResponse: only the top-level code (v3+), no results
        return {"error_code": code} if version >= 3 else {}
    if target is None and api_key == ELECT_LEADERS_KEY:
        # ElectLeadersRequest.getErrorResponse: every named partition with the error, and the
        # top-level code (v1+)
        named = request.topic_partitions or ()
        out["replica_election_results"] = [
            {"topic": t.topic, "partition_result": [{"partition_id": p, "error_code": code} for p in t.partitions]}
            for t in named
        ]
        if version >= 1:
            out["error_code"] = code
        return out
    if target is None:
        out.update(_sentinels(cls))
        for f in TOP_COPIED:
            if f in _fields(cls) and hasattr(request, f):
                out[f] = getattr(request, f)
        top = _has_error_code(cls) and api_key != METADATA_KEY
        if top:
            out["error_code"] = code
        if not top or (api_key == FETCH_KEY and version < 13):
            out.update(_mirror_arrays(cls, request, code, None, True, namer))
    else:
        out.update(_mirror_arrays(cls, request, code, target, False, namer))
    return out


# ------------------------------------------------------------------------ partial answers


def prune(request: Any, target: Target, namer: TopicNamer) -> tuple[Any, int]:
    """``request`` without the targeted entries, and how many entries it still names."""
    kept = 0

    def walk(obj: Any, inside_group: bool) -> Any:
        nonlocal kept
        changes: dict[str, Any] = {}
        for name in _fields(obj.__class__):
            value = getattr(obj, name, None)
            if not isinstance(value, tuple) or name in _NOT_MIRRORED:
                continue
            new_items = []
            touched = False
            for item in value:
                kind = _entity_kind(name, item, obj)
                if kind == "group":
                    gid = item if isinstance(item, str) else item.group_id
                    hit = target.groups is None or gid in target.groups
                    if hit and target.topics is None:
                        touched = True
                        continue  # the whole group entry is answered with the error
                    if hit and dataclasses.is_dataclass(item):
                        pruned = walk(item, True)  # counts the entries it keeps
                        if pruned is item:
                            kept += 1
                        else:
                            touched = True
                        new_items.append(pruned)
                        continue
                    kept += 1
                    new_items.append(item)
                elif kind == "topic":
                    t = _topic_of(item, namer)
                    if target.topics is not None and t in target.topics and (target.groups is None or inside_group):
                        touched = True
                        continue
                    kept += 1
                    new_items.append(item)
                else:
                    new_items.append(item)
            if touched:
                changes[name] = tuple(new_items)
        return dataclasses.replace(obj, **changes) if changes else obj

    top_group_hit = target.groups is None
    result = walk(request, top_group_hit)
    return result, kept


def _identity(obj: Any) -> Any:
    for f in ("group_id", "key", "topic_id", "name", "topic", "partition_index", "partition", "index"):
        if hasattr(obj, f):
            value = getattr(obj, f)
            if value is not None and value != "" and not (isinstance(value, uuid.UUID) and value.int == 0):
                return (f, value)
    return None


def merge(real: Any, errors: Any) -> Any:
    """``real`` (the handler's answer to the pruned request) with the error entries merged in
    (same identity: merged one level down; otherwise appended)."""
    changes: dict[str, Any] = {}
    for name, (_kt, nested) in _fields(real.__class__).items():
        if nested is None or name not in MIRRORS:
            continue
        theirs = getattr(errors, name, ())
        if not theirs:
            continue
        ours = list(getattr(real, name, ()) or ())
        index = {_identity(e): i for i, e in enumerate(ours)}
        for e in theirs:
            i = index.get(_identity(e))
            if i is None or _identity(e) is None:
                ours.append(e)
            else:
                ours[i] = merge(ours[i], e)
        changes[name] = tuple(ours)
    return dataclasses.replace(real, **changes) if changes else real


def as_message(api_key: int, version: int, body: Mapping[str, Any] | Any) -> Any:
    if isinstance(body, codec.Encoded):  # a cached answer (ApiVersions, Metadata)
        return codec.decode_response(api_key, version, body.body)
    return codec.build_response(api_key, version, body) if isinstance(body, Mapping) else body


# ------------------------------------------------------------------------ reading answers


def error_codes(api_key: int, version: int, response: Mapping[str, Any] | Any) -> tuple[int, ...]:
    """Every non-zero ``error_code`` in a handler's answer (a dict, a codec message or a cached
    encoded answer), in the order of the answer's schema.

    On the path of every request (the request log): an answer whose schema has its only error
    code at the top level (Heartbeat, JoinGroup, SyncGroup ...) is read with one lookup; other
    answers are read along the schema's paths to its error codes only (:func:`_code_paths`),
    not every field; a cached encoded answer's codes are read once and kept with it."""
    if type(response) is dict and _flat(api_key, version):
        code = response.get("error_code")
        # `code != 0`, not `if code`: truth-testing an IntEnum member runs Python code
        return (int(code),) if code is not None and code != 0 else ()
    if isinstance(response, codec.Encoded):
        known = response.errors
        if known is None:
            known = response.errors = error_codes(api_key, version, as_message(api_key, version, response))
        return known
    try:
        cls = codec.response_class(api_key, version)
    except codec.UnknownVersion:
        return ()
    if _compiled_codes is not None and type(response) is dict:
        found = _compiled_codes(_code_program(cls), response)
        if found is not None:
            return found
    out: list[int] = []
    _codes_along(response, cls, out)
    return tuple(out) if out else ()


# The same walk compiled (protocol/_encode.pyx, ``codes``), when the install built it: it takes
# answers of dicts, lists, tuples and integers along the paths, and declines (None) anything
# else, which _codes_along reads (tests/test_control_shapes.py holds the two to the same codes).
_compiled_codes = response_encoders.compiled_codes


@functools.cache
def _code_program(cls: type) -> tuple[tuple[str, Any], ...]:
    """:func:`_code_paths` of ``cls`` with each nested class replaced by its own paths."""
    return tuple((name, None if nested is None else _code_program(nested)) for name, nested in _code_paths(cls))


# (api_key << 16 | version) -> "the response has error codes only at its top level", filled as
# answers are seen (the request hook reads it without a function call).
FLAT: dict[int, bool] = {}


def _flat(api_key: int, version: int) -> bool:
    """Does the response schema have error codes only at its top level?"""
    key = api_key << 16 | version
    flat = FLAT.get(key)
    if flat is None:
        try:
            cls = codec.response_class(api_key, version)
        except codec.UnknownVersion:
            flat = False
        else:
            flat = not any(nested is not None and _nested_codes(nested) for _kt, nested in _fields(cls).values())
        FLAT[key] = flat
    return flat


def _nested_codes(cls: type) -> bool:
    return "error_code" in _fields(cls) or any(
        nested is not None and _nested_codes(nested) for _kt, nested in _fields(cls).values()
    )


@functools.cache
def _code_paths(cls: type) -> tuple[tuple[str, Any], ...]:
    """The fields of ``cls`` that hold error codes: ``(name, None)`` for its own error code,
    ``(name, nested class)`` for a struct (or array of structs) that holds some; schema order."""
    return tuple(
        (name, nested)
        for name, (_kt, nested) in _fields(cls).items()
        if (nested is None and name == "error_code") or (nested is not None and _nested_codes(nested))
    )


def _codes_along(obj: Any, cls: type, out: list[int]) -> None:
    """The non-zero error codes of ``obj`` (a dict, another mapping or a codec message of
    schema ``cls``), visiting only the paths to them; schema order."""
    t = type(obj)
    message = t is not dict and hasattr(t, "__dataclass_fields__")
    if message:
        cls = t
    elif t is not dict and not isinstance(obj, Mapping):
        return
    for name, nested in _code_paths(cls):
        value = getattr(obj, name, None) if message else obj.get(name)
        if value is None:
            continue
        if nested is None:
            if value != 0:
                out.append(int(value))
        elif type(value) is list or type(value) is tuple:
            for item in value:
                _codes_along(item, nested, out)
        else:
            _codes_along(value, nested, out)
