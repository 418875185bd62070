#!/usr/bin/env bash
# TensorFold's in-process `bench` against llama.cpp's llama-bench on the same GGUF files, alternated run by run:
# serial decode after a short prompt, prefill, and (TensorFold only) the forward cost of 1..8-row windows. With
# BASE=path/to/another/tensorfold, that binary runs in the same rounds too (an A/B of two builds).
#
# usage: bench/cpu-vs-llama-bench.sh [MODEL_SHORT_NAME...]   (default: smollm2 qwen05 qwen15 gemma3)
# env: THREADS (2), PROMPT (512 prefill tokens), GEN (64 decoded tokens), ROUNDS (3), BASE (unset).
# Needs target/release/tensorfold (cargo build --release -p tf-cli) and llama-bench from bench/build-llama-server.sh
# (then `cmake --build .llama/build-native-ON --target llama-bench`). Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
prompt=${PROMPT:-512}
gen=${GEN:-64}
rounds=${ROUNDS:-3}
llama=.llama/build-native-${LLAMA_NATIVE:-ON}/bin/llama-bench
declare -A file=(
  [smollm2]=smollm2-135m-instruct-q4_1.gguf
  [qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  [gemma3]=gemma-3-270m-q4_k_m.gguf
)
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(smollm2 qwen05 qwen15 gemma3)
[ -x "$llama" ] || { echo "missing $llama (see the header)" >&2; exit 1; }
isa=$(grep -qw avx512vnni /proc/cpuinfo && echo avx512 || echo avx2)
echo "# commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($isa)," \
  "threads $threads, prompt $prompt, gen $gen, rounds $rounds${BASE:+, base $BASE}"
bins=(target/release/tensorfold)
[ -n "${BASE:-}" ] && bins+=("$BASE")
for m in "${models[@]}"; do
  f=models/${file[$m]}
  for r in $(seq "$rounds"); do
    for b in "${bins[@]}"; do
      out=$("$b" bench "$f" --threads "$threads" --prompt-tokens "$prompt" --gen-tokens "$gen" --runs 1 --window-costs 8 2>&1)
      echo "$m round $r $b: $(grep -o 'prefill [0-9.]* tok/s' <<<"$out"), $(grep -o 'decode [0-9.]* tok/s' <<<"$out");" \
        "windows $(grep 'argmaxes back:' <<<"$out" | sed 's/.*argmaxes back: *//')"
    done
    j=$("$llama" -m "$f" -t "$threads" -p "$prompt" -n "$gen" -r 1 -o jsonl 2>/dev/null)
    echo "$m round $r llama-bench: $(python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    kind = "prefill" if d["n_prompt"] else "decode"
    print(kind, round(d["avg_ts"], 1), "tok/s,", end=" ")
' <<<"$j")"
  done
done
