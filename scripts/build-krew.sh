#!/usr/bin/env bash
# Build the tools that check the krew packaging from Go modules, and print the directory holding
# them (put it on PATH):
#
#   krew                     sigs.k8s.io/krew/cmd/krew                    (tests/controlplane/krew)
#   validate-krew-manifest   sigs.k8s.io/krew/cmd/validate-krew-manifest  (tests/controlplane/krew)
#   kubectl                  k8s.io/kubernetes/cmd/kubectl      (tests/controlplane/kube-apiserver)
#
# kubectl comes from the Kubernetes module already pinned for the local control plane, so checking
# the plugin through kubectl needs no kubectl on the machine; only if that build fails is a kubectl
# on PATH used instead, with a warning. Builds are cached under $PORTALLOC_CACHE_DIR (default
# ~/.cache/kubectl-portalloc), each keyed by a hash of its wrapper module's go.mod and go.sum, so
# they are redone exactly when a pin changes.
#
#   scripts/build-krew.sh --no-kubectl   only krew and validate-krew-manifest (the release workflow,
#                                        which needs no kubectl, skips the long Kubernetes build)
set -euo pipefail

with_kubectl=1
case ${1:-} in
  '') ;;
  --no-kubectl) with_kubectl=0 ;;
  *) echo "build-krew: unknown argument: $1" >&2; exit 1 ;;
esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
krew_module=$repo/tests/controlplane/krew
kas_module=$repo/tests/controlplane/kube-apiserver

log() { echo "build-krew: $*" >&2; }
die() { log "error: $*"; exit 1; }

module_sum() { cat "$1/go.mod" "$1/go.sum" | sha256sum | cut -c1-12; }
krew=$(awk '$1 == "sigs.k8s.io/krew" && $2 ~ /^v/ {print $2}' "$krew_module/go.mod")
k8s=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$kas_module/go.mod")
[[ -n $krew ]] || die "no sigs.k8s.io/krew version in $krew_module/go.mod"
[[ -n $k8s ]] || die "no k8s.io/kubernetes version in $kas_module/go.mod"
krew_dir=$cache_dir/krew/krew-$krew-$(module_sum "$krew_module")
kubectl_dir=$cache_dir/kubectl/kubectl-$k8s-$(module_sum "$kas_module")
bin_dir=$cache_dir/krew/bin-$(basename "$krew_dir")-$(basename "$kubectl_dir")

need_go() { command -v go >/dev/null || die "Go is needed to build krew and kubectl (https://go.dev/doc/install)"; }

# Build into a fresh directory and move it into place whole, so a killed or concurrent build never
# leaves a half-filled cache entry behind.
tmp=''
trap '[[ -z $tmp ]] || rm -rf "$tmp"' EXIT
publish() {
  mkdir -p "$(dirname "$1")"
  [[ -e $1 ]] || mv -T "$tmp" "$1" 2>/dev/null || [[ -e $1 ]] || die "cannot move the build to $1"
  rm -rf "$tmp"
  tmp=''
}

if ! [[ -x $krew_dir/krew && -x $krew_dir/validate-krew-manifest ]]; then
  need_go
  mkdir -p "$(dirname "$krew_dir")"
  tmp=$(mktemp -d "$krew_dir.tmp.XXXXXX")
  log "building krew and validate-krew-manifest $krew from their Go module (once; cached in $krew_dir)"
  (cd "$krew_module" && go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/krew/internal/version.gitTag=$krew" \
    -o "$tmp/" sigs.k8s.io/krew/cmd/krew sigs.k8s.io/krew/cmd/validate-krew-manifest) >&2
  publish "$krew_dir"
fi

kubectl=$kubectl_dir/kubectl
if ((with_kubectl)) && ! [[ -x $kubectl ]]; then
  need_go
  mkdir -p "$(dirname "$kubectl_dir")"
  tmp=$(mktemp -d "$kubectl_dir.tmp.XXXXXX")
  log "building kubectl $k8s from the pinned Kubernetes module (once; cached in $kubectl_dir)"
  # The version stamping scripts/local-cluster.sh gives kube-apiserver, in both packages kubectl
  # reads its version from.
  minor=$(echo "$k8s" | cut -d. -f2)
  flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  if (cd "$kas_module" && go build -trimpath -ldflags "$flags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl) >&2; then
    publish "$kubectl_dir"
  else
    kubectl=$(command -v kubectl) || die "building kubectl failed and there is no kubectl on PATH"
    log "WARNING: building kubectl failed; using $kubectl from PATH instead (not cached)"
  fi
fi

if ! ((with_kubectl)); then
  echo "$krew_dir"
  exit 0
fi
mkdir -p "$bin_dir"
for tool in "$krew_dir/krew" "$krew_dir/validate-krew-manifest" "$kubectl"; do
  ln -sfn "$tool" "$bin_dir/$(basename "$tool")"
done
echo "$bin_dir"
