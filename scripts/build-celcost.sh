#!/usr/bin/env bash
# Build celcost (tests/tools/celcost), which prints the API server's own estimated CEL cost of
# every x-kubernetes-validations rule in CRDs against its limits (or, with --policy, the runtime
# cost of the tenancy ValidatingAdmissionPolicy on synthetic shard writes), and print the
# binary's path:
#
#   "$(scripts/build-celcost.sh)" crds/portalloc-crds.yaml
#   "$(scripts/build-celcost.sh)" --policy rbac/portalloc-tenancy-policy.yaml
#
# It is built once and cached under $PORTALLOC_CACHE_DIR (default ~/.cache/kubectl-portalloc),
# keyed by its k8s.io/apiextensions-apiserver pin and a hash of its module's go.mod, go.sum and
# Go sources, so a build is redone exactly when the pin or the code changes. Runs at once build
# under a lock: one builds, the others reuse it.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
module=$repo/tests/tools/celcost
tools_cache=$cache_dir/test-tools

log() { echo "build-celcost: $*" >&2; }
die() { log "error: $*"; exit 1; }

module_sum() {
  (cd "$1" && shopt -s nullglob && cat go.mod go.sum ./*.go) | sha256sum | cut -c1-12
}
pinned() { awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2}' "$1/go.mod"; }

version=$(pinned "$module" k8s.io/apiextensions-apiserver)
[[ -n $version ]] || die "no k8s.io/apiextensions-apiserver version in $module/go.mod"
dir=$tools_cache/celcost-apiextensions-apiserver-$version-$(module_sum "$module")

if ! [[ -x $dir/celcost ]]; then
  command -v go >/dev/null || die "Go is needed to build celcost (https://go.dev/doc/install)"
  mkdir -p "$tools_cache"
  exec 9>"$tools_cache/.celcost.lock"
  flock 9
  if ! [[ -x $dir/celcost ]]; then # another run may have built it while we waited
    # Build into a fresh directory and move it into place whole, so a killed build never
    # leaves a half-filled cache entry behind.
    tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    chmod 755 "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    log "building celcost from $module (once; cached in $dir)"
    (cd "$module" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/celcost" .) >&2
    rm -rf "$dir"
    mv -T "$tmp" "$dir"
    trap - EXIT
  fi
  exec 9>&-
fi
echo "$dir/celcost"
