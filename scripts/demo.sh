#!/usr/bin/env bash
# The node demo: installs what it needs (idempotent), builds both processes and
# the demo, then brings up a private node (containerd with NRI, a fake API
# server, dra-plugin, nri-plugin), runs a shared, an exclusive and a mixed pod
# and prints each container's cpuset as it changes. Cleans up after itself.
# Needs root (containerd and cgroups).
#
#   scripts/demo.sh        on this machine
#   scripts/demo.sh --vm   inside the VM node of scripts/vm-node.sh: 8 CPUs
#                          in 2 sockets and 2 NUMA nodes with SMT, cgroup v2
#   scripts/demo.sh --cluster
#                          on the real node (scripts/real-node.sh): a real
#                          kube-apiserver, scheduler, controller-manager and
#                          kubelet, containerd 2.4, the driver installed by
#                          `helm install` (scripts/cluster-demo.sh; the first
#                          run builds them: tens of minutes)
#   --kubernetes-version 1.34|1.35|1.36|1.37 and --feature-gates Name=true,...
#                          choose what the fake API server plays
set -euo pipefail
cd "$(dirname "$0")/.."
in_vm=0
demo_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --vm) in_vm=1 ;;
    --cluster) shift; scripts/install-deps.sh; exec scripts/cluster-demo.sh "$@" ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) demo_args+=("$1") ;;
  esac
  shift
done
if [ "$(id -u)" -ne 0 ]; then
  echo "demo: must run as root (containerd and cgroups need it)" >&2
  exit 1
fi
scripts/install-deps.sh
echo "demo: building dra-plugin, nri-plugin and the demo (a first build takes a few minutes)"
cargo build --quiet -p dra-plugin -p nri-plugin -p dra-cpu-tests --bin dra-plugin --bin nri-plugin --bin node-demo
target_dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
export DRA_PLUGIN_BIN="${DRA_PLUGIN_BIN:-$target_dir/debug/dra-plugin}"
export NRI_PLUGIN_BIN="${NRI_PLUGIN_BIN:-$target_dir/debug/nri-plugin}"
# Arguments go to the demo: --kubernetes-version 1.34|1.35|1.36|1.37 and
# --feature-gates Name=true,... choose what the fake API server plays.
if [ "$in_vm" -eq 1 ]; then
  exec scripts/vm-node.sh -- "$target_dir/debug/node-demo" "${demo_args[@]}"
fi
exec "$target_dir/debug/node-demo" "${demo_args[@]}"
