#!/usr/bin/env bash
# Build actionlint (github.com/rhysd/actionlint/cmd/actionlint, pinned in tests/tools/actionlint)
# from the Go module proxy and print the path of the binary. It checks .github/workflows/*.yml:
#
#   "$(scripts/build-actionlint.sh)" -color .github/workflows/*.yml
#
# With shellcheck on PATH (Debian's shellcheck; scripts/install-deps.sh installs it), actionlint
# also lints every `run:` script. The build is cached under $PORTALLOC_CACHE_DIR (default
# ~/.cache/kubectl-portalloc), keyed by a hash of the wrapper module's go.mod and go.sum, so it is
# redone exactly when a pin changes.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
module=$repo/tests/tools/actionlint

log() { echo "build-actionlint: $*" >&2; }
die() { log "error: $*"; exit 1; }

version=$(awk '$1 == "github.com/rhysd/actionlint" && $2 ~ /^v/ {print $2}' "$module/go.mod")
[[ -n $version ]] || die "no github.com/rhysd/actionlint version in $module/go.mod"
sum=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-12)
dir=$cache_dir/actionlint/actionlint-$version-$sum

if ! [[ -x $dir/actionlint ]]; then
  command -v go >/dev/null || die "Go is needed to build actionlint (https://go.dev/doc/install)"
  mkdir -p "$(dirname "$dir")"
  # Built into a fresh directory and moved into place whole: a killed or concurrent build never
  # leaves a half-written entry behind.
  tmp=$(mktemp -d "$dir.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  log "building actionlint $version from its Go module (once; cached in $dir)"
  (cd "$module" && go build -trimpath \
    -ldflags "-s -w -X github.com/rhysd/actionlint.version=$version" \
    -o "$tmp/actionlint" github.com/rhysd/actionlint/cmd/actionlint) >&2
  [[ -e $dir ]] || mv -T "$tmp" "$dir" 2>/dev/null || [[ -e $dir ]] || die "cannot move the build to $dir"
fi
echo "$dir/actionlint"
