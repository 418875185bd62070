#!/usr/bin/env bash
# Runs on the device machine what scripts/device-tests.sh built into .device/: `tests` (every CUDA test binary),
# `cli` (tensorfold check with a draft model and token_sha CUDA vs CPU on the tiny models), `bench` (decode
# timings of real shapes with random weights, copy bandwidth, and the transformers peer). No argument: all three.
# `tensor` (not in the default): the tensor arithmetic, token_sha and check on a bf16 model, then its timings
# (the example, then the CLI: serial decode, 2048-token prefill, 1/8/32 streams). `quick`: the example only, both
# arithmetics, 1.5B and 7B. `window`: the verify-window cost in the tensor arithmetic (1-, 16- and 8-row steps
# alternated, argmax ids, forward only), attention alone, and the engine's window costs (`bench --window-costs`),
# 1.5B and 7B. `variants` (VARIANTS="base;IL_PIPE=0 ..."): kernel variants (TF_CUDA_DEFINES) A/B'd in one call.
# `profile`: ncu per-kernel times and DRAM bytes of one decode step, 7B and 1.5B. `floor` (ROUNDS, default 4):
# serial decode of the three shapes against the floor this machine's copy bandwidth
# gives, in alternated rounds (bench/decode_floor.py). `peer-build`: llama.cpp's CUDA build (llama-bench) from the
# packed llama-cpp-python source, then `peer`: TensorFold and llama-bench on the same random-weight GGUFs of the
# Qwen2.5-7B shape (Q4_K_M, Q8_0, bf16; PEER_TYPES, PEER_RUNS pick); `batched`: aggregate decode of 8, 32 and 64
# streams against llama.cpp's llama-batched-bench on the same file (STREAMS, PEER_TYPES pick). `serve`: CPU == CUDA, drafted, streamed and
# concurrent replies through `tensorfold serve` and the openai package, per matrix type (SERVE_TYPES). `qprofile`:
# ncu per-kernel times of a quantized prefill chunk and the stall sections of one `mmqt_*` launch.
# The examples are crates/cuda-lab's.
# Logs go to $OUT (default .device/out; one file per step) and a summary to stdout; a device call brings back at
# most 8 files, so a caller that runs several steps packs $OUT into one archive.
set -uo pipefail
OUT=${OUT:-.device/out}
mkdir -p "$OUT"
what=${1:-all}
# NVRTC ships with the CUDA toolkit and in Python wheels; put every copy's folder on the library path (never a
# stubs/ folder: its libcuda is a stub that fails every call).
libs=$(find /usr/local /usr/lib /opt -name 'libnvrtc.so*' -not -path '*/stubs/*' 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
export TF_REPO_ROOT=$PWD RUST_BACKTRACE=1
B=${TF_BIN:-.device/bin}  # TF_BIN: another build's binaries (an A/B)
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"
status=0

if [ "$what" = all ] || [ "$what" = tests ]; then
    for t in $B/test-*; do
        name=$(basename "$t")
        start=$(date +%s)
        "$t" --test-threads=4 --nocapture >"$OUT/$name.log" 2>&1
        rc=$?
        [ $rc -ne 0 ] && status=1
        echo "$name rc=$rc $(($(date +%s) - start))s: $(grep -E '^test result' "$OUT/$name.log" | tail -1)"
        [ $rc -ne 0 ] && grep -E 'panicked|differ|failed with|error' "$OUT/$name.log" | head -20
    done
fi

if [ "$what" = all ] || [ "$what" = cli ]; then
    {
        for be in cuda cpu; do
            for prec in checkpoint full; do
                $B/tensorfold run .device/tiny-llama --backend $be --precision $prec -p "The quick brown fox" \
                    --max-tokens 64 --temperature 0.8 --seed 7 2>&1 >/dev/null | grep token_sha |
                    sed "s/^/run $be $prec: /"
            done
        done
        $B/tensorfold check .device/tiny-llama --backend cuda --drafter .device/tiny-llama3 --seeds 2 \
            --max-tokens 48 --json >"$OUT/check-cuda.json" 2>"$OUT/check-cuda.err"
        echo "check cuda rc=$?: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); c=r["cases"]; print(len(c), "cases,", r["mismatches"], "mismatches,", sum(x["drafted"] for x in c), "drafted,", sum(x["accepted"] for x in c), "accepted")' "$OUT/check-cuda.json" 2>&1)"
        tail -3 "$OUT/check-cuda.err"
    } 2>&1 | tee "$OUT/cli.log"
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
    {
        python3 - <<'PY'
import torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): y.copy_(x)
e.record(); e.synchronize()
ms = s.elapsed_time(e) / 10
print(f"copy bandwidth (read + write): {2 * x.numel() / ms / 1e6:.0f} GB/s")
PY
        # tensorfold bench on dummy weights with real shapes (bench/shapes): serial decode after a 64-token prompt,
        # prefill of 2048 tokens in chunks of 256, aggregate decode of 1/8/32 streams through shared rounds.
        T="$B/tensorfold bench --load-format dummy --backend cuda --precision full --json"
        for shape in qwen2.5-1.5b qwen2.5-7b llama-3-8b; do
            c=.device/shapes/$shape.json
            echo "== $shape"
            timeout 120 $T $c --prompt-tokens 64 --gen-tokens 128 --runs 3 || echo "decode $shape failed"
            [ $shape = llama-3-8b ] && continue
            timeout 150 $T $c --prompt-tokens 2048 --prefill-chunk 256 --gen-tokens 2 --runs 2 ||
                echo "prefill $shape failed"
            for n in 1 8 32; do
                timeout 120 $T $c --prompt-tokens 64 --gen-tokens 64 --runs 2 --streams $n || echo "streams $n $shape failed"
            done
        done
        # 1 row vs a 16-row window, and per-op times (the bench example, same dummy weights).
        for cfg in "qwen2.5-1.5b bf16 full" "qwen2.5-7b bf16 full"; do
            timeout 150 $B/bench $cfg || echo "bench $cfg failed or timed out"
        done
        timeout 150 python3 - <<'PY' || echo "transformers peer failed"
import time, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
cfg = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                  rope_theta=1e6)
with torch.device("cuda"):
    m = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
ids = torch.randint(0, 150000, (1, 64), device="cuda")
kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
with torch.no_grad():
    m.generate(ids, max_new_tokens=8, min_new_tokens=8, **kw)
    torch.cuda.synchronize(); t = time.time()
    m.generate(ids, max_new_tokens=64, min_new_tokens=64, **kw)
    torch.cuda.synchronize(); dt = time.time() - t
print(f"transformers {torch.__version__} qwen2.5-1.5b-shaped bf16 greedy decode: {64 / dt:.1f} tok/s")
PY
    } 2>&1 | tee "$OUT/bench.log"
fi
if [ "$what" = quick ]; then
    {
        # Forward-only timings of both arithmetics: 1 row vs a 16-row window, per op (synchronized, and GPU time
        # between events), attention alone at several context lengths, the MLP matmuls alone.
        for cfg in "qwen2.5-1.5b bf16 full" "qwen2.5-7b bf16 full" "qwen2.5-1.5b bf16 full tensor" \
            "qwen2.5-7b bf16 full tensor"; do
            timeout 200 $B/bench $cfg || echo "bench $cfg failed or timed out"
        done
    } 2>&1 | tee "$OUT/quick.log"
fi
if [ "$what" = window ]; then
    {
        # The window / 1-row ratio as docs/benchmarks.md (H200, verify window) measures it: after a 64-row prefill, 40 steps
        # of each row count alternated (contexts 64..1064), each fetching argmax ids as the engine does for greedy
        # rows; then attention alone at several contexts (heads per block auto, ≤ 7, ≤ 1).
        for shape in qwen2.5-1.5b qwen2.5-7b; do
            TF_BENCH_DECODE_ONLY=1 TF_BENCH_IDS=1 TF_BENCH_ROWS=1,16,8 timeout 120 $B/bench $shape bf16 full tensor |
                grep "decode only" | sed "s/^/$shape: /" || echo "window $shape failed"
            TF_BENCH_ATTN_ONLY=1 timeout 120 $B/bench $shape bf16 full tensor | tail -1 ||
                echo "attention $shape failed"
            # What drafting prices windows with through the engine: widths 1..16 after a 64-token prefix, argmax
            # ids back (greedy rounds) and every logits row copied (sampled rounds).
            timeout 120 $B/tensorfold bench .device/shapes/$shape.json --load-format dummy --backend cuda \
                --precision full --arithmetic tensor --prompt-tokens 64 --gen-tokens 2 --runs 1 --window-costs 16 |
                tail -3 | sed "s/^/$shape engine: /" || echo "window costs $shape failed"
        done
    } 2>&1 | tee "$OUT/window.log"
fi
if [ "$what" = variants ]; then
    {
        # Kernel variants (VARIANTS: define lists separated by ';', `base` = the defaults; default: the defaults
        # against IL_PIPE=0 PRE_WAIT=0) timed in one call: the bench example alternating one-row steps of every
        # variant in one process after checking their logits bitwise equal (each new variant's first load compiles
        # and JITs its kernels, ~55 s), then the engine per variant and shape, two rounds alternated.
        V=${VARIANTS:-"base;IL_PIPE=0 PRE_WAIT=0"}
        for shape in qwen2.5-1.5b qwen2.5-7b; do
            TF_BENCH_VARIANTS="$V" timeout 400 $B/bench $shape bf16 full portable | grep -E "^variant|bitwise" ||
                echo "variants $shape failed or timed out"
        done
        T="$B/tensorfold bench --load-format dummy --backend cuda --precision full --json --prompt-tokens 64"
        for round in 1 2; do
            for shape in qwen2.5-1.5b qwen2.5-7b; do
                IFS=';' read -ra list <<<"$V"
                for d in "${list[@]}"; do
                    [ "$d" = base ] && d=""
                    r=$(TF_CUDA_DEFINES="$d" timeout 120 $T .device/shapes/$shape.json --gen-tokens 128 --runs 3 |
                        python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["decode_tok_s"])' 2>&1)
                    echo "engine round $round $shape [${d:-base}]: $r tok/s"
                done
            done
        done
    } 2>&1 | tee "$OUT/variants.log"
fi
if [ "$what" = tensor ]; then
    {
        # A bf16 model (the tiny llama's shapes, dummy weights): token_sha in each arithmetic (tensor differs from
        # portable = CPU by design), and drafted == serial in the tensor arithmetic.
        D="--load-format dummy --dummy-dtype bf16 --precision full"
        for be in "cpu portable" "cuda portable" "cuda tensor"; do
            set -- $be
            $B/tensorfold run .device/tiny-llama $D --backend $1 --arithmetic $2 -p "The quick brown fox" \
                --max-tokens 64 --temperature 0.8 --seed 7 2>&1 >/dev/null | grep token_sha | sed "s/^/run bf16 $1 $2: /"
        done
        $B/tensorfold check .device/tiny-llama $D --backend cuda --arithmetic tensor --drafter .device/tiny-llama3 \
            --seeds 2 --max-tokens 48 --json >"$OUT/check-tensor.json" 2>"$OUT/check-tensor.err"
        echo "check cuda tensor rc=$?: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); c=r["cases"]; print(len(c), "cases,", r["mismatches"], "mismatches,", sum(x["drafted"] for x in c), "drafted,", sum(x["accepted"] for x in c), "accepted")' "$OUT/check-tensor.json" 2>&1)"
        tail -3 "$OUT/check-tensor.err"
        # Forward-only timings (1 row, 16-row window, per op, MLP matmuls alone), then the CLI's serial
        # decode and 2048-token prefill.
        for cfg in "qwen2.5-1.5b bf16 full tensor" "qwen2.5-7b bf16 full tensor"; do
            timeout 200 $B/bench $cfg || echo "bench $cfg failed or timed out"
        done
        T="$B/tensorfold bench --load-format dummy --backend cuda --precision full --arithmetic tensor --json"
        for shape in qwen2.5-1.5b qwen2.5-7b; do
            c=.device/shapes/$shape.json
            echo "== $shape tensor"
            timeout 120 $T $c --prompt-tokens 64 --gen-tokens 128 --runs 3 || echo "decode $shape failed"
            timeout 150 $T $c --prompt-tokens 2048 --prefill-chunk 256 --gen-tokens 2 --runs 2 ||
                echo "prefill $shape failed"
            for n in 1 8 32; do
                timeout 120 $T $c --prompt-tokens 64 --gen-tokens 64 --runs 2 --streams $n || echo "streams $n $shape failed"
            done
        done
    } 2>&1 | tee "$OUT/tensor.log"
fi
if [ "$what" = profile ]; then
    {
        # Per-kernel GPU time and DRAM bytes of decode steps (ncu, each kernel alone with caches flushed, so PDL
        # overlap is not in these; medians over 250 launches, about one step), both shapes, current kernels
        # (TF_CUDA_DEFINES applies). Matmuls are told apart by the bytes they read.
        for shape in qwen2.5-7b qwen2.5-1.5b; do
            TF_BENCH_DECODE_ONLY=1 TF_BENCH_IDS=1 timeout 200 /usr/local/cuda/bin/ncu --clock-control none \
                --launch-skip 4000 --launch-count 250 --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
                $B/bench $shape bf16 full portable >"$OUT/ncu-$shape.csv" 2>/dev/null || echo "ncu $shape failed"
            SHAPE=$shape python3 - "$OUT/ncu-$shape.csv" <<'PY'
import collections, csv, os, sys
lines = open(sys.argv[1]).read().splitlines()
i = next((j for j, l in enumerate(lines) if l.startswith('"ID"')), None)
if i is None:
    sys.exit("ncu: no csv")
time_unit = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}
byte_unit = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9}
recs = collections.defaultdict(dict)
for r in csv.DictReader(lines[i:]):
    recs[r["ID"]]["name"] = r["Kernel Name"].split("(")[0]
    recs[r["ID"]][r["Metric Name"]] = (float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
st = collections.defaultdict(list)
for rec in recs.values():
    t, b = rec["gpu__time_duration.sum"], rec["dram__bytes_read.sum"]
    tn, bb = t[0] * time_unit[t[1]], b[0] * byte_unit[b[1]]
    st[rec["name"] + (f" [{bb / 1e6:.0f} MB]" if "matmul" in rec["name"] else "")].append((tn, bb))
print(f"ncu {os.environ['SHAPE']}: median per kernel (each alone)")
for k, v in sorted(st.items(), key=lambda x: -sorted(x[1])[len(x[1]) // 2][0]):
    t, b = sorted(x[0] for x in v)[len(v) // 2], sorted(x[1] for x in v)[len(v) // 2]
    print(f"  {k:42s} n={len(v):3d} {t / 1e3:8.2f} us {b / 1e6:9.2f} MB {b / t / 1e3:6.2f} TB/s")
PY
        done
    } 2>&1 | tee "$OUT/profile.log"
fi

if [ "$what" = peer-build ] || { [ "$what" = peer ] && [ ! -x .device/llama/llama-bench ]; } ||
    { [ "$what" = batched ] && [ ! -x .device/llama/llama-batched-bench ]; }; then
    # llama.cpp's CUDA build (llama-bench and llama-batched-bench, static, sm_90) from the source vendored in PyPI's llama-cpp-python
    # sdist (scripts/device-tests.sh packs it into .device/llama-src.tar.xz); the binary comes back under $OUT as
    # llama-cuda.tar.xz.* pieces, which scripts/device-tests.sh unpacks into .device/llama/ for later calls.
    {
        start=$(date +%s)
        rm -rf /tmp/llama && mkdir -p /tmp/llama && tar xJf .device/llama-src.tar.xz -C /tmp/llama
        cmake -S /tmp/llama/llama.cpp -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
            -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DBUILD_SHARED_LIBS=OFF >"$OUT/llama-cmake.log" 2>&1 || tail -20 "$OUT/llama-cmake.log"
        timeout ${LLAMA_BUILD_S:-480} cmake --build /tmp/llama/build --target llama-bench llama-batched-bench \
            -j "$(nproc)" >"$OUT/llama-build.log" 2>&1 || { tail -20 "$OUT/llama-build.log"; status=1; }
        mkdir -p .device/llama
        for b in llama-bench llama-batched-bench; do
            cp /tmp/llama/build/bin/$b .device/llama/ && strip .device/llama/$b
        done
        ls -la .device/llama
        echo "llama.cpp build: $(($(date +%s) - start))s, commit $(cat /tmp/llama/llama.cpp/.commit 2>/dev/null)"
        tar cJf - -C .device llama | split -b 15M - "$OUT/llama-cuda.tar.xz."
        ls -la "$OUT"/llama-cuda.tar.xz.*
    } 2>&1 | tee "$OUT/peer-build.log"
fi
if [ "$what" = peer ]; then
    # Both engines on the same GGUF files with random weights and the Qwen2.5-7B shape (the gguf_shape example):
    # serial decode of 128 tokens and prefill of 2048, TensorFold (`tensorfold bench`, greedy, the engine loop) and
    # llama.cpp (llama-bench, all layers on the GPU, flash attention on), formats and engines alternated.
    {
        G=${GGUF_DIR:-/tmp/gguf}
        mkdir -p "$G"
        python3 -c 'import torch; x=torch.empty(4<<30,dtype=torch.uint8,device="cuda"); y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
s,e=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True); s.record()
for _ in range(10): y.copy_(x)
e.record(); e.synchronize(); print(f"copy bandwidth (read + write): {2*x.numel()/(s.elapsed_time(e)/10)/1e6:.0f} GB/s")'
        for t in ${PEER_TYPES:-q4_k_m q8_0 bf16}; do
            [ -f "$G/qwen2.5-7b-$t.gguf" ] || $B/gguf_shape .device/shapes/qwen2.5-7b.json $t "$G/qwen2.5-7b-$t.gguf"
        done
        T="$B/tensorfold bench --backend cuda"
        L=".device/llama/llama-bench -ngl 99 -fa 1 -o jsonl"
        for what_ in ${PEER_RUNS:-decode prefill}; do
            for t in ${PEER_TYPES:-q4_k_m q8_0 bf16}; do
                f="$G/qwen2.5-7b-$t.gguf"
                prec=checkpoint
                [ $t = bf16 ] && prec=full
                if [ $what_ = decode ]; then
                    echo "== $t decode tensorfold: $(timeout 150 $T $f --precision $prec --prompt-tokens 64 --gen-tokens 128 --runs 3 2>&1 | tail -2 | tr '\n' ' ')"
                    # PEER_AB="VAR=VALUE ...": TensorFold again with those tuning variables (an A/B in the same round).
                    [ -n "${PEER_AB:-}" ] && [ $t != bf16 ] &&
                        echo "== $t decode tensorfold [$PEER_AB]: $(env $PEER_AB timeout 150 $T $f --precision $prec --prompt-tokens 64 --gen-tokens 128 --runs 3 2>&1 | tail -2 | tr '\n' ' ')"
                    echo "== $t decode llama.cpp: $(timeout 150 $L -m $f -p 0 -n 128 -r 3 2>"$OUT/llama-$t.err" | tail -1)"
                elif [ $what_ = prefill ]; then
                    echo "== $t prefill llama.cpp: $(timeout 150 $L -m $f -p 2048 -n 0 -r 2 2>>"$OUT/llama-$t.err" | tail -1)"
                    echo "== $t prefill tensorfold: $(timeout 200 $T $f --precision $prec --prompt-tokens 2048 --prefill-chunk ${PREFILL_CHUNK:-256} --gen-tokens 2 --runs 2 2>&1 | tail -2 | tr '\n' ' ')"
                fi
            done
        done
    } 2>&1 | tee "$OUT/peer.log"
fi
if [ "$what" = batched ]; then
    # Aggregate decode of STREAMS (default 8 32 64) sequences at once on the Q4_K_M file of the Qwen2.5-7B shape
    # (PEER_TYPES picks others): `tensorfold bench --streams N` (512-token prompts, 256 generated, greedy, shared
    # rounds through the engine loop) against llama.cpp's `llama-batched-bench` (the same batch sizes, prompts not
    # shared: its S_TG column is the aggregate generation speed). Both in-process, no HTTP.
    {
        G=${GGUF_DIR:-/tmp/gguf}
        mkdir -p "$G"
        for t in ${PEER_TYPES:-q4_k_m}; do
            f="$G/qwen2.5-7b-$t.gguf"
            [ -f "$f" ] || $B/gguf_shape .device/shapes/qwen2.5-7b.json $t "$f"
            prec=checkpoint
            [ $t = bf16 ] && prec=full
            for n in ${STREAMS:-8 32 64}; do
                echo "== $t $n streams tensorfold: $(timeout 200 $B/tensorfold bench "$f" --backend cuda --precision $prec \
                    --prompt-tokens 512 --gen-tokens 256 --runs 1 --streams $n 2>&1 | tail -2 | tr '\n' ' ')"
                timeout 200 .device/llama/llama-batched-bench -m "$f" -ngl 99 -fa on -c $((n * 768)) -b 2048 -ub 512 \
                    -npp 512 -ntg 256 -npl $n >"$OUT/llama-batched-$t-$n.log" 2>&1
                echo "== $t $n streams llama.cpp: $(grep -E '^\|' "$OUT/llama-batched-$t-$n.log" | tail -1)"
            done
        done
    } 2>&1 | tee "$OUT/batched.log"
fi
if [ "$what" = qprofile ]; then
    # Per-kernel GPU time and DRAM bytes of a quantized prefill (ncu, each kernel alone with caches flushed): one
    # warm-up and one measured prefill of PREFILL_ROWS (default 1024) rows in one chunk, on the Q4_K_M file of the
    # Qwen2.5-7B shape (PEER_TYPES picks others), then the stall and occupancy sections of one mmqt launch.
    {
        G=${GGUF_DIR:-/tmp/gguf}
        mkdir -p "$G"
        n=${PREFILL_ROWS:-1024}
        for t in ${PEER_TYPES:-q4_k_m}; do
            f="$G/qwen2.5-7b-$t.gguf"
            [ -f "$f" ] || $B/gguf_shape .device/shapes/qwen2.5-7b.json $t "$f"
            timeout 240 /usr/local/cuda/bin/ncu --clock-control none --launch-count 3000 \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $B/tensorfold bench "$f" --backend cuda \
                --precision checkpoint --prompt-tokens $n --prefill-chunk $n --gen-tokens 2 --runs 1 \
                >"$OUT/ncu-prefill-$t.csv" 2>"$OUT/ncu-prefill-$t.err" || echo "ncu prefill $t failed"
            python3 bench/ncu_summary.py "$OUT/ncu-prefill-$t.csv" "prefill $n rows $t"
            timeout 120 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:mmqt --launch-skip 2 \
                --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats \
                --section ComputeWorkloadAnalysis --section InstructionStats $B/tensorfold bench "$f" \
                --backend cuda --precision checkpoint --prompt-tokens $n --prefill-chunk $n --gen-tokens 2 --runs 1 \
                >"$OUT/ncu-mmqt-$t.txt" 2>&1 || echo "ncu mmqt $t failed"
            grep -vE '^==PROF==|^\s*$' "$OUT/ncu-mmqt-$t.txt" | tail -80
        done
    } 2>&1 | tee "$OUT/qprofile.log"
fi
if [ "$what" = serve ]; then
    # Per matrix type (SERVE_TYPES), three servers of the tiny Qwen2 shape with dummy weights: the CPU serial and
    # solo (the reference), CUDA serial and solo, CUDA drafting (--min-drafts 1) with 8 shared rounds; then
    # crates/cli/tests/py/backends_client.py through the openai package (wheels in .whl, see docs/cuda.md).
    {
        if [ -d .whl ]; then
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
                export PYTHONPATH=/tmp/site
        fi
        start_server() { # name, args...: starts `tensorfold serve`, prints its base URL once it listens
            local name=$1
            shift
            $B/tensorfold serve .device/tiny-qwen --load-format dummy --port 0 --context 1024 --kv-pool-gib 1 \
                --no-prefix-cache --no-live-line --name tiny "$@" >"$OUT/serve-$name.log" 2>&1 &
            echo $! >"$OUT/serve-$name.pid"
            for _ in $(seq 1200); do
                port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$OUT/serve-$name.log" | grep -o '[0-9]*$')
                [ -n "$port" ] && { echo "http://127.0.0.1:$port/v1"; return 0; }
                kill -0 "$(cat "$OUT/serve-$name.pid")" 2>/dev/null || break
                sleep 0.1
            done
            echo "server $name did not start: $(tail -3 "$OUT/serve-$name.log")" >&2
            return 1
        }
        for t in ${SERVE_TYPES:-q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k bf16}; do
            prec=checkpoint
            [ $t = bf16 ] && prec=full
            D="--dummy-dtype $t --precision $prec"
            ref=$(start_server "$t-ref" $D --backend cpu --threads 8 --no-drafts --parallel 1) &&
                ser=$(start_server "$t-serial" $D --backend cuda --no-drafts --parallel 1) &&
                tst=$(start_server "$t-test" $D --backend cuda --min-drafts 1 --parallel 8) &&
                timeout 300 python3 crates/cli/tests/py/backends_client.py --ref "$ref" --serial "$ser" --test "$tst" \
                    --model tiny >"$OUT/serve-$t.client.log" 2>&1
            rc=$?
            [ $rc -ne 0 ] && status=1
            echo "serve $t rc=$rc: $(grep -E '^(ok|FAIL)|drafted tokens' "$OUT/serve-$t.client.log" | tr '\n' ' ')"
            for n in ref serial test; do
                kill "$(cat "$OUT/serve-$t-$n.pid" 2>/dev/null)" 2>/dev/null
            done
            wait
        done
    } 2>&1 | tee "$OUT/serve.log"
fi
if [ "$what" = floor ]; then
    python3 bench/decode_floor.py --rounds "${ROUNDS:-4}" --out "$OUT/floor.json" 2>&1 | tee "$OUT/floor.log"
    [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
fi

exit $status
