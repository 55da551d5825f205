#!/usr/bin/env bash
# Builds cluster/podkubelet (a virtual-kubelet node that runs pods as processes; see its main.go
# and cluster/README.md) against github.com/virtual-kubelet/virtual-kubelet at
# VIRTUAL_KUBELET_VERSION (cluster/versions.env) from the Go module proxy, and caches the binary
# outside the repository under that version and a digest of the program's source, so a second
# run costs nothing.
#
#   cluster/podkubelet.sh    test and build if missing; print the binary's path on the last line
#
# Exit status 3 says the Go toolchain is missing (a test skips then); any other failure is the
# build's. Environment: INFERNETES_PODKUBELET_CACHE (default ~/.cache/infernetes/podkubelet),
# BUILD_NICE, GO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
src="$here/podkubelet"
version="$VIRTUAL_KUBELET_VERSION"
digest="$(gobuild_source_digest podkubelet.sh "$src" github.com/virtual-kubelet/virtual-kubelet "$version")"
cache_root="${INFERNETES_PODKUBELET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/podkubelet}"
out="$cache_root/virtual-kubelet-$version-$digest"
bin="$out/podkubelet"

built() { [[ -x "$bin" ]]; }
build() {
    cd "$src"
    export CGO_ENABLED=0
    # The provider's unit tests (status mapping, env expansion, the image map) gate the binary.
    gobuild_nice "$GO" test .
    gobuild_nice "$GO" build -o "$bin.tmp" .
    mv "$bin.tmp" "$bin"
}

gobuild_done built "$bin"
gobuild_toolchain podkubelet.sh
gobuild_cached podkubelet.sh "$out" "$bin" built build "podkubelet on virtual-kubelet $version"
