#!/usr/bin/env bash
# The VM node: a real Linux kernel (Debian trixie's linux-image-amd64) booted
# under QEMU with a chosen CPU shape (default 2 sockets x 2 cores x 2 threads,
# one NUMA node per socket, each with its own memory), cgroup v2, and
# containerd 1.7 with runc in its root image. Runs one command inside it and
# returns that command's exit code. See --help.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$script_dir/.." && pwd)"

usage() {
  cat <<'EOF'
Usage: scripts/vm-node.sh [options] [--] COMMAND [ARG...]
       scripts/vm-node.sh --build-only

Boots a VM node and runs COMMAND in it as root (PID 1's child), from the
current directory, then powers the VM off. The exit code is COMMAND's
(124: the VM did not finish within --timeout; 125: the guest's setup failed).
COMMAND's output comes back on the serial console.

The first run, as root on a Debian machine, installs qemu-system-x86 and
debootstrap, then builds the root image (debootstrap of Debian trixie
minbase with containerd, runc, busybox-static, iproute2, kmod,
ca-certificates and linux-image-amd64, from the machine's own Debian mirror
as scripts/install-deps.sh derives it) and caches it with its kernel and
initrd under /var/cache/dra-cpu/vm/<key>, the key a hash of everything that
went into it. Later runs reuse it; every run boots a throwaway copy (QEMU's
snapshot=on) unless --disk is given.

The guest sees the checkout (and CARGO_TARGET_DIR when it is elsewhere) at
the same path through virtio 9p, so binaries built on the host run there.
It mounts cgroup2 with +cpuset +cpu +memory +pids (and +hugetlb +io) delegated, tmpfs /run and
/tmp, devpts, brings lo up, loads overlay and writes /etc/hosts. COMMAND sees
DRA_CPU_VM_NODE=<sockets>x<cores>x<threads>,numa=<n> in its environment, and
CI, RUST_BACKTRACE, RUST_LOG, CARGO_TARGET_DIR, DRA_PLUGIN_BIN, NRI_PLUGIN_BIN
when the host has them.

Options:
  --sockets N        CPU sockets (default 2)
  --cores N          cores per socket (default 2)
  --threads N        hardware threads per core (default 2)
  --numa-nodes N     NUMA nodes, each with its own memory; CPUs and memory
                     are split evenly (default: one per socket)
  --memory MIB       guest memory in MiB (default 3072)
  --share DIR        also share DIR at the same path (repeatable)
  --env NAME=VALUE   set NAME in COMMAND's environment (repeatable)
  --disk FILE        boot FILE writably instead of a throwaway copy; FILE is
                     made from the cached image when it does not exist (for
                     runs that must find their writes after a reboot)
  --drive-cache MODE QEMU's cache mode for --disk (default none: the guest's
                     flushes reach the host's disk, and unflushed writes are
                     lost when QEMU is killed)
  --extra-disk FILE  attach FILE (raw, made sparse at 512 MiB when missing)
                     as the guest's second virtio disk, /dev/vdb, with
                     cache=none (repeatable: /dev/vdc, ...)
  --reboot           a guest reboot (e.g. sysrq b) boots the guest again in
                     the same QEMU and runs COMMAND again, instead of
                     ending QEMU; the VM ends when COMMAND exits
  --pidfile FILE     QEMU writes its pid to FILE (to kill it from outside)
  --accel auto|tcg|kvm QEMU accelerator (default auto: KVM where a probe guest
                     boots and runs a command under it within 30 s, else
                     TCG; a nested KVM guest hangs in early boot on the
                     machines this was built on; the verdict is cached)
  --timeout SECONDS  kill the VM after this long (default 3600)
  --build-only       build (or find) the cached image and exit
  --rebuild          build the image even when a cached one exists
  -h, --help         this text

Prints the image build time, the boot time (to the guest's init) and the
command's time when the VM powers off.
EOF
}

sockets=2 cores=2 threads=2 numa_nodes="" memory=3072
shares=() envs=() disk="" drive_cache=none accel=auto timeout_s=3600
extra_disks=() no_reboot=(-no-reboot) pidfile=()
build_only=0 rebuild=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sockets) sockets="$2"; shift 2 ;;
    --cores) cores="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --numa-nodes) numa_nodes="$2"; shift 2 ;;
    --memory) memory="$2"; shift 2 ;;
    --share) shares+=("$(cd "$2" && pwd)"); shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --disk) disk="$2"; shift 2 ;;
    --drive-cache) drive_cache="$2"; shift 2 ;;
    --extra-disk) extra_disks+=("$2"); shift 2 ;;
    --reboot) no_reboot=(); shift ;;
    --pidfile) pidfile=(-pidfile "$2"); shift 2 ;;
    --accel) accel="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --rebuild) rebuild=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "vm-node: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done

fail() {
  echo "vm-node: $*" >&2
  exit 1
}

# Arithmetic on decimals (seconds) without bc, which a minimal machine lacks.
calc() { awk "BEGIN { printf \"%.1f\", $1 }"; }

is_count() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
for pair in "sockets:$sockets" "cores:$cores" "threads:$threads" "memory:$memory" "timeout:$timeout_s"; do
  is_count "${pair#*:}" || fail "--${pair%%:*} must be a positive whole number, got '${pair#*:}'"
done
numa_nodes="${numa_nodes:-$sockets}"
is_count "$numa_nodes" || fail "--numa-nodes must be a positive whole number, got '$numa_nodes'"
cpus=$((sockets * cores * threads))
[ $((cpus % numa_nodes)) -eq 0 ] || fail "$cpus CPUs do not split evenly into $numa_nodes NUMA nodes"
[ $((memory % numa_nodes)) -eq 0 ] || fail "$memory MiB do not split evenly into $numa_nodes NUMA nodes"
case "$accel" in auto | tcg | kvm) ;; *) fail "--accel must be auto, tcg or kvm, got '$accel'" ;; esac
[ "$build_only" -eq 1 ] || [ $# -gt 0 ] || fail "no command given (see --help)"
[ "$(id -u)" -eq 0 ] || fail "must run as root (apt-get, debootstrap and the image build need it)"

# --- tools -------------------------------------------------------------------
cache_root="${DRA_CPU_VM_CACHE:-/var/cache/dra-cpu/vm}"
mkdir -p "$cache_root"
log="$cache_root/last-build.log"

step() {
  # Runs a command with its output in the log; a failure names the step and
  # prints the log's tail.
  local what="$1"
  shift
  echo "== $what: $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "vm-node: FAILED: $what (command: $*); log $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

if ! command -v qemu-system-x86_64 >/dev/null || ! command -v debootstrap >/dev/null ||
  [ ! -f /usr/share/debootstrap/scripts/trixie ]; then
  : >"$log"
  export DEBIAN_FRONTEND=noninteractive
  step "apt-get update" apt-get -q -o DPkg::Lock::Timeout=300 update
  step "apt-get install qemu-system-x86 debootstrap" apt-get -q -y --no-install-recommends \
    -o DPkg::Lock::Timeout=300 install qemu-system-x86 debootstrap
  echo "vm-node: installed $(qemu-system-x86_64 --version | head -n 1), debootstrap $(dpkg-query -W -f='${Version}' debootstrap)"
fi

# --- the root image ------------------------------------------------------------
# The mirror is the one scripts/install-deps.sh derived from this machine's
# own apt configuration for its trixie entry: no host is written here.
trixie_source=/etc/apt/sources.list.d/dra-cpu-trixie.sources
[ -f "$trixie_source" ] || "$script_dir/install-deps.sh" >/dev/null
[ -f "$trixie_source" ] || fail "no $trixie_source (scripts/install-deps.sh writes it) to take the Debian mirror from"
mirror="$(awk '$1 == "URIs:" {print $2; exit}' "$trixie_source")"
keyring="$(awk '$1 == "Signed-By:" {print $2; exit}' "$trixie_source")"
[ -n "$mirror" ] || fail "no URIs line in $trixie_source"

suite=trixie
packages=containerd,runc,busybox-static,iproute2,kmod,ca-certificates,irqbalance,linux-image-amd64
image_size=4G
# The image's boot stub: the initramfs has mounted the root, /proc, /sys and
# /dev; it mounts the job share and hands over to the job's init, so the
# init can change without a new image.
boot_stub='#!/bin/sh
mountpoint -q /proc || mount -t proc proc /proc
mountpoint -q /sys || mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
if modprobe 9pnet_virtio && modprobe 9p &&
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 job /vm-node-job; then
  exec /bin/sh /vm-node-job/init.sh
fi
echo "vm-node(guest): cannot mount the job share (virtio 9p)"
echo 1 >/proc/sys/kernel/sysrq
echo o >/proc/sysrq-trigger
sleep 30'
key="$(printf '%s\n' "recipe 1" "$suite" "$packages" "$mirror" "$image_size" "$boot_stub" | sha256sum | cut -c1-16)"
image_dir="$cache_root/$key"

build_image() {
  local work="$cache_root/build.$$" started ended
  started=$(date +%s.%N)
  : >"$log"
  rm -rf "$work"
  mkdir -p "$work"
  trap 'rm -rf "$work"' EXIT
  local keyring_args=()
  [ -z "$keyring" ] || keyring_args=(--keyring "$keyring")
  echo "vm-node: building the root image (debootstrap $suite from $mirror; a few minutes)"
  step "debootstrap" debootstrap --variant=minbase "--include=$packages" "${keyring_args[@]}" \
    "$suite" "$work/root" "$mirror"
  local kernel initrd version
  kernel="$(ls "$work"/root/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$kernel" ] || fail "debootstrap installed no kernel in $work/root/boot"
  version="${kernel##*/vmlinuz-}"
  initrd="$work/root/boot/initrd.img-$version"
  [ -f "$initrd" ] || fail "no initrd for kernel $version in $work/root/boot"
  [ -d "$work/root/lib/modules/$version" ] || fail "no /lib/modules/$version in the image"
  mkdir -p "$work/out"
  cp "$kernel" "$work/out/vmlinuz"
  cp "$initrd" "$work/out/initrd.img"
  rm -f "$work"/root/var/cache/apt/archives/*.deb
  rm -rf "$work"/root/var/lib/apt/lists/*
  printf '%s\n' "$boot_stub" >"$work/root/sbin/vm-node-boot"
  chmod 0755 "$work/root/sbin/vm-node-boot"
  mkdir -p "$work/root/vm-node-job"
  echo vm-node >"$work/root/etc/hostname"
  step "mke2fs" mke2fs -q -t ext4 -d "$work/root" -F "$work/out/root.img" "$image_size"
  {
    echo "suite: $suite"
    echo "mirror: $mirror"
    echo "packages: $packages"
    echo "kernel: $version"
    echo "containerd: $(chroot "$work/root" dpkg-query -W -f='${Version}' containerd)"
    echo "runc: $(chroot "$work/root" dpkg-query -W -f='${Version}' runc)"
    echo "built: $(date -u +%FT%TZ)"
  } >"$work/out/manifest"
  rm -rf "$image_dir"
  mv "$work/out" "$image_dir"
  rm -rf "$work"
  trap - EXIT
  ended=$(date +%s.%N)
  echo "vm-node: image built in $(calc "$ended - $started") s: $image_dir"
}

# One build at a time: a second run waits for the first one's image.
exec 9>"$cache_root/build.lock"
flock 9
if [ "$rebuild" -eq 1 ] || [ ! -f "$image_dir/manifest" ]; then
  build_image
else
  echo "vm-node: cached image $image_dir ($(awk '/^kernel:/ {print "kernel " $2} /^containerd:/ {print ", containerd " $2}' "$image_dir/manifest" | tr -d '\n'))"
fi
flock -u 9
[ "$build_only" -eq 0 ] || exit 0

# --accel auto: KVM only where it demonstrably boots. /dev/kvm can exist and
# still hang a nested guest in early boot (seen on the machines this was
# built on), so a one-CPU guest is booted under KVM with a short timeout,
# and the verdict is kept per image, QEMU and host kernel so that the probe
# runs once per machine.
if [ "$accel" = auto ]; then
  accel=tcg
  if [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    verdict_file="$cache_root/kvm-verdict-$(printf '%s\n' "$key" "$(qemu-system-x86_64 --version | head -n1)" "$(uname -r)" | sha256sum | cut -c1-16)"
    if [ ! -s "$verdict_file" ]; then
      echo "vm-node: probing KVM (a one-CPU guest under KVM must boot and run true within 30 s)"
      if DRA_CPU_VM_CACHE="$cache_root" "$script_dir/vm-node.sh" --accel kvm --sockets 1 --cores 1 --threads 1 \
        --numa-nodes 1 --memory 512 --timeout 30 -- true >"$cache_root/kvm-probe.log" 2>&1; then
        echo kvm >"$verdict_file"
      else
        echo tcg >"$verdict_file"
      fi
    fi
    accel="$(cat "$verdict_file")"
    echo "vm-node: accel $accel (KVM probe verdict in $verdict_file)"
  fi
fi

# --- the job -----------------------------------------------------------------
job="$(mktemp -d /tmp/vm-node-job.XXXXXX)"
trap 'rm -rf "$job"' EXIT
cp "$script_dir/vm-node-init.sh" "$job/init.sh"

all_shares=("$repo")
target="${CARGO_TARGET_DIR:-}"
if [ -n "$target" ] && [ -d "$target" ]; then
  target="$(cd "$target" && pwd)"
  case "$target/" in "$repo"/*) ;; *) all_shares+=("$target") ;; esac
fi
all_shares+=("${shares[@]}")
i=0
: >"$job/shares"
virtfs=()
for dir in "${all_shares[@]}"; do
  echo "share$i $dir" >>"$job/shares"
  virtfs+=(-virtfs "local,path=$dir,mount_tag=share$i,security_model=none,id=share$i")
  i=$((i + 1))
done

# Values in single quotes for the guest's /bin/sh.
sh_quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
  echo "DRA_CPU_VM_NODE=$(sh_quote "${sockets}x${cores}x${threads},numa=$numa_nodes")"
  for name in CI RUST_BACKTRACE RUST_LOG CARGO_TARGET_DIR DRA_PLUGIN_BIN NRI_PLUGIN_BIN; do
    if [ -n "${!name:-}" ]; then echo "$name=$(sh_quote "${!name}")"; fi
  done
  for pair in "${envs[@]}"; do
    [[ "$pair" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || fail "--env wants NAME=VALUE, got '$pair'"
    echo "${pair%%=*}=$(sh_quote "${pair#*=}")"
  done
} >"$job/env"
{
  printf 'cd %q || exit 125\n' "$PWD"
  printf 'exec'
  printf ' %q' "$@"
  printf '\n'
} >"$job/command.sh"

numa=()
per_node_cpus=$((cpus / numa_nodes))
per_node_mem=$((memory / numa_nodes))
for ((n = 0; n < numa_nodes; n++)); do
  first=$((n * per_node_cpus))
  numa+=(-object "memory-backend-ram,id=mem$n,size=${per_node_mem}M"
    -numa "node,nodeid=$n,cpus=$first-$((first + per_node_cpus - 1)),memdev=mem$n")
done
if [ -n "$disk" ]; then
  if [ ! -f "$disk" ]; then
    cp --sparse=always "$image_dir/root.img" "$disk.new"
    mv "$disk.new" "$disk"
  fi
  drive="file=$disk,if=virtio,format=raw,cache=$drive_cache"
else
  drive="file=$image_dir/root.img,if=virtio,format=raw,snapshot=on"
fi
extra_drives=()
for extra in "${extra_disks[@]}"; do
  [ -f "$extra" ] || truncate -s 512M "$extra"
  extra_drives+=(-drive "file=$extra,if=virtio,format=raw,cache=none")
done
accel_args=(-accel tcg,thread=multi -cpu Skylake-Server)
[ "$accel" = tcg ] || accel_args=(-accel kvm -cpu host)

# The last boot's stamp (a --reboot run writes one per boot).
stamp_of() { [ -f "$job/times" ] && awk -v what="$1" '$1 == what {v = $2} END {if (v != "") print v}' "$job/times" || true; }

# A guest kernel under multi-threaded TCG now and then dies with "Oops: int3"
# in code the kernel is patching live (static keys; seen on 6.12 under QEMU
# 7.2, in early boot and, more rarely, when a container's cgroup flips a
# static key): QEMU races the kernel's int3-based text patching across vCPUs.
# That is the emulator's fault, not the command's, so boot again, at most
# $boot_attempts times, and say so: always when the kernel died before init
# (nothing of the job has run), and after init only when the disk is a
# throwaway copy (the command starts over on a clean disk) and the console
# shows exactly that oops, or a double fault (seen once on an AMD host under
# QEMU 7.2, in the slab allocator mid-run: a kernel stack gone bad, which
# no program of the guest can cause). A writable --disk is never booted
# again: the command's writes there are the point of such a run.
boot_attempts=3
attempt=1
while :; do
  rm -f "$job/times" "$job/exit-code"
  echo "vm-node: booting $cpus CPUs (${sockets} sockets x ${cores} cores x ${threads} threads), $numa_nodes NUMA nodes, ${memory} MiB, accel $accel"
  started=$(date +%s.%N)
  set +e
  timeout --foreground --kill-after=10 "$timeout_s" qemu-system-x86_64 \
    "${accel_args[@]}" -m "$memory" \
    -smp "$cpus,sockets=$sockets,cores=$cores,threads=$threads" "${numa[@]}" \
    -kernel "$image_dir/vmlinuz" -initrd "$image_dir/initrd.img" \
    -append "console=ttyS0 root=/dev/vda rw init=/sbin/vm-node-boot panic=-1 quiet loglevel=3 cgroup_no_v1=all" \
    -drive "$drive" "${extra_drives[@]}" "${pidfile[@]}" \
    -virtfs "local,path=$job,mount_tag=job,security_model=none,id=job" "${virtfs[@]}" \
    -nic none -display none -monitor none -serial stdio "${no_reboot[@]}" \
    </dev/null 2>"$job/qemu.err" | sed -u 's/\r$//' | tee "$job/console"
  qemu_status=${PIPESTATUS[0]}
  set -e
  ended=$(date +%s.%N)
  if [ -s "$job/exit-code" ] || [ "$qemu_status" -eq 124 ] || [ "$qemu_status" -eq 137 ] ||
    [ "$attempt" -ge "$boot_attempts" ]; then
    break
  fi
  if [ -z "$(stamp_of init)" ]; then
    echo "vm-node: the guest kernel stopped before init (boot $attempt of $boot_attempts, QEMU exit $qemu_status); booting again" >&2
  elif [ -z "$disk" ] && oops="$(grep -Eo -m 1 '^\[ *[0-9]+\.[0-9]+\] Oops: (int3|double fault)' "$job/console")"; then
    echo "vm-node: the guest kernel died under the emulator (\"${oops#*] }\") while the command ran (boot $attempt of $boot_attempts); the command starts over on a fresh copy of the disk" >&2
  else
    break
  fi
  attempt=$((attempt + 1))
done
wall=$(calc "$ended - $started")

init_at="$(stamp_of init)"
command_start="$(stamp_of command-start)"
command_end="$(stamp_of command-end)"
if [ -n "$init_at" ] && [ -n "$command_start" ] && [ -n "$command_end" ]; then
  echo "vm-node: times: boot to init $init_at s (guest uptime; QEMU start to init and power-off $(calc "$wall - ($command_end - $init_at)") s wall)," \
    "guest setup $(calc "$command_start - $init_at") s, command $(calc "$command_end - $command_start") s, total $wall s"
fi
if [ -s "$job/exit-code" ]; then
  exit "$(cat "$job/exit-code")"
fi
if [ "$qemu_status" -eq 124 ] || [ "$qemu_status" -eq 137 ]; then
  echo "vm-node: the VM did not finish within ${timeout_s} s" >&2
  exit 124
fi
echo "vm-node: the VM stopped (QEMU exit $qemu_status) without the command's exit code; QEMU said:" >&2
tail -n 20 "$job/qemu.err" >&2
exit 125
