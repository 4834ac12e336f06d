#!/usr/bin/env bash
# The project's test command: installs what the tests need (idempotent), then
# runs the format check, clippy and every test of the workspace, the node demo
# (which must succeed and print its cpuset tables), the chart check, the real
# node (scripts/real-node-tests.sh: a real kube-apiserver, scheduler,
# controller-manager and kubelet built from the Go module proxy, containerd
# 2.x with NRI, the driver installed by `helm install`; Kubernetes 1.37 with
# containerd 2.4, then 1.34 with containerd 2.2), the node demo on it, then
# the VM node (scripts/vm-node-tests.sh): the node demo and the scenarios of
# tests/tests/vm_node.rs on a 2-socket, 2-NUMA-node, SMT, cgroup v2 guest, on
# containerd 1.7 and 2.x, and 20 power cuts of the power-cut storm
# (scripts/power-cut-storm.sh) in a 2-vCPU guest.
# The first run builds the real node's components (scripts/build-components.sh,
# tens of minutes on 2 cores); later runs find them cached.
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
scripts/check-chart.sh
# The real node: the oldest and newest supported pairs. Its scenarios use the
# test build of the binaries in the driver's image (no release build).
scripts/build-components.sh all
export DRA_CPU_IMAGE_PROFILE=debug
scripts/real-node-tests.sh
scripts/real-node-tests.sh --oldest
if ! scripts/demo.sh --cluster 2>&1 | tee "$demo_log"; then
  echo "test: scripts/demo.sh --cluster failed" >&2
  exit 1
fi
check_demo_tables "$demo_log" "scripts/demo.sh --cluster"
if ! scripts/vm-node-tests.sh --demo --power-cuts 20 2>&1 | tee "$vm_log"; then
  echo "test: the VM node runs failed (scripts/vm-node-tests.sh)" >&2
  exit 1
fi
check_demo_tables "$vm_log" "the node demo in the VM node"
