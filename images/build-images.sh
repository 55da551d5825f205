#!/usr/bin/env bash
# `make images`: builds the runtime and operator images with podman.
#
#   images/build-images.sh [target ...]     targets: runtime operator (default both)
#
# Environment:
#   BASE_IMAGE   the base image (default: the Containerfile's, a Debian bookworm image from a
#                registry); `debootstrap` makes a local one from Debian packages instead
#                (images/build-base.sh), for machines that reach no container registry.
#   IMAGE_REPO   image names' prefix (default localhost/infernetes); the runtime image is
#                $IMAGE_REPO:$IMAGE_TAG, the operator $IMAGE_REPO-operator:$IMAGE_TAG.
#   IMAGE_TAG    default: the version in pyproject.toml.
#   ISOLATION    podman build --isolation (default chroot: works without a daemon or user
#                namespaces, e.g. inside another container).
#   CA_BUNDLE    a CA bundle mounted over the image's during the build only, for networks whose
#                TLS proxy signs with a local CA (pip would not trust PyPI otherwise). Default:
#                the host's bundle when the host trusts extra CAs (/usr/local/share/ca-certificates).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
targets=("$@")
((${#targets[@]})) || targets=(runtime operator)
repo="${IMAGE_REPO:-localhost/infernetes}"
tag="${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml")}"

build_args=()
case "${BASE_IMAGE:-}" in
    "") ;;
    debootstrap) build_args+=(--build-arg "BASE_IMAGE=$("$root/images/build-base.sh" | tail -1)") ;;
    *) build_args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE") ;;
esac

ca_bundle="${CA_BUNDLE:-}"
if [[ -z "$ca_bundle" ]] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    ca_bundle=/etc/ssl/certs/ca-certificates.crt
fi
[[ -n "$ca_bundle" ]] && build_args+=(--volume "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro")

for target in "${targets[@]}"; do
    case "$target" in
        runtime) name="$repo:$tag" ;;
        operator) name="$repo-operator:$tag" ;;
        *) echo "build-images.sh: unknown target '$target'; allowed: runtime operator" >&2; exit 2 ;;
    esac
    start=$(date +%s)
    podman build --isolation="${ISOLATION:-chroot}" "${build_args[@]}" \
        --file "$root/Containerfile" --target "$target" --tag "$name" "$root"
    echo "build-images.sh: $name built in $(($(date +%s) - start)) s" >&2
done
