# Sourced by the cluster/*.sh scripts that build a Go program from the Go module proxy and cache
# it outside the repository. What they share lives here once: finding Go, one build at a time per
# cache entry (make and an e2e fixture may race), the build log and its timing, and the answer a
# script prints on its last line. Each script keeps its own cache key and build steps.
#
# Exit status 3 means a tool the build needs is missing (the tests that need the program skip);
# any other failure is the build's, with the last lines of its log on stderr.
# Environment: GO (go binary), BUILD_NICE (niceness of the compilers, default 10: the machine is
# shared).

# gobuild_missing SCRIPT MESSAGE: says what is missing and exits 3.
gobuild_missing() {
    echo "$1: $2" >&2
    exit 3
}

# gobuild_done IS_BUILT ANSWER: when the function IS_BUILT succeeds, prints ANSWER and exits
# (nothing to build: the cached program is there).
gobuild_done() {
    if "$1"; then
        echo "$2"
        exit 0
    fi
}

# gobuild_toolchain SCRIPT: sets and exports GO and the settings every build here uses (the Go
# installed, never a downloaded toolchain; no VCS stamping of module-cache copies).
gobuild_toolchain() {
    GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
    [[ -x "$GO" ]] || gobuild_missing "$1" "no Go toolchain found (set GO=/path/to/go)"
    export GO GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false"
}

# gobuild_nice COMMAND...: runs COMMAND at the compilers' niceness.
gobuild_nice() {
    nice -n "${BUILD_NICE:-10}" "$@"
}

# gobuild_module_dir MODULE@VERSION [FIELD]: the module's folder in the Go module cache (or
# another field of `go mod download -json`, e.g. GoMod), downloading it first.
gobuild_module_dir() {
    "$GO" mod download -json "$1" | sed -n "s/^[[:space:]]*\"${2:-Dir}\": \"\(.*\)\",\$/\1/p"
}

# gobuild_source_digest SCRIPT SRC MODULE VERSION: a digest of a Go program kept in this
# repository (SRC: go.mod, go.sum, *.go), after checking that its go.mod requires MODULE at
# VERSION, so that cluster/versions.env and the program cannot drift apart.
gobuild_source_digest() {
    grep -q "$3 $4\$" "$2/go.mod" || {
        echo "$1: $2/go.mod does not require $3 $4" >&2
        exit 1
    }
    cat "$2/go.mod" "$2/go.sum" "$2"/*.go | sha256sum | cut -c1-12
}

# gobuild_cached SCRIPT OUT ANSWER IS_BUILT BUILD WHAT: prints ANSWER and exits when the
# function IS_BUILT succeeds; otherwise runs the function BUILD (in a subshell with `set -e`, its
# output to OUT/build.log) under OUT's lock, then prints ANSWER. Call gobuild_toolchain (and check
# any other tool BUILD needs) first.
gobuild_cached() {
    local script="$1" out="$2" answer="$3" is_built="$4" build="$5" what="$6"
    mkdir -p "$out"
    exec 9>"$out/build.lock"
    flock 9
    gobuild_done "$is_built" "$answer"
    local log="$out/build.log" start rc=0
    start=$(date +%s)
    echo "$script: $(date -u +%FT%TZ) building $what with $("$GO" version)" >"$log"
    echo "$script: building $what ..." >&2
    # Not `"$build" || ...`: that context would switch off `set -e` inside the build function.
    set +e
    (set -e; "$build") >>"$log" 2>&1
    rc=$?
    set -e
    if ((rc != 0)); then
        echo "$script: build failed; last lines of $log:" >&2
        tail -40 "$log" >&2
        exit 1
    fi
    echo "$script: built in $(($(date +%s) - start)) s" | tee -a "$log" >&2
    echo "$answer"
}
