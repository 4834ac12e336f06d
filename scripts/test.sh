#!/usr/bin/env bash
# The project's test command: installs what the tests need (idempotent), then
# runs the format check, clippy and every test of the workspace, the node demo
# (which must succeed and print its cpuset tables), the chart check, the
# end-to-end scenarios again on containerd 2.x where it can run, then the VM
# node (scripts/vm-node-tests.sh): the node demo and the scenarios of
# tests/tests/vm_node.rs on a 2-socket, 2-NUMA-node, SMT, cgroup v2 guest, on
# containerd 1.7 and 2.x, and 20 power cuts of the power-cut storm
# (scripts/power-cut-storm.sh) in a 2-vCPU guest.
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
vm_log="$(mktemp)"
trap 'rm -f "$demo_log" "$vm_log"' EXIT
if ! scripts/demo.sh 2>&1 | tee "$demo_log"; then
  echo "test: scripts/demo.sh failed" >&2
  exit 1
fi
check_demo_tables() {
  local log="$1" what="$2"
  if ! grep -Eq '^ +pod +container +kind +cpuset\.cpus +Cpus_allowed_list *$' "$log"; then
    echo "test: $what printed no cpuset table" >&2
    exit 1
  fi
  if ! grep -Eq '^ +[^ ]+ +[^ ]+ +(shared|exclusive|mixed) +[0-9]' "$log"; then
    echo "test: the cpuset tables of $what list no container" >&2
    exit 1
  fi
}
check_demo_tables "$demo_log" scripts/demo.sh
# The demo publishes and prepares against the releases before the mapping
# too: 1.34 without consumable capacity (individual devices) and 1.36.
for release in 1.34 1.36; do
  if ! scripts/demo.sh --kubernetes-version "$release" 2>&1 | tee "$demo_log"; then
    echo "test: scripts/demo.sh --kubernetes-version $release failed" >&2
    exit 1
  fi
  check_demo_tables "$demo_log" "scripts/demo.sh --kubernetes-version $release"
done
scripts/check-chart.sh
scripts/e2e-containerd2.sh
if ! scripts/vm-node-tests.sh --demo --power-cuts 20 2>&1 | tee "$vm_log"; then
  echo "test: the VM node runs failed (scripts/vm-node-tests.sh)" >&2
  exit 1
fi
check_demo_tables "$vm_log" "the node demo in the VM node"
