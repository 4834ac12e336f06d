#!/bin/sh
# PID 1 of the VM node (scripts/vm-node.sh), run by the image's boot stub
# from the job share (/vm-node-job). Sets up what a node has (proc, sysfs,
# cgroup2 with the cpuset, cpu, memory and pids controllers delegated,
# tmpfs /run and /tmp, devpts, lo up, overlayfs for containerd's
# snapshotter, /etc/hosts), mounts the host's shares at their host paths,
# runs the job's command with its output on the console, writes its exit
# code to the job share and powers off. No systemd: nothing else runs.
job=/vm-node-job
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8

uptime_s() { cut -d' ' -f1 /proc/uptime; }
stamp() { echo "$1 $(uptime_s)" >>"$job/times"; }
say() { echo "vm-node(guest): $*"; }

finish() {
  echo "$1" >"$job/exit-code"
  sync
  echo o >/proc/sysrq-trigger
  sleep 30
}

die() {
  say "setup failed: $*"
  finish 125
}

stamp init
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run || die "tmpfs /run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp || die "tmpfs /tmp"
mkdir -p /dev/pts /dev/shm
mount -t devpts -o gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts || die "devpts"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm || die "tmpfs /dev/shm"
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup || die "cgroup2"
echo "+cpuset +cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control ||
  die "cannot enable cpuset, cpu, memory and pids in /sys/fs/cgroup/cgroup.subtree_control"
# What a kubelet also asks of its cgroup where the kernel has it (hugetlb; io
# for its stats), as a systemd host delegates them.
for controller in hugetlb io; do
  if grep -qw "$controller" /sys/fs/cgroup/cgroup.controllers; then
    echo "+$controller" >/sys/fs/cgroup/cgroup.subtree_control || die "cannot enable $controller"
  fi
done
# The kernel's sysrq must accept the power-off below.
echo 1 >/proc/sys/kernel/sysrq
ip link set lo up || die "lo up"
modprobe overlay || die "modprobe overlay"
hostname vm-node
printf '127.0.0.1\tlocalhost\n127.0.1.1\tvm-node\n::1\tlocalhost ip6-localhost ip6-loopback\n' >/etc/hosts
mkdir -p /var/run /run/containerd

# Shares: one "tag path" per line, mounted at the host's own path so that
# paths compiled into the test binaries hold in the guest.
while read -r tag path; do
  [ -n "$tag" ] || continue
  mkdir -p "$path" || die "mkdir $path"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=loose "$tag" "$path" ||
    die "mounting share $tag at $path"
done <"$job/shares"

if [ -f "$job/env" ]; then
  set -a
  . "$job/env"
  set +a
fi
stamp command-start
/bin/bash "$job/command.sh" </dev/null
rc=$?
stamp command-end
say "command exited $rc"
# A failure: the kernel's say on it (the OOM killer, a hung task) is below
# the console's log level, so its last messages are printed here.
if [ "$rc" -ne 0 ]; then
  say "the guest kernel's last messages:"
  dmesg 2>/dev/null | tail -n 40 || true
fi
finish "$rc"
