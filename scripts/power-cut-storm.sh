#!/usr/bin/env bash
# The power-cut storm (dra-plugin/tests/power_cut.rs) in a small VM node
# (scripts/vm-node.sh: 2 vCPUs, one NUMA node, 768 MiB).
#
#   scripts/power-cut-storm.sh [--cuts N] [--seed S] [--host-kill-every K] [--no-sync-control]
#
# Every boot of the guest runs dra-plugin on a store on the guest's root
# disk (a --disk image, QEMU cache=none) with its CDI directory on a tmpfs,
# checks what the last cut left (every acknowledged prepare stored with the
# same CPUs, every acknowledged unprepare gone, no CPU in two claims, the
# CDI directory rebuilt to match the store by registration, every
# interrupted call converging when repeated, and nri-plugin, started then,
# putting every container a stand-in NRI runtime re-creates on the right
# CPUs: repinned=N wrong=M), then storms prepares and
# unprepares and cuts the power: sysrq b from inside (the guest reboots in
# the same QEMU), or, on every Kth cut (--host-kill-every, default 4; 0:
# never), the host SIGKILLs QEMU and boots the same disk again. Each
# acknowledgement is on a second disk (O_DIRECT|O_SYNC) before the next
# call is sent, so the host and the next boot know it whatever the cut.
#
# --cuts N (default 20); --seed S replays a run's schedule (the seed is
# printed; timing under the emulator still varies); --no-sync-control runs
# the same storm with the store's fdatasync compiled out (shared-state's
# test-only unsafe-no-sync feature) and succeeds only when that loses
# acknowledged claims. Prints cuts, acknowledgements, losses, seconds per
# cut and the wall time. Runs as root; work files in
# ${DRA_CPU_POWER_CUT_DIR:-/var/tmp/dra-cpu-power-cut}.
set -euo pipefail
cd "$(dirname "$0")/.."

cuts=20 seed="" control=0 host_kill_every=4
while [ $# -gt 0 ]; do
  case "$1" in
    --cuts) cuts="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --host-kill-every) host_kill_every="$2"; shift 2 ;;
    --no-sync-control) control=1; shift ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "power-cut-storm: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$cuts" =~ ^[1-9][0-9]*$ ]] || { echo "power-cut-storm: --cuts wants a positive whole number" >&2; exit 2; }
[[ "$host_kill_every" =~ ^[0-9]+$ ]] || { echo "power-cut-storm: --host-kill-every wants a whole number" >&2; exit 2; }
seed="${seed:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "power-cut-storm: --seed wants a whole number" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "power-cut-storm: must run as root (scripts/vm-node.sh)" >&2; exit 1; }
what="power-cut storm"
[ "$control" -eq 0 ] || what="power-cut storm CONTROL (store sync off)"
echo "power-cut-storm: $what, $cuts cuts, seed $seed (--seed $seed replays it)"

work="${DRA_CPU_POWER_CUT_DIR:-/var/tmp/dra-cpu-power-cut}"
mkdir -p "$work"
target_dir="$(mkdir -p "${CARGO_TARGET_DIR:-target}" && cd "${CARGO_TARGET_DIR:-target}" && pwd)"

plugin="$target_dir/debug/dra-plugin"
if [ "$control" -eq 1 ]; then
  cargo build --quiet -p dra-plugin --bin dra-plugin --features shared-state/unsafe-no-sync
  # Copied out of the way: the normal build below takes the usual path back.
  mkdir -p "$target_dir/power-cut"
  cp "$plugin" "$target_dir/power-cut/dra-plugin-no-sync"
  plugin="$target_dir/power-cut/dra-plugin-no-sync"
fi
cargo build --quiet -p dra-plugin --bin dra-plugin
# Started by every boot's re-pin check (dra-plugin/tests/power_cut.rs).
cargo build --quiet -p nri-plugin --bin nri-plugin
# The guest runs copies: other cargo runs of the workspace (CI runs tests
# beside this) replace target/debug/<name> with their own builds, unlinking
# the file first. Retried for the moment between that unlink and the link.
mkdir -p "$target_dir/power-cut"
private_copy() {
  local from="$1" to="$target_dir/power-cut/$2"
  for _ in 1 2 3 4 5; do
    if cp "$from" "$to.tmp" 2>/dev/null; then
      mv -f "$to.tmp" "$to"
      return 0
    fi
    sleep 1
  done
  echo "power-cut-storm: cannot copy $from" >&2
  return 1
}
if [ "$control" -eq 0 ]; then
  private_copy "$plugin" dra-plugin
  plugin="$target_dir/power-cut/dra-plugin"
fi
private_copy "$target_dir/debug/nri-plugin" nri-plugin
nri_plugin="$target_dir/power-cut/nri-plugin"
test_bin="$(cargo test --quiet -p dra-plugin --test power_cut --no-run --message-format=json |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "power_cut":
        print(m["executable"])')"
[ -x "$test_bin" ] || { echo "power-cut-storm: the power_cut test binary was not built" >&2; exit 1; }

# A fresh root disk (the cached image, copied by vm-node.sh) and log disk.
disk="$work/root.img" acks="$work/acks.img" pidfile="$work/qemu.pid"
rm -f "$disk" "$acks" "$pidfile"
truncate -s 512M "$acks"

# The log's records, one a line (4096-byte blocks up to the first empty one).
read_log() {
  python3 - "$acks" <<'EOF'
import sys
with open(sys.argv[1], "rb") as f:
    while True:
        block = f.read(4096)
        if len(block) < 4096 or block[0] == 0:
            break
        print(block.split(b"\n", 1)[0].decode(errors="replace"))
EOF
}

# Watches the log from its current end and SIGKILLs QEMU a seeded random
# 0.2-6 s after each "storm N cut=host" record. Also the watchdog of a
# reset that never boots: under TCG a guest reset now and then hangs in
# QEMU before the kernel starts (seen once in 100 cuts on a loaded host),
# which would stall the storm until its overall timeout. When a sysrq cut
# is not followed by the next boot's record within $hung_reset_s seconds,
# QEMU is SIGKILLed and the same disks booted again: the guest wrote
# nothing after the cut, so this is one more power cut at the same moment.
# Each such kill is noted in $hung_marker and counted in the summary.
hung_reset_s="${DRA_CPU_POWER_CUT_HUNG_RESET_S:-300}"
hung_marker="$work/hung-resets"
: > "$hung_marker"
host_killer() {
  exec python3 - "$acks" "$pidfile" "$seed" "$hung_reset_s" "$hung_marker" <<'EOF'
import os, random, signal, sys, time
log, pidfile, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
hung_reset_s, hung_marker = float(sys.argv[4]), sys.argv[5]
def kill_qemu():
    with open(pidfile) as p:
        os.kill(int(p.read().strip()), signal.SIGKILL)
def records():
    out = []
    with open(log, "rb") as f:
        while True:
            block = f.read(4096)
            if len(block) < 4096 or block[0] == 0:
                return out
            out.append(block.split(b"\n", 1)[0].decode(errors="replace"))
start = len(records())
last_new = time.monotonic()
while True:
    time.sleep(0.05)
    recs = records()
    for line in recs[start:]:
        words = line.split()
        if words[:1] == ["storm"] and "cut=host" in words:
            boot = int(words[1])
            delay = random.Random(seed * 100003 + boot).uniform(0.2, 6.0)
            time.sleep(delay)
            print(f"power-cut-storm: host SIGKILLs QEMU {delay:.1f} s into storm {boot}", flush=True)
            kill_qemu()
            sys.exit(0)
    if len(recs) != start:
        last_new = time.monotonic()
    start = len(recs)
    # The storm's record comes before its calls' records; a boot's record
    # after it means the guest came back.
    storm = next((r.split() for r in reversed(recs) if r.split()[:1] in (["storm"], ["boot"])), [])
    if storm[:1] == ["storm"] and "cut=sysrq" in storm and time.monotonic() - last_new > hung_reset_s:
        print(f"power-cut-storm: nothing logged {hung_reset_s:.0f} s after storm {storm[1]}'s sysrq cut "
              "(a hung reset); SIGKILL QEMU and boot the same disks again", flush=True)
        with open(hung_marker, "a") as m:
            m.write(f"{storm[1]}\n")
        kill_qemu()
        sys.exit(0)
EOF
}

started=$(date +%s)
qemu_runs=0
while :; do
  qemu_runs=$((qemu_runs + 1))
  host_killer &
  killer=$!
  set +e
  scripts/vm-node.sh --sockets 1 --cores 2 --threads 1 --numa-nodes 1 --memory 768 \
    --disk "$disk" --extra-disk "$acks" --reboot --pidfile "$pidfile" \
    --timeout $((cuts * 180 + 600)) \
    --env DRA_PLUGIN_BIN="$plugin" --env NRI_PLUGIN_BIN="$nri_plugin" \
    --env DRA_CPU_POWER_CUT_LOG=/dev/vdb --env DRA_CPU_POWER_CUT_SEED="$seed" \
    --env DRA_CPU_POWER_CUT_CUTS="$cuts" --env DRA_CPU_POWER_CUT_HOST_KILL_EVERY="$host_kill_every" \
    --env DRA_CPU_POWER_CUT_CONTROL="$control" \
    -- "$test_bin" --ignored --exact power_cut_boot --nocapture --test-threads=1 --color=never
  rc=$?
  set -e
  kill "$killer" 2>/dev/null || true
  wait "$killer" 2>/dev/null || true
  if read_log | grep -qx end; then
    break
  fi
  last_storm="$(read_log | grep '^storm ' | tail -n 1)"
  if [ "$rc" -eq 124 ] && [[ "$last_storm" == *cut=host* ]] && ! read_log | tail -n 1 | grep -q '^boot '; then
    # vm-node.sh reports a killed QEMU as a timeout: here it was the cut.
    echo "power-cut-storm: QEMU killed by the host's cut; booting the same disks again"
    continue
  fi
  last_storm_or_boot="$(read_log | grep -E '^(storm|boot) ' | tail -n 1)"
  if [ "$rc" -eq 124 ] && [[ "$last_storm_or_boot" == "storm "*cut=sysrq* ]] &&
    grep -qx "$(echo "$last_storm_or_boot" | cut -d' ' -f2)" "$hung_marker"; then
    echo "power-cut-storm: QEMU killed after a hung reset; booting the same disks again"
    continue
  fi
  echo "power-cut-storm: the VM ended (exit $rc) before the storm's end; the log's last records:" >&2
  read_log | tail -n 5 >&2
  exit 1
done
wall=$(($(date +%s) - started))

python3 - "$acks" "$wall" "$cuts" "$control" "$qemu_runs" "$(wc -l < "$hung_marker")" <<'EOF'
import sys
log, wall, cuts_wanted, control, qemu_runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
hung_resets = int(sys.argv[6])
lines = []
with open(log, "rb") as fh:
    while True:
        block = fh.read(4096)
        if len(block) < 4096 or block[0] == 0:
            break
        lines.append(block.split(b"\n", 1)[0].decode(errors="replace"))
f = dict(cuts=0, sysrq=0, host=0, P=0, U=0, lost_prepares=0, lost_unprepares=0, doubled=0, cdi_wrong=0,
         converged=0, refused=0, repinned=0, wrong=0)
uptimes, starts, repins = [], [], []
for line in lines:
    w = line.split()
    kv = dict(x.split("=", 1) for x in w if "=" in x)
    if w[0] == "storm":
        f["cuts"] += 1
        f["host" if "cut=host" in w else "sysrq"] += 1
    elif w[0] in ("P", "U"):
        f[w[0]] += 1
    elif w[0] == "boot" and w[1] != "0":
        uptimes.append(float(kv.get("uptime", "nan")))
    elif w[0] == "checked":
        for k in ("lost_prepares", "lost_unprepares", "doubled", "cdi_wrong", "converged", "repinned", "wrong"):
            f[k] += int(kv.get(k, 0))
        starts.append(int(kv.get("start_ms", 0)) / 1000)
        repins.append(int(kv.get("repin_ms", 0)) / 1000)
    elif w[0] == "refused":
        f["refused"] += 1
        f["lost_prepares"] += int(kv.get("lost_prepares", 0))
mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
cuts = f["cuts"]
print(f"power-cut-storm: {cuts} cuts ({f['sysrq']} sysrq b, {f['host']} host SIGKILL of QEMU, {qemu_runs} QEMU runs, "
      f"{hung_resets} hung resets killed); "
      f"acknowledged {f['P']} prepares, {f['U']} unprepares; lost {f['lost_prepares']} prepares, {f['lost_unprepares']} unprepares "
      f"(store refused to open {f['refused']} times); doubled CPUs {f['doubled']}; wrong CDI {f['cdi_wrong']}; "
      f"interrupted calls converged {f['converged']}; "
      f"re-created containers re-pinned by nri-plugin {f['repinned']}, on wrong CPUs {f['wrong']}")
print(f"power-cut-storm: wall {wall} s, {wall / max(cuts, 1):.1f} s per cut; guest uptime when the check began "
      f"{mean(uptimes):.1f} s on average (max {max(uptimes, default=float('nan')):.1f}); "
      f"dra-plugin start to registration {mean(starts):.2f} s on average; "
      f"re-pin check {mean(repins):.2f} s on average (max {max(repins, default=float('nan')):.2f})")
bad = f["lost_prepares"] + f["lost_unprepares"] + f["doubled"] + f["cdi_wrong"] + f["wrong"]
if cuts != cuts_wanted:
    print(f"power-cut-storm: FAILED: {cuts} cuts, {cuts_wanted} wanted", file=sys.stderr)
    sys.exit(1)
if control:
    if f["lost_prepares"] == 0:
        print("power-cut-storm: CONTROL FAILED: without the fdatasync the storm lost no acknowledged prepare", file=sys.stderr)
        sys.exit(1)
    print("power-cut-storm: control: without the fdatasync the cuts lost acknowledged prepares, as they must")
elif bad:
    print("power-cut-storm: FAILED: acknowledged calls lost or state wrong after a cut", file=sys.stderr)
    sys.exit(1)
else:
    print("power-cut-storm: passed")
EOF
