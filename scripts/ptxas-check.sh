#!/usr/bin/env bash
# Compiles the CUDA kernels here (NVRTC, then ptxas: no GPU needed) for sm_90 with the given kernel defines and
# prints each kernel's registers and spills, so a variant whose PTX does not assemble, or that spills, is caught
# before it takes device time. Needs libnvrtc and ptxas: NVRTC_LIB (the folder of libnvrtc.so.13 or .12) and PTXAS
# (default: the CUDA 13.0 wheels, which match the device's driver, when unpacked under target/nvrtc13 by
# `pip install --target target/nvrtc13 "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-nvcc==13.0.*"`; else the cu12 wheels
# nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 under target/nvrtc). CARGO_TARGET_DIR defaults to target/cuda.
#
# With CUBIN_OUT=FILE it also keeps the machine code there.
#
# Usage: scripts/ptxas-check.sh [NAME=INTEGER ...] [| grep il1]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target/cuda}
if [ -z "${NVRTC_LIB:-}${PTXAS:-}" ] && [ -x target/nvrtc13/nvidia/cu13/bin/ptxas ]; then
    NVRTC_LIB=$PWD/target/nvrtc13/nvidia/cu13/lib PTXAS=$PWD/target/nvrtc13/nvidia/cu13/bin/ptxas
fi
NVRTC_LIB=${NVRTC_LIB:-$PWD/target/nvrtc/nvidia/cuda_nvrtc/lib}
PTXAS=${PTXAS:-$PWD/target/nvrtc/nvidia/cuda_nvcc/bin/ptxas}
# The kernels are embedded by include_str! in src/geometry.rs: touching it makes cargo rebuild and copy the example
# to release/examples/ptx even when its own unit is fresh, which it would otherwise leave as is; a build of the
# same example from another checkout (a git worktree) sharing this target dir would then be what runs (a "new"
# module built that way holds the worktree's old kernels).
touch crates/backend-cuda/src/geometry.rs
cargo build --release -q -p tf-cuda-lab --features cuda --example ptx
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
LD_LIBRARY_PATH="$NVRTC_LIB" "$CARGO_TARGET_DIR/release/examples/ptx" sm_90 "$@" >"$tmp/k.ptx"
"$PTXAS" -arch=sm_90 -v "$tmp/k.ptx" -o "$tmp/k.cubin" 2>&1 |
    awk '/Compiling entry function/ { split($0, q, "'"'"'"); k = q[2] }
         /Used [0-9]+ registers/ {
             match($0, /Used [0-9]+ registers/); print k, substr($0, RSTART + 5, RLENGTH - 15), "registers" }
         /spill/ && !/0 bytes spill stores, 0 bytes spill loads/ { print k, $0 }
         /error/ { print }'
if [ -n "${CUBIN_OUT:-}" ]; then
    cp "$tmp/k.cubin" "$CUBIN_OUT"
    ls -la "$CUBIN_OUT"
fi
