#!/usr/bin/env bash
# The real-node scenarios: brings up the real node (scripts/real-node.sh up),
# installs the driver with `helm install`, runs tests/tests/real_node/
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
#   scripts/real-node-tests.sh --set KEY=VALUE ...
#                                         a value of the chart for the install
#                                         (repeatable), e.g.
#                                         draPlugin.groupBy=machine
#   scripts/real-node-tests.sh --no-uninstall ...
#                                         leave out the uninstall checks
#   scripts/real-node-tests.sh --vm ...   the same, with the whole node inside
#                                         the VM node (scripts/vm-node.sh: a
#                                         real kernel, cgroup v2, 2 sockets x 2
#                                         cores x 2 threads, 2 NUMA nodes), for
#                                         the scenarios a 2-CPU host cannot
#                                         hold (several 2-CPU claims at once,
#                                         grouped claims of two requests,
#                                         exclusive, mixed and shared pods
#                                         through one restart, an offline CPU)
#
# The first run builds the components (tens of minutes on 2 cores; cached).
set -euo pipefail
cd "$(dirname "$0")/.."
which=() filters=() vm=0 uninstall=1 helm_set=() args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --vm) vm=1; shift ;;
    --no-uninstall) uninstall=0; shift ;;
    --set)
      [ $# -ge 2 ] || { echo "real-node-tests: --set KEY=VALUE" >&2; exit 2; }
      helm_set+=(--set "$2"); shift 2 ;;
    --oldest) which=(--oldest); shift ;;
    --versions)
      [ $# -ge 3 ] || { echo "real-node-tests: --versions KUBERNETES CONTAINERD" >&2; exit 2; }
      which=(--versions "$2" "$3"); shift 3 ;;
    --smoke) filters=(slices_are_published an_exclusive_claim_is_pinned a_mixed_pod_gets restarts_keep); shift ;;
    --) shift; filters=("$@"); break ;;
    *) echo "usage: $0 [--vm] [--no-uninstall] [--set KEY=VALUE]... [--oldest | --versions KUBERNETES CONTAINERD] [--smoke | -- NAME...]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "real-node-tests: must run as root" >&2; exit 1; }

# The executable of the integration test "$1" of dra-cpu-tests.
test_binary() {
  cargo test --quiet -p dra-cpu-tests --test "$1" --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}

if [ "$vm" -eq 1 ]; then
  # Everything is built here (the guest has neither cargo nor the Go module
  # proxy) and runs there: this script again, without --vm, in the guest.
  vm_args=()
  for arg in "${args[@]}"; do [ "$arg" = --vm ] || vm_args+=("$arg"); done
  . tests/real-node/pins.env
  case "${which[0]:-}" in
    --oldest) scripts/build-components.sh pair "$KUBERNETES_OLDEST" "$CONTAINERD_OLDEST" ;;
    --versions) scripts/build-components.sh pair "${which[1]}" "${which[2]}" ;;
    *) scripts/build-components.sh pair "$KUBERNETES_LATEST" "$CONTAINERD_LATEST" ;;
  esac
  # The driver's build as real-node.sh install would make it here.
  profile="${DRA_CPU_IMAGE_PROFILE:-release}"
  case "$profile" in
    release) cargo build --quiet --release -p dra-plugin -p nri-plugin --bin dra-plugin --bin nri-plugin ;;
    debug) cargo build --quiet -p dra-plugin -p nri-plugin --bin dra-plugin --bin nri-plugin ;;
    *) echo "real-node-tests: DRA_CPU_IMAGE_PROFILE is release or debug, not $profile" >&2; exit 2 ;;
  esac
  archive="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/real-node-driver.tar"
  DRA_CPU_IMAGE_PROFILE="$profile" scripts/real-node.sh image "$archive"
  scenarios_bin="$(test_binary real_node)" uninstall_bin="$(test_binary real_node_uninstall)"
  [ -x "$scenarios_bin" ] && [ -x "$uninstall_bin" ] || { echo "real-node-tests: the test binaries were not built" >&2; exit 1; }
  command -v helm >/dev/null || { echo "real-node-tests: helm not found (scripts/install-deps.sh)" >&2; exit 1; }
  helm_dir="$(dirname "$(command -v helm)")"
  exec scripts/vm-node.sh --memory 6144 --timeout 3000 \
    --share "$(dirname "$(scripts/build-components.sh --print-dir etcd)")" --share "$helm_dir" \
    --env DRA_CPU_PREBUILT=1 --env "DRA_CPU_IMAGE_PROFILE=$profile" --env "DRA_CPU_DRIVER_ARCHIVE=$archive" \
    --env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$helm_dir" \
    --env "DRA_CPU_REAL_NODE_TEST_BINS=$scenarios_bin $uninstall_bin" \
    -- scripts/real-node-tests.sh "${vm_args[@]}"
fi
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
# Runs the integration test "$1" of dra-cpu-tests with the test harness's
# arguments after it: built now, or the binary the host built for the VM.
run_test() {
  local name="$1" bin
  shift
  if [ -n "${DRA_CPU_REAL_NODE_TEST_BINS:-}" ]; then
    for bin in $DRA_CPU_REAL_NODE_TEST_BINS; do
      case "$(basename "$bin")" in "$name"-*) "$bin" --color=never "$@"; return ;; esac
    done
    echo "real-node-tests: no binary of $name in DRA_CPU_REAL_NODE_TEST_BINS" >&2
    return 1
  fi
  cargo test -p dra-cpu-tests --test "$name" -- "$@"
}

[ -n "${DRA_CPU_REAL_NODE_TEST_BINS:-}" ] || cargo build --quiet -p dra-cpu-tests --tests
scripts/real-node.sh up "${which[@]}"
# The test build of the binaries (DRA_CPU_IMAGE_PROFILE=debug) saves a
# release build where only the behaviour is under test.
scripts/real-node.sh install "${helm_set[@]}"
run_test real_node --ignored --test-threads=1 "${filters[@]}"
# One at a time, in name order: the second installs the driver again.
[ "$uninstall" -eq 0 ] || run_test real_node_uninstall --ignored --test-threads=1
