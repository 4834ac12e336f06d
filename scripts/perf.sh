#!/usr/bin/env bash
# The performance table: builds dra-plugin, nri-plugin and perf-table in
# release mode, then measures every row against its baseline in one run and
# prints the table (Markdown). Extra arguments go to perf-table:
#   --quick             few samples, to check that every row runs
#   --skip-containerd   rows 4 and 5 (real containerd) reported as not measured
#   --out FILE          also write the table to FILE
# Rows 4 and 5 start a private containerd, so they need root as the
# end-to-end tests do (scripts/install-deps.sh installs containerd).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p dra-plugin -p nri-plugin -p dra-cpu-tests --bin dra-plugin --bin nri-plugin --bin perf-table
target="${CARGO_TARGET_DIR:-$PWD/target}/release"
export DRA_PLUGIN_BIN="$target/dra-plugin"
export NRI_PLUGIN_BIN="$target/nri-plugin"
exec "$target/perf-table" "$@"
