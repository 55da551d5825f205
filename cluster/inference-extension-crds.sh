#!/usr/bin/env bash
# Fetches the Gateway API Inference Extension's CustomResourceDefinitions (config/crd/bases/*.yaml
# of the module sigs.k8s.io/gateway-api-inference-extension at INFERENCE_EXTENSION_VERSION,
# cluster/versions.env) through the Go module proxy, checked against the checksum database, and
# caches them outside the repository. The endpoint picker is not built: the e2e tests need the API
# server to serve and validate InferencePools, no more.
#
#   cluster/inference-extension-crds.sh      fetch if missing; print the directory of the YAML
#
# Environment: INFERNETES_INFERENCE_EXTENSION_CACHE (default
# ~/.cache/infernetes/inference-extension), GO (go binary).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

module=sigs.k8s.io/gateway-api-inference-extension
cache_root="${INFERNETES_INFERENCE_EXTENSION_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/inference-extension}"
out="$cache_root/$INFERENCE_EXTENSION_VERSION/crds"
if compgen -G "$out/inference.networking.k8s.io_*.yaml" >/dev/null; then
    echo "$out"
    exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { echo "inference-extension-crds.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 1; }
mkdir -p "$cache_root"
exec 9>"$cache_root/fetch.lock"
flock 9
if ! compgen -G "$out/inference.networking.k8s.io_*.yaml" >/dev/null; then
    dir="$(GOTOOLCHAIN=local "$GO" mod download -json "$module@$INFERENCE_EXTENSION_VERSION" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$dir/config/crd/bases" ]] || { echo "inference-extension-crds.sh: no config/crd/bases in $dir" >&2; exit 1; }
    mkdir -p "$out.new"
    cp "$dir"/config/crd/bases/*.yaml "$out.new/"
    chmod u+w "$out.new"/*.yaml
    rm -rf "$out"
    mv "$out.new" "$out"
fi
echo "$out"
