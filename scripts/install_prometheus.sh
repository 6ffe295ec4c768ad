#!/bin/sh
# Install Prometheus (server + promtool) from Debian when missing: the metrics tests scrape
# a running InferFlux with a real Prometheus, and CI checks deploy/prometheus/alerts.yml
# with promtool. Idempotent: does nothing when both binaries are on PATH.
set -eu
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the server and promtool only (no node exporter, no web assets)
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
