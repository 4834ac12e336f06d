#!/usr/bin/env bash
# containerd 2.x for test runs, without installing it: Debian sid's
# `containerd` package, found through an apt source derived from this
# machine's own Debian entry exactly as scripts/install-deps.sh derives the
# trixie one (suite changed, no mirror host written anywhere), unpacked into
# a cache directory.
#
#   scripts/containerd2.sh fetch
#       prints the directory holding containerd, ctr and
#       containerd-shim-runc-v2 (downloads and unpacks them once); exits 3
#       with the reason on stderr when sid or its package cannot be had.
#   scripts/containerd2.sh run BIN_DIR COMMAND [ARG...]
#       runs COMMAND in a private mount namespace where BIN_DIR's binaries
#       are bound over /usr/bin's, so only COMMAND sees containerd 2.x.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "containerd2: must run as root" >&2; exit 1; }

fetch() {
  local trixie_source=/etc/apt/sources.list.d/dra-cpu-trixie.sources
  local cache="${DRA_CPU_CONTAINERD2_CACHE:-/var/cache/dra-cpu/containerd2}"
  local log="$cache/apt.log"
  mkdir -p "$cache/apt/lists/partial" "$cache/apt/parts" "$cache/apt/cache/archives/partial"
  : >"$log"
  unavailable() {
    echo "containerd2: containerd 2.x cannot be had here: $*" >&2
    [ -s "$log" ] && tail -n 20 "$log" >&2
    exit 3
  }
  [ -f "$trixie_source" ] || scripts/install-deps.sh >&2
  [ -f "$trixie_source" ] || unavailable "no $trixie_source to derive the sid entry from (scripts/install-deps.sh did not write it)"
  sed -e 's/^Suites: trixie$/Suites: sid/' -e 's/^# Debian trixie.*/# Debian sid, for the containerd 2.x test run only./' \
    "$trixie_source" >"$cache/apt/parts/sid.sources"
  local apt_options=(
    -o Dir::Etc::SourceList=/dev/null
    -o "Dir::Etc::SourceParts=$cache/apt/parts"
    -o "Dir::State::Lists=$cache/apt/lists"
    -o "Dir::Cache=$cache/apt/cache"
    -o APT::Sandbox::User=root
  )
  apt-get -q "${apt_options[@]}" update >>"$log" 2>&1 || unavailable "apt-get update of Debian sid failed"
  # dpkg's status may change under apt-cache while another install runs: retry.
  local version="" attempt
  for attempt in 1 2 3 4 5; do
    version="$(apt-cache "${apt_options[@]}" policy containerd 2>>"$log" | awk '/Candidate:/ {print $2}')" || true
    [ -n "$version" ] && break
    sleep 2
  done
  case "$version" in
    2.*) ;;
    *) unavailable "Debian sid offers containerd '$version', not 2.x" ;;
  esac
  local root="$cache/containerd-$version"
  if [ ! -x "$root/usr/bin/containerd" ]; then
    (cd "$cache" && apt-get -q "${apt_options[@]}" download "containerd=$version") >>"$log" 2>&1 ||
      unavailable "downloading containerd $version from sid failed"
    local deb
    deb="$(ls "$cache"/containerd_*"$(echo "$version" | sed 's/:/%3a/')"*.deb 2>/dev/null | head -n 1)"
    [ -n "$deb" ] || unavailable "the downloaded containerd $version package is not in $cache"
    rm -rf "$root.new" && mkdir -p "$root.new" && dpkg-deb -x "$deb" "$root.new" && mv "$root.new" "$root"
  fi
  "$root/usr/bin/containerd" --version >>"$log" 2>&1 ||
    unavailable "containerd $version does not start on this system (see the log)"
  echo "$root/usr/bin"
}

case "${1:-}" in
  fetch) fetch ;;
  run)
    [ $# -ge 3 ] || { echo "usage: scripts/containerd2.sh run BIN_DIR COMMAND [ARG...]" >&2; exit 2; }
    bin="$2"
    shift 2
    for b in containerd ctr containerd-shim-runc-v2; do
      [ -x "$bin/$b" ] || { echo "containerd2: no $bin/$b" >&2; exit 1; }
    done
    exec unshare --mount --propagation private sh -ec '
      bin="$1"; shift
      for b in containerd ctr containerd-shim-runc-v2; do mount --bind "$bin/$b" "/usr/bin/$b"; done
      containerd --version
      exec "$@"
    ' containerd2 "$bin" "$@"
    ;;
  *) echo "usage: scripts/containerd2.sh fetch | run BIN_DIR COMMAND [ARG...]" >&2; exit 2 ;;
esac
