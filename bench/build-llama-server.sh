#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server (llama-server, which has --parallel slots) from the llama.cpp source that
# PyPI's llama-cpp-python sdist vendors: the same llama.cpp version as the reference venv
# (tools/reference/setup-venv.sh), so the two peers we measure are one code base. Output: .llama/bin/llama-server
# (and llama-server.flags, which bench/compare-servers.py prints with its results).
#
# usage: bench/build-llama-server.sh   (about 10 minutes on 2 cores; run it before, not during, a benchmark)
# env: LLAMA_NATIVE=ON (default: ggml compiled for this CPU, -march=native, so AVX-512/VNNI where present) or
#      OFF (a portable AVX2/FMA/F16C build, as the reference venv and comparisons before 2026-12-01 12:00 used).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
native=${LLAMA_NATIVE:-ON}
out=.llama
flags="llama-cpp-python==$version GGML_NATIVE=$native"
if [ -x "$out/bin/llama-server" ] && [ "$(cat "$out/bin/llama-server.flags" 2>/dev/null)" = "$flags" ]; then
    echo "$out/bin/llama-server exists ($flags)"
    exit 0
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install --quiet cmake ninja
mkdir -p "$out/src"
if [ ! -d "$out/src/llama_cpp_python-$version" ]; then
    .venv/bin/python -m pip download --quiet --no-deps --no-binary=llama-cpp-python \
        "llama-cpp-python==$version" -d "$out/src"
    tar xzf "$out/src/llama_cpp_python-$version.tar.gz" -C "$out/src"
fi
src="$out/src/llama_cpp_python-$version/vendor/llama.cpp"
build="$out/build-native-$native"
PATH="$(pwd)/.venv/bin:$PATH" cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE="$native" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
PATH="$(pwd)/.venv/bin:$PATH" cmake --build "$build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$build/bin/llama-server" "$out/bin/"
echo "$flags" >"$out/bin/llama-server.flags"
echo "built $out/bin/llama-server ($flags)"
