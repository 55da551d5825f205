#!/usr/bin/env bash
# Installs Debian's prometheus package when `prometheus` is missing: e2e/test_prometheus_scrape.py
# runs the real server against a locally started runtime (the test runs its own server on a free
# port). A no-op when present; without root (or sudo) it says what to install and that test skips.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/debian-package.sh" prometheus prometheus
