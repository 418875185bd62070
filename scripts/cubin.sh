#!/usr/bin/env bash
# Builds the CUDA kernels here into a module image for sm_90 (NVRTC, then ptxas; no GPU needed: the machine code
# scripts/ptxas-check.sh assembles and lists, kept), for measurements on the device without its driver JIT (about a minute
# per define set there): run the engine with TF_CUDA_MODULE=FILE and the same TF_CUDA_DEFINES (the host reads
# some of them). Needs what scripts/ptxas-check.sh needs.
#
# Usage: scripts/cubin.sh FILE.cubin [NAME=INTEGER ...]
set -euo pipefail
out=${1:?usage: scripts/cubin.sh FILE.cubin [NAME=INTEGER ...]}
shift
CUBIN_OUT=$(realpath -m "$out") exec "$(dirname "$0")/ptxas-check.sh" "$@"
