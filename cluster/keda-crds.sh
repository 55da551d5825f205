#!/usr/bin/env bash
# Fetches KEDA's CustomResourceDefinitions (config/crd/bases/*.yaml of the module
# github.com/kedacore/keda/v2 at KEDA_VERSION, cluster/versions.env) through the Go module proxy,
# checked against the checksum database, and caches them outside the repository. KEDA's operator
# is not built: the e2e tests need the API server to serve and validate ScaledObjects, no more.
#
#   cluster/keda-crds.sh      fetch if missing; print the directory holding the YAML files
#
# Environment: INFERNETES_KEDA_CACHE (default ~/.cache/infernetes/keda), GO (go binary).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${INFERNETES_KEDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/keda}"
out="$cache_root/$KEDA_VERSION/crds"
if compgen -G "$out/keda.sh_*.yaml" >/dev/null; then
    echo "$out"
    exit 0
fi

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[[ -x "$GO" ]] || { echo "keda-crds.sh: no Go toolchain found (set GO=/path/to/go)" >&2; exit 1; }
mkdir -p "$cache_root"
exec 9>"$cache_root/fetch.lock"
flock 9
if ! compgen -G "$out/keda.sh_*.yaml" >/dev/null; then
    dir="$(GOTOOLCHAIN=local "$GO" mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$dir/config/crd/bases" ]] || { echo "keda-crds.sh: no config/crd/bases in $dir" >&2; exit 1; }
    mkdir -p "$out.new"
    cp "$dir"/config/crd/bases/*.yaml "$out.new/"
    chmod u+w "$out.new"/*.yaml
    rm -rf "$out"
    mv "$out.new" "$out"
fi
echo "$out"
