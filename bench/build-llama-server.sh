#!/usr/bin/env bash
# Builds llama.cpp's own HTTP server (llama-server, which has --parallel slots) from the llama.cpp source that
# PyPI's llama-cpp-python sdist vendors: the same llama.cpp version and flags as the reference venv
# (tools/reference/setup-venv.sh), so the two peers we measure are one code base. Output: .llama/bin/llama-server
#
# usage: bench/build-llama-server.sh   (about 10 minutes on 2 cores; run it before, not during, a benchmark)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
out=.llama
if [ -x "$out/bin/llama-server" ]; then
    echo "$out/bin/llama-server exists"
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
PATH="$(pwd)/.venv/bin:$PATH" cmake -S "$src" -B "$out/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
PATH="$(pwd)/.venv/bin:$PATH" cmake --build "$out/build" --target llama-server -j "$(nproc)"
mkdir -p "$out/bin"
cp "$out/build/bin/llama-server" "$out/bin/"
echo "built $out/bin/llama-server"
