#!/usr/bin/env bash
# Builds llm-d's P/D routing sidecar (cmd/pd-sidecar of github.com/llm-d/llm-d-inference-scheduler
# at LLMD_INFERENCE_SCHEDULER_VERSION, cluster/versions.env; the sidecar moved there from
# llm-d-routing-sidecar) from the Go module proxy, against the module's own go.mod, as its
# Dockerfile.sidecar builds it (pure Go, CGO_ENABLED=0). Caches the binary outside the repository
# under that version, so a second run costs nothing.
#
#   cluster/pd-sidecar.sh    build if missing; print the binary's path on the last line
#
# Exit status 3: no Go toolchain (a test skips then); any other failure is the build's.
# Environment: INFERNETES_PD_SIDECAR_CACHE (default ~/.cache/infernetes/pd-sidecar), BUILD_NICE, GO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
version="$LLMD_INFERENCE_SCHEDULER_VERSION"
module=github.com/llm-d/llm-d-inference-scheduler
cache_root="${INFERNETES_PD_SIDECAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/pd-sidecar}"
out="$cache_root/pd-sidecar-$version"
bin="$out/pd-sidecar"

built() { [[ -x "$bin" ]]; }
build() {
    local src work="$out/src"
    src="$(gobuild_module_dir "$module@$version")"
    # The module cache is read-only; build in a copy so go.mod's own requirements apply.
    rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
    cd "$work"
    export CGO_ENABLED=0
    gobuild_nice "$GO" build -o "$bin.tmp" \
        -ldflags "-X $module/pkg/sidecar/version.BuildRef=$version" ./cmd/pd-sidecar
    cd "$out" && rm -rf "$work"
    mv "$bin.tmp" "$bin"
}

gobuild_done built "$bin"
gobuild_toolchain pd-sidecar.sh
gobuild_cached pd-sidecar.sh "$out" "$bin" built build "llm-d's routing sidecar ($version)"
