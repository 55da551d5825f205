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
src="$here/epp"
version="$INFERENCE_EXTENSION_VERSION"
module=sigs.k8s.io/gateway-api-inference-extension
grep -q "$module $version\$" "$src/go.mod" || {
    echo "epp.sh: $src/go.mod does not require $module $version" >&2
    exit 1
}
digest="$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)"
cache_root="${INFERNETES_EPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/epp}"
out="$cache_root/gateway-api-inference-extension-$version-$digest"

if [[ -x "$out/epp" && -x "$out/epp-pick" ]]; then
    echo "$out/epp"
    exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { echo "epp.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 3; }
mkdir -p "$out"
exec 9>"$out/build.lock"
flock 9
if [[ -x "$out/epp" && -x "$out/epp-pick" ]]; then
    echo "$out/epp"
    exit 0
fi
start=$(date +%s)
echo "epp.sh: building the endpoint picker ($version) ..." >&2
(cd "$src" && export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" &&
    nice -n "${BUILD_NICE:-10}" "$GO" build -o "$out/epp.tmp" "$module/cmd/epp" &&
    nice -n "${BUILD_NICE:-10}" "$GO" build -o "$out/epp-pick.tmp" .) >"$out/build.log" 2>&1 || {
    tail -40 "$out/build.log" >&2
    exit 1
}
mv "$out/epp-pick.tmp" "$out/epp-pick"
mv "$out/epp.tmp" "$out/epp"
echo "epp.sh: built in $(($(date +%s) - start)) s" | tee -a "$out/build.log" >&2
echo "$out/epp"
