#!/usr/bin/env bash
# Builds cluster/kvindexer (llm-d's KV-cache indexer run on its own, for a test to query; see its
# main.go) against github.com/llm-d/llm-d-kv-cache-manager at LLMD_KV_CACHE_MANAGER_VERSION
# (cluster/versions.env) from the Go module proxy, and caches the binary outside the repository
# under that version and a digest of the program's source, so a second run costs nothing.
#
#   cluster/kvindexer.sh    build if missing; print the binary's path on the last line
#
# llm-d's ZMQ binding is cgo (github.com/pebbe/zmq4): it needs a C compiler, pkg-config and
# libzmq's headers (Debian: libzmq3-dev). Exit status 3 says one of those is missing (a test
# skips then); any other failure is the build's.
# Environment: INFERNETES_KVINDEXER_CACHE (default ~/.cache/infernetes/kvindexer), BUILD_NICE, GO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
src="$here/kvindexer"
version="$LLMD_KV_CACHE_MANAGER_VERSION"
grep -q "github.com/llm-d/llm-d-kv-cache-manager $version\$" "$src/go.mod" || {
    echo "kvindexer.sh: $src/go.mod does not require llm-d-kv-cache-manager $version" >&2
    exit 1
}
digest="$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)"
cache_root="${INFERNETES_KVINDEXER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/kvindexer}"
out="$cache_root/llm-d-kv-cache-manager-$version-$digest"
bin="$out/kvindexer"

if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { echo "kvindexer.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 3; }
command -v cc >/dev/null || { echo "kvindexer.sh: no C compiler (llm-d's ZMQ binding is cgo)" >&2; exit 3; }
pkg-config --exists libzmq 2>/dev/null || {
    echo "kvindexer.sh: no libzmq for pkg-config (Debian: apt-get install libzmq3-dev pkg-config)" >&2
    exit 3
}
mkdir -p "$out"
exec 9>"$out/build.lock"
flock 9
if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi
start=$(date +%s)
echo "kvindexer.sh: building llm-d's indexer ($version) ..." >&2
(cd "$src" && CGO_ENABLED=1 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" \
    nice -n "${BUILD_NICE:-10}" "$GO" build -o "$bin.tmp" .) >"$out/build.log" 2>&1 || {
    tail -40 "$out/build.log" >&2
    exit 1
}
mv "$bin.tmp" "$bin"
echo "kvindexer.sh: built in $(($(date +%s) - start)) s" | tee -a "$out/build.log" >&2
echo "$bin"
