#!/usr/bin/env bash
# The GGUF i-quant types against llama.cpp on the CPU, on files made by llama.cpp's own quantizer.
#
# 1. An importance matrix for the model from bench/imatrix-calibration.txt (llama-imatrix, a few short chunks).
# 2. llama-quantize --allow-requantize --imatrix: the model into each i-quant type, under target/iquants/. The
#    source is a Q4_K_M file, so its tensors are requantized; llama-quantize keeps its own per-tensor choices
#    (token embedding, output and tensors whose rows are not a multiple of 256 get other types), which
#    `tensorfold info` lists per file.
# 3. `tensorfold run` on each file, greedy, 32 tokens: it must answer without error.
# 4. Per file, TensorFold's `bench` and llama-bench on the same file: decode (64-token prompt, 64 generated) and
#    prefill (512 tokens), the engines alternated measurement by measurement, PASSES passes (the second pass runs
#    llama.cpp first). Before each pair the 1-minute load average (as `uptime` prints it) must be at most
#    MAX_LOAD, else it is polled every 30 s. A file TensorFold refuses is reported with its exact error.
#
# Needs the release binary (cargo build --release -p tf-cli; built here if missing) and llama.cpp's llama-bench,
# llama-quantize and llama-imatrix from the llama.cpp that bench/build-llama-server.sh unpacks (built here if
# missing). Run on a quiet machine: nothing else may be using the cores.
#
# usage: bench/iquants.sh [TYPE...]   (default: IQ4_NL IQ4_XS IQ3_S IQ3_XXS IQ2_XS IQ2_XXS IQ1_S)
# env:   MODEL (models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf), THREADS (2), RUNS (3), PASSES (2),
#        MAX_LOAD (1.2), CHUNKS (4) and CTX (256) for llama-imatrix, LLAMA_NATIVE (ON), OUT (target/iquants)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
threads=${THREADS:-2}
runs=${RUNS:-3}
passes=${PASSES:-2}
max_load=${MAX_LOAD:-1.2}
chunks=${CHUNKS:-4}
ctx=${CTX:-256}
native=${LLAMA_NATIVE:-ON}
out=${OUT:-target/iquants}
calib=bench/imatrix-calibration.txt
types=("$@")
[ ${#types[@]} -eq 0 ] && types=(IQ4_NL IQ4_XS IQ3_S IQ3_XXS IQ2_XS IQ2_XXS IQ1_S)
tf=target/release/tensorfold
build=.llama/build-native-$native
bin=$build/bin

[ -f "$model" ] || scripts/fetch-models.sh
[ -x "$tf" ] || cargo build --release -p tf-cli
missing=()
for t in llama-bench llama-quantize llama-imatrix; do [ -x "$bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -gt 0 ]; then
    # Unpacks and configures llama.cpp (and builds llama-server) when the build folder is not there yet.
    [ -f "$build/CMakeCache.txt" ] || LLAMA_NATIVE=$native bench/build-llama-server.sh
    PATH="$(pwd)/.venv/bin:$PATH" cmake --build "$build" --target "${missing[@]}" -j "$(nproc)"
fi
mkdir -p "$out"

# 1. Importance matrix.
imatrix=$out/imatrix.gguf
if [ ! -f "$imatrix" ]; then
    "$bin/llama-imatrix" -m "$model" -f "$calib" -o "$imatrix" -c "$ctx" --chunks "$chunks" -t "$threads" \
        >"$out/imatrix.log" 2>&1 || { tail -20 "$out/imatrix.log"; exit 1; }
fi
echo "# imatrix: $imatrix from $calib ($(grep -m1 -o 'computing over [0-9]* chunks.*' "$out/imatrix.log" || echo '?'))"

# 2. Quantize.
base=$(basename "$model" .gguf)
base=${base%-q4_k_m}
file_of() { echo "$out/$base-$(echo "$1" | tr 'A-Z' 'a-z').gguf"; }
for t in "${types[@]}"; do
    f=$(file_of "$t")
    if [ ! -f "$f" ]; then
        "$bin/llama-quantize" --allow-requantize --imatrix "$imatrix" "$model" "$f.tmp" "$t" "$threads" \
            >"$out/quantize-$t.log" 2>&1 || { tail -20 "$out/quantize-$t.log"; exit 1; }
        mv "$f.tmp" "$f"
    fi
    echo "# $t: $f, $(($(stat -c %s "$f") / 1048576)) MiB, $("$tf" info "$f" 2>&1 | grep '^tensor types' | sed 's/^tensor types *//')"
done

# 3. Greedy generation on each file.
for t in "${types[@]}"; do
    f=$(file_of "$t")
    if text=$("$tf" run "$f" -p "def fibonacci(n):" --max-tokens 32 --temperature 0 --threads "$threads" 2>"$out/run-$t.err"); then
        printf 'run %s: %q\n' "$t" "$text"
    else
        echo "run $t: FAILED: $(grep -v '^\s*$' "$out/run-$t.err" | tail -3 | tr '\n' ' ')"
    fi
done

# 4. Timed pairs.
wait_quiet() {
    local load
    while load=$(cut -d' ' -f1 /proc/loadavg) && awk -v l="$load" -v m="$max_load" 'BEGIN { exit !(l > m) }'; do
        echo "# load average $load > $max_load, polling again in 30 s" >&2
        sleep 30
    done
}
results=$out/results.tsv
: >"$results"
# tf_bench TYPE PASS KIND PROMPT GEN: one TensorFold measurement; a refusal is recorded with its error text.
tf_bench() {
    local f key json
    f=$(file_of "$1")
    key=decode_tok_s
    [ "$3" = prefill ] && key=prefill_tok_s
    if json=$("$tf" bench "$f" --threads "$threads" --prompt-tokens "$4" --gen-tokens "$5" --runs "$runs" --json \
        2>"$out/bench-$1.err"); then
        v=$(echo "$json" | python3 -c "import json,sys; print('%.1f' % json.load(sys.stdin)['$key'])")
    else
        v="error: $(grep -v '^\s*$' "$out/bench-$1.err" | tail -3 | tr '\n' ' ')"
    fi
    printf '%s\t%s\ttensorfold\t%s\t%s\n' "$2" "$1" "$3" "$v" | tee -a "$results"
}
# llama_bench TYPE PASS KIND PROMPT GEN
llama_bench() {
    local f json
    f=$(file_of "$1")
    if json=$("$bin/llama-bench" -m "$f" -t "$threads" -p "$4" -n "$5" -r "$runs" -o json 2>"$out/llama-bench-$1.err"); then
        v=$(echo "$json" | python3 -c "import json,sys; print('%.1f' % json.load(sys.stdin)[0]['avg_ts'])")
    else
        v="error: $(grep -v '^\s*$' "$out/llama-bench-$1.err" | tail -3 | tr '\n' ' ')"
    fi
    printf '%s\t%s\tllama.cpp\t%s\t%s\n' "$2" "$1" "$3" "$v" | tee -a "$results"
}
echo "# commit $(git rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), threads $threads, runs $runs, passes $passes"
for pass in $(seq 1 "$passes"); do
    for t in "${types[@]}"; do
        for kind in decode prefill; do
            if [ "$kind" = decode ]; then tfp=(64 64) lp=(0 64); else tfp=(512 2) lp=(512 0); fi
            wait_quiet
            if [ $((pass % 2)) -eq 1 ]; then
                tf_bench "$t" "$pass" "$kind" "${tfp[@]}"
                llama_bench "$t" "$pass" "$kind" "${lp[@]}"
            else
                llama_bench "$t" "$pass" "$kind" "${lp[@]}"
                tf_bench "$t" "$pass" "$kind" "${tfp[@]}"
            fi
        done
    done
done

# Table: medians over the passes, tok/s; ratio = TensorFold / llama.cpp.
python3 - "$results" "${types[@]}" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
def cell(t, engine, kind):
    vals = [r[4] for r in rows if r[1] == t and r[2] == engine and r[3] == kind]
    errs = [v for v in vals if v.startswith("error")]
    if errs:
        return None, errs[0]
    nums = [float(v) for v in vals]
    return (statistics.median(nums), "%.1f" % statistics.median(nums)) if nums else (None, "")
print("| type | decode TF | decode llama.cpp | TF / llama.cpp | prefill 512 TF | prefill 512 llama.cpp | TF / llama.cpp |")
print("|---|---:|---:|---:|---:|---:|---:|")
for t in sys.argv[2:]:
    out = [t]
    for kind in ("decode", "prefill"):
        a, sa = cell(t, "tensorfold", kind)
        b, sb = cell(t, "llama.cpp", kind)
        out += [sa, sb, "%.2f" % (a / b) if a and b else ""]
    print("| " + " | ".join(out) + " |")
EOF
