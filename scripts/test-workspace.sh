#!/usr/bin/env bash
# Every test of the workspace, as `cargo test --workspace` runs them, but
# several test binaries at once and more tests of a binary at once than the
# machine has CPUs: most of the suites wait on processes, sockets and
# timeouts rather than compute, and one at a time on 2 CPUs they took 14 of
# their 17 minutes waiting. A binary's output is printed whole when it ends,
# failures listed again at the end.
#
#   scripts/test-workspace.sh [cargo test options...]   default --workspace;
#                                                       e.g. -p nri-plugin
#
# DRA_CPU_TEST_JOBS (default 4) binaries at once, RUST_TEST_THREADS (default
# 4) tests at once in each. The duration of each binary is kept, and the
# next run starts the slowest first: in $DRA_CPU_TEST_DURATIONS, by default
# /var/cache/dra-cpu/test-durations.tsv where that directory can be written
# (it outlives a clone, as the component cache does), else in target/.
# The tests in `run_alone` change what every node on the host sees (the
# cgroup v1 root's load balancing, which wakes every test node's nri-plugin
# to walk the shared /kubepods); they are skipped in their binary's run and
# run by themselves after the rest, as `cargo test` would run them, one
# binary at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${DRA_CPU_TEST_JOBS:-4}"
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
target_dir="$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)"
durations="${DRA_CPU_TEST_DURATIONS:-}"
if [ -z "$durations" ]; then
  durations="$target_dir/test-durations.tsv"
  if mkdir -p /var/cache/dra-cpu 2>/dev/null && [ -w /var/cache/dra-cpu ]; then
    durations=/var/cache/dra-cpu/test-durations.tsv
  fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Build everything first (compiler messages on stderr as cargo prints them),
# then list each test binary: package directory, target name and kind, file.
[ "$#" -gt 0 ] || set -- --workspace
cargo test "$@" --no-run --message-format=json-render-diagnostics |
  jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null)
    | [(.manifest_path | sub("/Cargo.toml$"; "")), .target.name, .target.kind[0], .executable]
    | @tsv' >"$work/binaries.tsv"
if [ ! -s "$work/binaries.tsv" ]; then
  echo "test-workspace: cargo listed no test binary" >&2
  exit 1
fi
# Slowest first by the last run's durations; binaries not timed yet first of all.
touch "$durations"
awk -F '\t' 'FILENAME == ARGV[1] { seconds[$1] = $2; next }
  { key = $2 "/" $3; print (key in seconds ? seconds[key] : 1e9) "\t" $0 }' \
  "$durations" "$work/binaries.tsv" | sort -t "$(printf '\t')" -k1,1 -g -r | cut -f2- >"$work/ordered.tsv"

# binary (name/kind) and test name, a line each.
run_alone=(
  "e2e_tuning/test load_balancing_off_on_cgroup_v1_turns_off_the_cpusets_that_hold_the_claims_cpus"
)
# The --skip arguments for binary "$1/$2", one a line.
alone_skips() {
  local entry
  for entry in "${run_alone[@]}"; do
    [ "${entry%% *}" != "$1/$2" ] || printf -- '--skip\n%s\n' "${entry#* }"
  done
}

run_binary() {
  local index="$1" dir="$2" name="$3" kind="$4" executable="$5" start=$SECONDS status=0 skips
  mapfile -t skips < <(alone_skips "$name" "$kind")
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$executable" --color=never "${skips[@]}") \
    >"$work/$index.log" 2>&1 </dev/null || status=$?
  printf '%s/%s\t%d\t%d\n' "$name" "$kind" $((SECONDS - start)) "$status" >"$work/$index.done"
  return "$status"
}

declare -A running=()
index=0 failed=()
report() {
  local pid="$1" index="${running[$1]}" key seconds status
  unset "running[$pid]"
  IFS=$'\t' read -r key seconds status <"$work/$index.done"
  echo "== $key ($(sed -n "$((index + 1))p" "$work/ordered.tsv" | cut -f4 | xargs basename)): exit $status after $seconds s"
  cat "$work/$index.log"
  [ "$status" -eq 0 ] || failed+=("$key")
}
wait_one() {
  local pid
  wait -n -p pid "${!running[@]}" || true
  report "$pid"
}
while IFS=$'\t' read -r dir name kind executable; do
  while [ "${#running[@]}" -ge "$jobs" ]; do wait_one; done
  run_binary "$index" "$dir" "$name" "$kind" "$executable" &
  running[$!]="$index"
  index=$((index + 1))
done <"$work/ordered.tsv"
while [ "${#running[@]}" -gt 0 ]; do wait_one; done

# The tests that run alone, each in its binary's directory.
for entry in "${run_alone[@]}"; do
  key="${entry%% *}" test_name="${entry#* }"
  line="$(awk -F '\t' -v key="$key" '$2 "/" $3 == key' "$work/binaries.tsv" | head -n 1)"
  [ -n "$line" ] || continue
  IFS=$'\t' read -r dir _ _ executable <<<"$line"
  echo "== $key $test_name (alone)"
  if ! (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$executable" --color=never --exact "$test_name") </dev/null 2>&1; then
    failed+=("$key $test_name")
  fi
done

# Doc tests, which no test binary holds.
doc_status=0
cargo test "$@" --doc --color=never || doc_status=$?
[ "$doc_status" -eq 0 ] || failed+=("doc tests")

# Durations of the binaries that passed replace their old ones.
cat "$work"/*.done | awk -F '\t' '$3 == 0 { print $1 "\t" $2 }' >"$work/passed.tsv"
awk -F '\t' 'FILENAME == ARGV[1] { fresh[$1] = $2; print; next } !($1 in fresh)' \
  "$work/passed.tsv" "$durations" | sort >"$durations.new"
mv "$durations.new" "$durations"
if [ "${#failed[@]}" -ne 0 ]; then
  echo "test-workspace: failed: ${failed[*]}" >&2
  exit 1
fi
echo "test-workspace: all $index test binaries and the doc tests passed" >&2
