#!/bin/sh
# Make sure an image stage has Python >= 3.11 with the venv module.  Used by both Dockerfile stages.
#
#   ensure-python.sh [EXTRA_DEBIAN_PACKAGE ...]
#
# - python:3.11-slim (the default base) already has it: nothing is installed, nothing changes.
# - A bare Debian bookworm base (docker/build-local.sh makes one with debootstrap) has no Python:
#   install Debian's python3 (3.11 on bookworm) and python3-venv, plus the extra packages given
#   (the build stage asks for ca-certificates so pip can reach PyPI over HTTPS), then drop apt's
#   lists and caches so the layer carries only the packages.
set -eu

have_python() {
    command -v python3 >/dev/null 2>&1 &&
        python3 -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null
}

if have_python; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-python: the base image has no python3 >= 3.11 (with venv) and no apt-get to install it" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv "$@"
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log
if ! have_python; then
    echo "ensure-python: installed Debian's python3, but it is not >= 3.11 with venv (base too old?)" >&2
    python3 --version >&2 || true
    exit 1
fi
