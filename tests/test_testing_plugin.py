"""rallypoint.testing.Rallypoint and the pytest plugin (fixtures ``rallypoint`` and
``rallypoint_session``, marker ``@pytest.mark.rallypoint``): both modes, real clients, clean-up
also when a test fails, and the plugin from a fresh install in another project."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from rallypoint.testing import ControlError, Rallypoint

from tests.support import WireClient
from tests.support.wheels import build_wheel, empty_venv, pip

pytestmark = pytest.mark.clients

pytest_plugins = ["pytester"]


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def _heartbeat_error(rp: Rallypoint, client_id: str) -> int:
    with WireClient("127.0.0.1", rp.port, client_id=client_id) as c:
        resp = c.call(12, 3, {"group_id": "nobody", "generation_id": 1, "member_id": "m"})
    return int(resp.error_code)


@pytest.mark.parametrize("mode", ["inprocess", "subprocess"])
def test_faults_request_log_and_clock_in_both_modes(mode: str) -> None:
    with Rallypoint(mode=mode) as rp:  # type: ignore[arg-type]
        assert rp.health()["listeners"] == [f"PLAINTEXT://{rp.bootstrap}"]
        assert _heartbeat_error(rp, "before") == 25  # UNKNOWN_MEMBER_ID
        fault = rp.inject("Heartbeat", "NOT_COORDINATOR", count=2, client_id="steered")
        assert fault.hits == 0 and [f.id for f in rp.faults()] == [fault.id]
        assert _heartbeat_error(rp, "other") == 25  # the rule matches one client only
        assert _heartbeat_error(rp, "steered") == 16
        assert fault.wait(1, timeout=5)["hits"] == 1
        with pytest.raises(TimeoutError):
            fault.wait(2, timeout=0.2)
        assert _heartbeat_error(rp, "steered") == 16 and fault.hits == 2
        assert _heartbeat_error(rp, "steered") == 25  # count used up
        log = rp.requests(api="Heartbeat", client_id="steered")
        assert [e["errors"] for e in log] == [["NOT_COORDINATOR"], ["NOT_COORDINATOR"], ["UNKNOWN_MEMBER_ID"]]
        assert [e["fault"] for e in log] == [fault.id, fault.id, None]
        assert rp.requests(since=log[-1]["seq"]) == []
        assert rp.clear_requests() >= 5 and rp.requests() == []
        assert rp.clear_faults() == 1 and rp.faults() == []
        with pytest.raises(ControlError) as err:
            rp.inject("NoSuchApi", "NOT_COORDINATOR")
        assert err.value.status == 400
        assert rp.advance_clock(1000)["skew_ms"] == 1000
        assert rp.group("nobody") is None
        port, data_dir = rp.port, rp.data_dir
    assert _refused(port) and not data_dir.exists()


def test_a_real_group_is_waited_for_expired_and_kept_across_a_restart(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    group = f"g-{uuid.uuid4().hex[:6]}"
    with Rallypoint({"group.initial.rebalance.delay.ms": 0}, mode="subprocess") as rp:
        with WireClient("127.0.0.1", rp.port) as w:  # the topic (consumers do not create one)
            w.call(3, 4, {"topics": [{"name": "t"}], "allow_auto_topic_creation": True})
        c = Consumer({"bootstrap.servers": rp.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            c.subscribe(["t"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not c.assignment():
                c.poll(0.1)
            view = rp.wait_group(group, state="Stable", members=1, timeout=30)
            assert view["generation"] >= 1
            with pytest.raises(TimeoutError):
                rp.wait_group(group, members=2, timeout=0.3)
            (member,) = view["members"]
            c.commit(offsets=[TopicPartition("t", 0, 7)], asynchronous=False)
            rp.expire_member(group, member["member_id"])
            assert rp.wait_group(group, state="Empty", members=0, timeout=10)["state"] == "Empty"
        finally:
            c.close()
        old_port = rp.port
        rp.restart()  # same data dir: the committed offset is replayed
        assert rp.port == old_port
        with WireClient("127.0.0.1", rp.port) as w:
            resp = w.call(9, 5, {"group_id": group, "topics": [{"name": "t", "partition_indexes": [0]}]})
        assert [(p.partition_index, p.committed_offset) for t in resp.topics for p in t.partitions] == [(0, 7)]


def test_bad_arguments_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="mode"):
        Rallypoint(mode="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="brokers"):
        Rallypoint(brokers=0)
    with pytest.raises(ValueError, match=r"rallypoint\.brokers"):
        Rallypoint({"rallypoint.brokers": "3"})
    with pytest.raises(ValueError, match="port"):
        Rallypoint({"port": "9092"})
    rp = Rallypoint({"no.such.setting": "1"})
    with pytest.raises(Exception, match=r"no\.such\.setting"):
        rp.start()
    rp.close()
    assert not rp.data_dir.exists()


PLUGIN_TESTS = """
import json, os, socket
import pytest

OUT = os.environ["RP_OUT"]

def record(name, rp):
    with open(OUT, "a") as f:
        f.write(json.dumps({"test": name, "port": rp.port, "data_dir": str(rp.data_dir), "mode": rp.mode}) + "\\n")

@pytest.mark.rallypoint(config={"num.partitions": "3"}, mode="MODE")
def test_passes(rallypoint):
    record("passes", rallypoint)
    with socket.create_connection(("127.0.0.1", rallypoint.port), timeout=5):
        pass
    assert rallypoint.config["num.partitions"] == "3"

def test_fails(rallypoint):
    record("fails", rallypoint)
    assert False, "this test fails on purpose"

def test_session_a(rallypoint_session):
    record("session_a", rallypoint_session)

def test_session_b(rallypoint_session):
    record("session_b", rallypoint_session)
"""


@pytest.mark.parametrize("mode", ["inprocess", "subprocess"])
def test_fixtures_clean_up_also_when_a_test_fails(
    pytester: pytest.Pytester, mode: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = tmp_path / "seen.jsonl"
    monkeypatch.setenv("RP_OUT", str(out))
    pytester.makepyfile(test_plugin_use=PLUGIN_TESTS.replace("MODE", mode))
    pytester.makeini(f"[pytest]\nrallypoint_mode = {mode}\nrallypoint_config =\n    num.partitions=2\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=120)
    result.assert_outcomes(passed=3, failed=1)
    seen = {e["test"]: e for e in map(json.loads, out.read_text().splitlines())}
    assert set(seen) == {"passes", "fails", "session_a", "session_b"}
    assert seen["passes"]["mode"] == mode and seen["fails"]["mode"] == "inprocess"  # marker vs default
    assert seen["session_a"]["port"] == seen["session_b"]["port"]  # one broker per session
    assert seen["session_a"]["mode"] == mode
    for e in seen.values():  # every broker stopped, every port closed, every data dir gone
        assert _refused(e["port"]), e
        assert not Path(e["data_dir"]).exists(), e


def test_a_bad_marker_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.rallypoint(mode="kubernetes")
        def test_it(rallypoint):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q", timeout=60)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*mode must be one of inprocess, subprocess*"])


@pytest.mark.slow
def test_the_plugin_works_from_a_fresh_install_in_another_project(tmp_path: Path) -> None:
    """Build the wheel, install it (no dependencies) into a new virtual environment whose
    dependencies come from this one's site-packages as a plain path (so the editable install
    here is not seen), and run pytest in a throwaway project that only uses the fixture."""
    wheel = build_wheel(tmp_path)
    python = empty_venv(tmp_path / "venv")
    (site,) = (tmp_path / "venv" / "lib").glob("python*/site-packages")
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "deps-from-the-test-venv.pth").write_text("\n".join(deps) + "\n")
    pip("--python", str(python), "install", "--quiet", "--no-deps", str(wheel))
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_uses_rallypoint.py").write_text(
        textwrap.dedent(
            """
            import urllib.request

            import rallypoint
            from kafka import KafkaProducer


            def test_produce(rallypoint_fixture_check, rallypoint):
                producer = KafkaProducer(bootstrap_servers=rallypoint.bootstrap)
                producer.send("t", b"hello").get(timeout=30)
                producer.close()
                assert [r["api"] for r in rallypoint.requests(api="Produce")] == ["Produce"]
                with urllib.request.urlopen(rallypoint.control_url + "/") as page:  # the live page ships
                    assert b"EventSource" in page.read()
            """
        )
    )
    (project / "conftest.py").write_text(
        textwrap.dedent(
            f"""
            import pytest
            import rallypoint


            @pytest.fixture
            def rallypoint_fixture_check():
                # the installed wheel, not the checkout's editable install
                assert rallypoint.__file__.startswith({str(site)!r}), rallypoint.__file__
            """
        )
    )
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout


@pytest.mark.parametrize("mode", ["inprocess", "subprocess"])
def test_several_brokers_move_and_restart_on_the_same_ports(mode: str) -> None:
    """``Rallypoint(brokers=3)``: three nodes on consecutive ports, leadership steered through
    the methods, the same ports after a restart (docs/cluster.md)."""
    with Rallypoint(brokers=3, mode=mode) as rp:  # type: ignore[arg-type]
        nodes = rp.cluster()["brokers"]
        ports = [int(n["endpoints"]["PLAINTEXT"].rpartition(":")[2]) for n in nodes]
        assert ports == [rp.port, rp.port + 1, rp.port + 2]
        with WireClient("127.0.0.1", rp.port) as w:
            w.call(19, 5, {"topics": [{"name": "m", "num_partitions": 1, "replication_factor": 1}], "timeout": 5000})
        assert rp.move_leader("m", 0, 3)["leader"] == 3
        moved = rp.move_coordinator("some-group", 2)
        assert moved["coordinator"] == 2
        stopped = rp.stop_broker(3)
        assert [n["state"] for n in stopped["brokers"]] == ["running", "running", "stopped"]
        assert [n["state"] for n in rp.start_broker(3)["brokers"]] == ["running"] * 3
        rp.restart()
        again = [int(n["endpoints"]["PLAINTEXT"].rpartition(":")[2]) for n in rp.cluster()["brokers"]]
        assert again == ports


def test_a_group_loaded_at_start_up_has_no_transitions_yet() -> None:
    """docs/control.md: after a restart ``transitions`` starts empty (loading is not shown as a
    transition; only a coordinator move's unload and load are)."""
    with Rallypoint() as rp:
        with WireClient("127.0.0.1", rp.port) as w:
            w.call(19, 5, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}], "timeout": 5000})
            w.call(10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
            commit = {
                "group_id": "g",
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 3}]}],
            }
            w.call(8, 8, commit)
        rp.restart()
        view = rp.group("g")
        assert view is not None and view["state"] == "Empty" and view["transitions"] == []
