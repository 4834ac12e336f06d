#!/usr/bin/env bash
# The performance table: builds dra-plugin, nri-plugin and perf-table in
# release mode, then measures every row against its baseline in one run and
# prints the table (Markdown). Extra arguments go to perf-table:
#   --quick             few samples, to check that every row runs
#   --skip-containerd   rows 4 and 5 (real containerd) reported as not measured
#   --only GROUPS       measure only these groups of rows, comma-separated:
#                       dra, alloc, nri, containerd
#   --out FILE          also write the table to FILE
# Rows 4 and 5 start a private containerd, so they need root as the
# end-to-end tests do (scripts/install-deps.sh installs containerd). Row 4b
# needs Go and the module proxy: the Go reference plugin
# (tests/perf/go-reference/main.go) is built with the NRI module Debian's
# containerd 1.7 was built with (its Built-Using). Rows 4c, 4d and 5c are
# the same on containerd $CONTAINERD_LATEST (tests/real-node/pins.env), built
# from the Go module proxy by scripts/build-components.sh (cached), with the
# Go reference plugin built with the NRI module that release requires; rows
# are reported as not measured when what they need cannot be had.
set -euo pipefail
case "${1:-}" in
  -h | --help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
cargo build --release -p dra-plugin -p nri-plugin -p dra-cpu-perf --bin dra-plugin --bin nri-plugin --bin perf-table
target="${CARGO_TARGET_DIR:-$PWD/target}/release"
export DRA_PLUGIN_BIN="$target/dra-plugin"
export NRI_PLUGIN_BIN="$target/nri-plugin"
want_containerd=1
case " $* " in *" --skip-containerd "*) want_containerd=0 ;; esac
case " $* " in *" --only "*) case " $* " in *containerd*) ;; *) want_containerd=0 ;; esac ;; esac

# The Go reference plugin for containerd "$1", built from the Go module
# proxy with NRI module version "$2" (empty: none known), its path exported
# as "$3"; row "$4" is reported as not measured when it cannot be had.
reference_for() {
  local runtime="$1" nri="$2" var="$3" row="$4" dir="$target/../tmp/go-reference-containerd-$1"
  if [ -z "$nri" ]; then
    echo "no NRI version known for containerd $runtime: row $row will not be measured" >&2
    return 0
  fi
  rm -rf "$dir" && mkdir -p "$dir"
  cp tests/perf/go-reference/main.go "$dir/"
  if (
    cd "$dir"
    export GOTOOLCHAIN=auto GOFLAGS=-mod=mod
    printf 'module dra-cpu.local/nri-go-reference\n\ngo 1.24\n' >go.mod
    go get "github.com/containerd/nri@$nri" && go build -o nri-go-reference .
  ) >"$dir.log" 2>&1; then
    export "$var=$dir/nri-go-reference"
    echo "containerd $runtime: Go reference plugin built with NRI $nri" >&2
  else
    echo "the Go reference plugin for containerd $runtime (NRI $nri) did not build (see $dir.log): row $row will not be measured" >&2
  fi
}

if [ "$want_containerd" = 1 ] && ! command -v go >/dev/null; then
  echo "no Go toolchain: rows 4b, 4c, 4d and 5c will not be measured" >&2
elif [ "$want_containerd" = 1 ]; then
  # Debian's containerd 1.7 names the NRI it was built with in Built-Using.
  nri="$(dpkg-query -W -f='${Built-Using}' containerd 2>/dev/null | tr ',' '\n' |
    sed -n 's/^ *golang-github-containerd-nri (= \([0-9.]*\)-.*/v\1/p')"
  reference_for 1.7 "$nri" NRI_GO_REFERENCE_BIN 4b
  # shellcheck source=../tests/real-node/pins.env
  . tests/real-node/pins.env
  if ctd_dir="$(scripts/build-components.sh containerd | tail -n 1)" && [ -x "$ctd_dir/containerd" ]; then
    export DRA_CPU_CONTAINERD2_DIR="$ctd_dir" DRA_CPU_CONTAINERD2_VERSION="$CONTAINERD_LATEST"
    # The NRI module containerd $CONTAINERD_LATEST requires, from its go.mod.
    ctd_mod="$(GOTOOLCHAIN=auto GOFLAGS=-mod=mod go mod download -json "github.com/containerd/containerd/v2@v$CONTAINERD_LATEST" |
      sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')" || true
    nri="$(awk '$1 == "github.com/containerd/nri" {print $2; exit}' "$ctd_mod" 2>/dev/null || true)"
    reference_for "$CONTAINERD_LATEST" "$nri" NRI_GO_REFERENCE2_BIN 4d
  else
    echo "containerd $CONTAINERD_LATEST could not be built: rows 4c, 4d and 5c will not be measured" >&2
  fi
fi
exec "$target/perf-table" "$@"
