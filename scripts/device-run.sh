#!/usr/bin/env bash
# Runs on the device machine (see scripts/device-tests.sh): every CUDA test binary in .device/bin, then the
# benchmarks in .device/bench.sh if present. Logs go to $OUT (one file per step) and a summary to stdout.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# NVRTC ships with the CUDA toolkit and in Python wheels; put every copy's folder on the library path.
libs=$(find /usr/local /usr/lib /opt -name 'libnvrtc.so*' -not -path '*/stubs/*' 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
export TF_REPO_ROOT=$PWD RUST_BACKTRACE=1
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd .device/bin/tensorfold 2>&1 | head -20
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"
status=0
for t in .device/bin/test-*; do
    name=$(basename "$t")
    start=$(date +%s)
    "$t" --test-threads=2 >"$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    echo "$name rc=$rc $(( $(date +%s) - start ))s: $(grep -E '^test result' "$OUT/$name.log" | tail -1)"
    [ $rc -ne 0 ] && grep -E 'panicked|differ|failed with|error' "$OUT/$name.log" | head -20
done
if [ -f .device/bench.sh ]; then
    bash .device/bench.sh 2>&1 | tee "$OUT/bench.log"
fi
exit $status
