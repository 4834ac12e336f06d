#!/usr/bin/env bash
# The real-node scenarios: brings up the real node (scripts/real-node.sh up),
# installs the driver with `helm install`, runs tests/tests/real_node.rs
# against it, uninstalls the driver and checks that it left nothing behind,
# then takes the node down, also when a step fails.
#
#   scripts/real-node-tests.sh            Kubernetes and containerd: the newest
#                                         pair of tests/real-node/pins.env
#   scripts/real-node-tests.sh --oldest   the oldest pair
#   scripts/real-node-tests.sh --versions KUBERNETES CONTAINERD   any pair
#   scripts/real-node-tests.sh --smoke    only the smoke scenarios (slices, an
#                                         exclusive and a mixed pod, restarts)
#   scripts/real-node-tests.sh -- NAME... only the scenarios whose names
#                                         contain one of NAME (and the
#                                         uninstall checks)
#
# The first run builds the components (tens of minutes on 2 cores; cached).
set -euo pipefail
cd "$(dirname "$0")/.."
which=() filters=()
while [ $# -gt 0 ]; do
  case "$1" in
    --oldest) which=(--oldest); shift ;;
    --versions)
      [ $# -ge 3 ] || { echo "real-node-tests: --versions KUBERNETES CONTAINERD" >&2; exit 2; }
      which=(--versions "$2" "$3"); shift 3 ;;
    --smoke) filters=(slices_are_published an_exclusive_claim_is_pinned a_mixed_pod_gets restarts_keep); shift ;;
    --) shift; filters=("$@"); break ;;
    *) echo "usage: $0 [--oldest | --versions KUBERNETES CONTAINERD] [--smoke | -- NAME...]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "real-node-tests: must run as root" >&2; exit 1; }
cleanup() {
  local status=$?
  if [ "$status" -ne 0 ] && [ -d "${DRA_CPU_REAL_NODE_DIR:-/tmp/dcpu-real-node}/logs" ]; then
    echo "real-node-tests: FAILED; the last lines of each component's log:" >&2
    for f in "${DRA_CPU_REAL_NODE_DIR:-/tmp/dcpu-real-node}"/logs/*.log; do
      echo "--- $f" >&2
      tail -n 15 "$f" >&2
    done
    scripts/real-node.sh kubectl -n dra-cpu logs -l app.kubernetes.io/name=dra-cpu --all-containers --tail=40 >&2 || true
  fi
  scripts/real-node.sh down || true
  exit "$status"
}
trap cleanup EXIT
cargo build --quiet -p dra-cpu-tests --tests
scripts/real-node.sh up "${which[@]}"
# The test build of the binaries (DRA_CPU_IMAGE_PROFILE=debug) saves a
# release build where only the behaviour is under test.
scripts/real-node.sh install
cargo test -p dra-cpu-tests --test real_node -- --ignored --test-threads=1 "${filters[@]}"
# One at a time, in name order: the second installs the driver again.
cargo test -p dra-cpu-tests --test real_node_uninstall -- --ignored --test-threads=1
