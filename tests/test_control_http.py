"""The control plane's HTTP layer against a real broker process: start-up, 400/401/404/405,
bounded input, the request log, events, the clock (coordinator/control/api.py, http.py)."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.control_support import Control, control_url
from tests.support import BrokerProcess, WireClient, free_port

pytestmark = pytest.mark.wire

CONTROL = ["--control-port", "0"]
HEARTBEAT, API_VERSIONS = 12, 18


@pytest.fixture
def ctl_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(extra_args=CONTROL)


@pytest.fixture(scope="module")
def shared_ctl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the tests that must change nothing (bad input, unknown paths, reads):
    each case also checks that the broker still holds no rule and no clock skew, so a case
    that did change something fails the next ones too."""
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("ctl"), config={}, extra_args=CONTROL)
    b.start()
    yield b
    b.kill()


def kafka_ok(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        assert (
            int(c.call(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code) == 0
        )


# ------------------------------------------------------------------------------ start-up


def test_listening_line_and_health_name_the_control_address(ctl_broker: BrokerProcess) -> None:
    url = control_url(ctl_broker)
    assert url.startswith("http://127.0.0.1:")
    health = Control(url).get("/v1/health")
    assert health["node_id"] == 1
    assert health["control"] == url
    assert health["listeners"] == [f"PLAINTEXT://127.0.0.1:{ctl_broker.port}"]
    assert isinstance(health["uptime_ms"], int) and health["uptime_ms"] >= 0


def test_control_port_off(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(extra_args=["--control-port", "-1"])
    assert b.events("listening")[-1]["control"] is None
    kafka_ok(b)


def test_an_explicit_control_port_that_is_taken_stops_the_broker(broker_factory: Callable[..., BrokerProcess]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"control port {port} on 127.0.0.1 is not available"):
            broker_factory(config={"rallypoint.control.port": str(port)})


def test_the_default_control_port_taken_falls_back_to_a_free_one(broker_factory: Callable[..., BrokerProcess]) -> None:
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker binds: past TIME_WAIT
    try:
        # Hold 9644 ourselves: a broker of a test running beside this one may hold it only for a
        # moment (every broker started without a control port tries 9644 first), and could
        # release it before the broker below binds.
        deadline = time.monotonic() + 30
        while True:
            try:
                blocker.bind(("127.0.0.1", 9644))
                break
            except OSError:
                assert time.monotonic() < deadline, "127.0.0.1:9644 stayed taken for 30 s"
                time.sleep(0.05)
        blocker.listen()
        b = broker_factory()
        url = control_url(b)
        assert not url.endswith(":9644")
        assert any(e.get("wanted") == 9644 for e in b.events("control port taken, using a free port"))
        assert Control(url).get("/v1/health")["control"] == url
    finally:
        blocker.close()


# ------------------------------------------------------------------------------ errors


def test_unknown_paths_methods_and_ids(shared_ctl_broker: BrokerProcess) -> None:
    c = Control.of(shared_ctl_broker)
    assert c.call("GET", "/v1/nothing").status == 404
    assert c.call("GET", "/v2/health").status == 404
    r = c.call("PUT", "/v1/faults")
    assert r.status == 405 and "POST" in r.headers["allow"]
    assert c.call("GET", "/v1/groups/no-such-group").status == 404
    r = c.call("GET", "/v1/groups/a%2Fb%20c")  # ids are percent-decoded per path segment
    assert r.status == 404 and r.body["error"] == "no group 'a/b c'"
    assert c.call("POST", "/v1/groups/no-such-group/members/m/expire").status == 404
    assert c.call("GET", "/v1/faults/7").status == 404
    assert c.call("DELETE", "/v1/faults/7").status == 404
    assert c.call("DELETE", "/v1/faults/abc").status == 404
    assert c.call("POST", "/v1/faults/7/release").status == 404
    assert c.call("POST", "/v1/faults/7/wait", {"hits": 1}).status == 404


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/faults", b"{not json"),
        ("/v1/faults", b"[1, 2]"),
        ("/v1/faults", b'{"api": "Heartbeat", "error": 27, "extra": 1}'),
        ("/v1/faults", b'{"api": "Hartbeat", "error": 27}'),
        ("/v1/faults", b'{"api": "Heartbeat", "error": "NOT_AN_ERROR"}'),
        ("/v1/faults", b'{"api": "Heartbeat", "action": "explode"}'),
        ("/v1/faults", b'{"api": "Heartbeat", "error": 27, "count": "2"}'),
        ("/v1/faults", b'{"api": "Heartbeat", "error": 27, "probability": NaN}'),
        ("/v1/clock/advance", b'{"ms": -5}'),
        ("/v1/clock/advance", b'{"ms": "5"}'),
        ("/v1/clock/advance", b"{}"),
        ("/v1/clock/advance", b'{"ms": 5, "also": 1}'),
        ("/v1/groups/g/wait", b'{"state": "Wobbly"}'),
        ("/v1/groups/g/wait", b'{"members": true}'),
        ("/v1/groups/g/wait", b'{"timeout_ms": 1, "x": 1}'),
    ],
)
def test_bad_bodies_get_400_with_a_message_and_change_nothing(
    shared_ctl_broker: BrokerProcess, path: str, body: bytes
) -> None:
    c = Control.of(shared_ctl_broker)
    r = c.raw("POST", path, body, {"Content-Type": "application/json"})
    assert r.status == 400, r.body
    assert r.body["error"]
    assert c.get("/v1/faults") == []
    assert c.get("/v1/clock")["skew_ms"] == 0
    kafka_ok(shared_ctl_broker)


def test_bad_query_parameters(shared_ctl_broker: BrokerProcess) -> None:
    c = Control.of(shared_ctl_broker)
    assert c.call("GET", "/v1/requests?api=NoSuchApi").status == 400
    assert c.call("GET", "/v1/requests?since=x").status == 400
    assert c.call("GET", "/v1/requests?colour=red").status == 400
    assert c.call("GET", "/v1/events?types=weather").status == 400


def test_input_is_bounded_and_bad_http_closes_only_that_connection(shared_ctl_broker: BrokerProcess) -> None:
    c = Control.of(shared_ctl_broker)
    r = c.raw("POST", "/v1/faults", b"{" + b" " * (1024 * 1024 + 10) + b"}")
    assert r.status == 413
    with socket.create_connection((c.host, c.port), timeout=10) as s:
        s.sendall(b"NONSENSE\r\n\r\n")
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 400")
    with socket.create_connection((c.host, c.port), timeout=10) as s:
        try:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (300 * 1024) + b"\r\n\r\n")
        except OSError:
            pass  # the broker may stop reading once the head is too large; its answer is still there
        assert s.recv(4096).startswith(b"HTTP/1.1 431")  # the head is bounded
    assert c.get("/v1/health")["node_id"] == 1
    kafka_ok(shared_ctl_broker)


def test_keep_alive_serves_several_requests_on_one_connection(shared_ctl_broker: BrokerProcess) -> None:
    c = Control.of(shared_ctl_broker)
    conn = http.client.HTTPConnection(c.host, c.port, timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", "/v1/clock")
            resp = conn.getresponse()
            assert resp.status == 200
            resp.read()
    finally:
        conn.close()


# ------------------------------------------------------------------------------ token


def test_token_required_on_every_endpoint(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"rallypoint.control.token": "s3cret"}, extra_args=CONTROL)
    url = control_url(b)
    anon = Control(url)
    for method, path in [
        ("GET", "/v1/health"),
        ("GET", "/v1/groups"),
        ("POST", "/v1/faults"),
        ("GET", "/v1/requests"),
        ("GET", "/v1/events"),
        ("POST", "/v1/clock/advance"),
        ("GET", "/v1/nothing"),
    ]:
        r = anon.call(method, path, {"api": "Heartbeat", "error": 27} if method == "POST" else None)
        assert r.status == 401, (path, r.status)
        assert r.headers.get("www-authenticate") == "Bearer"
    assert Control(url, token="wrong").call("GET", "/v1/health").status == 401
    assert anon.call("GET", "/v1/health", headers={"Authorization": "Basic czNjcmV0"}).status == 401
    assert Control(url, token="s3cret").get("/v1/health")["node_id"] == 1
    assert anon.call("GET", "/v1/health?token=s3cret").status == 200
    assert anon.get("/v1/faults?token=s3cret") == []
    assert Control(url, token="s3cret").get("/v1/faults") == []  # the 401 POST created nothing
    stream = anon.events("/v1/events?token=s3cret")
    assert stream.status == 200
    stream.close()
    kafka_ok(b)


# ------------------------------------------------------------------------------ request log


def heartbeat(c: WireClient, group: str = "nobody") -> int:
    return int(c.call(HEARTBEAT, 4, {"group_id": group, "generation_id": 1, "member_id": "m"}).error_code)


def test_request_log_entries_filters_clear_and_sequence(ctl_broker: BrokerProcess) -> None:
    c = Control.of(ctl_broker)
    with WireClient(ctl_broker.host, ctl_broker.port, client_id="logged") as w:
        assert heartbeat(w) == 25  # UNKNOWN_MEMBER_ID
        kafka_ok(ctl_broker)
    entries = c.requests(client_id="logged")
    assert len(entries) == 1
    e = entries[0]
    assert {k: e[k] for k in ("node", "client_id", "api", "api_key", "version", "errors")} == {
        "node": 1,
        "client_id": "logged",
        "api": "Heartbeat",
        "api_key": 12,
        "version": 4,
        "errors": ["UNKNOWN_MEMBER_ID"],
    }
    assert e["client_host"] == "127.0.0.1" and e["correlation_id"] == 1 and e["connection"] >= 1
    assert e["latency_ms"] >= 0 and e["time_ms"] > 0 and e["fault"] is None and e["answered"] is True
    assert [x["api"] for x in c.requests(api="18")] == ["ApiVersions"]
    assert [x["api"] for x in c.requests(api="ApiVersions")] == ["ApiVersions"]
    assert c.requests(node="2") == []
    everything = c.get("/v1/requests")
    assert everything["dropped"] == 0 and everything["size"] == 10000
    last = everything["last_seq"]
    assert c.requests(since=str(last)) == []
    cleared = c.call("DELETE", "/v1/requests").body
    assert cleared["cleared"] >= 2 and c.requests() == []
    kafka_ok(ctl_broker)
    assert [x["seq"] for x in c.requests()] == [last + 1]  # numbers keep growing


def test_request_log_ring_is_bounded_and_says_how_many_were_dropped(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    b = broker_factory(config={"rallypoint.control.request.log.size": "5"}, extra_args=CONTROL)
    with WireClient(b.host, b.port) as w:
        for _ in range(12):
            heartbeat(w)
    log = Control.of(b).get("/v1/requests")
    assert [e["seq"] for e in log["requests"]] == [8, 9, 10, 11, 12]
    assert log["dropped"] == 7


def test_request_log_off(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"rallypoint.control.request.log.size": "0"}, extra_args=CONTROL)
    kafka_ok(b)
    assert Control.of(b).get("/v1/requests")["requests"] == []


# ------------------------------------------------------------------------------ faults over HTTP


def test_fault_life_cycle_over_http(ctl_broker: BrokerProcess) -> None:
    c = Control.of(ctl_broker)
    fid = c.fault(api="Heartbeat", error="NOT_COORDINATOR", count=2, client_id="victim")
    assert c.get(f"/v1/faults/{fid}")["remaining"] == 2
    with WireClient(ctl_broker.host, ctl_broker.port, client_id="victim") as w:
        assert [heartbeat(w) for _ in range(3)] == [16, 16, 25]
    with WireClient(ctl_broker.host, ctl_broker.port, client_id="bystander") as w:
        assert heartbeat(w) == 25
    rule = c.post(f"/v1/faults/{fid}/wait", {"hits": 2, "timeout_ms": 1000})
    assert (rule["hits"], rule["remaining"]) == (2, 0)
    r = c.call("POST", f"/v1/faults/{fid}/wait", {"hits": 3, "timeout_ms": 200})
    assert r.status == 408 and r.body["hits"] == 2
    faulted = [e for e in c.requests(client_id="victim") if e["fault"] == fid]
    assert [e["errors"] for e in faulted] == [["NOT_COORDINATOR"], ["NOT_COORDINATOR"]]
    assert c.call("DELETE", f"/v1/faults/{fid}").status == 204
    assert c.get("/v1/faults") == []
    c.fault(api="Heartbeat", error=16)
    c.fault(api="Heartbeat", delay_ms=10)
    assert c.call("DELETE", "/v1/faults").body == {"deleted": 2}


def test_fault_wait_returns_when_the_hits_arrive(ctl_broker: BrokerProcess) -> None:
    c = Control.of(ctl_broker)
    fid = c.fault(api="Heartbeat", error=27)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(c.call("POST", f"/v1/faults/{fid}/wait", {"timeout_ms": 10000})))
    t.start()
    time.sleep(0.3)
    with WireClient(ctl_broker.host, ctl_broker.port) as w:
        assert heartbeat(w) == 27
    t.join(10)
    assert result and result[0].status == 200 and result[0].body["hits"] == 1


# ------------------------------------------------------------------------------ events


@pytest.mark.slow  # ~8 s of waiting on the stream: make test only
def test_events_stream_fault_hits_and_replay_with_last_event_id(ctl_broker: BrokerProcess) -> None:
    c = Control.of(ctl_broker)
    live = c.events()
    assert live.status == 200
    fid = c.fault(api="Heartbeat", error=27, count=2)
    with WireClient(ctl_broker.host, ctl_broker.port, client_id="sse") as w:
        heartbeat(w)
        heartbeat(w)
    got = [e for e in live.events(5) if e["event"] == "fault"][:2]
    live.close()
    assert [(e["data"]["fault_id"], e["data"]["hits"], e["data"]["client_id"]) for e in got] == [
        (fid, 1, "sse"),
        (fid, 2, "sse"),
    ]
    first_id = got[0]["id"]
    replay = c.events(headers={"Last-Event-ID": str(first_id)})
    again = [e for e in replay.events(1.5) if e["event"] == "fault"]
    replay.close()
    assert [e["id"] for e in again] == [got[1]["id"]]
    groups_only = c.events("/v1/events?types=group&last_event_id=0")
    assert [e for e in groups_only.events(1.0) if e["event"] != "group"] == []
    groups_only.close()


# ------------------------------------------------------------------------------ clock


def test_clock_shows_and_accumulates_the_skew(ctl_broker: BrokerProcess) -> None:
    c = Control.of(ctl_broker)
    before = c.get("/v1/clock")
    assert before["skew_ms"] == 0 and abs(before["now_ms"] - time.time() * 1000) < 5000
    c.post("/v1/clock/advance", {"ms": 60000})
    after = c.post("/v1/clock/advance", {"ms": 1000})
    assert after["skew_ms"] == 61000 and after["advanced_ms"] == 1000
    assert after["now_ms"] - time.time() * 1000 > 55000
    kafka_ok(ctl_broker)


def test_a_fixed_control_port(broker_factory: Callable[..., BrokerProcess]) -> None:
    port = free_port()
    b = broker_factory(extra_args=["--control-port", str(port)])
    assert control_url(b) == f"http://127.0.0.1:{port}"
