#!/usr/bin/env bash
# The compatibility matrix: the real node's smoke (scripts/real-node-tests.sh
# --smoke: slices, an exclusive and a mixed pod, restarts of each process) on
# every pair of MATRIX_KUBERNETES x MATRIX_CONTAINERD of
# tests/real-node/pins.env, one pair after the other, then a table of the
# results (Markdown, as the README's compatibility table).
#
#   scripts/real-node-matrix.sh [--kubernetes "1.36.3 1.37.2"] [--containerd "2.4.2"]
#
# Each Kubernetes release not yet built costs a cold build (15-20 minutes on 2
# cores; scripts/build-components.sh); the smoke takes 3-5 minutes a pair.
# Logs and the table go to $DRA_CPU_MATRIX_DIR (default /var/tmp/dra-cpu-matrix).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../tests/real-node/pins.env
. tests/real-node/pins.env
kubernetes="$MATRIX_KUBERNETES" containerd="$MATRIX_CONTAINERD"
while [ $# -gt 0 ]; do
  case "$1" in
    --kubernetes) kubernetes="$2"; shift 2 ;;
    --containerd) containerd="$2"; shift 2 ;;
    *) echo "usage: $0 [--kubernetes \"V ...\"] [--containerd \"V ...\"]" >&2; exit 2 ;;
  esac
done
out="${DRA_CPU_MATRIX_DIR:-/var/tmp/dra-cpu-matrix}"
mkdir -p "$out"
results="$out/results"
: >"$results"
failed=0
for k in $kubernetes; do
  for c in $containerd; do
    log="$out/kubernetes-$k-containerd-$c.log"
    echo "real-node-matrix: Kubernetes $k, containerd $c (log: $log)" >&2
    start=$SECONDS
    if scripts/real-node-tests.sh --versions "$k" "$c" --smoke >"$log" 2>&1; then
      result=pass
    else
      result=FAIL failed=$((failed + 1))
      grep -E "^test .* FAILED|panicked at|FAILED" "$log" | head -n 5 >&2 || true
    fi
    # The smoke's own time: the cold build of a release is not the pair's.
    passed="$(grep -Eo '[0-9]+ passed' "$log" | awk '{n += $1} END {print n + 0}')"
    echo "$k $c $result $passed $((SECONDS - start))" >>"$results"
    echo "real-node-matrix: Kubernetes $k, containerd $c: $result ($passed tests passed, $((SECONDS - start)) s)" >&2
  done
done
table="$out/table.md"
{
  echo "Run $(date -u +%F) by scripts/real-node-matrix.sh: the smoke of scripts/real-node-tests.sh on each pair."
  echo
  printf '| Kubernetes |'
  for c in $containerd; do printf ' containerd %s |' "$c"; done
  echo
  printf '|---|'
  for _ in $containerd; do printf -- '---|'; done
  echo
  for k in $kubernetes; do
    printf '| %s |' "$k"
    for c in $containerd; do
      awk -v k="$k" -v c="$c" '$1 == k && $2 == c {printf " %s (%s tests) |", $3, $4}' "$results"
    done
    echo
  done
} >"$table"
cat "$table"
[ "$failed" -eq 0 ]
