#!/usr/bin/env bash
# Builds llm-d's inference scheduler (the endpoint picker with llm-d's plugins, among them the
# precise-prefix-cache-scorer fed by the pods' KV events) from the Go module proxy:
# github.com/llm-d/llm-d-inference-scheduler at LLMD_INFERENCE_SCHEDULER_VERSION
# (cluster/versions.env), its cmd/epp, against the module's own go.mod. Caches the binary outside
# the repository under that version, so a second run costs nothing.
#
#   cluster/llmd-scheduler.sh    build if missing; print the binary's path on the last line
#
# The precise scorer's tokenizer imports a Python module of llm-d's KV-cache manager
# (render_jinja_template_wrapper.py, which the project's image copies into site-packages): it is
# copied into python/ beside the binary; run the binary with that directory on PYTHONPATH.
#
# Its cgo dependencies, as the project's Dockerfile.epp builds them: libzmq (pebbe/zmq4; Debian:
# libzmq3-dev, pkg-config), libtokenizers.a (github.com/daulet/tokenizers, a Rust static library:
# built here with cargo from the source in that Go module, at the version the scheduler's go.mod
# requires, rather than downloaded prebuilt) and an embeddable Python 3.12 (python3.12-config; the
# chat-template preprocessing). Exit status 3 says one of those is missing (a test skips then);
# any other failure is the build's.
# Environment: INFERNETES_LLMD_SCHEDULER_CACHE (default ~/.cache/infernetes/llmd-scheduler),
# BUILD_NICE, GO, CARGO, PYTHON_CONFIG.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
# shellcheck source=gobuild.sh
source "$here/gobuild.sh"
version="$LLMD_INFERENCE_SCHEDULER_VERSION"
module=github.com/llm-d/llm-d-inference-scheduler
cache_root="${INFERNETES_LLMD_SCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/llmd-scheduler}"
out="$cache_root/llm-d-inference-scheduler-$version"
bin="$out/epp"
wrapper="$out/python/render_jinja_template_wrapper.py"

built() { [[ -x "$bin" && -f "$wrapper" ]]; }
gobuild_done built "$bin"

CARGO="${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}"
# The first python3.12-config that answers (a pyenv shim may exist and refuse).
python_config() {
    local candidate
    for candidate in ${PYTHON_CONFIG:-} "$(command -v python3.12-config || true)" \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12-config; do
        if [[ -n "$candidate" ]] && "$candidate" --cflags >/dev/null 2>&1; then
            echo "$candidate"
            return
        fi
    done
}
PYTHON_CONFIG="$(python_config)"
script=llmd-scheduler.sh
gobuild_toolchain $script
[[ -x "$CARGO" ]] || gobuild_missing $script "no cargo (libtokenizers.a is Rust; set CARGO=/path/to/cargo)"
[[ -n "$PYTHON_CONFIG" ]] || gobuild_missing $script "no python3.12-config (the scheduler embeds Python 3.12)"
command -v cc >/dev/null || gobuild_missing $script "no C compiler (the scheduler is cgo)"
pkg-config --exists libzmq 2>/dev/null ||
    gobuild_missing $script "no libzmq for pkg-config (Debian: apt-get install libzmq3-dev pkg-config)"

build() {
    local src tok_version tok_src lib kv_src work="$out/src"
    src="$(gobuild_module_dir "$module@$version")"
    # The tokenizers version the scheduler's own go.mod resolves to.
    tok_version="$(cd "$src" && "$GO" list -m -f '{{.Version}}' github.com/daulet/tokenizers)"
    tok_src="$(cd "$src" && gobuild_module_dir "github.com/daulet/tokenizers@$tok_version")"
    lib="$out/tokenizers-$tok_version"
    if [[ ! -f "$lib/libtokenizers.a" ]]; then
        rm -rf "$lib.src" && cp -r "$tok_src" "$lib.src" && chmod -R u+w "$lib.src"
        (cd "$lib.src" && gobuild_nice "$CARGO" build --release --locked --lib)
        mkdir -p "$lib" && cp "$lib.src/target/release/libtokenizers.a" "$lib/"
        rm -rf "$lib.src"
    fi
    kv_src="$(cd "$src" && gobuild_module_dir \
        "github.com/llm-d/llm-d-kv-cache-manager@$(cd "$src" && "$GO" list -m -f '{{.Version}}' \
            github.com/llm-d/llm-d-kv-cache-manager)")"
    mkdir -p "$out/python"
    cp "$kv_src/pkg/preprocessing/chat_completions/render_jinja_template_wrapper.py" "$wrapper.tmp"
    mv "$wrapper.tmp" "$wrapper"
    if [[ ! -x "$bin" ]]; then
        # The module cache is read-only; build in a copy so go.mod's own requirements apply.
        rm -rf "$work" && cp -r "$src" "$work" && chmod -R u+w "$work"
        cd "$work"
        export CGO_ENABLED=1
        CGO_CFLAGS="$("$PYTHON_CONFIG" --cflags) -I$lib"
        CGO_LDFLAGS="$("$PYTHON_CONFIG" --ldflags --embed) -L$lib -ltokenizers -ldl -lm"
        export CGO_CFLAGS CGO_LDFLAGS
        gobuild_nice "$GO" build -o "$bin.tmp" ./cmd/epp
        cd "$out" && rm -rf "$work"
        mv "$bin.tmp" "$bin"
    fi
}

gobuild_cached $script "$out" "$bin" built build "llm-d's inference scheduler ($version)"
