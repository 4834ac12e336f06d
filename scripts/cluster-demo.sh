#!/usr/bin/env bash
# The node demo on the real node (scripts/demo.sh --cluster): brings up the
# real node of scripts/real-node.sh, installs the driver with `helm install`,
# runs a shared pod, an exclusive pod (a claim of one CPU) and a mixed pod (a
# claim of one CPU plus requests.cpu), and prints each container's cpuset
# after each step: `cpuset.cpus` of its cgroup and the `Cpus_allowed_list` of
# a process inside it (kubectl exec). Takes the node down at the end.
#   --oldest   Kubernetes and containerd: the oldest pair of tests/real-node/pins.env
set -euo pipefail
cd "$(dirname "$0")/.."
which=()
[ "${1:-}" = "--oldest" ] && which=(--oldest)
[ "$(id -u)" -eq 0 ] || { echo "cluster-demo: must run as root" >&2; exit 1; }
trap 'scripts/real-node.sh down >/dev/null 2>&1 || true' EXIT
echo "cluster-demo: bringing up the real node (the first run builds Kubernetes and containerd from the Go module proxy: tens of minutes)"
scripts/real-node.sh up "${which[@]}"
scripts/real-node.sh install
k() { scripts/real-node.sh kubectl "$@"; }
ns=demo
k create namespace "$ns" >/dev/null
until k -n "$ns" get serviceaccount default >/dev/null 2>&1; do sleep 1; done
grouped=$(k get resourceslices -o jsonpath='{.items[*].spec.devices[*].capacity}' | grep -c 'dra.cpu/cpu' || true)
if [ "$grouped" -gt 0 ]; then
  request='capacity: {requests: {dra.cpu/cpu: "1"}}'
else
  request='count: 1'
fi
k apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-cpu, namespace: $ns}
spec:
  spec:
    devices:
      requests:
      - name: cpus
        exactly: {deviceClassName: dra.cpu, $request}
EOF

# pod NAME [CPU_REQUEST] [claim]
pod() {
  local name="$1" cpu="${2:-}" claim="${3:-}"
  {
    echo "apiVersion: v1"
    echo "kind: Pod"
    echo "metadata: {name: $name, namespace: $ns}"
    echo "spec:"
    echo "  terminationGracePeriodSeconds: 1"
    [ -z "$claim" ] || echo "  resourceClaims: [{name: cpus, resourceClaimTemplateName: one-cpu}]"
    echo "  containers:"
    echo "  - name: app"
    echo "    image: dra-cpu.test/busybox:1"
    echo "    imagePullPolicy: Never"
    echo "    command: [/bin/sleep, infinity]"
    echo "    resources:"
    [ -z "$cpu" ] || echo "      requests: {cpu: $cpu}"
    [ -z "$claim" ] || echo "      claims: [{name: cpus}]"
  } | k apply -f - >/dev/null
  k -n "$ns" wait --for=condition=Ready "pod/$name" --timeout=240s >/dev/null
}

# The cpuset.cpus of the cgroup of process $1 (cgroup v1 or v2).
cgroup_cpus() {
  local pid="$1" path dir
  if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    path="$(sed -n 's/^0:://p' "/proc/$pid/cgroup")"
    dir="/sys/fs/cgroup$path"
    if [ -s "$dir/cpuset.cpus" ] && [ -n "$(tr -d '\n' <"$dir/cpuset.cpus")" ]; then
      cat "$dir/cpuset.cpus"
    else
      echo "$(cat "$dir/cpuset.cpus.effective")*"
    fi
  else
    path="$(awk -F: '$2 ~ /(^|,)cpuset(,|$)/ {print $3}' "/proc/$pid/cgroup")"
    cat "/sys/fs/cgroup/cpuset$path/cpuset.cpus"
  fi
}

declare -A kinds=()
step=0
table() {
  step=$((step + 1))
  sleep 2
  echo
  echo "== $step. $1"
  printf '  %-12s %-10s %-10s %-12s %s\n' pod container kind cpuset.cpus Cpus_allowed_list
  local name id pid
  for name in shared exclusive mixed later; do
    [ -n "${kinds[$name]:-}" ] || continue
    id="$(k -n "$ns" get pod "$name" -o jsonpath='{.status.containerStatuses[0].containerID}')"
    id="${id#*://}"
    pid="$(scripts/real-node.sh ctr tasks ls 2>/dev/null | awk -v id="$id" '$1 == id {print $2}')"
    printf '  %-12s %-10s %-10s %-12s %s\n' "$name" app "${kinds[$name]}" "$(cgroup_cpus "$pid")" \
      "$(k -n "$ns" exec "$name" -- cat /proc/self/status | sed -n 's/^Cpus_allowed_list:[[:space:]]*//p')"
  done
}

pod shared 500m
kinds[shared]=shared
table "a shared pod (requests.cpu: 500m): every CPU"
pod exclusive "" claim
kinds[exclusive]=exclusive
table "an exclusive pod (a claim of one CPU): the shared pod leaves its CPU"
k -n "$ns" delete pod exclusive --wait=true >/dev/null
unset 'kinds[exclusive]'
pod mixed 250m claim
kinds[mixed]=mixed
table "the exclusive pod deleted, a mixed pod (claim + requests.cpu: 250m): its CPU and the shared pool"
k -n "$ns" delete pod mixed --wait=true >/dev/null
unset 'kinds[mixed]'
pod later 100m
kinds[later]=shared
table "the mixed pod deleted: every shared pod back on every CPU"
echo
echo "cluster-demo: Kubernetes $(k version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1) with the driver installed by helm; taking the node down"
