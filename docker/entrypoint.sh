#!/bin/sh
# Container entrypoint of the rallypoint image.
#
# Configuration comes from the environment, as with the apache/kafka image: every setting is
# KAFKA_<KEY> with dots turned into underscores (KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS=0,
# KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://localhost:9092, KAFKA_ADVERTISED_HOST=...).  The broker
# reads those itself (coordinator/config.py); this script only sets the container defaults:
#
#   KAFKA_HOST      0.0.0.0              bind every interface, so a published port reaches it
#   KAFKA_PORT      9092
#   KAFKA_DATA_DIR  /var/lib/rallypoint  the image's VOLUME (unless KAFKA_LOG_DIRS names one)
#   RALLYPOINT_LOG_FORMAT console|json   RALLYPOINT_LOG_LEVEL debug|info|warning|error
#
# Arguments: none or flags (--config k=v ...) run the broker with them; `probe ...` or
# `certs ...` (a throwaway CA and broker certificate, docs/security.md) runs that rallypoint
# subcommand; anything else (e.g. `sh`) is executed as given.
# The broker is exec'ed, so it is PID 1 and receives SIGTERM/SIGINT from `docker stop` directly.
set -eu

: "${KAFKA_HOST:=0.0.0.0}"
: "${KAFKA_PORT:=9092}"
export KAFKA_HOST KAFKA_PORT
if [ -z "${KAFKA_DATA_DIR:-}" ] && [ -z "${KAFKA_LOG_DIRS:-}" ]; then
    KAFKA_DATA_DIR=/var/lib/rallypoint
    export KAFKA_DATA_DIR
fi

case "${1:-}" in
    "" | -*)
        data_dir=${KAFKA_DATA_DIR:-${KAFKA_LOG_DIRS%%,*}}
        if [ -d "$data_dir" ] && [ ! -w "$data_dir" ]; then
            echo "rallypoint: data directory $data_dir is not writable by uid $(id -u)." >&2
            echo "  Mount a volume there that this user may write (a named volume is set up for you)," >&2
            echo "  or run with --user matching the owner of the host directory." >&2
            exit 1
        fi
        exec rallypoint \
            --log-format "${RALLYPOINT_LOG_FORMAT:-console}" \
            --log-level "${RALLYPOINT_LOG_LEVEL:-info}" \
            "$@"
        ;;
    probe | certs)
        exec rallypoint "$@"
        ;;
    *)
        exec "$@"
        ;;
esac
