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
rm -rf .device
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
# Real model shapes (config.json only) for --load-format dummy.
cp -r bench/shapes .device/shapes
ls -la .device/bin
du -sh .device
cat <<'MSG'

Run on the device (tool `run`, carry [".device"], timeout_s 600):
  bash scripts/device-run.sh            # tests, CLI checks, benchmarks; or one of: tests | cli | bench
MSG
