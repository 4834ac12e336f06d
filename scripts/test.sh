#!/usr/bin/env bash
# The project's test command: installs what the tests need (idempotent), then
# runs the format check, clippy and every test of the workspace, then the
# end-to-end scenarios again on containerd 2.x where it can run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/install-deps.sh ]; then
  scripts/install-deps.sh
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
scripts/check-chart.sh
scripts/e2e-containerd2.sh
