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
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
src="$here/kvindexer"
version="$LLMD_KV_CACHE_MANAGER_VERSION"
digest="$(gobuild_source_digest kvindexer.sh "$src" github.com/llm-d/llm-d-kv-cache-manager "$version")"
cache_root="${INFERNETES_KVINDEXER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/kvindexer}"
out="$cache_root/llm-d-kv-cache-manager-$version-$digest"
bin="$out/kvindexer"

built() { [[ -x "$bin" ]]; }
build() {
    cd "$src"
    export CGO_ENABLED=1
    gobuild_nice "$GO" build -o "$bin.tmp" .
    mv "$bin.tmp" "$bin"
}

gobuild_done built "$bin"
gobuild_toolchain kvindexer.sh
command -v cc >/dev/null || gobuild_missing kvindexer.sh "no C compiler (llm-d's ZMQ binding is cgo)"
pkg-config --exists libzmq 2>/dev/null ||
    gobuild_missing kvindexer.sh "no libzmq for pkg-config (Debian: apt-get install libzmq3-dev pkg-config)"
gobuild_cached kvindexer.sh "$out" "$bin" built build "llm-d's indexer ($version)"
