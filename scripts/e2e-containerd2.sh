#!/usr/bin/env bash
# Runs the end-to-end scenarios again on containerd 2.x: Debian sid's
# `containerd` package, found through an apt source derived from this
# machine's own Debian entry exactly as scripts/install-deps.sh derives the
# trixie one (suite changed, no mirror host written anywhere).
#
# The package is not installed on the host: the node keeps containerd 1.7
# for everything else. Its binaries are unpacked into a cache directory and
# bound over /usr/bin/containerd, ctr and containerd-shim-runc-v2 inside a
# private mount namespace that only this test run sees. The host's runc
# (bookworm) runs the containers, as it does for containerd 1.7.
#
# When sid or its package cannot be had, says why and exits 0 (the 1.7 run
# is the one that must pass everywhere); when the scenarios fail, exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "e2e-containerd2: must run as root" >&2; exit 1; }
trixie_source=/etc/apt/sources.list.d/dra-cpu-trixie.sources
cache="${DRA_CPU_CONTAINERD2_CACHE:-/var/cache/dra-cpu/containerd2}"
log="$cache/apt.log"
mkdir -p "$cache/apt/lists/partial" "$cache/apt/parts" "$cache/apt/cache/archives/partial"
: >"$log"

skip() {
  echo "e2e-containerd2: SKIPPED, containerd 2.x cannot run here: $*" >&2
  [ -s "$log" ] && tail -n 20 "$log" >&2
  exit 0
}

[ -f "$trixie_source" ] || scripts/install-deps.sh
[ -f "$trixie_source" ] || skip "no $trixie_source to derive the sid entry from (scripts/install-deps.sh did not write it)"
sed -e 's/^Suites: trixie$/Suites: sid/' -e 's/^# Debian trixie.*/# Debian sid, for the containerd 2.x test run only./' \
  "$trixie_source" >"$cache/apt/parts/sid.sources"
apt_options=(
  -o Dir::Etc::SourceList=/dev/null
  -o "Dir::Etc::SourceParts=$cache/apt/parts"
  -o "Dir::State::Lists=$cache/apt/lists"
  -o "Dir::Cache=$cache/apt/cache"
  -o APT::Sandbox::User=root
)
apt-get -q "${apt_options[@]}" update >>"$log" 2>&1 || skip "apt-get update of Debian sid failed"
# dpkg's status may change under apt-cache while another install runs: retry.
version=""
for attempt in 1 2 3 4 5; do
  version="$(apt-cache "${apt_options[@]}" policy containerd 2>>"$log" | awk '/Candidate:/ {print $2}')" || true
  [ -n "$version" ] && break
  sleep 2
done
case "$version" in
  2.*) ;;
  *) skip "Debian sid offers containerd '$version', not 2.x" ;;
esac
root="$cache/containerd-$version"
if [ ! -x "$root/usr/bin/containerd" ]; then
  (cd "$cache" && apt-get -q "${apt_options[@]}" download "containerd=$version") >>"$log" 2>&1 ||
    skip "downloading containerd $version from sid failed"
  deb="$(ls "$cache"/containerd_*"$(echo "$version" | sed 's/:/%3a/')"*.deb 2>/dev/null | head -n 1)"
  [ -n "$deb" ] || skip "the downloaded containerd $version package is not in $cache"
  rm -rf "$root.new" && mkdir -p "$root.new" && dpkg-deb -x "$deb" "$root.new" && mv "$root.new" "$root"
fi
"$root/usr/bin/containerd" --version >>"$log" 2>&1 ||
  skip "containerd $version does not start on this system (see the log)"
echo "e2e-containerd2: running the end-to-end scenarios on $("$root/usr/bin/containerd" --version)"

cargo build --quiet -p dra-plugin -p nri-plugin
tests=()
for file in tests/tests/e2e_*.rs; do
  name="$(basename "$file" .rs)"
  tests+=(--test "$name")
done
bin="$root/usr/bin"
exec unshare --mount --propagation private sh -ec '
  bin="$1"; shift
  for b in containerd ctr containerd-shim-runc-v2; do mount --bind "$bin/$b" "/usr/bin/$b"; done
  containerd --version
  exec cargo test -p dra-cpu-tests "$@"
' e2e-containerd2 "$bin" "${tests[@]}"
