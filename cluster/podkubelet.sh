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
src="$here/podkubelet"
version="$VIRTUAL_KUBELET_VERSION"
grep -q "github.com/virtual-kubelet/virtual-kubelet $version\$" "$src/go.mod" || {
    echo "podkubelet.sh: $src/go.mod does not require virtual-kubelet $version" >&2
    exit 1
}
digest="$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -c1-12)"
cache_root="${INFERNETES_PODKUBELET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/podkubelet}"
out="$cache_root/virtual-kubelet-$version-$digest"
bin="$out/podkubelet"

if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { echo "podkubelet.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 3; }
mkdir -p "$out"
exec 9>"$out/build.lock"
flock 9
if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi
start=$(date +%s)
echo "podkubelet.sh: building podkubelet on virtual-kubelet $version ..." >&2
# The provider's unit tests (status mapping, env expansion, the image map) gate the binary.
(cd "$src" && export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" &&
    nice -n "${BUILD_NICE:-10}" "$GO" test . &&
    nice -n "${BUILD_NICE:-10}" "$GO" build -o "$bin.tmp" .) >"$out/build.log" 2>&1 || {
    tail -40 "$out/build.log" >&2
    exit 1
}
mv "$bin.tmp" "$bin"
echo "podkubelet.sh: built in $(($(date +%s) - start)) s" | tee -a "$out/build.log" >&2
echo "$bin"
