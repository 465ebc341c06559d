#!/usr/bin/env bash
# Build Helm (helm.sh/helm/v4/cmd/helm, pinned in tests/tools/helm) from the Go module proxy and
# print the path of the binary. The chart's tests (tests/e2e/helm) and scripts/gen-deploy.sh use it:
#
#   "$(scripts/build-helm.sh)" lint --strict charts/kubectl-portalloc
#
# `helm version` reports the pinned release, as Helm's own release builds set it. The build is
# cached under $PORTALLOC_CACHE_DIR (default ~/.cache/kubectl-portalloc), keyed by the pin and a
# hash of the wrapper module's go.mod and go.sum, so it is redone exactly when a pin changes.
# Concurrent callers build once: the first holds a lock, the others wait and reuse its build.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
module=$repo/tests/tools/helm

log() { echo "build-helm: $*" >&2; }
die() { log "error: $*"; exit 1; }

version=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ {print $2}' "$module/go.mod")
[[ -n $version ]] || die "no helm.sh/helm/v4 version in $module/go.mod"
sum=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)
dir=$cache_dir/helm/helm-$version-$sum

if ! [[ -x $dir/helm ]]; then
  command -v go >/dev/null || die "Go is needed to build Helm (https://go.dev/doc/install)"
  mkdir -p "$(dirname "$dir")"
  exec 9>"$(dirname "$dir")/.build.lock"
  flock 9
  if ! [[ -x $dir/helm ]]; then
    # Built into a fresh directory and moved into place whole: a killed build never leaves a
    # half-written entry behind.
    tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    log "building Helm $version from its Go module (once; cached in $dir)"
    started=$SECONDS
    (cd "$module" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
      -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
      -o "$tmp/helm" helm.sh/helm/v4/cmd/helm) >&2
    "$tmp/helm" version --short >/dev/null || die "the Helm just built does not run"
    mv -T "$tmp" "$dir" || die "cannot move the build to $dir"
    log "built Helm $version in $((SECONDS - started)) s"
  fi
  exec 9>&-
fi
echo "$dir/helm"
