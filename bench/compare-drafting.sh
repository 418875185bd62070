#!/usr/bin/env bash
# Drafted decoding, TensorFold vs llama.cpp, on the same GGUF files and prompts, interleaved run by run.
# All orchestration is in bench/llamacpp_spec.py (one Python process drives llama.cpp in-process and
# `target/release/tensorfold run` as a subprocess, alternating engines so machine-speed drift hits both); this
# script only picks models and settings. See the docstring of bench/llamacpp_spec.py for what every mode
# measures and how.
#
# Needs the release binary (cargo build --release -p tf-cli) and the reference venv with llama-cpp-python
# (tools/reference/setup-venv.sh). Run on a quiet machine: nothing else may be using the cores.
#
# usage: bench/compare-drafting.sh [TARGET [DRAFT]]
#   TARGET / DRAFT: a short name (smollm2 qwen05 qwen15 gemma3) or a .gguf path; DRAFT must share TARGET's vocab.
#   No arguments: smollm2 alone (prompt lookup / context copies only), then qwen15 with qwen05 as the draft.
# env: MAX_TOKENS (128) RUNS (3) THREADS (2) KINDS (all; e.g. code-edit,json) LIMIT (all prompts)
#      PROMPTS (bench/prompts/drafting.json) OUT (target/bench) EXTRA (more llamacpp_spec.py arguments)
set -euo pipefail
cd "$(dirname "$0")/.."
max_tokens=${MAX_TOKENS:-128}
runs=${RUNS:-3}
threads=${THREADS:-2}
prompts=${PROMPTS:-bench/prompts/drafting.json}
out=${OUT:-target/bench}
declare -A file=(
  [smollm2]=models/smollm2-135m-instruct-q4_1.gguf
  [qwen05]=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  [qwen15]=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
  [gemma3]=models/gemma-3-270m-q4_k_m.gguf
)
resolve() { if [ -n "${file[$1]:-}" ]; then echo "${file[$1]}"; else echo "$1"; fi; }
[ -x target/release/tensorfold ] || { echo "target/release/tensorfold missing: cargo build --release -p tf-cli" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo ".venv missing: tools/reference/setup-venv.sh" >&2; exit 1; }
mkdir -p "$out"

one() {  # TARGET_FILE [DRAFT_FILE]
  local target=$1 draft=${2:-} name args=()
  name=$(basename "$target" .gguf)
  [ -n "$draft" ] && { args+=(--draft "$draft"); name+="+$(basename "$draft" .gguf)"; }
  [ -n "${KINDS:-}" ] && args+=(--kinds "$KINDS")
  [ -n "${LIMIT:-}" ] && args+=(--limit "$LIMIT")
  echo "# commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (+ local changes)'), $(nproc) cores," \
       "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2086
  .venv/bin/python bench/llamacpp_spec.py "$target" "${args[@]}" --prompts "$prompts" --max-tokens "$max_tokens" \
    --runs "$runs" --threads "$threads" --tensorfold target/release/tensorfold --json "$out/drafting-$name.json" \
    ${EXTRA:-}
}

if [ $# -eq 0 ]; then
  one "${file[smollm2]}"
  one "${file[qwen15]}" "${file[qwen05]}"
else
  one "$(resolve "$1")" ${2:+"$(resolve "$2")"}
fi
