#!/usr/bin/env bash
# Serial decode after a short and after a long prompt, per KV storage type (`--kv-type`), against llama.cpp's
# llama-bench at the same depths with the same cache types, on the same GGUF files in one run. Needs the release
# binary (cargo build --release -p tf-cli) and llama-bench built for this CPU (bench/build-llama-server.sh builds
# it under .llama/). Run on a quiet machine: nothing else may be using the cores.
#
# usage: bench/long-context.sh [MODEL_SHORT_NAME...]   (default: smollm2 qwen05 qwen15)
# env:   SHORT (512) and DEPTH (4096) prompt tokens, GEN (64) decoded tokens, RUNS (2), THREADS (2),
#        TYPES ("f32 f16 q8_0"), LLAMA_BENCH (.llama/build-native-ON/bin/llama-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
short=${SHORT:-512}
depth=${DEPTH:-4096}
gen=${GEN:-64}
runs=${RUNS:-2}
types=${TYPES:-f32 f16 q8_0}
llama=${LLAMA_BENCH:-.llama/build-native-ON/bin/llama-bench}
declare -A file=(
  [smollm2]=smollm2-135m-instruct-q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
)
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(smollm2 qwen05 qwen15)
echo "# commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $threads, prompts $short and $depth, gen $gen, runs $runs"
for m in "${models[@]}"; do
  f=models/${file[$m]}
  for t in $types; do
    for p in "$short" "$depth"; do
      tf=$(target/release/tensorfold bench "$f" --threads "$threads" --prompt-tokens "$p" --gen-tokens "$gen" \
        --runs "$runs" --kv-type "$t" --json 2>/dev/null |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["decode_tok_s"])' || echo "?")
      echo "tensorfold $m kv=$t prompt=$p decode_tok_s=$tf"
    done
    # llama.cpp: K and V in the same type (llama-bench takes f16, its default, or a quantized type; not f32); a
    # quantized V cache needs flash attention there.
    [ "$t" = f32 ] && continue
    "$llama" -m "$f" -t "$threads" -p 0 -n "$gen" -d "$short,$depth" -ctk "$t" -ctv "$t" -fa 1 -r "$runs" -o json 2>/dev/null |
      python3 -c 'import json,sys
for r in json.load(sys.stdin): print("llamacpp '"$m"' kv='"$t"' prompt=%d decode_tok_s=%.1f" % (r["n_depth"], r["avg_ts"]))' ||
      echo "llamacpp $m kv=$t: failed"
  done
done
