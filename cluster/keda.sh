#!/usr/bin/env bash
# Builds KEDA's operator (cmd/operator) and its metrics API server (cmd/adapter) from
# github.com/kedacore/keda/v2 at KEDA_VERSION (cluster/versions.env) through the Go module proxy,
# and caches them outside the repository under a key of their own (the CRDs of the same version
# come from cluster/go-module-crds.sh). The e2e runs both on the host against the local control
# plane (cluster/keda_controller.py).
#
#   cluster/keda.sh     build if missing; print the directory holding bin/
#
# KEDA's go.mod has replace and exclude directives, which `go install module@version` refuses, so
# a wrapper module carries them over (as build.sh does for kubernetes). KEDA links every scaler's
# cloud SDK: a cold build took 39 min on a busy 2-core machine (load 12-15): the operator 33 min,
# then the metrics API server 5 (their shared packages cached); the times go to build.log.
# Exit status 3 says the Go toolchain is missing (a test skips then); any other failure is the
# build's. Environment: INFERNETES_KEDA_CACHE (default ~/.cache/infernetes/keda), BUILD_NICE, GO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"

cache_root="${INFERNETES_KEDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/keda}"
out="$cache_root/$KEDA_VERSION"
module=github.com/kedacore/keda/v2

built() {
    [[ -x "$out/bin/keda-operator" && -x "$out/bin/keda-metrics-apiserver" ]]
}

build() {
    local dir src="$out/src" ldflags="-s -w -X $module/version.Version=$KEDA_VERSION"
    export CGO_ENABLED=0
    dir="$(gobuild_module_dir "$module@$KEDA_VERSION")"
    [[ -s "$dir/go.mod" ]] || { echo "keda.sh: $module@$KEDA_VERSION did not download"; return 1; }
    # Only one-line directives are carried over; a block would need parsing, so it stops the build.
    if grep -Eq '^(replace|exclude)[[:space:]]*\(' "$dir/go.mod"; then
        echo "keda.sh: $dir/go.mod has a replace/exclude block; extend keda.sh to carry it"
        return 1
    fi
    rm -rf "$src"
    mkdir -p "$src"
    {
        echo "module infernetes.local/cluster/keda"
        echo
        echo "go $(sed -n 's/^go //p' "$dir/go.mod")"
        echo
        echo "require $module $KEDA_VERSION"
        echo
        grep -E '^(replace|exclude|godebug)[[:space:]]' "$dir/go.mod" || true
    } >"$src/go.mod"
    cd "$src"
    "$GO" get "$module/cmd/operator@$KEDA_VERSION" "$module/cmd/adapter@$KEDA_VERSION"
    gobuild_nice "$GO" build -trimpath -ldflags "$ldflags" -o "$src/keda-operator" "$module/cmd/operator"
    gobuild_nice "$GO" build -trimpath -ldflags "$ldflags" -o "$src/keda-metrics-apiserver" \
        "$module/cmd/adapter"
    mkdir -p "$out/bin"
    mv "$src/keda-operator" "$src/keda-metrics-apiserver" "$out/bin/"
}

gobuild_done built "$out"
gobuild_toolchain keda.sh
gobuild_cached keda.sh "$out" "$out" built build "KEDA $KEDA_VERSION (operator, metrics API server)"
