#!/usr/bin/env bash
# Runs the end-to-end scenarios again on containerd 2.x: Debian sid's
# `containerd` package (scripts/containerd2.sh fetches it).
#
# The package is not installed on the host: the node keeps containerd 1.7
# for everything else. Its binaries are bound over /usr/bin/containerd, ctr
# and containerd-shim-runc-v2 inside a private mount namespace that only
# this test run sees. The host's runc (bookworm) runs the containers, as it
# does for containerd 1.7.
#
# When sid or its package cannot be had, says why and exits 0 (the 1.7 run
# is the one that must pass everywhere); when the scenarios fail, exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "e2e-containerd2: must run as root" >&2; exit 1; }
status=0
bin="$(scripts/containerd2.sh fetch)" || status=$?
if [ "$status" -eq 3 ]; then
  echo "e2e-containerd2: SKIPPED, containerd 2.x cannot run here (reason above)" >&2
  exit 0
elif [ "$status" -ne 0 ]; then
  exit "$status"
fi
echo "e2e-containerd2: running the end-to-end scenarios on $("$bin/containerd" --version)"

cargo build --quiet -p dra-plugin -p nri-plugin
tests=()
for file in tests/tests/e2e_*.rs; do
  name="$(basename "$file" .rs)"
  tests+=(--test "$name")
done
exec scripts/containerd2.sh run "$bin" cargo test -p dra-cpu-tests "${tests[@]}"
