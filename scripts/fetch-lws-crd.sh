#!/usr/bin/env bash
# Print the path of LeaderWorkerSet's own CRD (sigs.k8s.io/lws, pinned below), taken from its Go
# module through the Go module proxy and checked against the pinned module hash, so the
# examples' LeaderWorkerSets are validated by LWS's real schema when the tests apply them.
# Cached under $PORTALLOC_CACHE_DIR (default ~/.cache/kubectl-portalloc), keyed by the version.
set -euo pipefail

version=v0.9.0
# go.sum's h1: hash of sigs.k8s.io/lws@v0.9.0: a module the proxy serves differently fails here.
sum='h1:DcJCgxjjoGOx//QHZkeKpyiblxYq70aCRZNYSfykWyI='
crd_in_module=config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml

cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
out=$cache_dir/lws-crd-$version.yaml
die() { echo "fetch-lws-crd: error: $*" >&2; exit 1; }

if [[ ! -s $out ]]; then
  command -v go >/dev/null || die "Go is needed to fetch the LeaderWorkerSet CRD (https://go.dev/doc/install)"
  mkdir -p "$cache_dir"
  info=$(cd "$cache_dir" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "sigs.k8s.io/lws@$version") ||
    die "go mod download sigs.k8s.io/lws@$version failed: $info"
  got=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  [[ $got == "$sum" ]] || die "sigs.k8s.io/lws@$version has hash ${got:-none}, expected $sum"
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
  [[ -f $dir/$crd_in_module ]] || die "$crd_in_module is not in sigs.k8s.io/lws@$version"
  cp "$dir/$crd_in_module" "$out.tmp.$$"
  mv -f "$out.tmp.$$" "$out"
fi
echo "$out"
