#!/usr/bin/env bash
# Starts the OpenAI-compatible server. Without a MODEL it serves the default model, SmolLM2-135M-Instruct,
# fetching it first (scripts/fetch-models.sh) when it is missing. Builds the release binary if needed.
#   scripts/serve.sh                      # default model on http://127.0.0.1:8080
#   scripts/serve.sh --port 9000          # flags go to `tensorfold serve`
#   scripts/serve.sh models/other.gguf    # another MODEL first
set -euo pipefail
cd "$(dirname "$0")/.."
default=models/smollm2-135m-instruct-q4_1.gguf
model=$default
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
    model=$1
    shift
fi
if [ "$model" = "$default" ] && [ ! -f "$model" ]; then
    bash scripts/fetch-models.sh smollm2
fi
cargo build --release --locked -p tf-cli
exec target/release/tensorfold serve "$model" "$@"
