#!/usr/bin/env bash
# Builds the CUDA kernels here into a module image for sm_90 (NVRTC, then ptxas; no GPU needed), for
# measurements on the device without its driver JIT (about a minute per define set there): run the engine with
# TF_CUDA_MODULE=FILE and the same TF_CUDA_DEFINES (the host reads some of them). Needs libnvrtc and ptxas, as
# scripts/ptxas-check.sh (the pip wheels nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12 under /work/nvrtc).
#
# Usage: scripts/cubin.sh FILE.cubin [NAME=INTEGER ...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/cubin.sh FILE.cubin [NAME=INTEGER ...]}
shift
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-cuda}
NVRTC_LIB=${NVRTC_LIB:-/work/nvrtc/nvidia/cuda_nvrtc/lib}
PTXAS=${PTXAS:-/work/nvrtc/nvidia/cuda_nvcc/bin/ptxas}
cargo build --release -q -p tf-backend-cuda --features cuda --example ptx
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
LD_LIBRARY_PATH="$NVRTC_LIB" "$CARGO_TARGET_DIR/release/examples/ptx" sm_90 "$@" >"$tmp/k.ptx"
"$PTXAS" -O3 -arch=sm_90 "$tmp/k.ptx" -o "$out"
ls -la "$out"
