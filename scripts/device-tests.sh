#!/usr/bin/env bash
# Builds the CUDA test binaries, the CUDA-enabled `tensorfold` and the lab's bench example (crates/cuda-lab) here (the device machine has
# no Rust toolchain), copies them with two tiny model directories into .device/ (git-ignored, carried to the
# device), and prints the `run` command that executes scripts/device-run.sh there (logs under $OUT).
#
# Usage: scripts/device-tests.sh            (then call the device `run` tool with the printed command)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/cuda}
mkdir -p .git/info && touch .git/info/exclude
grep -qx '/.device/' .git/info/exclude || echo '/.device/' >>.git/info/exclude
# .device/llama (llama.cpp's CUDA build, which comes back from a device call) and the packed llama.cpp source
# survive a rebuild.
find .device -mindepth 1 -maxdepth 1 ! -name llama ! -name llama-src.tar.xz -exec rm -rf {} + 2>/dev/null || true
mkdir -p .device/bin

# Test binaries: cargo names them <test>-<hash>; keep the test name.
cargo test --release -p tf-backend-cuda --features cuda --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
    cp "$exe" ".device/bin/test-$name"
done
cargo build --release -p tf-cuda-lab --features cuda --examples
cp "$CARGO_TARGET_DIR/release/examples/bench" .device/bin/bench
cp "$CARGO_TARGET_DIR/release/examples/skeleton" .device/bin/skeleton
cp "$CARGO_TARGET_DIR/release/examples/gguf_shape" .device/bin/gguf_shape
cargo build --release -p tf-cli --features cuda
cp "$CARGO_TARGET_DIR/release/tensorfold" .device/bin/tensorfold
strip --strip-debug .device/bin/*

# Tiny target and draft model directories (random 2-layer checkpoints, byte-level tokenizer, context 2048), as
# crates/cli/tests/cli_check.rs builds them.
for m in llama llama3; do
    mkdir -p ".device/tiny-$m"
    cp "fixtures/tiny/$m/model.safetensors" ".device/tiny-$m/"
    cp fixtures/tiny/byte-tokenizer.json ".device/tiny-$m/tokenizer.json"
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["max_position_embeddings"]=2048; print(json.dumps(c))' \
        "fixtures/tiny/$m/config.json" >".device/tiny-$m/config.json"
done
# The tiny Qwen2 shape (4 layers, 512 wide: K-quant rows) with the byte-level tokenizer, for `device-run.sh serve`
# (dummy weights in every quantized type).
mkdir -p .device/tiny-qwen
cp fixtures/tiny/byte-tokenizer.json .device/tiny-qwen/tokenizer.json
python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c.update(vocab_size=256, bos_token_id=2, eos_token_id=1, max_position_embeddings=2048); print(json.dumps(c))' \
    bench/shapes/tiny-qwen.json >.device/tiny-qwen/config.json
# Real model shapes (config.json only) for --load-format dummy and the gguf_shape example.
cp -r bench/shapes .device/shapes
# The peer: llama.cpp's source as PyPI's llama-cpp-python sdist vendors it (as bench/build-llama-server.sh gets it),
# without its docs, models, tests and other backends (4 MB), for `device-run.sh peer-build`. A build that came back
# from the device (llama-cuda.tar.xz.* pieces, LLAMA_PIECES=folder) is unpacked into .device/llama.
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
if [ ! -f .device/llama-src.tar.xz ]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary=llama-cpp-python "llama-cpp-python==$version" -d "$tmp"
    tar xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
    v="$tmp/llama_cpp_python-$version/vendor"
    grep -om1 'llama.cpp@[0-9a-f]*' "$tmp/llama_cpp_python-$version/CHANGELOG.md" | cut -d@ -f2 >"$v/llama.cpp/.commit"
    tar cJf .device/llama-src.tar.xz -C "$v" --exclude=.git \
        $(for d in docs models media tools/ui examples tests benches gguf-py scripts conversion \
            ggml/src/ggml-{sycl,vulkan,opencl,metal,hexagon,et,cann,musa,webgpu,zdnn}; do echo "--exclude=llama.cpp/$d"; done) \
        llama.cpp
    rm -rf "$tmp"
fi
if [ -n "${LLAMA_PIECES:-}" ]; then
    cat "$LLAMA_PIECES"/llama-cuda.tar.xz.* | tar xJf - -C .device
fi
ls -la .device/bin
du -sh .device
cat <<'MSG'

Run on the device (tool `run`, carry [".device"], timeout_s 600):
  bash scripts/device-run.sh            # tests, CLI checks, benchmarks; or one of: tests | cli | bench
MSG
