#!/usr/bin/env bash
# The performance table: builds dra-plugin, nri-plugin and perf-table in
# release mode, then measures every row against its baseline in one run and
# prints the table (Markdown). Extra arguments go to perf-table:
#   --quick             few samples, to check that every row runs
#   --skip-containerd   rows 4 and 5 (real containerd) reported as not measured
#   --only GROUPS       measure only these groups of rows, comma-separated:
#                       dra, alloc, nri, containerd
#   --out FILE          also write the table to FILE
# Rows 4 and 5 start a private containerd, so they need root as the
# end-to-end tests do (scripts/install-deps.sh installs containerd). Row 4b
# needs the Go reference plugin (tests/perf/go-reference/main.go), built
# here offline when Debian's golang-1.24-go (or any go) and
# golang-github-containerd-nri-dev are installed.
set -euo pipefail
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
cargo build --release -p dra-plugin -p nri-plugin -p dra-cpu-perf --bin dra-plugin --bin nri-plugin --bin perf-table
target="${CARGO_TARGET_DIR:-$PWD/target}/release"
export DRA_PLUGIN_BIN="$target/dra-plugin"
export NRI_PLUGIN_BIN="$target/nri-plugin"
go_bin="$(command -v go || true)"
[ -n "$go_bin" ] || go_bin="$(ls /usr/lib/go-1.*/bin/go 2>/dev/null | sort -V | tail -1 || true)"
if [ -n "$go_bin" ] && [ -d /usr/share/gocode/src/github.com/containerd/nri/pkg/stub ]; then
  mkdir -p "$target/../tmp"
  (cd tests/perf/go-reference &&
    GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$target/../tmp/go-cache" \
      "$go_bin" build -o "$target/../tmp/nri-go-reference" main.go)
  export NRI_GO_REFERENCE_BIN="$target/../tmp/nri-go-reference"
else
  echo "no Go toolchain with the NRI stub: row 4b will not be measured" >&2
fi
exec "$target/perf-table" "$@"
