#!/usr/bin/env bash
# Runs the cargo-fuzz targets under fuzz/ (nightly Rust and cargo-fuzz: `cargo install cargo-fuzz`), one libFuzzer
# process at a time, each target for a number of executions (-runs) or seconds (-max_total_time), starting from
# its seeds (fuzz/seeds/<target>, read-only) and its working corpus (fuzz/corpus/<target>, git-ignored), with its
# dictionary and input length from crates/fuzz/src/lib.rs. Crashes are written to fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh                      # every target, 1,000,000 executions each
#   FUZZ_RUNS=10000 scripts/fuzz.sh gguf # one target, 10,000 executions
#   FUZZ_TIME=10 scripts/fuzz.sh         # every target, 10 seconds each
#
# Prints one line per target: its name, executions, seconds and the final libFuzzer line. Exits non-zero on the
# first target that fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "scripts/fuzz.sh needs a nightly toolchain and cargo-fuzz (rustup toolchain install nightly; cargo install cargo-fuzz)" >&2
    exit 2
fi

# name dict max_len, as tf_fuzz::TARGETS says.
targets=(
    "gguf gguf.dict 4096"
    "safetensors safetensors.dict 4096"
    "tokenizer text.dict 1024"
    "chat_template request.dict 2048"
    "chat request.dict 2048"
    "completions request.dict 2048"
    "responses request.dict 2048"
    "messages request.dict 2048"
    "count_tokens request.dict 2048"
    "tokenize request.dict 2048"
    "detokenize request.dict 2048"
)
want=("$@")
limit="-runs=${FUZZ_RUNS:-1000000}"
if [[ -n "${FUZZ_TIME:-}" ]]; then
    limit="-max_total_time=$FUZZ_TIME"
fi

# No sanitizer unless FUZZ_SANITIZER names one (address, ...): the code under test is safe Rust, fuzzed with
# debug assertions and overflow checks on; AddressSanitizer runs 3 to 6 times slower.
sanitizer="${FUZZ_SANITIZER:-none}"
nice -n 10 cargo +nightly fuzz build --sanitizer "$sanitizer" >/dev/null
mkdir -p target/fuzz-logs
for t in "${targets[@]}"; do
    read -r name dict max_len <<<"$t"
    if [[ ${#want[@]} -gt 0 && ! " ${want[*]} " =~ " $name " ]]; then
        continue
    fi
    mkdir -p "fuzz/corpus/$name" "fuzz/artifacts/$name"
    log="target/fuzz-logs/$name.log"
    start=$(date +%s)
    if ! nice -n 10 cargo +nightly fuzz run --sanitizer "$sanitizer" "$name" "fuzz/corpus/$name" "fuzz/seeds/$name" -- \
        "$limit" -dict="fuzz/dict/$dict" -max_len="$max_len" -timeout=10 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$name/" >"$log" 2>&1; then
        echo "$name: FAILED (log: $log)" >&2
        grep -m 1 -A 2 -E "panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer" "$log" >&2 || tail -n 20 "$log" >&2
        grep -E "^artifact_prefix=|Test unit written" "$log" >&2 || true
        exit 1
    fi
    secs=$(($(date +%s) - start))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    echo "$name: $execs executions in ${secs}s; $(grep -E '^Done [0-9]+ runs' "$log" | tail -n 1)"
done
