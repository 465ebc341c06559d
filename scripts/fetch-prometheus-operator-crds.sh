#!/usr/bin/env bash
# Print the path of a directory holding the Prometheus Operator's own CRDs for ServiceMonitor
# and PrometheusRule (github.com/prometheus-operator/prometheus-operator, pinned below), taken from
# its Go module through the Go module proxy and checked against the pinned module hash, so the
# chart's monitoring objects are validated by their real schemas when the tests dry-run them.
# Cached under $PORTALLOC_CACHE_DIR (default ~/.cache/kubectl-portalloc), keyed by the version.
set -euo pipefail

# v0.85.0: the newest version of the operator's root module the Go module proxy serves.
version=v0.85.0
# go.sum's h1: hash of the module: a module the proxy serves differently fails here.
sum='h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s='
in_module=example/prometheus-operator-crd
crds=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml)

cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
out=$cache_dir/prometheus-operator-crds-$version
die() { echo "fetch-prometheus-operator-crds: error: $*" >&2; exit 1; }

if [[ ! -d $out ]]; then
  command -v go >/dev/null || die "Go is needed to fetch the Prometheus Operator CRDs (https://go.dev/doc/install)"
  mkdir -p "$cache_dir"
  module=github.com/prometheus-operator/prometheus-operator@$version
  info=$(cd "$cache_dir" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "$module") ||
    die "go mod download $module failed: $info"
  got=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  [[ $got == "$sum" ]] || die "$module has hash ${got:-none}, expected $sum"
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
  tmp=$(mktemp -d "$out.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  for crd in "${crds[@]}"; do
    [[ -f $dir/$in_module/$crd ]] || die "$in_module/$crd is not in $module"
    cp "$dir/$in_module/$crd" "$tmp/"
  done
  mv -T "$tmp" "$out" 2>/dev/null || [[ -d $out ]] || die "cannot move the CRDs to $out"
fi
echo "$out"
