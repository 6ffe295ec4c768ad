#!/bin/sh
# Install redis-server from Debian when missing: the rate-limit tests start their own
# redis-server (a free loopback port, no persistence) to check limits shared across
# replicas. Idempotent: does nothing when redis-server is on PATH.
set -eu
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the server binary only (redis-tools comes as a dependency)
$SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
