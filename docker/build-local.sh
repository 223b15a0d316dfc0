#!/usr/bin/env bash
# Build the rallypoint image on a machine with no Docker engine and no reachable container
# registry, using Debian's podman:
#
#   1. installs podman, buildah, runc and debootstrap with apt (only if one is missing);
#   2. points podman at docker/podman/containers.conf (runc, ulimits; see the file);
#   3. makes a Debian bookworm base image once with debootstrap --variant=minbase, from the
#      Debian mirror this machine's apt already uses, and imports it as BASE (kept as a cache:
#      skipped when it exists);
#   4. builds ./Dockerfile with --build-arg BASE_IMAGE=BASE as IMAGE (docker format, so the
#      HEALTHCHECK is kept), removes the image it replaces, and prints the image size.
#
# Environment: IMAGE (default localhost/rallypoint:local; stage 1 is kept as NAME-build:TAG),
# BASE (default localhost/debian-local:bookworm), REBUILD_BASE=1 to remake BASE,
# DEBIAN_MIRROR (default: the one in /etc/apt/sources.list{,.d/*}).
# The last line of output is the image name.  Run as root (or with sudo available).
# `build-local.sh --print-mirror` only prints the Debian mirror it would use.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-localhost/rallypoint:local}
BASE=${BASE:-localhost/debian-local:bookworm}
case "${IMAGE##*/}" in *:*) ;; *) IMAGE=$IMAGE:latest ;; esac
BUILD_IMAGE=${IMAGE%:*}-build:${IMAGE##*:}
SUITE=bookworm
export CONTAINERS_CONF="$ROOT/docker/podman/containers.conf"

step() { printf '== %s\n' "$*" >&2; }
die() {
    printf 'build-local.sh: %s\n' "$*" >&2
    exit 1
}

# The Debian mirror apt uses on this machine (never hard-coded).
debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local files=() etc=${APT_ETC:-/etc/apt}
    [ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
    for f in "$etc"/sources.list.d/*.list "$etc"/sources.list.d/*.sources; do
        [ -f "$f" ] && files+=("$f")
    done
    [ "${#files[@]}" -gt 0 ] || return 0
    # One-line ("deb [opts] URI SUITE ...") and deb822 ("Types:/URIs:/Suites:") entries; the
    # first enabled "deb" entry for SUITE wins, else the first one whose URI path ends in /debian.
    awk -v suite="$SUITE" '
        function consider(types, uris, suites, enabled,   n, u, i, s) {
            if (enabled ~ /^[Nn]o$/ || (" " types " ") !~ / deb /) return
            n = split(uris, u, /[ \t]+/)
            if (n == 0 || u[1] == "") return
            split(suites, s, /[ \t]+/)
            for (i in s) if (s[i] == suite && exact == "") exact = u[1]
            if (fallback == "" && u[1] ~ /\/debian\/?$/) fallback = u[1]
        }
        FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
        function flush() {
            if (t != "" || uri != "") consider(t, uri, su, en)
            t = ""; uri = ""; su = ""; en = ""
        }
        /^[ \t]*#/ { next }
        deb822 && /^[ \t]*$/ { flush(); next }
        deb822 && /^Types:/ { sub(/^Types:[ \t]*/, ""); t = $0; next }
        deb822 && /^URIs:/ { sub(/^URIs:[ \t]*/, ""); uri = $0; next }
        deb822 && /^Suites:/ { sub(/^Suites:[ \t]*/, ""); su = $0; next }
        deb822 && /^Enabled:/ { sub(/^Enabled:[ \t]*/, ""); en = $0; next }
        !deb822 && $1 == "deb" {
            i = 2
            if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            consider("deb", $i, $(i + 1), "")
        }
        END { flush(); print (exact != "" ? exact : fallback) }
    ' "${files[@]}"
}


if [ "${1:-}" = "--print-mirror" ]; then # the mirror step 2 would use (APT_ETC: another /etc/apt)
    debian_mirror
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "needs root (apt-get, debootstrap, rootful podman) and sudo is not installed"
    exec sudo --preserve-env=IMAGE,BASE,DEBIAN_MIRROR,REBUILD_BASE "$0" "$@"
fi

# One build at a time on a machine (two test runs may start it together).
if command -v flock >/dev/null 2>&1; then
    exec 9>"${RALLYPOINT_BUILD_LOCK:-/run/lock/rallypoint-build-local.lock}"
    flock 9
fi

# --- 1. tools -----------------------------------------------------------------------------------
missing=()
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
    step "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "step 'apt-get update' failed"
    apt-get install -y -qq --no-install-recommends podman buildah runc debootstrap >/dev/null ||
        die "step 'apt-get install podman buildah runc debootstrap' failed"
fi
step "$(podman --version), $(runc --version | head -n1)"

base_exists() { podman image exists "$BASE"; }

# --- 2. the local Debian base image (cached) -----------------------------------------------------
if [ "${REBUILD_BASE:-0}" = 1 ] && base_exists; then
    podman rmi "$BASE" >/dev/null
fi
if base_exists; then
    step "base image $BASE exists (cached; REBUILD_BASE=1 remakes it)"
else
    mirror=$(debian_mirror)
    [ -n "$mirror" ] || die "step 'find the Debian mirror' failed: no deb entry in /etc/apt/sources.list{,.d} (set DEBIAN_MIRROR)"
    rootfs=$(mktemp -d /var/tmp/rallypoint-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    step "debootstrap --variant=minbase $SUITE from $mirror"
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
        tail -n 20 "$rootfs.log" >&2
        rm -f "$rootfs.log"
        die "step 'debootstrap $SUITE' failed"
    }
    rm -f "$rootfs.log"
    # Slim, like Debian's own -slim images: no documentation (but the copyright files), manual
    # pages or translations, now and for everything apt installs later; no apt lists or .debs.
    cat >"$rootfs/etc/dpkg/dpkg.cfg.d/rallypoint-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
EOF
    find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,locale}/* \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*
    step "importing it as $BASE"
    tar -C "$rootfs" -c . | podman import --message "debootstrap --variant=minbase $SUITE" - "$BASE" >/dev/null ||
        die "step 'podman import' failed"
    rm -rf "$rootfs"
    trap - EXIT
fi

# --- 3. the image ---------------------------------------------------------------------------------
# pip in the build stage must trust what this machine trusts (some networks re-sign TLS with
# their own CA): hand the host's CA bundle to it as the Dockerfile's optional "pip-ca" secret,
# which only that RUN step sees; nothing of it reaches the image.
secret_args=()
for bundle in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -n "$bundle" ] && [ -f "$bundle" ]; then
        secret_args=(--secret "id=pip-ca,src=$bundle")
        break
    fi
done

# Stage 1 is tagged too (BUILD_IMAGE), so that it is not a dangling image: it is the layer cache
# that makes the next build fast.  Images that a new build replaces are removed.
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
build() {
    podman build --format docker --pull=never --network=host --build-arg "BASE_IMAGE=$BASE" "${secret_args[@]}" \
        -f "$ROOT/Dockerfile" "$@" "$ROOT" >&2
}
old_ids="$(image_id "$BUILD_IMAGE") $(image_id "$IMAGE")"
step "podman build $IMAGE (BASE_IMAGE=$BASE)"
build --target build -t "$BUILD_IMAGE" || die "step 'podman build --target build' failed"
build -t "$IMAGE" || die "step 'podman build' failed"
new_ids="$(image_id "$BUILD_IMAGE") $(image_id "$IMAGE")"
for id in $old_ids; do
    case " $new_ids " in
        *" $id "*) ;;
        *) podman rmi "$id" >/dev/null 2>&1 || true ;; # still used by a container: keep it
    esac
done

size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
step "image $IMAGE: $((size / 1000000)) MB ($size bytes)"
echo "$IMAGE"
