#!/usr/bin/env bash
# The whole test suite: fetch the real models the tests read, then format check and every test.
# This is the README's test command; .ci/run calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== models"
bash scripts/fetch-models.sh all

echo "== python test venv (.venv-test: the openai client the serve tests drive)"
if [ ! -x .venv-test/bin/python ]; then
    python3 -m venv .venv-test
fi
.venv-test/bin/python -m pip install --quiet --disable-pip-version-check -r crates/cli/tests/py/requirements.txt
TF_TEST_PYTHON="$(pwd)/.venv-test/bin/python"
export TF_TEST_PYTHON

echo "== node test packages (crates/cli/tests/js/node_modules: the openai JS SDK the serve tests drive)"
npm ci --prefix crates/cli/tests/js --no-audit --no-fund

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo test"
cargo test --workspace --locked "$@"
