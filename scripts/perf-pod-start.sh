#!/usr/bin/env bash
# Pod start on the real node (docs/performance.md, rows 8 to 8c and 5b):
# brings up the real node of scripts/real-node.sh on the newest pair of
# tests/real-node/pins.env, installs the driver with `helm install`, and
# times, from the pod's creation (its ADDED event on a watch) to its
# container running (its process has exec'd past its first command, which
# printed its Cpus_allowed_list) with its cpuset read from its cgroup:
#   a  a pod with a ResourceClaim of --cpus exclusive CPUs (our driver)
#   b  the same pod without a claim (the floor), beside a, round by round
#   c  a Guaranteed pod with --cpus integer CPUs under kubelet's static CPU
#      manager (cpuManagerPolicy: static, reservedSystemCPUs: "0"), the
#      driver uninstalled, beside b again, round by round
# in alternating blocks (driver / static CPU manager; switching the kubelet
# policy removes its cpu_manager_state and restarts it), and row 5b on this
# containerd: from dra-plugin's "claim unprepared" (NodeUnprepareResources
# returning) to a running shared container's cgroup showing the grown pool.
# Prints the table (Markdown) and where the time of a pod start goes, read
# from the components' own log lines (kubelet -v=3, kube-scheduler -v=3,
# containerd, dra-plugin, nri-plugin) and watches stamped on arrival.
#
#   scripts/perf-pod-start.sh [--rounds N] [--blocks B] [--cpus N]
#                             [--grow-rounds N] [--out FILE] [--keep-data DIR]
#                             [--reuse-node]
#     --rounds N       pods of each kind (default 30), spread over the blocks
#     --blocks B       blocks of each kind (default 3)
#     --cpus N         CPUs of the claim and of the Guaranteed pod (default
#                      2; fewer when the node cannot give them: the chart
#                      keeps 1 CPU for the shared pool and the static policy
#                      reserves CPU 0, so at most CPUs - 1)
#     --grow-rounds N  unprepares timed for row 5 (default 15; 0 skips it)
#     --out FILE       also write the report to FILE
#     --keep-data DIR  keep the raw samples and logs in DIR
#     --reuse-node     use the node that is up (brought up with
#                      DRA_CPU_REAL_NODE_LOG_V=3, driver installed) and leave
#                      it up with its kubelet configuration and driver back
#
# Needs root and python3. The first run builds the components (tens of
# minutes on 2 cores; cached). A run of the defaults takes about 12 minutes
# on 2 cores after that.
set -euo pipefail
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
rounds=30 blocks=3 cpus=2 grow_rounds=15 out="" keep="" reuse=0
die() { echo "perf-pod-start: $*" >&2; exit 1; }
log() { echo "perf-pod-start: $*" >&2; }
count() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "${3:-1}" ] || die "$1 takes a number >= ${3:-1}, not '$2'"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) count "$1" "${2:-}"; rounds="$2"; shift 2 ;;
    --blocks) count "$1" "${2:-}"; blocks="$2"; shift 2 ;;
    --cpus) count "$1" "${2:-}"; cpus="$2"; shift 2 ;;
    --grow-rounds) count "$1" "${2:-}" 0; grow_rounds="$2"; shift 2 ;;
    --out) [ -n "${2:-}" ] || die "--out FILE"; out="$2"; shift 2 ;;
    --keep-data) [ -n "${2:-}" ] || die "--keep-data DIR"; keep="$2"; shift 2 ;;
    --reuse-node) reuse=1; shift ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
[ "$blocks" -le "$rounds" ] || die "--blocks ($blocks) is at most --rounds ($rounds)"
[ "$(id -u)" -eq 0 ] || die "must run as root"
command -v python3 >/dev/null || die "python3 not found"
command -v nsenter >/dev/null || die "nsenter not found (util-linux)"
if [ -n "$keep" ]; then
  [ ! -e "$keep" ] || [ -z "$(ls -A "$keep")" ] || die "--keep-data $keep exists and is not empty"
fi
host_cpus="$(nproc --all)"
fits=$((host_cpus - 1))
[ "$fits" -ge 1 ] || die "the node needs at least 2 CPUs (this one has $host_cpus)"
if [ "$cpus" -gt "$fits" ]; then
  log "--cpus $cpus does not fit on $host_cpus CPUs (1 kept for the shared pool, CPU 0 reserved for the static policy): $fits CPUs"
  cpus="$fits"
fi

ns=pod-start
work="$(mktemp -d /tmp/dcpu-pod-start.XXXXXX)"
node_up=0 static_on=0 driver_off=0 watch_pids=()
R() { scripts/real-node.sh "$@"; }

cleanup() {
  local status=$?
  local pid
  for pid in "${watch_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ "$node_up" = 1 ]; then
    R kubectl delete namespace "$ns" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
    if [ "$reuse" = 1 ]; then
      [ "$static_on" = 0 ] || kubelet_policy none || log "could not restore the kubelet's configuration"
      [ "$driver_off" = 0 ] || R install >/dev/null || log "could not install the driver again"
    else
      R down || true
    fi
  fi
  if [ -n "$keep" ]; then
    mkdir -p "$keep" && cp -a "$work"/. "$keep"/ && log "raw data in $keep"
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

if [ "$reuse" = 1 ]; then
  R env >/dev/null 2>&1 || die "--reuse-node: no node is up"
else
  if R env >/dev/null 2>&1; then die "a real node is up; take it down first or pass --reuse-node"; fi
  node_up=1
  DRA_CPU_REAL_NODE_LOG_V=3 R up
  R install
fi
node_up=1
eval "$(R env)"
[ "${REAL_NODE_CONTAINERD:-}" ] || die "scripts/real-node.sh env said nothing"
[ "$(cat "$REAL_NODE_DIR/log-verbosity" 2>/dev/null || echo 1)" -ge 3 ] ||
  die "the node logs at -v=$(cat "$REAL_NODE_DIR/log-verbosity" 2>/dev/null || echo 1); bring it up with DRA_CPU_REAL_NODE_LOG_V=3"
R kubectl -n dra-cpu rollout status daemonset/dra-cpu --timeout=120s >/dev/null || die "the driver is not installed (scripts/real-node.sh install)"
kubectl_bin=(nsenter --net="$REAL_NODE_NETNS" -- "$REAL_NODE_KUBECTL" --kubeconfig="$REAL_NODE_KUBECONFIG")
k() { "${kubectl_bin[@]}" "$@"; }
cp "$REAL_NODE_DIR/kubelet.yaml" "$work/kubelet.yaml.orig"

if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  cg_base=/sys/fs/cgroup/dcpu-node
else
  cg_base=/sys/fs/cgroup/cpuset/dcpu-node
fi
[ -d "$cg_base" ] || die "no cgroup $cg_base: is the node up?"
# A file descriptor that never has data: `read -t` on it sleeps without a fork.
mkfifo "$work/tick"
exec {tick}<>"$work/tick"
nap() { read -r -t "$1" -u "$tick" _ || true; }

# The cpuset of the cgroup directory "$1" (v2: effective when unwritten).
cg_cpus() {
  local v=""
  read -r v <"$1/cpuset.cpus" 2>/dev/null || true
  [ -n "$v" ] || read -r v <"$1/cpuset.cpus.effective" 2>/dev/null || true
  echo "$v"
}

# Polls every 2 ms until the app container of pod "$1" runs `sleep 3600`
# (its first command done), then prints "TIME CPUS CGROUP".
wait_running() {
  local uid="$1" deadline=$((SECONDS + 180)) d pid args
  while :; do
    for d in "$cg_base"/kubepods/pod"$uid"/*/ "$cg_base"/kubepods/*/pod"$uid"/*/; do
      [ -f "${d}cgroup.procs" ] || continue
      pid=""
      read -r pid <"${d}cgroup.procs" 2>/dev/null || true
      [ -n "$pid" ] || continue
      # The pod's sandbox runs `/bin/sleep infinity`; the app `sleep 3600`.
      args=()
      mapfile -d '' args <"/proc/$pid/cmdline" 2>/dev/null || true
      if [ "${args[0]:-}" = sleep ] && [ "${args[1]:-}" = 3600 ]; then
        local t=$EPOCHREALTIME
        echo "$t $(cg_cpus "$d") ${d%/}"
        return 0
      fi
    done
    [ $SECONDS -lt $deadline ] || return 1
    nap 0.002
  done
}

# Watches "$1" (pods or resourceclaims) in the namespace, each event stamped
# with the time it arrived, into "$2".
watch_objects() {
  local columns='E:.type,N:.object.metadata.name,NODE:.object.spec.nodeName'
  [ "$1" = pods ] || columns='E:.type,N:.object.metadata.name,DEV:.object.status.allocation.devices.results[0].device'
  "${kubectl_bin[@]}" -n "$ns" get "$1" --watch --output-watch-events -o "custom-columns=$columns" --no-headers \
    > >(while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done >>"$2") 2>>"$work/watch.err" &
  watch_pids+=($!)
}

stop_watches() {
  local pid
  for pid in "${watch_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  watch_pids=()
}

# pod_yaml KIND NAME: a (claim), b (nothing), c (Guaranteed), s (shared, no
# claim, for row 5).
pod_yaml() {
  local kind="$1" name="$2"
  echo "apiVersion: v1"
  echo "kind: Pod"
  echo "metadata: {name: $name, namespace: $ns}"
  echo "spec:"
  echo "  terminationGracePeriodSeconds: 1"
  [ "$kind" != a ] || echo "  resourceClaims: [{name: cpus, resourceClaimTemplateName: cpus}]"
  echo "  containers:"
  echo "  - name: app"
  echo "    image: dra-cpu.test/busybox:1"
  echo "    imagePullPolicy: Never"
  echo "    command: [/bin/sh, -c, 'grep Cpus_allowed_list /proc/self/status; exec sleep 3600']"
  case "$kind" in
    a) echo "    resources: {claims: [{name: cpus}]}" ;;
    c) echo "    resources: {limits: {cpu: \"$cpus\", memory: 64Mi}, requests: {cpu: \"$cpus\", memory: 64Mi}}" ;;
  esac
}

# One pod of KIND named NAME in block BLOCK: create, wait running, read the
# cpuset inside, delete and wait until it (and its claim) are gone.
one_pod() {
  local kind="$1" name="$2" block="$3" uid seen inside
  uid="$(pod_yaml "$kind" "$name" | k create -f - -o jsonpath='{.metadata.uid}')"
  seen="$(wait_running "$uid")" || die "pod $name did not run within 180 s"
  # The container runs before the kubelet reports it: its log may be
  # refused for a moment.
  local text="" deadline=$((SECONDS + 60))
  until text="$(k -n "$ns" logs "$name" 2>/dev/null)" && [ -n "$text" ]; do
    [ $SECONDS -lt $deadline ] || die "no log from pod $name within 60 s"
    sleep 0.2
  done
  inside="$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' <<<"$text")"
  # kind block name uid seen cgroup-cpus cgroup inside-cpus
  set -- $seen
  printf '%s %s %s %s %s %s %s %s\n' "$kind" "$block" "$name" "$uid" "$1" "$2" "$3" "${inside:--}" >>"$work/pods.txt"
  k -n "$ns" delete pod "$name" --wait=true --timeout=120s >/dev/null
  if [ "$kind" = a ]; then
    deadline=$((SECONDS + 120))
    while [ -n "$(k -n "$ns" get resourceclaims -o name)" ]; do
      [ $SECONDS -lt $deadline ] || die "the claim of $name was not deleted within 120 s"
      sleep 0.2
    done
  fi
  sleep 1
}

driver_pod() { k -n dra-cpu get pods -l app.kubernetes.io/name=dra-cpu -o jsonpath='{.items[0].metadata.name}'; }
driver_metrics() { k get --raw "/api/v1/namespaces/dra-cpu/pods/$(driver_pod):$1/proxy/metrics"; }

# kubelet_policy static|none: the kubelet's CPU manager policy; its state
# file goes with each switch, as kubelet refuses a file of another policy.
kubelet_policy() {
  if [ "$1" = static ]; then
    {
      cat "$work/kubelet.yaml.orig"
      echo "cpuManagerPolicy: static"
      echo 'reservedSystemCPUs: "0"'
    } >"$REAL_NODE_DIR/kubelet.yaml"
    static_on=1
  else
    cp "$work/kubelet.yaml.orig" "$REAL_NODE_DIR/kubelet.yaml"
    static_on=0
  fi
  rm -f "$REAL_NODE_DIR/kubelet/cpu_manager_state"
  # A restart starts the kubelet's log afresh: keep what it logged so far.
  cat "$REAL_NODE_DIR/logs/kubelet.log" >>"$work/kubelet.log"
  R restart kubelet >/dev/null
}

setup_namespace() {
  k create namespace "$ns" >/dev/null
  until k -n "$ns" get serviceaccount default >/dev/null 2>&1; do sleep 0.5; done
}

setup_template() {
  local request
  if k get resourceslices -o jsonpath='{.items[*].spec.devices[*].capacity}' | grep -q 'dra.cpu/cpu'; then
    request="capacity: {requests: {dra.cpu/cpu: \"$cpus\"}}"
  else
    request="count: $cpus"
  fi
  k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: cpus, namespace: $ns}
spec:
  spec:
    devices:
      requests:
      - name: cpus
        exactly: {deviceClassName: dra.cpu, $request}
EOF
}

# Row 5: a running shared pod; each round a claim pod starts (the pool
# shrinks), is deleted, and a poller stamps the moment the shared
# container's cgroup shows the whole pool again.
grow_rounds() {
  local shared full i name uid seen t
  uid="$(pod_yaml s shared | k create -f - -o jsonpath='{.metadata.uid}')"
  seen="$(wait_running "$uid")" || die "the shared pod did not run"
  set -- $seen
  full="$2" shared="$3"
  for i in $(seq -w 1 "$grow_rounds"); do
    name="g-$i"
    uid="$(pod_yaml a "$name" | k create -f - -o jsonpath='{.metadata.uid}')"
    wait_running "$uid" >/dev/null || die "pod $name did not run"
    local deadline=$((SECONDS + 30))
    until [ "$(cg_cpus "$shared")" != "$full" ]; do
      [ $SECONDS -lt $deadline ] || die "the shared pod was not shrunk for $name within 30 s"
      nap 0.01
    done
    local claim
    claim="$(k -n "$ns" get pod "$name" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')"
    (
      deadline=$((SECONDS + 60))
      until [ "$(cg_cpus "$shared")" = "$full" ]; do
        [ $SECONDS -lt $deadline ] || exit 1
        nap 0.001
      done
      echo "$EPOCHREALTIME"
    ) >"$work/grown.$i" &
    local poller=$!
    k -n "$ns" delete pod "$name" --wait=true --timeout=120s >/dev/null
    wait "$poller" || die "the shared pod did not grow back within 60 s after $name"
    t="$(cat "$work/grown.$i")"
    echo "$i $claim $t" >>"$work/grow.txt"
    while [ -n "$(k -n "$ns" get resourceclaims -o name)" ]; do sleep 0.2; done
    sleep 1
  done
  k -n "$ns" delete pod shared --wait=true --timeout=120s >/dev/null
}

collect_driver_logs() {
  local block="$1" pod
  pod="$(driver_pod)"
  k -n dra-cpu logs "$pod" -c dra-plugin >"$work/dra-plugin.$block.log"
  k -n dra-cpu logs "$pod" -c nri-plugin >"$work/nri-plugin.$block.log"
}

setup_namespace
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
per_block=$(((rounds + blocks - 1) / blocks))
log "Kubernetes $REAL_NODE_KUBERNETES, containerd $REAL_NODE_CONTAINERD; $host_cpus CPUs, pods of $cpus CPUs; $rounds pods of each kind in $blocks blocks of $per_block rounds"
done_d=0 done_s=0
for block in $(seq 1 "$blocks"); do
  # --- the driver: a and b, alternating which goes first ---
  if [ "$driver_off" = 1 ]; then
    kubelet_policy none
    R install >/dev/null
    driver_off=0
  fi
  setup_template
  watch_objects pods "$work/pods-watch.d$block"
  watch_objects resourceclaims "$work/claims-watch.d$block"
  sleep 1
  driver_metrics 9440 >"$work/dra-metrics.d$block.before"
  driver_metrics 9441 >"$work/nri-metrics.d$block.before"
  if [ "$block" = 1 ] && [ "$grow_rounds" -gt 0 ]; then
    log "row 5: $grow_rounds unprepares with a shared pod running"
    grow_rounds
  fi
  for r in $(seq 1 "$per_block"); do
    [ "$done_d" -lt "$rounds" ] || break
    name="$(printf 'd%d-%02d' "$block" "$r")"
    if [ $((r % 2)) = 1 ]; then order=(a b); else order=(b a); fi
    for kind in "${order[@]}"; do one_pod "$kind" "$kind-$name" "d$block"; done
    done_d=$((done_d + 1))
  done
  driver_metrics 9440 >"$work/dra-metrics.d$block.after"
  driver_metrics 9441 >"$work/nri-metrics.d$block.after"
  stop_watches
  collect_driver_logs "d$block"
  log "block $block, driver: $done_d rounds done"
  # --- the static CPU manager: c and b, the driver uninstalled ---
  R uninstall >/dev/null
  driver_off=1
  kubelet_policy static
  watch_objects pods "$work/pods-watch.s$block"
  sleep 1
  for r in $(seq 1 "$per_block"); do
    [ "$done_s" -lt "$rounds" ] || break
    name="$(printf 's%d-%02d' "$block" "$r")"
    if [ $((r % 2)) = 1 ]; then order=(c b); else order=(b c); fi
    for kind in "${order[@]}"; do one_pod "$kind" "$kind-$name" "s$block"; done
    done_s=$((done_s + 1))
  done
  stop_watches
  log "block $block, static CPU manager: $done_s rounds done"
done

cat "$REAL_NODE_DIR/logs/kubelet.log" >>"$work/kubelet.log"
cp "$REAL_NODE_DIR"/logs/{kube-scheduler,containerd}.log "$work/"
report=0
python3 scripts/perf-pod-start-report.py "$work" \
  --header "Kubernetes $REAL_NODE_KUBERNETES, containerd $REAL_NODE_CONTAINERD, $host_cpus CPUs, pods of $cpus CPUs, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load_before at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end" \
  --cpus "$cpus" --namespace "$ns" >"$work/report.md" || report=$?
cat "$work/report.md"
[ -z "$out" ] || cp "$work/report.md" "$out"
[ "$report" = 0 ] || die "the report found failed checks (above)"
