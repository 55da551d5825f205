#!/usr/bin/env bash
# Installs Debian's prometheus package when `prometheus` is missing: e2e/test_prometheus_scrape.py
# runs the real server against a locally started runtime. A no-op when present; without root (or
# sudo) it says what to install and that test skips.
set -euo pipefail

command -v prometheus >/dev/null && exit 0
if [[ $(id -u) == 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "prometheus.sh: prometheus is missing; install with: apt-get install prometheus" >&2
    exit 0
fi
"${sudo[@]}" apt-get update -qq
# The package's service is not started: without systemd (containers, CI) there is none, and the
# test runs its own server on a free port.
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
