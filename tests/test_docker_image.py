"""The real image: built by docker/build-local.sh with podman (no Docker engine here), run with a
published 127.0.0.1 port and a named volume, and driven by a real client.

Every step that cannot run on this machine FAILS naming the step and why (never a silent skip).
Steps that need the consumer-group coordinator, the data plane or the offsets log fail with the
reason if the broker does not serve them -- after every other check ran.

Cleans up: the container and volume it made, the iptables rules, chains and bridge podman's
networking added (when no other container is running), and checks no conmon process is left.
The base image and the built image are kept: they are build-local.sh's cache.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rallypoint.protocol import codec

from tests.support import ROOT, WireClient, free_port
from tests.test_docker import (
    DATA_APIS,
    DATA_VOLUME,
    GROUP_APIS,
    commit_offsets,
    committed_offsets,
    consume_assigned,
    consume_in_group,
    high_watermarks,
    pending,
    produce,
    served_apis,
    timed_first_join,
)

BUILD_SCRIPT = ROOT / "docker" / "build-local.sh"
CONTAINERS_CONF = ROOT / "docker" / "podman" / "containers.conf"
BUILD_TIMEOUT_S = 1800.0
HEALTHY_TIMEOUT_S = 90.0
# The image on the local Debian base measured 146 MB; fail on bloat (a compiler, caches).
MAX_IMAGE_BYTES = 200_000_000
INITIAL_DELAY_MS = 1500

pytestmark = [pytest.mark.docker, pytest.mark.timeout(BUILD_TIMEOUT_S + 600)]


def fail_step(step: str, why: str) -> None:
    pytest.fail(f"docker image: step {step!r} failed: {why}", pytrace=False)


def root_prefix() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", "--preserve-env=CONTAINERS_CONF"]
    fail_step("root", "rootful podman, iptables and debootstrap need root or passwordless sudo")
    raise AssertionError  # unreachable


@dataclass
class Podman:
    prefix: list[str]
    env: dict[str, str] = field(default_factory=lambda: {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)})

    def run(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        cmd = [*self.prefix, "podman", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and r.returncode != 0:
            fail_step(shlex.join(cmd[len(self.prefix) :]), f"exit {r.returncode}: {r.stderr.strip()[-2000:]}")
        return r

    def inspect(self, what: str, fmt: str) -> str:
        return self.run("inspect", "--format", fmt, what).stdout.strip()


@pytest.fixture(scope="module")
def podman() -> Podman:
    return Podman(root_prefix())


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """docker/build-local.sh: tools, base image (cached), the image.  Returns the image name."""
    log = tmp_path_factory.mktemp("build") / "build-local.log"
    t0 = time.monotonic()
    try:
        with open(log, "w") as out:
            r = subprocess.run(
                [str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=out, text=True, timeout=BUILD_TIMEOUT_S
            )
    except subprocess.TimeoutExpired:
        fail_step("docker/build-local.sh", f"did not finish in {BUILD_TIMEOUT_S:.0f}s; log: {log}")
    took = time.monotonic() - t0
    text = log.read_text(errors="replace")
    if r.returncode != 0:
        failed = [line for line in text.splitlines() if line.startswith("build-local.sh:")]
        fail_step(
            "docker/build-local.sh",
            (failed[-1] if failed else f"exit {r.returncode}") + "\n" + "\n".join(text.splitlines()[-30:]),
        )
    name = r.stdout.strip().splitlines()[-1]
    size = int(podman.inspect(name, "{{.Size}}"))
    print(f"\nbuild-local.sh: {took:.1f}s, image {name} {size / 1e6:.0f} MB")
    assert size < MAX_IMAGE_BYTES, f"image is {size / 1e6:.0f} MB"
    return name


# --- host network state: what podman's bridge networking adds, removed again -----------------


def _iptables_save(tool: str, table: str) -> list[str]:
    r = subprocess.run([*root_prefix(), f"{tool}-save", "-t", table], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        return []
    # Chains as ":NAME POLICY" (without counters) and rules as "-A CHAIN ...".
    return [
        " ".join(line.split()[:2]) if line.startswith(":") else line
        for line in r.stdout.splitlines()
        if line.startswith((":", "-A "))
    ]


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def _net_snapshot() -> dict[tuple[str, str], list[str]]:
    snap = {}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save"):
            for table in ("filter", "nat", "mangle"):
                snap[(tool, table)] = _iptables_save(tool, table)
    return snap


def _net_restore(podman: Podman, before: dict[tuple[str, str], list[str]], links_before: set[str]) -> list[str]:
    """Remove the rules, chains and links added since ``before``; returns what it removed."""
    removed: list[str] = []
    if podman.run("ps", "-q", check=False).stdout.strip():
        return ["(other containers are running: podman's shared chains and bridge left alone)"]
    prefix = root_prefix()
    for (tool, table), lines_before in before.items():
        after = _iptables_save(tool, table)
        for line in reversed([x for x in after if x.startswith("-A ") and x not in lines_before]):
            spec = shlex.split(line)[1:]
            subprocess.run([*prefix, tool, "-t", table, "-D", *spec], capture_output=True, timeout=30)
            removed.append(f"{tool} -t {table} {line}")
        chains = [x[1:].split()[0] for x in after if x.startswith(":") and x not in lines_before]
        for c in chains:
            subprocess.run([*prefix, tool, "-t", table, "-F", c], capture_output=True, timeout=30)
        for c in chains:
            subprocess.run([*prefix, tool, "-t", table, "-X", c], capture_output=True, timeout=30)
            removed.append(f"{tool} -t {table} chain {c}")
    for link in sorted(_links() - links_before):
        subprocess.run([*prefix, "ip", "link", "delete", link], capture_output=True, timeout=30)
        removed.append(f"link {link}")
    return removed


@dataclass
class Resources:
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)


@pytest.fixture
def resources(podman: Podman, image: str) -> Iterator[Resources]:
    """Containers/volumes a test registers are removed, then the host's network is restored."""
    net_before = _net_snapshot()
    links_before = _links()
    res = Resources()
    try:
        yield res
    finally:
        ids = []
        for c in res.containers:
            ids.append(podman.run("inspect", "--format", "{{.Id}}", c, check=False).stdout.strip())
            podman.run("rm", "--force", "--time", "0", c, check=False)
        for v in res.volumes:
            podman.run("volume", "rm", "--force", v, check=False)
        removed = _net_restore(podman, net_before, links_before)
        print("\nnetwork clean-up:", *removed, sep="\n  ")
        still = _net_snapshot()
        if not podman.run("ps", "-q", check=False).stdout.strip():
            for key, lines in still.items():
                assert sorted(lines) == sorted(net_before.get(key, lines)), f"{key} not restored"
            assert _links() <= links_before, _links() - links_before
        # No conmon (the container monitor) or container process of ours may be left.
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                for cid in filter(None, ids):
                    assert cid.encode() not in cmd, f"process {pid} of container {cid[:12]} is still running"


# --- the test -----------------------------------------------------------------------------


@dataclass
class Container:
    podman: Podman
    name: str
    port: int

    def wait_healthy(self) -> float:
        """Run the image's HEALTHCHECK until it passes (podman has no systemd timers here)."""
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < HEALTHY_TIMEOUT_S:
            state = self.podman.inspect(self.name, "{{.State.Status}}")
            if state not in ("running", "created", "configured"):
                fail_step("wait for healthy", f"container is {state}:\n{self.logs()}")
            last = self.podman.run("healthcheck", "run", self.name, check=False)
            if last.returncode == 0:
                assert self.podman.inspect(self.name, "{{.State.Health.Status}}") == "healthy"
                return time.monotonic() - t0
            time.sleep(0.5)
        fail_step("wait for healthy", f"not healthy after {HEALTHY_TIMEOUT_S}s: {last}\n{self.logs()}")
        raise AssertionError  # unreachable

    def logs(self) -> str:
        r = self.podman.run("logs", self.name, check=False)
        return r.stdout + r.stderr

    def exec(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return self.podman.run("exec", self.name, *cmd, check=False)

    def metadata(self, topic: str) -> dict[str, object]:
        with WireClient("127.0.0.1", self.port) as c:
            return codec.to_dict(c.call(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": True}))


def test_image_serves_clients_and_keeps_offsets_across_restart(
    podman: Podman, image: str, resources: Resources
) -> None:
    tag = uuid.uuid4().hex[:8]
    name, volume, port = f"rallypoint-test-{tag}", f"rallypoint-test-{tag}", free_port()
    resources.volumes.append(volume)
    podman.run("volume", "create", volume)
    resources.containers.append(name)
    podman.run(
        "run",
        "--detach",
        "--name",
        name,
        "--publish",
        f"127.0.0.1:{port}:9092",
        "--volume",
        f"{volume}:{DATA_VOLUME}",
        # docker-style configuration, as for the apache/kafka image
        "--env",
        f"KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://127.0.0.1:{port}",
        "--env",
        f"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS={INITIAL_DELAY_MS}",
        "--env",
        "KAFKA_NUM_PARTITIONS=2",
        image,
    )
    ctr = Container(podman, name, port)
    print(f"\nhealthy after {ctr.wait_healthy():.1f}s")

    # The image as configured: non-root, the probe as HEALTHCHECK, the volume, port 9092.
    conf = json.loads(podman.run("image", "inspect", image).stdout)[0]
    assert conf["Config"]["User"] == "10001:10001"
    assert "rallypoint probe" in " ".join(conf["Healthcheck"]["Test"]), "HEALTHCHECK lost (OCI format?)"
    assert list(conf["Config"]["Volumes"]) == [DATA_VOLUME]
    assert sorted(conf["Config"]["ExposedPorts"]) == ["9092/tcp", "9644/tcp"]  # Kafka, control plane
    assert ctr.exec("id", "-u").stdout.strip() == "10001"
    pid1 = ctr.exec("cat", "/proc/1/cmdline").stdout.replace("\0", " ")
    assert "/opt/rallypoint/bin/rallypoint" in pid1, f"PID 1 is not the broker: {pid1}"
    tools = ctr.exec("sh", "-c", "command -v gcc cc pip pip3 apt-get >/dev/null; ls /opt/rallypoint/bin")
    assert "pip" not in tools.stdout.split(), tools.stdout
    assert ctr.exec("sh", "-c", "command -v gcc || command -v cc").returncode != 0, "a compiler in the image"
    assert ctr.exec("test", "-e", "/root/.cache/pip").returncode != 0

    # Advertised listener and partitions from the environment; the broker bound 0.0.0.0 inside.
    md = ctr.metadata("image-topic")
    brokers = md["brokers"]
    assert isinstance(brokers, list)
    assert [(b["host"], b["port"]) for b in brokers] == [("127.0.0.1", port)]
    topics = md["topics"]
    assert isinstance(topics, list) and len(topics[0]["partitions"]) == 2
    cluster_id = md["cluster_id"]
    topic_id = topics[0]["topic_id"]
    assert "host=0.0.0.0" in ctr.logs()

    served = served_apis("127.0.0.1", port)
    not_yet: list[str] = []
    bootstrap = f"127.0.0.1:{port}"
    committed: dict[int, int] = {}
    group = f"image-group-{tag}"
    why_groups = pending(served, GROUP_APIS, "groups")
    why_data = pending(served, DATA_APIS, "data")
    if why_groups:
        not_yet.append(f"initial rebalance delay from KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS: {why_groups}")
    else:
        took = timed_first_join("127.0.0.1", port, f"delay-{tag}", served)
        assert INITIAL_DELAY_MS / 1000 * 0.9 <= took < INITIAL_DELAY_MS / 1000 + 8, (
            f"first JoinGroup took {took:.2f}s; KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS={INITIAL_DELAY_MS}"
        )
    produced: dict[int, int] = {}
    if why_data:
        not_yet.append(f"produce and consume: {why_data}")
    else:
        values = [f"v{i}".encode() for i in range(30)]
        produce(bootstrap, "image-topic", values)
        assert sorted(consume_assigned(bootstrap, "image-topic", [0, 1], len(values))) == sorted(values)
        produced = high_watermarks(bootstrap, "image-topic", [0, 1])
        assert sum(produced.values()) == len(values), produced
        if why_groups:
            not_yet.append(f"consume in a group and commit: {why_groups}")
        else:
            got, committed = consume_in_group(bootstrap, "image-topic", group, len(values))
            assert sorted(got) == sorted(values)
            assert committed == produced, (committed, produced)
    if not why_groups and not committed:
        # Without the data plane, a real client still commits (outside a generation).
        committed = {0: 7, 1: 11}
        commit_offsets(bootstrap, group, {("image-topic", p): o for p, o in committed.items()})
    if committed:
        assert committed_offsets(bootstrap, "image-topic", group, sorted(committed)) == committed

    # Stop (SIGTERM to PID 1: a clean exit) and start again on the same volume.
    podman.run("stop", "--time", "20", name, timeout=60)
    assert podman.inspect(name, "{{.State.ExitCode}}") == "0", ctr.logs()
    assert "stopped" in ctr.logs()
    podman.run("start", name)
    print(f"healthy again after {ctr.wait_healthy():.1f}s")
    md2 = ctr.metadata("image-topic")
    assert md2["cluster_id"] == cluster_id, "the data volume did not keep meta.properties"
    topics2 = md2["topics"]
    assert isinstance(topics2, list) and topics2[0]["topic_id"] == topic_id, "the volume did not keep the topic"
    if produced:
        # The records survive in the volume (docs/data-plane.md, "Durable topic data").
        assert high_watermarks(bootstrap, "image-topic", [0, 1]) == produced
        assert sorted(consume_assigned(bootstrap, "image-topic", [0, 1], len(values))) == sorted(values)
        # ... and a SIGKILL of the container's broker loses nothing acknowledged either.
        more = [f"w{i}".encode() for i in range(20)]
        produce(bootstrap, "image-topic", more)
        podman.run("kill", "--signal", "KILL", name, timeout=60)
        podman.run("start", name)
        print(f"healthy after a SIGKILL in {ctr.wait_healthy():.1f}s")
        got = consume_assigned(bootstrap, "image-topic", [0, 1], len(values) + len(more))
        assert sorted(got) == sorted(values + more), "records lost across a SIGKILL of the container"
    if committed:
        logs = ctr.exec("find", DATA_VOLUME, "-maxdepth", "1", "-name", "__consumer_offsets-*").stdout.split()
        if not logs:
            not_yet.append("committed offsets across a restart: no offsets log in the volume yet (branch offsets)")
        else:
            after = committed_offsets(bootstrap, "image-topic", group, sorted(committed))
            assert after == committed, f"committed offsets lost across restart: {after} != {committed}"
    if not_yet:
        pytest.fail(" | ".join(not_yet))
