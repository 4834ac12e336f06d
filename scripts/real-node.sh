#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, without Docker, from the
# components scripts/build-components.sh builds: etcd, kube-apiserver (Node and
# RBAC authorization, NodeRestriction, service-account tokens),
# kube-controller-manager, kube-scheduler, containerd 2.x (CRI, NRI and CDI on)
# with runc, and the kubelet, with a bridge CNI network.
#
#   scripts/real-node.sh up [--oldest | --versions KUBERNETES CONTAINERD]
#                                        start it (Kubernetes and containerd of
#                                        tests/real-node/pins.env: the newest
#                                        pair, the oldest, or any pair the
#                                        Go module proxy serves), wait for Ready
#   scripts/real-node.sh down            stop and remove everything it made
#   scripts/real-node.sh install [HELM ARGS]
#                                        build the driver's image (release
#                                        build; DRA_CPU_IMAGE_PROFILE=debug for
#                                        the test build), import it and `helm
#                                        install` charts/dra-cpu with
#                                        tests/real-node/values.yaml (the tag
#                                        is the chart's appVersion, or
#                                        DRA_CPU_IMAGE_TAG); HELM ARGS are
#                                        kept for the node's later installs
#   scripts/real-node.sh image ARCHIVE   only build the image install would
#                                        import, to ARCHIVE (no node needed)
#   scripts/real-node.sh uninstall       `helm uninstall` it
#   scripts/real-node.sh restart containerd|kubelet
#   scripts/real-node.sh kubectl ARGS    kubectl as cluster admin
#   scripts/real-node.sh ctr ARGS        ctr on the node's containerd
#   scripts/real-node.sh helm ARGS       helm as cluster admin
#   scripts/real-node.sh env             the node's facts as shell variables
#
# DRA_CPU_REAL_NODE_LOG_V at `up` (default 1): the klog verbosity of the
# kubelet and kube-scheduler for the node's life (3 and 2 log the steps of a
# pod's start that scripts/perf-pod-start.sh reads back).
#
# Everything lives under one private directory ($DRA_CPU_REAL_NODE_DIR,
# default /tmp/dcpu-real-node) and one network namespace (dcpu-node) holding
# the node's address, the pod bridge and every listening socket, so no
# traffic leaves the machine and `down` removes the lot by deleting it; pods'
# cgroups live under the cgroup /dcpu-node. Needs root. The first `up`
# builds the components (a cold build takes tens of minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
# shellcheck source=../tests/real-node/pins.env
. tests/real-node/pins.env

dir="${DRA_CPU_REAL_NODE_DIR:-/tmp/dcpu-real-node}"
netns=dcpu-node
node_name=dcpu-node
node_ip=10.213.0.2
pod_cidr=10.213.1.0/24
service_cidr=10.213.2.0/24
service_ip=10.213.2.1
cgroup_root=/dcpu-node
cache="${DRA_CPU_COMPONENTS:-/var/cache/dra-cpu/components}"

log() { echo "real-node: $*" >&2; }
die() { log "$*"; exit 1; }

in_netns() { nsenter --net="/run/netns/$netns" -- "$@"; }

# DRA_CPU_PREBUILT=1: the driver's binaries, the image tool and the
# components were built beforehand, on a machine with cargo and the Go module
# proxy (the VM node has neither: scripts/real-node-tests.sh --vm builds on
# the host and runs this in the guest); build nothing, use what is there.
prebuilt() { [ -n "${DRA_CPU_PREBUILT:-}" ]; }

# --- what runs where ---------------------------------------------------------
load_versions() {
  if [ -f "$dir/versions" ]; then
    # shellcheck disable=SC1091
    . "$dir/versions"
  fi
}

components() {
  kube_bin="$cache/kubernetes-$KUBERNETES_VERSION"
  ctd_bin="$cache/containerd-$CONTAINERD_VERSION"
  runc_bin="$cache/runc-$RUNC/runc"
  cni_bin="$cache/cni-plugins-$CNI_PLUGINS"
  etcd_bin="$cache/etcd-$ETCD/etcd"
}

feature_gates() {
  # The DRA gates of each release that the driver uses; the rest stay at the
  # release's defaults. The same gates go to all four components.
  case "$KUBERNETES_VERSION" in
    1.34.*|1.35.*) echo "DRAResourceClaimDeviceStatus=true" ;;
    *) echo "DRAConsumableCapacity=true,DRAResourceClaimDeviceStatus=true,ResourceHealthStatus=true,DRANodeAllocatableResources=true,DRAListTypeAttributes=true" ;;
  esac
}

cgroup_v2() { [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; }

# --- certificates ------------------------------------------------------------
# "$1" name, "$2" subject, "$3" extensions (optional subjectAltName list)
issue_cert() {
  local name="$1" subject="$2" san="${3:-}" pki="$dir/pki"
  openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
  openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -z "$san" ] || echo "subjectAltName=$san"
  } >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 30 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

kubeconfig() {
  local name="$1" pki="$dir/pki"
  cat >"$dir/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: dcpu
  cluster:
    server: https://$node_ip:6443
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: dcpu
  context: {cluster: dcpu, user: $name}
current-context: dcpu
EOF
}

make_pki() {
  local pki="$dir/pki"
  mkdir -p "$pki"
  openssl genrsa -out "$pki/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=dcpu-node-ca" -days 30 -out "$pki/ca.crt" 2>/dev/null
  issue_cert apiserver "/CN=kube-apiserver" \
    "IP:$node_ip,IP:127.0.0.1,IP:$service_ip,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  issue_cert admin "/O=system:masters/CN=kubernetes-admin"
  issue_cert controller-manager "/CN=system:kube-controller-manager"
  issue_cert scheduler "/CN=system:kube-scheduler"
  issue_cert kubelet "/O=system:nodes/CN=system:node:$node_name"
  issue_cert apiserver-kubelet-client "/O=kubeadm:cluster-admins/CN=kube-apiserver-kubelet-client"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  for name in admin controller-manager scheduler kubelet; do kubeconfig "$name"; done
}

# --- processes ---------------------------------------------------------------
# Starts "$@" in the node's network namespace, logging to logs/NAME.log, and
# records its pid in pids/NAME.
start() {
  local name="$1"
  shift
  mkdir -p "$dir/logs" "$dir/pids"
  nsenter --net="/run/netns/$netns" -- setsid "$@" >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

alive() { [ -f "$dir/pids/$1" ] && kill -0 "$(cat "$dir/pids/$1")" 2>/dev/null; }

# Waits up to "$2" seconds for the command "$3..." to succeed while "$1" runs.
wait_for() {
  local name="$1" seconds="$2" deadline
  shift 2
  deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ! alive "$name"; then
      log "$name exited; last lines of $dir/logs/$name.log:"
      tail -n 30 "$dir/logs/$name.log" >&2
      return 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      log "$name not ready after ${seconds}s; last lines of $dir/logs/$name.log:"
      tail -n 30 "$dir/logs/$name.log" >&2
      return 1
    fi
    sleep 1
  done
}

kubectl_admin() { in_netns "$kube_bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }

# --- network -----------------------------------------------------------------
make_netns() {
  ip netns add "$netns"
  in_netns ip link set lo up
  # The node's address, on the namespace's own loopback device: reachable
  # only inside the namespace (by the node's processes and, through the
  # bridge, by pods).
  in_netns ip addr add "$node_ip/32" dev lo
  mkdir -p "$dir/cni/net.d"
  cat >"$dir/cni/net.d/10-dcpu.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dcpu",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "dcpu0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$pod_cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$dir/cni/ipam"
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

# --- cgroups -----------------------------------------------------------------
make_cgroup_root() {
  if cgroup_v2; then
    mkdir -p "/sys/fs/cgroup$cgroup_root"
    local controllers
    controllers="$(sed 's/\([^ ]*\)/+\1/g' /sys/fs/cgroup/cgroup.subtree_control)"
    [ -z "$controllers" ] || echo "$controllers" >"/sys/fs/cgroup$cgroup_root/cgroup.subtree_control" || true
  else
    local c
    for c in /sys/fs/cgroup/*/; do
      [ -L "${c%/}" ] && continue
      mkdir -p "$c${cgroup_root#/}"
    done
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$cgroup_root/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$cgroup_root/cpuset.mems"
  fi
}

# The processes whose arguments name "$1" (pgrep -f, which a minimal image
# such as the VM node's lacks).
processes_naming() {
  grep -lzF -- "$1" /proc/[0-9]*/cmdline 2>/dev/null | sed -n 's#^/proc/\([0-9]*\)/cmdline$#\1#p' || true
}

# Removes the cgroup tree under "$1" bottom-up (its processes must be gone).
remove_cgroup_tree() {
  [ -d "$1" ] || return 0
  find "$1" -depth -type d -exec rmdir {} \; 2>/dev/null || true
}

# --- images ------------------------------------------------------------------
import_images() {
  local archive
  for archive in "$dir"/images/*.tar; do
    [ -f "$archive" ] || continue
    "$ctd_bin/ctr" --address "$dir/containerd/containerd.sock" -n k8s.io images import \
      --all-platforms "$archive" >>"$dir/logs/images.log" 2>&1 ||
      die "ctr images import $archive failed (see $dir/logs/images.log)"
  done
}

oci_image_tool() {
  prebuilt || cargo build --quiet -p dra-cpu-tests --bin oci-image >&2
  echo "$(cargo_target)/debug/oci-image"
}

cargo_target() {
  if [ -n "${CARGO_TARGET_DIR:-}" ]; then (cd "$CARGO_TARGET_DIR" && pwd); else echo "$repo/target"; fi
}

# Writes the driver's image "dra-cpu.test/dra-cpu:$3" of the "$2" build of
# both binaries to the archive "$4" with the image tool "$1"; prints its digest.
driver_image() {
  "$1" driver "dra-cpu.test/dra-cpu:$3" "$4" "$(cargo_target)/$2/dra-plugin" "$(cargo_target)/$2/nri-plugin" |
    awk '{print $2}'
}

driver_tag() { sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/dra-cpu/Chart.yaml; }

helm_admin() { in_netns env KUBECONFIG="$dir/admin.kubeconfig" helm "$@"; }

# --- the driver, installed as users install it ---------------------------------
install_driver() {
  # The profile of the node's last install unless DRA_CPU_IMAGE_PROFILE says
  # otherwise, so that an upgrade keeps the build a scenario started with.
  local profile tag tool digest flag=()
  profile="${DRA_CPU_IMAGE_PROFILE:-$(cat "$dir/driver-profile" 2>/dev/null || echo release)}"
  case "$profile" in release | debug) ;; *) die "DRA_CPU_IMAGE_PROFILE is release or debug, not $profile" ;; esac
  echo "$profile" >"$dir/driver-profile"
  # Helm arguments given to an install are kept for the node's later
  # installs (an upgrade keeps the values a scenario started with).
  local helm_args=("$@")
  if [ $# -gt 0 ]; then
    printf '%s\n' "$@" >"$dir/helm-args"
  elif [ -f "$dir/helm-args" ]; then
    mapfile -t helm_args <"$dir/helm-args"
  fi
  # DRA_CPU_IMAGE_TAG: another tag than the chart's appVersion, so that an
  # install is an upgrade to a new image (the helm upgrade scenario).
  tag="${DRA_CPU_IMAGE_TAG:-$(driver_tag)}"
  [ -n "$tag" ] || die "no appVersion in charts/dra-cpu/Chart.yaml"
  [ "$profile" = release ] && flag=(--release)
  log "building dra-plugin and nri-plugin ($profile) and the image dra-cpu.test/dra-cpu:$tag"
  prebuilt || cargo build --quiet "${flag[@]}" -p dra-plugin -p nri-plugin --bin dra-plugin --bin nri-plugin
  if prebuilt && [ -f "${DRA_CPU_DRIVER_ARCHIVE:-}" ] && [ "$tag" = "$(driver_tag)" ]; then
    # Made beforehand where it is quick (the VM node's host): the same
    # binaries, the same tag, its digest beside it.
    cp "$DRA_CPU_DRIVER_ARCHIVE" "$dir/images/driver.tar"
    digest="$(cat "$DRA_CPU_DRIVER_ARCHIVE.digest")"
  else
    tool="$(oci_image_tool)"
    digest="$(driver_image "$tool" "$profile" "$tag" "$dir/images/driver.tar")"
  fi
  import_images
  sed -e "s#@DIR@#$dir#g" -e "s#@NODE_IP@#$node_ip#g" tests/real-node/values.yaml >"$dir/values.yaml"
  # The tag stays the chart's appVersion; the image's digest in a pod
  # annotation rolls the pods when the image changes under the same tag.
  log "helm upgrade --install dra-cpu charts/dra-cpu (namespace dra-cpu), image $digest"
  helm_admin upgrade --install dra-cpu charts/dra-cpu --namespace dra-cpu --create-namespace \
    -f "$dir/values.yaml" --set image.tag="$tag" \
    --set-string "podAnnotations.dra-cpu\\.test/image-digest=$digest" --wait --timeout 300s "${helm_args[@]}" >"$dir/logs/helm.log" 2>&1 || {
    tail -n 20 "$dir/logs/helm.log" >&2
    kubectl_admin -n dra-cpu get pods -o wide >&2 || true
    kubectl_admin -n dra-cpu describe pods >&2 || true
    die "helm install failed"
  }
  log "driver installed: $(kubectl_admin -n dra-cpu get pods -o name | tr '\n' ' ')"
}

# The two node daemons a scenario restarts (scripts/real-node.sh restart).
run_containerd() {
  PATH="$ctd_bin:$PATH" start containerd "$ctd_bin/containerd" --config "$dir/containerd/config.toml"
  wait_for containerd 60 test -S "$dir/containerd/containerd.sock"
  wait_for containerd 60 "$ctd_bin/ctr" --address "$dir/containerd/containerd.sock" version
}

# The kernel settings kubelet changes at start (protectKernelDefaults off):
# their values before the node, restored by `down`.
kernel_tunables=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
  kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

save_kernel_tunables() {
  [ -f "$dir/sysctl.saved" ] && return 0
  local t
  for t in "${kernel_tunables[@]}"; do
    [ -r "/proc/sys/$t" ] && echo "$t $(cat "/proc/sys/$t")"
  done >"$dir/sysctl.saved"
}

restore_kernel_tunables() {
  [ -f "$dir/sysctl.saved" ] || return 0
  local t value
  while read -r t value; do
    echo "$value" >"/proc/sys/$t" 2>/dev/null || log "cannot restore /proc/sys/$t to $value"
  done <"$dir/sysctl.saved"
}

# The klog verbosity the node was brought up with (DRA_CPU_REAL_NODE_LOG_V).
log_v() { cat "$dir/log-verbosity" 2>/dev/null || echo 1; }

run_kubelet() {
  save_kernel_tunables
  start kubelet "$kube_bin/kubelet" --config="$dir/kubelet.yaml" --kubeconfig="$dir/kubelet.kubeconfig" \
    --root-dir="$dir/kubelet" --hostname-override="$node_name" --node-ip="$node_ip" --v="$(log_v)"
  wait_for kubelet 120 kubectl_admin get node "$node_name"
  wait_for kubelet 180 kubectl_admin wait --for=condition=Ready "node/$node_name" --timeout=5s
}

# Stops "$1" (containerd or kubelet; SIGTERM, SIGKILL after 30 s) and starts
# it again with the same configuration. containerd's shims, and so every
# container, keep running meanwhile.
restart_daemon() {
  local name="$1" pid deadline
  [ -f "$dir/pids/$name" ] || die "$name is not running here"
  pid="$(cat "$dir/pids/$name")"
  kill "$pid" 2>/dev/null || true
  deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || kill -9 "$pid" 2>/dev/null || true
    sleep 0.2
  done
  case "$name" in
    containerd) run_containerd ;;
    kubelet) run_kubelet ;;
    *) die "restart: containerd or kubelet, not $name" ;;
  esac
  log "$name restarted"
}

# --- up ----------------------------------------------------------------------
up() {
  [ "$(id -u)" -eq 0 ] || die "must run as root"
  if [ -e "/run/netns/$netns" ] || [ -d "$dir" ]; then
    log "a node is already here; taking it down first"
    down
  fi
  KUBERNETES_VERSION="$KUBERNETES_LATEST" CONTAINERD_VERSION="$CONTAINERD_LATEST"
  case "${1:-}" in
    "") ;;
    --oldest) KUBERNETES_VERSION="$KUBERNETES_OLDEST" CONTAINERD_VERSION="$CONTAINERD_OLDEST" ;;
    --versions)
      [ $# -eq 3 ] || die "usage: up --versions KUBERNETES CONTAINERD (e.g. 1.36.3 2.3.7)"
      KUBERNETES_VERSION="$2" CONTAINERD_VERSION="$3"
      ;;
    *) die "usage: up [--oldest | --versions KUBERNETES CONTAINERD]" ;;
  esac
  components
  if prebuilt; then
    local built
    for built in "$kube_bin" "$ctd_bin" "${runc_bin%/runc}" "$cni_bin" "${etcd_bin%/etcd}"; do
      [ -f "$built/.complete" ] || die "DRA_CPU_PREBUILT is set but $built was not built (scripts/build-components.sh)"
    done
  else
    scripts/build-components.sh pair "$KUBERNETES_VERSION" "$CONTAINERD_VERSION"
  fi
  command -v nsenter >/dev/null || die "nsenter not found (util-linux)"
  [ -e /dev/net/tun ] || true

  mkdir -p "$dir"/{images,manifests,logs,pids,cdi,nri,kubelet,containerd,etcd}
  printf 'KUBERNETES_VERSION=%s\nCONTAINERD_VERSION=%s\n' "$KUBERNETES_VERSION" "$CONTAINERD_VERSION" >"$dir/versions"
  case "${DRA_CPU_REAL_NODE_LOG_V:-1}" in
    [0-9] | 10) echo "${DRA_CPU_REAL_NODE_LOG_V:-1}" >"$dir/log-verbosity" ;;
    *) die "DRA_CPU_REAL_NODE_LOG_V is a klog verbosity (0-10), not $DRA_CPU_REAL_NODE_LOG_V" ;;
  esac
  log "Kubernetes $KUBERNETES_VERSION, containerd $CONTAINERD_VERSION, runc $RUNC, etcd $ETCD in $dir"
  ip netns list 2>/dev/null | awk '{print $1}' >"$dir/netns.before"
  make_netns
  make_pki
  make_cgroup_root
  local tool
  tool="$(oci_image_tool)"
  "$tool" busybox "$dir/images/busybox.tar" >/dev/null
  local gates
  gates="$(feature_gates)"

  start etcd "$etcd_bin" --name dcpu --data-dir "$dir/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster dcpu=http://127.0.0.1:2380 --unsafe-no-fsync --quota-backend-bytes 1073741824
  wait_for etcd 60 in_netns bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379'

  local pki="$dir/pki"
  start kube-apiserver "$kube_bin/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=6443 \
    --advertise-address="$node_ip" --service-cluster-ip-range="$service_cidr" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --api-audiences=https://kubernetes.default.svc.cluster.local \
    --kubelet-preferred-address-types=InternalIP \
    --allow-privileged=true --feature-gates="$gates" --enable-priority-and-fairness=false \
    --profiling=false --v=1
  wait_for kube-apiserver 180 kubectl_admin get --raw /readyz
  # The admin's group: kubeadm binds it the same way.
  kubectl_admin create clusterrolebinding kubeadm:cluster-admins --clusterrole=cluster-admin \
    --group=kubeadm:cluster-admins >/dev/null

  start kube-controller-manager "$kube_bin/kube-controller-manager" \
    --kubeconfig="$dir/controller-manager.kubeconfig" --use-service-account-credentials \
    --controllers='*' --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --leader-elect=false --feature-gates="$gates" --profiling=false --bind-address=127.0.0.1 --v=1
  cat >"$dir/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $dir/scheduler.kubeconfig
leaderElection:
  leaderElect: false
EOF
  start kube-scheduler "$kube_bin/kube-scheduler" --config="$dir/scheduler.yaml" \
    --feature-gates="$gates" --profiling=false --bind-address=127.0.0.1 --v="$(log_v)"

  # containerd: CRI, NRI and CDI, runc from the build, the pinned sandbox image.
  cat >"$dir/containerd/config.toml" <<EOF
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = ""
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "dra-cpu.test/pause:1"
[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["$dir/cdi"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$runc_bin"
        Root = "$dir/containerd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$cni_bin"]
    conf_dir = "$dir/cni/net.d"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "$dir/nri/nri.sock"
  plugin_path = "$dir/nri/plugins"
  plugin_config_path = "$dir/nri/conf.d"
EOF
  run_containerd
  import_images

  cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: $cgroup_root
containerRuntimeEndpoint: unix://$dir/containerd/containerd.sock
failSwapOn: false
failCgroupV1: false
staticPodPath: $dir/manifests
podCIDR: $pod_cidr
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
localStorageCapacityIsolation: false
# Nothing can be pulled here: never collect an image.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
syncFrequency: 10s
podLogsDirectory: $dir/pod-logs
featureGates: {$(echo "$gates" | sed 's/=/: /g; s/,/, /g')}
EOF
  run_kubelet
  log "node $node_name Ready: Kubernetes $KUBERNETES_VERSION, containerd $CONTAINERD_VERSION (kubectl: scripts/real-node.sh kubectl ...)"
}

# Pod network namespaces that containerd made for this node's pods: the cni-*
# ones that appeared after `up` and hold either an address of the node's pod
# range or nothing but loopback (their veth went with the bridge, or the
# sandbox was torn down halfway).
remove_pod_netns() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^cni-' || true); do
    if [ -f "$dir/netns.before" ] && grep -qx "$ns" "$dir/netns.before"; then
      continue
    fi
    if nsenter --net="/run/netns/$ns" ip -o addr 2>/dev/null | grep -q " ${pod_cidr%.*}\\." ||
      ! nsenter --net="/run/netns/$ns" ip -o link 2>/dev/null | grep -vq ': lo:'; then
      ip netns delete "$ns" 2>/dev/null || log "cannot delete network namespace $ns"
    fi
  done
}

# --- down --------------------------------------------------------------------
down() {
  [ "$(id -u)" -eq 0 ] || die "must run as root"
  local name pid
  # The kubelet first, so it restarts nothing; then every container's shim.
  for name in kubelet kube-scheduler kube-controller-manager kube-apiserver; do
    if [ -f "$dir/pids/$name" ]; then
      pid="$(cat "$dir/pids/$name")"
      kill "$pid" 2>/dev/null || true
    fi
  done
  if [ -f "$dir/pids/containerd" ] && [ -S "$dir/containerd/containerd.sock" ]; then
    load_versions
    if [ -n "${CONTAINERD_VERSION:-}" ]; then
      components
      if [ -x "$ctd_bin/ctr" ]; then
        local ctr=("$ctd_bin/ctr" --address "$dir/containerd/containerd.sock" -n k8s.io)
        for task in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
          "${ctr[@]}" tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
        done
      fi
    fi
  fi
  # Every process whose executable or arguments lie under the private
  # directory, the shims and containers included (their cgroups are ours).
  local pids
  for _ in 1 2 3; do
    pids="$(processes_naming "$dir/")"
    for name in "$dir"/pids/*; do
      [ -f "$name" ] && pids="$pids $(cat "$name")"
    done
    # Processes in the node's cgroups (containers and their shims).
    pids="$pids $(cat $(find /sys/fs/cgroup -path "*${cgroup_root}/*" -name cgroup.procs 2>/dev/null) /dev/null 2>/dev/null || true)"
    # Never init nor this script (a stale pid file could name any process).
    pids="$(echo "$pids" | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -u | grep -vx -e 0 -e 1 -e "$$" -e "$PPID" || true)"
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 1
  done
  # Mounts under the private directory (kubelet's volumes and its shared
  # root, containerd's sandboxes and snapshots), deepest first.
  local mounts
  mounts="$(awk -v d="$dir" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)"
  for m in $mounts; do umount -l "$m" 2>/dev/null || true; done
  remove_pod_netns
  if [ -e "/run/netns/$netns" ]; then
    ip netns delete "$netns" 2>/dev/null || true
  fi
  # Once more: a pod's namespace whose veth went with the bridge only now
  # holds nothing but loopback.
  remove_pod_netns
  if cgroup_v2; then
    remove_cgroup_tree "/sys/fs/cgroup$cgroup_root"
  else
    local c
    for c in /sys/fs/cgroup/*/; do remove_cgroup_tree "$c${cgroup_root#/}"; done
  fi
  restore_kernel_tunables
  rm -rf "$dir"
  log "down: processes, mounts, network namespaces, cgroups and $dir removed; kernel settings restored"
}

# The versions and binaries of the node that is up, or a clear error.
need_node() {
  load_versions
  [ -n "${KUBERNETES_VERSION:-}" ] && [ -n "${CONTAINERD_VERSION:-}" ] || die "no node is up (scripts/real-node.sh up)"
  components
}

cmd="${1:-}"
shift || true
case "$cmd" in
  up) up "$@" ;;
  down) down ;;
  install)
    need_node
    install_driver "$@"
    ;;
  image)
    # The driver's image as `install` makes it (DRA_CPU_IMAGE_PROFILE's
    # build, the chart's tag), written to an archive with its digest in
    # ARCHIVE.digest, for a node that cannot build it (the VM node's
    # DRA_CPU_DRIVER_ARCHIVE). Needs no node.
    [ $# -eq 1 ] || die "usage: image ARCHIVE"
    driver_image "$(oci_image_tool)" "${DRA_CPU_IMAGE_PROFILE:-release}" "$(driver_tag)" "$1" >"$1.digest"
    ;;
  uninstall)
    need_node
    helm_admin uninstall dra-cpu --namespace dra-cpu --wait --timeout 120s
    ;;
  restart)
    need_node
    restart_daemon "${1:-}"
    ;;
  kubectl)
    need_node
    kubectl_admin "$@"
    ;;
  ctr)
    need_node
    "$ctd_bin/ctr" --address "$dir/containerd/containerd.sock" -n k8s.io "$@"
    ;;
  helm)
    need_node
    helm_admin "$@"
    ;;
  env)
    need_node
    cat <<EOF
REAL_NODE_DIR=$dir
REAL_NODE_NAME=$node_name
REAL_NODE_IP=$node_ip
REAL_NODE_NETNS=/run/netns/$netns
REAL_NODE_KUBECONFIG=$dir/admin.kubeconfig
REAL_NODE_KUBECTL=$kube_bin/kubectl
REAL_NODE_KUBERNETES=$KUBERNETES_VERSION
REAL_NODE_CONTAINERD=$CONTAINERD_VERSION
REAL_NODE_CDI_DIR=$dir/cdi
REAL_NODE_NRI_SOCKET=$dir/nri/nri.sock
REAL_NODE_KUBELET_DIR=$dir/kubelet
EOF
    ;;
  *) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
