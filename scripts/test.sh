#!/usr/bin/env bash
# The whole test suite: fetch the real models the tests read, then format check and every test.
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== models"
bash scripts/fetch-models.sh all

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo test"
cargo test --workspace --locked "$@"
