#!/usr/bin/env bash
# Builds the LeaderWorkerSet controller (sigs.k8s.io/lws at LWS_VERSION, cluster/versions.env)
# from the Go module proxy, with its CustomResourceDefinitions and webhook configurations from
# the same module, and caches them outside the repository under a key of their own (so the
# control plane's cache, cluster/build.sh, is not rebuilt when LWS_VERSION moves). The e2e runs
# the manager on the host against the local control plane (e2e/lws.py).
#
#   cluster/lws.sh      build if missing; print the directory holding bin/, crds/, webhook/
#
# A cold build took 344 s on a busy 2-core machine (Go module cache warm for the modules the
# control plane shares; the time goes to build.log).
# Environment: INFERNETES_LWS_CACHE (default ~/.cache/infernetes/lws), BUILD_NICE, GO.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"

cache_root="${INFERNETES_LWS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/lws}"
out="$cache_root/$LWS_VERSION"

built() {
    [[ -x "$out/bin/lws-manager" && -s "$out/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml" \
        && -s "$out/webhook/manifests.yaml" ]]
}

build() {
    local dir src="$out/src" ldflags="-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION"
    export CGO_ENABLED=0
    dir="$(gobuild_module_dir "sigs.k8s.io/lws@$LWS_VERSION")"
    [[ -d "$dir/config/crd/bases" ]] || { echo "lws.sh: no config/crd/bases in $dir"; return 1; }
    # A wrapper module (as build.sh does for etcd): `go install module@version` would ask the proxy
    # for the module's version list, which it may refuse.
    rm -rf "$src" "$out/crds.new" "$out/webhook.new"
    mkdir -p "$src"
    cat >"$src/go.mod" <<MOD
module infernetes.local/cluster/lws

go $(sed -n 's/^go //p' "$dir/go.mod")

require sigs.k8s.io/lws $LWS_VERSION
MOD
    cd "$src"
    "$GO" get "sigs.k8s.io/lws/cmd@$LWS_VERSION"
    gobuild_nice "$GO" build -trimpath -ldflags "$ldflags" -o "$src/lws-manager" sigs.k8s.io/lws/cmd
    mkdir -p "$out/bin" "$out/crds.new" "$out/webhook.new"
    mv "$src/lws-manager" "$out/bin/lws-manager"
    cp "$dir"/config/crd/bases/*.yaml "$out/crds.new/"
    # The webhooks as the release's kustomization patches them (the pod webhooks only see pods
    # labelled by LWS); e2e/lws.py points them at the manager on the host.
    cp "$dir"/config/webhook/manifests.yaml "$dir"/config/webhook/*-patch.yaml "$out/webhook.new/"
    chmod -R u+w "$out/crds.new" "$out/webhook.new"
    rm -rf "$out/crds" "$out/webhook"
    mv "$out/crds.new" "$out/crds"
    mv "$out/webhook.new" "$out/webhook"
}

gobuild_done built "$out"
gobuild_toolchain lws.sh
gobuild_cached lws.sh "$out" "$out" built build "the LeaderWorkerSet controller $LWS_VERSION"
