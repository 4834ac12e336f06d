#!/usr/bin/env bash
# The project's test command: installs what the tests need (idempotent), then
# runs the format check, clippy and every test of the workspace, the node demo
# (which must succeed and print its cpuset tables), the chart check, then the
# end-to-end scenarios again on containerd 2.x where it can run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x scripts/install-deps.sh ]; then
  scripts/install-deps.sh
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# The node demo as a user runs it: a failure, or output without a cpuset
# table (header "pod container kind cpuset.cpus Cpus_allowed_list"), fails
# the run.
demo_log="$(mktemp)"
trap 'rm -f "$demo_log"' EXIT
if ! scripts/demo.sh 2>&1 | tee "$demo_log"; then
  echo "test: scripts/demo.sh failed" >&2
  exit 1
fi
if ! grep -Eq '^ +pod +container +kind +cpuset\.cpus +Cpus_allowed_list *$' "$demo_log"; then
  echo "test: scripts/demo.sh printed no cpuset table" >&2
  exit 1
fi
if ! grep -Eq '^ +[^ ]+ +[^ ]+ +(shared|exclusive|mixed) +[0-9]' "$demo_log"; then
  echo "test: the cpuset tables of scripts/demo.sh list no container" >&2
  exit 1
fi
scripts/check-chart.sh
scripts/e2e-containerd2.sh
