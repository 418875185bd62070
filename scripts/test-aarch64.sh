#!/usr/bin/env bash
# Runs the CPU kernel tests (tf-backend-cpu, tf-quant) as aarch64 binaries under qemu user-mode emulation, so the
# NEON kernels are compared bit for bit with the scalar reference on an x86 machine. Every test that loops over
# `Isa::available()` gets `[Scalar, Neon]` there. This checks exactness only: timings under qemu mean nothing.
#
# Needs (installs nothing itself):
#   rustup target add aarch64-unknown-linux-gnu
#   apt-get install -y qemu-user gcc-aarch64-linux-gnu      (Debian/Ubuntu: qemu-aarch64, the cross linker and the
#                                                            aarch64 libc under /usr/aarch64-linux-gnu)
# Usage: scripts/test-aarch64.sh [extra cargo test arguments, e.g. -- --test-threads=1]
# Release mode because the emulated debug build is slow (ops_exact alone takes minutes even in release).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=0
for tool in qemu-aarch64 aarch64-linux-gnu-gcc; do
    command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y qemu-user gcc-aarch64-linux-gnu)" >&2; missing=1; }
done
rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu ||
    { echo "missing: rustup target aarch64-unknown-linux-gnu (rustup target add aarch64-unknown-linux-gnu)" >&2; missing=1; }
[ "$missing" = 0 ] || exit 2
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
exec cargo test --release -p tf-backend-cpu -p tf-quant --target aarch64-unknown-linux-gnu "$@"
