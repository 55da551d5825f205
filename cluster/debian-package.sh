#!/usr/bin/env bash
# Installs a Debian package when a command it provides, or a library pkg-config knows it by, is
# missing:
#
#   cluster/debian-package.sh COMMAND PACKAGE
#   cluster/debian-package.sh --pkg-config MODULE PACKAGE    e.g. --pkg-config libzmq libzmq3-dev
#
# A no-op when COMMAND (or MODULE) is found; without root (or sudo) it says what to install and
# exits 0 (the tests that need it skip). The package's service, if any, is not started: without
# systemd (containers, CI) there is none.
set -euo pipefail

if [[ $1 == --pkg-config ]]; then
    module="$2" package="$3"
    pkg-config --exists "$module" 2>/dev/null && exit 0
    missing="pkg-config's $module"
else
    command="$1" package="$2"
    command -v "$command" >/dev/null && exit 0
    missing="$command"
fi
if [[ $(id -u) == 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "debian-package.sh: $missing is missing; install with: apt-get install $package" >&2
    exit 0
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "$package" >/dev/null
