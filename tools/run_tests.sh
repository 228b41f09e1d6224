#!/usr/bin/env bash
# Installs everything the tests need on a fresh Debian machine, then runs every test.
# Usage: bash tools/run_tests.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 || { ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; }; then
  # Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser), and nginx for the
  # shipped reverse-proxy configuration's test (tests/test_hosting_proxy.py; not started as a service)
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core \
    nginx-light >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -r requirements-dev.txt -r requirements-cluster.txt
python3 -m pytest "$@"
