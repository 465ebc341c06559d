#!/usr/bin/env bash
# Build the Go programs that check how GitOps tools read our objects, and print the directory
# holding them (put it on PATH):
#
#   kstatus      kstatus status as Flux computes it  (tests/tools/kstatus, sigs.k8s.io/cli-utils)
#   argocd-lua   Argo CD health checks in Argo CD's Lua environment  (tests/tools/argocd-lua)
#   promtool     Prometheus's promtool: `check metrics` lints the text exposition format,
#                `test rules` unit-tests alerting and recording rules  (tests/tools/promtool,
#                github.com/prometheus/prometheus/cmd/promtool, built with -tags remove_all_sd,
#                which leaves out every service-discovery plugin)
#
# Each is cached under $PORTALLOC_CACHE_DIR (default ~/.cache/kubectl-portalloc), keyed by its pin
# and a hash of its module's go.mod, go.sum and Go sources (kstatus and argocd-lua have code of
# their own; promtool's is a wrapper module with none, built from the upstream package path), so a
# build is redone exactly when a pin or the code changes. Test binaries running at once build
# under a lock: one builds, the others reuse it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
tools=$repo/tests/tools
tools_cache=$cache_dir/test-tools

log() { echo "build-test-tools: $*" >&2; }
die() { log "error: $*"; exit 1; }

module_sum() {
  (cd "$1" && shopt -s nullglob && cat go.mod go.sum ./*.go) | sha256sum | cut -c1-12
}
pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2}' "$1/go.mod"; }

kstatus_version=$(pinned "$tools/kstatus" sigs.k8s.io/cli-utils)
lua_version=$(pinned "$tools/argocd-lua" github.com/yuin/gopher-lua)
prometheus_version=$(pinned "$tools/promtool" github.com/prometheus/prometheus)
[[ -n $kstatus_version ]] || die "no sigs.k8s.io/cli-utils version in $tools/kstatus/go.mod"
[[ -n $lua_version ]] || die "no github.com/yuin/gopher-lua version in $tools/argocd-lua/go.mod"
[[ -n $prometheus_version ]] ||
  die "no github.com/prometheus/prometheus version in $tools/promtool/go.mod"
kstatus_dir=$tools_cache/kstatus-cli-utils-$kstatus_version-$(module_sum "$tools/kstatus")
lua_dir=$tools_cache/argocd-lua-gopher-lua-$lua_version-$(module_sum "$tools/argocd-lua")
promtool_dir=$tools_cache/promtool-prometheus-$prometheus_version-$(module_sum "$tools/promtool")
bin_dir=$tools_cache/bin-$(basename "$kstatus_dir")-$(basename "$lua_dir")
bin_dir+=-$(basename "$promtool_dir")

built() { [[ -x $kstatus_dir/kstatus && -x $lua_dir/argocd-lua && -x $promtool_dir/promtool ]]; }

# Build into a fresh directory and move it into place whole, so a killed build never leaves a
# half-filled cache entry behind.
tmp=''
trap '[[ -z $tmp ]] || rm -rf "$tmp"' EXIT
build() { # name module_dir cache_entry [go build flags...] package
  local name=$1 module=$2 dir=$3
  shift 3
  [[ -x $dir/$name ]] && return
  tmp=$(mktemp -d "$dir.tmp.XXXXXX")
  log "building $name from $module (once; cached in $dir)"
  (cd "$module" && go build -mod=readonly -trimpath -o "$tmp/$name" "$@") >&2
  rm -rf "$dir"
  mv -T "$tmp" "$dir"
  tmp=''
}

if ! built; then
  command -v go >/dev/null || die "Go is needed to build the test tools (https://go.dev/doc/install)"
  mkdir -p "$tools_cache"
  exec 9>"$tools_cache/.build.lock"
  flock 9
  build kstatus "$tools/kstatus" "$kstatus_dir" -ldflags "-s -w" .
  build argocd-lua "$tools/argocd-lua" "$lua_dir" -ldflags "-s -w" .
  if ! [[ -x $promtool_dir/promtool ]]; then
    # `promtool --version` shows the release (3.x, from the module's VERSION file; the module's
    # own version is v0.3xx) as Prometheus's release builds set it.
    prometheus_src=$(cd "$tools/promtool" && go mod download github.com/prometheus/prometheus &&
      go list -mod=readonly -m -f '{{.Dir}}' github.com/prometheus/prometheus)
    [[ -f $prometheus_src/VERSION ]] || die "no VERSION file in github.com/prometheus/prometheus"
    release=$(<"$prometheus_src/VERSION")
    build promtool "$tools/promtool" "$promtool_dir" -tags remove_all_sd \
      -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
      github.com/prometheus/prometheus/cmd/promtool
  fi
  exec 9>&-
fi

# Each link is made beside its place and renamed over it, so concurrent runs never collide.
mkdir -p "$bin_dir"
for tool in "$kstatus_dir/kstatus" "$lua_dir/argocd-lua" "$promtool_dir/promtool"; do
  ln -sfn "$tool" "$bin_dir/.$(basename "$tool").$$"
  mv -fT "$bin_dir/.$(basename "$tool").$$" "$bin_dir/$(basename "$tool")"
done
echo "$bin_dir"
