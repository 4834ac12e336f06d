#!/usr/bin/env bash
# The scenarios of tests/tests/vm_node.rs inside the VM node
# (scripts/vm-node.sh: 2 sockets x 2 cores x 2 threads, 2 NUMA nodes,
# cgroup v2), on containerd 1.7 (trixie, in the image) and on containerd 2.x
# (Debian sid's, from scripts/containerd2.sh, bound over the guest's
# /usr/bin in a private mount namespace as on the host).
#
#   scripts/vm-node-tests.sh [--runtime 1.7|2|both] [--demo] [--e2e] [--power-cuts N] [-- TEST FILTER...]
#   scripts/vm-node-tests.sh --build-only
#
# --build-only builds what the guest runs (with the options given), copies
# it aside and stops; a later run with --prebuilt (and the same options)
# runs it without building: CI builds first, then runs the VM node beside
# the real node, whose own builds would otherwise meet its builds.
# --power-cuts N also runs the power-cut storm (scripts/power-cut-storm.sh
# --cuts N, in a small VM node of its own) after the scenarios.
# --demo also runs the node demo in the VM first (scripts/demo.sh --vm does
# only that); --e2e also runs the host's end-to-end tests (tests/tests/e2e_*)
# in the VM, on cgroup v2 and the VM's topology (about as long again as the
# scenarios, so CI leaves it out). Without a test filter, the containerd
# 1.7 pass also boots a VM twice for claims' tuning across a power cut.
# Builds on the host, runs in the guest; exits non-zero when a scenario
# fails on either runtime. When containerd 2.x cannot be had (no sid),
# says why and runs 1.7 only, as scripts/e2e-containerd2.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

runtimes=both demo=0 e2e=0 power_cuts=0 build_only=0 prebuilt=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runtime) runtimes="$2"; shift 2 ;;
    --demo) demo=1; shift ;;
    --e2e) e2e=1; shift ;;
    --power-cuts) power_cuts="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --prebuilt) prebuilt=1; shift ;;
    -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "vm-node-tests: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$runtimes" in 1.7 | 2 | both) ;; *) echo "vm-node-tests: --runtime 1.7, 2 or both" >&2; exit 2 ;; esac
[[ "$power_cuts" =~ ^[0-9]+$ ]] || { echo "vm-node-tests: --power-cuts wants a whole number" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "vm-node-tests: must run as root" >&2; exit 1; }

target_dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
vm_bin="$target_dir/vm-bin"
mkdir -p "$vm_bin"
# What a --build-only run built, for a later --prebuilt run.
built_env="$vm_bin/built.env"
build() {
  echo "vm-node-tests: building dra-plugin, nri-plugin, node-demo and the VM scenarios"
  cargo build --quiet -p dra-plugin -p nri-plugin -p dra-cpu-tests --bin dra-plugin --bin nri-plugin --bin node-demo
  # The executables of the named integration tests of dra-cpu-tests, one a line.
  test_binaries() {
    local args=() name
    for name in "$@"; do args+=(--test "$name"); done
    cargo test --quiet -p dra-cpu-tests "${args[@]}" --no-run --message-format=json |
      python3 -c '
import json, sys
wanted = set(sys.argv[1:])
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in wanted:
        print(m["executable"])' "$@"
  }
  test_bin="$(test_binaries vm_node)"
  [ -x "$test_bin" ] || { echo "vm-node-tests: the vm_node test binary was not built" >&2; exit 1; }
  # Claims' tuning across a power cut (dra-plugin/tests/tuning_power_cut.rs):
  # one boot before the cut, one after, on a writable disk.
  tuning_cut_bin="$(cargo test --quiet -p dra-plugin --test tuning_power_cut --no-run --message-format=json |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "tuning_power_cut":
        print(m["executable"])')"
  [ -x "$tuning_cut_bin" ] || { echo "vm-node-tests: the tuning_power_cut test binary was not built" >&2; exit 1; }
  e2e_bins=()
  if [ "$e2e" -eq 1 ]; then
    e2e_names=()
    for file in tests/tests/e2e_*.rs; do e2e_names+=("$(basename "$file" .rs)"); done
    mapfile -t e2e_bins < <(test_binaries "${e2e_names[@]}")
    [ ${#e2e_bins[@]} -eq ${#e2e_names[@]} ] || { echo "vm-node-tests: not every e2e test binary was built" >&2; exit 1; }
  fi
  # The guest runs copies of the binaries built above. Other cargo runs of the
  # workspace (CI runs its tests beside this) put their own builds at
  # target/debug/<name>, unlinking the file there and linking theirs, so a
  # guest that ran target/debug/<name> could find it missing, or another
  # build than this script's. The test executables have names of their own.
  for name in dra-plugin nri-plugin node-demo; do
    copied=0
    # Retried: another cargo run may be between its unlink and its link.
    for _ in 1 2 3 4 5; do
      if cp "$target_dir/debug/$name" "$vm_bin/$name.tmp" 2>/dev/null; then
        mv -f "$vm_bin/$name.tmp" "$vm_bin/$name"
        copied=1
        break
      fi
      sleep 1
    done
    [ "$copied" -eq 1 ] || { echo "vm-node-tests: cannot copy $target_dir/debug/$name" >&2; exit 1; }
  done
  declare -p test_bin tuning_cut_bin e2e_bins >"$built_env"
}
if [ "$prebuilt" -eq 1 ]; then
  # shellcheck source=/dev/null
  . "$built_env" || { echo "vm-node-tests: --prebuilt without a --build-only run before it" >&2; exit 1; }
else
  build
fi
if [ "$build_only" -eq 1 ]; then
  echo "vm-node-tests: built; the guest's binaries are in $vm_bin"
  exit 0
fi
# Runs every e2e binary, one test at a time; fails when any failed.
e2e_command=(bash -c 'rc=0; for t in "$@"; do echo "== $t"; "$t" --test-threads=1 --color=never || rc=1; done; exit $rc' e2e "${e2e_bins[@]}")
export DRA_PLUGIN_BIN="$vm_bin/dra-plugin" NRI_PLUGIN_BIN="$vm_bin/nri-plugin"
# The scenarios one process each, in the order listed, each one that passes
# noted in a progress file on the shared target directory: when the
# emulator's live-patching race kills the guest mid-run, scripts/vm-node.sh
# boots a fresh copy and runs the command again, and the scenarios that
# passed on an earlier boot are not run again. The guest's console is a
# terminal: no colour codes in the logs.
scenario_command() {
  local progress="$target_dir/vm-scenarios-$1.done"
  shift
  rm -f "$progress"
  scenarios=(bash -c '
    progress="$1" bin="$2"
    shift 2
    names="$("$bin" --list --ignored "$@" | sed -n "s/: test\$//p")" || exit 1
    [ -n "$names" ] || { echo "no scenario matches: $*" >&2; exit 1; }
    touch "$progress"
    rc=0
    for name in $names; do
      if grep -qxF "$name" "$progress"; then
        echo "== $name: passed on an earlier boot of this run"
        continue
      fi
      if "$bin" --ignored --exact --test-threads=1 --nocapture --color=never "$name"; then
        echo "$name" >>"$progress"
      else
        rc=1
      fi
    done
    exit $rc' scenarios "$progress" "$test_bin" "$@")
}

# The guest has no Python for kubernetes-validate: the e2e tests leave the
# objects they would validate under this shared directory (see
# tests/src/apiserver/schema.rs), and the host validates them after the run.
schema_dir="$target_dir/vm-schema-checks"
schema_env=(--env "DRA_CPU_DEFER_SCHEMA_CHECKS=$schema_dir")
fresh_schema_dir() { rm -rf "$schema_dir" && mkdir -p "$schema_dir"; }
# Validates every deferred batch; adds "$1" to the failures when one fails.
check_deferred_schemas() {
  local what="$1" batch version flag out bad=0 count=0
  for batch in "$schema_dir"/*/; do
    [ -f "$batch/versions" ] || continue
    count=$((count + 1))
    flag=()
    [ "$(cat "$batch/strict")" = true ] && flag=(--strict)
    while read -r version; do
      [ -n "$version" ] || continue
      if ! out="$(kubernetes-validate -k "$version" --quiet "${flag[@]}" "$batch"/*.json 2>&1)" ||
        grep -q '^WARN' <<<"$out"; then
        echo "vm-node-tests: schema check of $batch against $version failed:" >&2
        echo "$out" >&2
        bad=1
      fi
    done <"$batch/versions"
  done
  echo "vm-node-tests: $what: $count deferred schema checks validated on the host"
  # The e2e tests validate what they send; none deferred means the guest
  # validated nothing.
  [ "$count" -gt 0 ] || { echo "vm-node-tests: $what deferred no schema check" >&2; bad=1; }
  [ "$bad" -eq 0 ] || failed+=("schema checks of $what")
}

failed=()
run() {
  local what="$1" started
  shift
  echo "vm-node-tests: === $what"
  started=$(date +%s)
  if scripts/vm-node.sh "$@"; then
    echo "vm-node-tests: === $what: passed in $(($(date +%s) - started)) s"
  else
    echo "vm-node-tests: === $what: FAILED after $(($(date +%s) - started)) s" >&2
    failed+=("$what")
  fi
}

if [ "$runtimes" != 2 ]; then
  if [ "$demo" -eq 1 ]; then
    run "node demo, containerd 1.7" -- "$vm_bin/node-demo"
  fi
  scenario_command containerd-1.7 "$@"
  run "scenarios, containerd 1.7" -- "${scenarios[@]}"
  if [ $# -eq 0 ]; then
    tuning_disk="$target_dir/vm-tuning-cut.img"
    rm -f "$tuning_disk"
    run "tuning across a power cut" --disk "$tuning_disk" --reboot -- \
      "$tuning_cut_bin" --ignored --exact --nocapture --color=never \
      tuning_is_restored_for_stored_claims_and_put_back_after_a_power_cut
    rm -f "$tuning_disk"
  fi
  if [ "$e2e" -eq 1 ]; then
    fresh_schema_dir
    run "end-to-end tests, containerd 1.7" "${schema_env[@]}" -- "${e2e_command[@]}"
    check_deferred_schemas "end-to-end tests, containerd 1.7"
  fi
fi
if [ "$runtimes" != 1.7 ]; then
  status=0
  bin="$(scripts/containerd2.sh fetch)" || status=$?
  if [ "$status" -eq 3 ]; then
    echo "vm-node-tests: containerd 2.x SKIPPED, it cannot be had here (reason above)" >&2
  elif [ "$status" -ne 0 ]; then
    failed+=("fetching containerd 2.x")
  else
    scenario_command containerd-2 "$@"
    run "scenarios, containerd 2.x" --share "$(dirname "$(dirname "$bin")")" -- \
      scripts/containerd2.sh run "$bin" "${scenarios[@]}"
    if [ "$e2e" -eq 1 ]; then
      fresh_schema_dir
      run "end-to-end tests, containerd 2.x" "${schema_env[@]}" --share "$(dirname "$(dirname "$bin")")" -- \
        scripts/containerd2.sh run "$bin" "${e2e_command[@]}"
      check_deferred_schemas "end-to-end tests, containerd 2.x"
    fi
  fi
fi
if [ "$power_cuts" -gt 0 ]; then
  echo "vm-node-tests: === power-cut storm, $power_cuts cuts"
  started=$(date +%s)
  if scripts/power-cut-storm.sh --cuts "$power_cuts"; then
    echo "vm-node-tests: === power-cut storm: passed in $(($(date +%s) - started)) s"
  else
    echo "vm-node-tests: === power-cut storm: FAILED after $(($(date +%s) - started)) s" >&2
    failed+=("power-cut storm")
  fi
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "vm-node-tests: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "vm-node-tests: every VM node run passed"
