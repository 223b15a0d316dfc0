# syntax=docker/dockerfile:1
# rallypoint: a Kafka-compatible test broker.   docker build -t rallypoint .
# (docs/docker.md: running, configuration, compose, the advertised-listener pitfall.)
#
# BASE_IMAGE is the base of both stages.  The default, python:3.11-slim, already has Python;
# a bare Debian bookworm image works too (docker/build-local.sh builds from one made with
# debootstrap): docker/ensure-python.sh then installs Debian's python3 (3.11) with apt.
ARG BASE_IMAGE=python:3.11-slim

# --- stage 1: wheels of rallypoint and of all its dependencies -------------------------------
FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY docker/ensure-python.sh /usr/local/lib/rallypoint/
RUN sh /usr/local/lib/rallypoint/ensure-python.sh build
WORKDIR /src
# Dependencies first, in a layer of their own that only pyproject.toml invalidates, so a code
# change does not download them again.  --only-binary: they come as published wheels only (kio,
# crc32c, msgspec and uvloop have native code and ship manylinux wheels for x86_64 and aarch64), so no
# stage ever needs a compiler.  The build venv also gets rallypoint's build backend.
# Optional secret "pip-ca": a CA bundle for pip, on networks that re-sign TLS with their own CA
# (docker build --secret id=pip-ca,src=/path/to/ca-bundle.crt .).  Only this stage sees it.
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip-ca,target=/run/secrets/pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -m venv /opt/build-venv \
    && /opt/build-venv/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
open('/tmp/backend.txt', 'w').write('\n'.join(p['build-system']['requires'])); \
open('/tmp/dependencies.txt', 'w').write('\n'.join(p['project']['dependencies']))" \
    && /opt/build-venv/bin/pip install --only-binary=:all: --requirement /tmp/backend.txt \
    && /opt/build-venv/bin/pip wheel --only-binary=:all: --wheel-dir /wheels --requirement /tmp/dependencies.txt \
    && rm /tmp/dependencies.txt /tmp/backend.txt
# rallypoint itself, built from the source tree, offline; with no compiler here its optional
# compiled extensions are skipped (docs/docker.md).
COPY README.md ./
COPY protocol/ protocol/
COPY coordinator/ coordinator/
COPY pipeline/ pipeline/
RUN /opt/build-venv/bin/pip wheel --no-deps --no-index --no-build-isolation --wheel-dir /wheels . \
    && rm -rf build ./*.egg-info \
    && sha256sum /wheels/*.whl > /wheels/SHA256SUMS

# --- stage 2: the runtime ---------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
COPY docker/ensure-python.sh /usr/local/lib/rallypoint/
RUN sh /usr/local/lib/rallypoint/ensure-python.sh runtime
# Install the wheels from stage 1 into a venv without pip: stage 1's pip does it (--python), and
# both its venv and the wheels are mounted, not copied, so they leave nothing behind.
# Only the wheels' checksums are copied: a build cache (buildah's at least) does not look into a
# RUN's mounts, but a changed COPY invalidates every step after it; they also record what is inside.
COPY --from=build /wheels/SHA256SUMS /opt/rallypoint/wheels.sha256
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/opt/build-venv,target=/opt/build-venv \
    sha256sum --check --quiet /opt/rallypoint/wheels.sha256 \
    && python3 -m venv --without-pip /opt/rallypoint \
    && /opt/build-venv/bin/pip --python /opt/rallypoint/bin/python install --no-cache-dir \
        --disable-pip-version-check --no-index --only-binary=:all: --find-links=/wheels rallypoint \
    && /opt/rallypoint/bin/python -c "import rallypoint.cli, rallypoint.protocol.codec"

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 rallypoint \
    && useradd --system --uid 10001 --gid rallypoint --no-create-home \
        --home-dir /var/lib/rallypoint --shell /usr/sbin/nologin rallypoint \
    && mkdir -p /var/lib/rallypoint \
    && chown rallypoint:rallypoint /var/lib/rallypoint \
    && chmod 0750 /var/lib/rallypoint
COPY docker/entrypoint.sh /usr/local/bin/rallypoint-entrypoint

ENV PATH=/opt/rallypoint/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /var/lib/rallypoint
VOLUME ["/var/lib/rallypoint"]
# 9092: Kafka; 9644: the control plane (HTTP: faults, waits, clock, request log; docs/control.md).
EXPOSE 9092 9644
# The bundled probe: one ApiVersions round trip to the broker; exit 0 healthy, 1 not.
# Through sh so that a KAFKA_PORT given to the container is the port probed.
HEALTHCHECK --interval=5s --timeout=5s --start-period=10s --retries=3 \
    CMD ["sh", "-c", "exec rallypoint probe --quiet --timeout 3 --host 127.0.0.1 --port \"${KAFKA_PORT:-9092}\""]
ENTRYPOINT ["/usr/local/bin/rallypoint-entrypoint"]
