#!/usr/bin/env bash
# Regenerate every reference fixture under fixtures/ from the GGUF models in models/.
#
#   scripts/fetch-models.sh                 # the four GGUFs (git-ignored)
#   tools/reference/setup-venv.sh           # .venv with gguf, transformers(+torch), llama-cpp-python
#   tools/reference/make-fixtures.sh        # this script; FIXTURE_MODELS=smollm2,gemma3 to restrict
#
# Offline (HF_HUB_OFFLINE=1) and deterministic: rerunning gives byte-identical files.
# Takes ~10-15 minutes on 2 cores (the dequant pass of the 1.5B model is the slowest step).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
py="$root/.venv/bin/python"
[ -x "$py" ] || { echo "missing $py: run tools/reference/setup-venv.sh" >&2; exit 1; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0
cd "$root/tools/reference"
"$py" make_strings.py
"$py" gguf_meta.py
"$py" tokenizer_fixtures.py
"$py" chat_fixtures.py
"$py" dequant_fixtures.py
"$py" tiny_models.py                     # fixtures/tiny/ (~10 s)
if [ "${WITH_QUALITY:-0}" = 1 ]; then    # fixtures/quality/ (~30-45 min on 2 cores; needs accelerate)
  "$py" real_quality.py
  "$py" llama_cpp_greedy.py
fi
"$py" versions.py > "$root/fixtures/VERSIONS.txt"
echo "fixtures regenerated under $root/fixtures"
