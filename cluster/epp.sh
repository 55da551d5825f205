#!/usr/bin/env bash
# Builds the Gateway API Inference Extension's endpoint picker (its cmd/epp, the program of the
# image the operator's spec.routing renders) and cluster/epp (epp-pick, an Envoy ext-proc client
# that asks it for an endpoint) against sigs.k8s.io/gateway-api-inference-extension at
# INFERENCE_EXTENSION_VERSION (cluster/versions.env) from the Go module proxy, and caches both
# outside the repository under that version and a digest of the client's source.
#
#   cluster/epp.sh    build if missing; print the picker's path on the last line (epp-pick is
#                     beside it)
#
# Exit status 3 says the Go toolchain is missing (a test skips then); any other failure is the
# build's. Environment: INFERNETES_EPP_CACHE (default ~/.cache/infernetes/epp), BUILD_NICE, GO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
src="$here/epp"
version="$INFERENCE_EXTENSION_VERSION"
module=sigs.k8s.io/gateway-api-inference-extension
digest="$(gobuild_source_digest epp.sh "$src" "$module" "$version")"
cache_root="${INFERNETES_EPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/epp}"
out="$cache_root/gateway-api-inference-extension-$version-$digest"

built() { [[ -x "$out/epp" && -x "$out/epp-pick" ]]; }
build() {
    cd "$src"
    export CGO_ENABLED=0
    gobuild_nice "$GO" build -o "$out/epp.tmp" "$module/cmd/epp"
    gobuild_nice "$GO" build -o "$out/epp-pick.tmp" .
    mv "$out/epp-pick.tmp" "$out/epp-pick"
    mv "$out/epp.tmp" "$out/epp"
}

gobuild_done built "$out/epp"
gobuild_toolchain epp.sh
gobuild_cached epp.sh "$out" "$out/epp" built build "the endpoint picker ($version)"
