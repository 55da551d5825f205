#!/usr/bin/env bash
# Builds the local control plane's binaries from the Go module proxy and caches them outside the
# repository, keyed by the versions in cluster/versions.env, so a second run costs nothing.
#
#   cluster/build.sh          build what is missing, print the bin directory on the last line
#   cluster/build.sh --print  print the bin directory only (no build)
#
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl come from k8s.io/kubernetes
# through a wrapper module: the kubernetes go.mod replaces its staging modules (k8s.io/api, ...)
# with local paths, so `go install ...@version` cannot work; the wrapper replaces each with its
# published v0.<minor>.<patch>. etcd gets a wrapper of its own for the same reason. kwok and helm
# have no replace directives and use `go install`.
#
# Needs Go 1.26 or newer (the pinned modules declare `go 1.26`; GOTOOLCHAIN=local, so an older Go
# fails with that message instead of downloading a toolchain). A cold build took 29 min on a
# busy 2-core machine (etcd 2, kubernetes 16, kwok 5, helm 7); the times go to build.log.
#
# Environment: INFERNETES_CLUSTER_CACHE (cache root, default ~/.cache/infernetes/cluster),
# BUILD_NICE (niceness of the compilers, default 10: the machine is shared), GO (go binary).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"

cache_root="${INFERNETES_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/cluster}"
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
top="$cache_root/$key"
bin="$top/bin"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)
# kwok's own default stages (node initialise + lease heartbeat, pod ready/complete/delete), taken
# from the kwok module source at its pinned version; the kwok binary has no built-in stages.
kwok_stages="$top/kwok-stages.yaml"

if [[ "${1:-}" == "--print" ]]; then
    echo "$bin"
    exit 0
fi

all_built() {
    local b
    for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
    [[ -s "$kwok_stages" ]]
}

if all_built; then
    echo "$bin"
    exit 0
fi

gobuild_toolchain build.sh
export CGO_ENABLED=0

mkdir -p "$bin" "$top/src"
log="$top/build.log"
# One build at a time per version set (make cluster and the e2e fixture may race).
exec 9>"$top/build.lock"
flock 9
if all_built; then
    echo "$bin"
    exit 0
fi

step() { # step NAME COMMAND...: run, time it, log it
    local name="$1" start end
    shift
    start=$(date +%s)
    echo "build.sh: $name ..." | tee -a "$log" >&2
    # Not `"$@" || ...`: that context would switch off `set -e` inside the build functions.
    local rc=0
    set +e
    (set -e; "$@") >>"$log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
        echo "build.sh: $name failed; last lines of $log:" >&2
        tail -40 "$log" >&2
        exit 1
    fi
    end=$(date +%s)
    echo "build.sh: $name took $((end - start)) s" | tee -a "$log" >&2
}

total_start=$(date +%s)
echo "build.sh: $(date -u +%FT%TZ) building $key with $("$GO" version)" >>"$log"

# --- kubernetes: wrapper module replacing every staging module the kubernetes go.mod requires.
build_kubernetes() {
    local dir="$top/src/kubernetes" kmod minor commit date_now
    mkdir -p "$dir"
    kmod="$(cd "$dir" && gobuild_module_dir "k8s.io/kubernetes@$KUBERNETES_VERSION" GoMod)"
    commit="$(cd "$dir" && "$GO" mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | awk -F'"' '$2 == "Hash" && !found {print $4; found = 1}')"
    minor="${KUBERNETES_VERSION#v1.}"
    minor="${minor%%.*}"
    {
        echo "module infernetes.local/cluster/kubernetes"
        echo
        echo "go $(sed -n 's/^go //p' "$kmod")"
        echo
        echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
        echo
        # Staging modules: the ones the kubernetes go.mod replaces with ./staging/src paths.
        awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print "replace " $1 " => " $1 " v0." m "." p}' \
            m="$minor" p="${KUBERNETES_VERSION##*.}" "$kmod"
    } >"$dir/go.mod"
    # godebug settings of the upstream main module keep the binaries' runtime behaviour identical.
    grep '^godebug' "$kmod" >>"$dir/go.mod" || true
    local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
                k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
    (cd "$dir" && "$GO" get "${pkgs[@]/%/@$KUBERNETES_VERSION}")
    date_now="$(date -u +%FT%TZ)"
    local ldflags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date_now"
        ldflags+=" -X $pkg.gitCommit=$commit"  # empty when the proxy gives no origin hash
    done
    mkdir -p "$dir/out"
    (cd "$dir" && gobuild_nice "$GO" build -trimpath -ldflags "$ldflags" -o "$dir/out/" "${pkgs[@]}")
    mv "$dir/out/"* "$bin/"
}

# --- etcd: wrapper module requiring the server and its sibling modules at the same version.
build_etcd() {
    local dir="$top/src/etcd"
    mkdir -p "$dir"
    cat >"$dir/go.mod" <<EOF
module infernetes.local/cluster/etcd

go 1.26

require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
EOF
    (cd "$dir" && "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
    (cd "$dir" && gobuild_nice "$GO" build -trimpath -ldflags "-s -w" -o "$dir/etcd.new" go.etcd.io/etcd/server/v3)
    # `go get` of the wrong version would pass silently; the binary says what it is.
    local reported
    reported="$("$dir/etcd.new" --version)"
    grep -qx "etcd Version: ${ETCD_VERSION#v}" <<<"$reported" \
        || { echo "built etcd is not $ETCD_VERSION: $reported"; return 1; }
    mv "$dir/etcd.new" "$bin/etcd"
}

build_kwok() {
    GOBIN="$top/src/gobin" gobuild_nice "$GO" install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
        "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv "$top/src/gobin/kwok" "$bin/kwok"
}

extract_kwok_stages() {
    local src
    src="$(gobuild_module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage"
    local f out="$kwok_stages.new"
    : >"$out"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        echo "---" >>"$out"
        cat "$src/$f" >>"$out"
    done
    mv "$out" "$kwok_stages"
}

build_helm() {
    local base="helm.sh/helm/v3/internal/version" hmod k8s_minor ldflags
    # As helm's own Makefile does: the default Kubernetes version of `helm template`/`helm lint`
    # is the minor of the client-go that helm is built with.
    hmod="$(gobuild_module_dir "helm.sh/helm/v3@$HELM_VERSION" GoMod)"
    k8s_minor="$(awk '$1 == "k8s.io/client-go" {split($2, v, "."); print v[2]}' "$hmod")"
    ldflags="-s -w -X $base.version=$HELM_VERSION -X $base.gitTreeState=clean"
    local pkg
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
    done
    GOBIN="$top/src/gobin" gobuild_nice "$GO" install -trimpath -ldflags "$ldflags" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    mv "$top/src/gobin/helm" "$bin/helm"
}

[[ -x "$bin/etcd" ]] || step "etcd $ETCD_VERSION" build_etcd
[[ -x "$bin/kube-apiserver" && -x "$bin/kube-controller-manager" && -x "$bin/kube-scheduler" && -x "$bin/kubectl" ]] \
    || step "kubernetes $KUBERNETES_VERSION" build_kubernetes
[[ -x "$bin/kwok" ]] || step "kwok $KWOK_VERSION" build_kwok
[[ -s "$kwok_stages" ]] || step "kwok stages" extract_kwok_stages
[[ -x "$bin/helm" ]] || step "helm $HELM_VERSION" build_helm

echo "build.sh: all binaries built in $(( $(date +%s) - total_start )) s" | tee -a "$log" >&2
echo "$bin"
