#!/usr/bin/env bash
# TensorFold vs llama.cpp on the same GGUF files, in one run: prefill and serial decode tok/s (medians).
# Needs the release binary (cargo build --release -p tf-cli) and the reference venv with llama-cpp-python
# (tools/reference/setup-venv.sh). Run on a quiet machine: nothing else may be using the cores.
#
# usage: bench/compare-llamacpp.sh [MODEL_SHORT_NAME...]   (default: smollm2 qwen05 qwen15 gemma3)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
pt=${PROMPT_TOKENS:-512}
gt=${GEN_TOKENS:-128}
runs=${RUNS:-3}
declare -A file=(
  [smollm2]=smollm2-135m-instruct-q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  [gemma3]=gemma-3-270m-q4_k_m.gguf
)
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(smollm2 qwen05 qwen15 gemma3)
echo "# commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $threads, prompt $pt, gen $gt, runs $runs"
for m in "${models[@]}"; do
  f=models/${file[$m]}
  for p in checkpoint full; do
    echo "tensorfold $m $p $(target/release/tensorfold bench "$f" --threads "$threads" --prompt-tokens "$pt" --gen-tokens "$gt" --runs "$runs" --precision $p --json)"
  done
  echo "llamacpp $m - $(.venv/bin/python bench/llamacpp_bench.py "$f" --threads "$threads" --prompt-tokens "$pt" --gen-tokens "$gt" --runs "$runs")"
done
