#!/bin/sh
# Install Debian's chromium and chromium-driver when missing: the web console's browser
# tests (tests/integration/test_console_browser.py) drive the system browser headless
# through Selenium with /usr/bin/chromedriver, so nothing is downloaded at test time.
# Idempotent: does nothing when both are on PATH; `apt-get update` only when installing.
set -eu
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
