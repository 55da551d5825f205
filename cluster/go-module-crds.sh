#!/usr/bin/env bash
# Fetches CustomResourceDefinitions out of a Go module (KEDA's, the Gateway API's, the Gateway API
# Inference Extension's) through the Go module proxy, checked against the checksum database, and
# caches them outside the repository. Nothing is built: the e2e tests need the API server to serve
# and validate the kinds, no more.
#
#   cluster/go-module-crds.sh MODULE VERSION GLOB
#       e.g. cluster/go-module-crds.sh sigs.k8s.io/gateway-api v1.4.0 'config/crd/standard/*.yaml'
#
# GLOB is relative to the module's root. Prints the directory holding the copied YAML files
# (fetched once; later calls only print it). Versions are pinned in cluster/versions.env.
#
# Environment: INFERNETES_CRD_CACHE (default ~/.cache/infernetes/crds), GO (go binary).
set -euo pipefail

# shellcheck source=gobuild.sh
source "$(dirname "${BASH_SOURCE[0]}")/gobuild.sh"

[[ $# -eq 3 ]] || { echo "usage: $0 MODULE VERSION GLOB" >&2; exit 2; }
module="$1" version="$2" glob="$3"

cache_root="${INFERNETES_CRD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/crds}"
# One directory per module, version and glob: two globs of one module never share a cache.
key="$(printf '%s' "$glob" | sha256sum | cut -c1-12)"
out="$cache_root/${module//\//_}/$version/$key"
if [[ -f "$out/.complete" ]]; then
    echo "$out"
    exit 0
fi

gobuild_toolchain go-module-crds.sh
mkdir -p "$cache_root"
exec 9>"$cache_root/fetch.lock"
flock 9
if [[ ! -f "$out/.complete" ]]; then
    dir="$(gobuild_module_dir "$module@$version")"
    [[ -d "$dir" ]] || { echo "go-module-crds.sh: $module@$version did not download" >&2; exit 1; }
    shopt -s nullglob
    # shellcheck disable=SC2206  # the glob is meant to expand
    files=("$dir"/$glob)
    [[ ${#files[@]} -gt 0 ]] || { echo "go-module-crds.sh: nothing matches $glob in $module@$version" >&2; exit 1; }
    rm -rf "$out.new"
    mkdir -p "$out.new"
    cp "${files[@]}" "$out.new/"
    chmod u+w "$out.new"/*
    touch "$out.new/.complete"
    rm -rf "$out"
    mv "$out.new" "$out"
fi
echo "$out"
