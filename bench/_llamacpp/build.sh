#!/usr/bin/env bash
# Builds llama.cpp for the cpu_llamacpp bench from the llama-cpp-python source package (it has no
# wheels) and caches it outside the repository, keyed by the package's version, so a second run
# costs nothing:
#
#   bench/_llamacpp/build.sh          build what is missing, print the cache directory last
#   bench/_llamacpp/build.sh --print  print the cache directory only (no build)
#
# One CMake build of the vendored llama.cpp, as shared libraries, gives llama-server,
# llama-quantize and libllama; the Python binding is installed into its own venv with
# LLAMA_BUILD=OFF and loads that libllama through LLAMA_CPP_LIB_PATH, so ggml is compiled once.
# Layout under ~/.cache/infernetes/llama.cpp/<version>/: src/ (the unpacked sdist), build/bin/
# (binaries and .so files), venv/ (the binding), build.log.
#
# Environment: LLAMA_CPP_PYTHON_VERSION (default below), INFERNETES_LLAMACPP_CACHE (cache root),
# BUILD_NICE (niceness of the compilers, default 10: the machine is shared), BUILD_JOBS.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache_root="${INFERNETES_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infernetes/llama.cpp}"
top="$cache_root/$version"

if [[ "${1:-}" == "--print" ]]; then
    echo "$top"
    exit 0
fi

built() {
    [[ -x "$top/build/bin/llama-server" && -x "$top/build/bin/llama-quantize" ]] &&
        [[ -f "$top/build/bin/libllama.so" && -f "$top/venv/.installed" ]]
}

if built; then
    echo "$top"
    exit 0
fi

mkdir -p "$top"
# Away from the caller's folder: `python -m pip` puts it first on sys.path, and this repository's
# operator/ folder would shadow the standard library's operator module.
cd "$top"
log="$top/build.log"
# One build at a time per version (the bench and a person may race).
exec 9>"$top/build.lock"
flock 9
if built; then
    echo "$top"
    exit 0
fi

nice_cmd=(nice -n "${BUILD_NICE:-10}")
jobs="${BUILD_JOBS:-$(nproc)}"
python="${PYTHON:-python3}"

# A venv for the build tools and the binding; cmake and ninja from PyPI where the system has none.
[[ -x "$top/venv/bin/python" ]] || "$python" -m venv "$top/venv"
pip=("$top/venv/bin/python" -m pip --disable-pip-version-check -q)
cmake_bin="$(command -v cmake || true)"
if [[ -z "$cmake_bin" ]] || ! command -v ninja >/dev/null; then
    "${pip[@]}" install cmake ninja >>"$log" 2>&1
    cmake_bin="$top/venv/bin/cmake"
    export PATH="$top/venv/bin:$PATH"
fi

sdist="$top/llama_cpp_python-$version.tar.gz"
if [[ ! -s "$sdist" ]]; then
    echo "build.sh: downloading llama-cpp-python==$version (sdist)" >&2
    "${pip[@]}" download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$top" >>"$log" 2>&1
fi
if [[ ! -d "$top/src" ]]; then
    rm -rf "$top/src.tmp" && mkdir -p "$top/src.tmp"
    tar xzf "$sdist" -C "$top/src.tmp" --strip-components=1
    mv "$top/src.tmp" "$top/src"
fi

echo "build.sh: building llama-server, llama-quantize, libllama ($jobs jobs; log $log)" >&2
start=$SECONDS
"${nice_cmd[@]}" "$cmake_bin" -S "$top/src/vendor/llama.cpp" -B "$top/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    >>"$log" 2>&1
"${nice_cmd[@]}" "$cmake_bin" --build "$top/build" -j "$jobs" \
    --target llama-server llama-quantize llama >>"$log" 2>&1
echo "llama.cpp build: $((SECONDS - start)) s" >>"$log"

# The binding without its own copy of llama.cpp; the bench sets LLAMA_CPP_LIB_PATH=build/bin.
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "${nice_cmd[@]}" "${pip[@]}" install "$sdist" \
    >>"$log" 2>&1
touch "$top/venv/.installed"
echo "$top"
