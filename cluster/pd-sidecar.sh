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
version="$LLMD_INFERENCE_SCHEDULER_VERSION"
module=github.com/llm-d/llm-d-inference-scheduler
cache_root="${INFERNETES_PD_SIDECAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/pd-sidecar}"
out="$cache_root/pd-sidecar-$version"
bin="$out/pd-sidecar"

if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { echo "pd-sidecar.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 3; }

mkdir -p "$out"
exec 9>"$out/build.lock"
flock 9
if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi
start=$(date +%s)
echo "pd-sidecar.sh: building llm-d's routing sidecar ($version) ..." >&2
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false"
{
    src="$("$GO" mod download -json "$module@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
    # The module cache is read-only; build in a copy so go.mod's own requirements apply.
    work="$out/src" && rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
    cd "$work"
    CGO_ENABLED=0 nice -n "${BUILD_NICE:-10}" "$GO" build -o "$bin.tmp" \
        -ldflags "-X $module/pkg/sidecar/version.BuildRef=$version" ./cmd/pd-sidecar
    cd "$out" && rm -rf "$work"
    mv "$bin.tmp" "$bin"
} >"$out/build.log" 2>&1 || {
    tail -40 "$out/build.log" >&2
    exit 1
}
echo "pd-sidecar.sh: built in $(($(date +%s) - start)) s" | tee -a "$out/build.log" >&2
echo "$bin"
