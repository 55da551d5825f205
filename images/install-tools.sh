#!/usr/bin/env bash
# Installs what building the images needs, from Debian's packages, when it is missing:
# podman and buildah (build with --isolation=chroot, no daemon), debootstrap (the local base
# image), fuse-overlayfs and uidmap (podman's storage). A no-op when all are present; without
# root (or sudo) it says what to install and leaves the image tests to skip.
set -euo pipefail

missing=()
for tool in podman buildah debootstrap fuse-overlayfs newuidmap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
((${#missing[@]} == 0)) && exit 0

packages=(podman buildah debootstrap fuse-overlayfs uidmap)
if [[ $(id -u) == 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "install-tools.sh: missing ${missing[*]}; install with: apt-get install ${packages[*]}" >&2
    exit 0
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
