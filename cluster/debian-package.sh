#!/usr/bin/env bash
# Installs a Debian package when a command it provides is missing:
#
#   cluster/debian-package.sh COMMAND PACKAGE
#
# A no-op when COMMAND is found; without root (or sudo) it says what to install and exits 0 (the
# tests that need it skip). The package's service, if any, is not started: without systemd
# (containers, CI) there is none.
set -euo pipefail

command="$1" package="$2"
command -v "$command" >/dev/null && exit 0
if [[ $(id -u) == 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "debian-package.sh: $command is missing; install with: apt-get install $package" >&2
    exit 0
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "$package" >/dev/null
