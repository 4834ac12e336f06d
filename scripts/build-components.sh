#!/usr/bin/env bash
# Builds the real node's components from the Go module proxy into a cache keyed
# by version, so that the demo, the tests and the benchmarks share one build
# and a rebuild happens only when a pin in tests/real-node/pins.env changes:
#   kubernetes-V/   kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
#   containerd-V/   containerd containerd-shim-runc-v2 ctr
#   runc-V/         runc (cgo, libseccomp, tag seccomp)
#   cni-plugins-V/  bridge host-local loopback
#   etcd-V/         etcd
#
# Usage: scripts/build-components.sh [latest|oldest|all]   (default: latest)
#        scripts/build-components.sh containerd   (containerd-$CONTAINERD_LATEST
#                                     only: the performance table's 2.x rows)
#        scripts/build-components.sh pair KUBERNETES CONTAINERD   (any versions;
#                                     the matrix of scripts/real-node-matrix.sh)
#        scripts/build-components.sh --print-dir NAME-VERSION
# The cache is $DRA_CPU_COMPONENTS (default /var/cache/dra-cpu/components); Go's
# own module and build caches make a rebuild after a pin change quick. A cold
# build of one Kubernetes release on 2 cores takes about 20-30 minutes; progress
# is printed per component.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
# shellcheck source=../tests/real-node/pins.env
. tests/real-node/pins.env

cache="${DRA_CPU_COMPONENTS:-/var/cache/dra-cpu/components}"
# auto: a Go older than a module needs fetches the toolchain it names from the
# module proxy; the Go on this kind of machine is new enough and is used as is.
export GOTOOLCHAIN=auto GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "build-components: go not found (Go 1.26 is needed)" >&2; exit 1; }

log() { echo "build-components: $*" >&2; }

# Runs the build function "$2" for cache entry "$1" unless its stamp exists;
# builds into a temporary directory and renames it into place, so an
# interrupted build never leaves a half entry.
build_entry() {
  local entry="$1" fn="$2" dir="$cache/$1" tmp start
  if [ -f "$dir/.complete" ]; then
    log "$entry: cached in $dir"
    return 0
  fi
  mkdir -p "$cache"
  tmp="$(mktemp -d "$cache/.$entry.XXXXXX")"
  chmod 0755 "$tmp"
  start=$SECONDS
  log "$entry: building (cold builds take minutes; output in $tmp/build.log)"
  if ! "$fn" "$tmp" "${entry##*-}" >"$tmp/build.log" 2>&1; then
    log "$entry: FAILED; last lines of $tmp/build.log:"
    tail -n 40 "$tmp/build.log" >&2
    return 1
  fi
  date -u +%FT%TZ >"$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  log "$entry: built in $((SECONDS - start)) s"
}

# A throwaway module that requires "$2" (path@version), in "$1".
module_dir() {
  local dir="$1/src"
  mkdir -p "$dir"
  printf 'module dra-cpu.local/components\n\ngo 1.24\n' >"$dir/go.mod"
  echo "$dir"
}

build_kubernetes() {
  local out="$1" version="$2" dir minor kk
  dir="$(module_dir "$out")"
  minor="${version#*.}"; minor="${minor%%.*}"
  (
    cd "$dir"
    go mod download -json "k8s.io/kubernetes@v$version" >kk.json
    kk="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' kk.json)"
    [ -n "$kk" ] || { echo "no module directory for k8s.io/kubernetes@v$version"; exit 1; }
    # k/k replaces its staging modules with ./staging/...; a dependent must
    # replace each with its published version (v0.MINOR.PATCH).
    {
      echo "require k8s.io/kubernetes v$version"
      echo "replace ("
      sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\t\1 => \1 v0.'"${version#*.}"'#p' "$kk/go.mod"
      echo ")"
    } >>go.mod
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=v$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    go get "k8s.io/kubernetes@v$version"
    # As k/k builds them: the control plane and kubectl without cgo, kubelet with.
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
    CGO_ENABLED=1 go build -trimpath -ldflags "$ldflags" -o "$out/" k8s.io/kubernetes/cmd/kubelet
  )
  rm -rf "$dir"
}

# Builds the packages "$@" of module "$3" (path@version) into directory "$1",
# as the file "$2" when one package is given a name ("" keeps Go's names),
# with cgo "$4" (0 or 1), build tags "$5" and link flags "$6", from a
# throwaway module that requires it.
build_from_module() {
  local out="$1" name="$2" module="$3" cgo="$4" tags="$5" ldflags="$6" dir
  shift 6
  dir="$(module_dir "$out")"
  (
    cd "$dir"
    go get "$module"
    CGO_ENABLED="$cgo" go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$out/$name" "$@"
  )
  rm -rf "$dir"
}

build_containerd() {
  local x=github.com/containerd/containerd/v2
  build_from_module "$1" "" "$x@v$2" 1 no_btrfs \
    "-X $x/version.Version=v$2 -X $x/version.Revision=module -X $x/version.Package=$x" \
    "$x/cmd/containerd" "$x/cmd/containerd-shim-runc-v2" "$x/cmd/ctr"
}

build_runc() {
  build_from_module "$1" runc "github.com/opencontainers/runc@v$2" 1 seccomp \
    "-X main.version=$2 -X main.gitCommit=module" github.com/opencontainers/runc
}

build_cni_plugins() {
  local x=github.com/containernetworking/plugins/plugins
  build_from_module "$1" "" "github.com/containernetworking/plugins@v$2" 0 "" "" \
    "$x/main/bridge" "$x/main/loopback" "$x/ipam/host-local"
}

build_etcd() {
  # Named: Go would call it after the path's last element, v3.
  build_from_module "$1" etcd "go.etcd.io/etcd/server/v3@v$2" 0 "" "" go.etcd.io/etcd/server/v3
}

need_libseccomp() {
  if ! [ -f /usr/include/seccomp.h ]; then
    log "installing libseccomp-dev and pkg-config (runc's seccomp support)"
    DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends install libseccomp-dev pkg-config >/dev/null ||
      { apt-get -q update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends install libseccomp-dev pkg-config >/dev/null; }
  fi
}

if [ "${1:-}" = "--print-dir" ]; then
  echo "$cache/$2"
  exit 0
fi
if [ "${1:-}" = "containerd" ]; then
  build_entry "containerd-$CONTAINERD_LATEST" build_containerd
  echo "$cache/containerd-$CONTAINERD_LATEST"
  exit 0
fi

which="${1:-latest}"
pairs=()
case "$which" in
  latest) pairs=("$KUBERNETES_LATEST $CONTAINERD_LATEST") ;;
  oldest) pairs=("$KUBERNETES_OLDEST $CONTAINERD_OLDEST") ;;
  all) pairs=("$KUBERNETES_LATEST $CONTAINERD_LATEST" "$KUBERNETES_OLDEST $CONTAINERD_OLDEST") ;;
  pair)
    [ $# -eq 3 ] && [[ "$2" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] && [[ "$3" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
      { echo "usage: $0 pair KUBERNETES CONTAINERD (versions such as 1.36.3 2.3.7)" >&2; exit 2; }
    pairs=("$2 $3")
    ;;
  *) echo "usage: $0 [latest|oldest|all] | containerd | pair KUBERNETES CONTAINERD | --print-dir NAME-VERSION" >&2; exit 2 ;;
esac

need_libseccomp
build_entry "etcd-$ETCD" build_etcd
build_entry "cni-plugins-$CNI_PLUGINS" build_cni_plugins
build_entry "runc-$RUNC" build_runc
for pair in "${pairs[@]}"; do
  read -r k8s ctd <<<"$pair"
  build_entry "containerd-$ctd" build_containerd
  build_entry "kubernetes-$k8s" build_kubernetes
done
log "all components in $cache (repo $repo)"
