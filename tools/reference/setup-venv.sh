#!/usr/bin/env bash
# Create .venv (git-ignored) with the reference tools that regenerate fixtures under fixtures/.
# llama-cpp-python has no binary wheel on PyPI: it builds llama.cpp from source (several minutes on 2 cores).
# requirements.txt includes torch (transformers' GGUF tokenizer loader imports it; ~3 GB with its CUDA wheels).
# Then: tools/reference/make-fixtures.sh regenerates fixtures/.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
python3 -m venv "$here/.venv"
"$here/.venv/bin/pip" install --quiet --upgrade pip
"$here/.venv/bin/pip" install --quiet -r "$here/tools/reference/requirements.txt"
if [ "${WITH_LLAMA_CPP:-1}" = 1 ]; then
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    "$here/.venv/bin/pip" install --quiet llama-cpp-python==0.3.36
fi
