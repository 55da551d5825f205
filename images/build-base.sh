#!/usr/bin/env bash
# Makes a local Debian bookworm base image from Debian's own packages (debootstrap), so the
# Containerfile can be built without a container registry:
#
#   images/build-base.sh           build if missing; print the image name on the last line
#   images/build-base.sh --print   print the image name only
#
# The root filesystem is cached as a tarball under ~/.cache/infernetes/images (keyed by suite and
# package list), so a second run only re-imports it when podman's storage lost the image.
# Environment: INFERNETES_IMAGES_CACHE (cache dir), DEBIAN_MIRROR (default deb.debian.org).
set -euo pipefail

suite=bookworm
# python3.11-venv brings ensurepip: the Containerfile makes its virtualenv with the base's Python.
# It depends on the virtual package python3.11-distutils, which debootstrap cannot resolve
# (it ignores Provides), so the package that provides it is named here.
packages=python3.11,python3.11-venv,python3-distutils,ca-certificates
key="$(printf '%s %s' "$suite" "$packages" | sha256sum | cut -c1-12)"
image="localhost/infernetes-base:${suite}-${key}"

if [[ "${1:-}" == "--print" ]]; then
    echo "$image"
    exit 0
fi

cache="${INFERNETES_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/images}"
tarball="$cache/debian-${suite}-${key}.tar"
mkdir -p "$cache"
exec 9>"$cache/build-base.lock"
flock 9

if podman image exists "$image"; then
    echo "$image"
    exit 0
fi

if [[ ! -s "$tarball" ]]; then
    command -v debootstrap >/dev/null || { echo "build-base.sh: debootstrap is not installed" >&2; exit 1; }
    rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
    trap 'rm -rf "$rootfs"' EXIT
    start=$(date +%s)
    if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2; then
        cp "$rootfs/debootstrap/debootstrap.log" "$cache/debootstrap-failed.log" 2>/dev/null || true
        echo "build-base.sh: debootstrap failed; its log: $cache/debootstrap-failed.log" >&2
        exit 1
    fi
    # What a container base image leaves out: downloaded packages and the index files.
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    echo "build-base.sh: debootstrap of $suite took $(($(date +%s) - start)) s" >&2
fi

podman import --change 'CMD ["/bin/bash"]' "$tarball" "$image" >&2
echo "$image"
