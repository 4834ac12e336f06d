#!/usr/bin/env bash
# What claim tuning buys a busy workload, measured inside the VM node
# (scripts/vm-node.sh: a real kernel whose interrupts can be moved without
# harming other work): interrupts on a claim's CPUs and involuntary context
# switches of a busy loop there, untuned, with `irqs: isolate` (and the idle
# bound) and with `loadBalancing: off` on top, rotated round by round in one
# run; --host-hogs N adds N unpinned busy loops outside any container.
# Prints a table for docs/user/tuning.md.
#
#   scripts/tuning-noise.sh [--rounds N] [--seconds S] [--host-hogs N] [--trace-ipis]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "tuning-noise: must run as root" >&2; exit 1; }
cargo build --quiet -p dra-plugin -p nri-plugin -p dra-cpu-tests --bin dra-plugin --bin nri-plugin --bin tuning-noise
target_dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
export DRA_PLUGIN_BIN="$target_dir/debug/dra-plugin" NRI_PLUGIN_BIN="$target_dir/debug/nri-plugin"
exec scripts/vm-node.sh -- "$target_dir/debug/tuning-noise" "$@"
