#!/bin/sh
# Make sure an image stage has Python >= 3.11.  Used by both Dockerfile stages:
#
#   ensure-python.sh build     python3 with venv and ensurepip (pip), and CA certificates
#   ensure-python.sh runtime   python3 with venv (the runtime venv is made --without-pip)
#
# - python:3.11-slim (the default base) already has all of it: nothing is installed.
# - A bare Debian bookworm base (docker/build-local.sh makes one with debootstrap) has no Python:
#   install Debian's python3 (3.11 on bookworm) -- plus python3-venv and ca-certificates for the
#   build stage -- then drop apt's lists and caches so the layer carries only the packages.
set -eu

case "${1:-}" in
    build)
        check='import ensurepip, venv'
        packages="python3 python3-venv ca-certificates"
        ;;
    runtime)
        check='import venv'
        packages="python3"
        ;;
    *)
        echo "usage: ensure-python.sh build|runtime" >&2
        exit 2
        ;;
esac

have_python() {
    command -v python3 >/dev/null 2>&1 &&
        python3 -c "import sys; $check; sys.exit(0 if sys.version_info >= (3, 11) else 1)" 2>/dev/null
}

if have_python; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-python: the base image has no python3 >= 3.11 and no apt-get to install it" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086 # a list of package names
apt-get install -y --no-install-recommends $packages
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log
if ! have_python; then
    echo "ensure-python: installed Debian's $packages, but python3 is not >= 3.11 (base too old?)" >&2
    python3 --version >&2 || true
    exit 1
fi
