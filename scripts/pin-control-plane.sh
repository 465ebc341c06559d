#!/usr/bin/env bash
# Re-pin the local control plane to another Kubernetes release:
#
#   scripts/pin-control-plane.sh v1.36.3
#
# Rewrites tests/controlplane/kube-apiserver/go.mod: k8s.io/kubernetes at that version, and a
# replace line for every staging module that version's own go.mod maps to ./staging/src/...
# (a dependency's replace lines are ignored, so ours must map each to its published v0.X.Y).
# Pins etcd in tests/controlplane/etcd/go.mod to the version that release's
# build/dependencies.yaml names. The `tool` lines (kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, kubectl) are kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

version=${1:?usage: $0 vMAJOR.MINOR.PATCH (e.g. v1.36.3)}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a Kubernetes release: $version" >&2; exit 2; }
staging=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}

dir=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -d $dir ]] || { echo "go mod download k8s.io/kubernetes@$version gave no source directory" >&2; exit 1; }
etcd=v$(awk '/name: "etcd"/ {found = 1} found && /version:/ {print $2; exit}' "$dir/build/dependencies.yaml")

kas=tests/controlplane/kube-apiserver/go.mod
{
  echo "// Wrapper module that builds kube-apiserver from k8s.io/kubernetes for the local test control plane."
  echo "// k8s.io/kubernetes replaces its staging modules with local paths, which a dependent module ignores,"
  echo "// so each one is mapped here to its published v0.X.Y. Regenerate with scripts/pin-control-plane.sh."
  echo "module portalloc.dev/tests/controlplane/kube-apiserver"
  echo
  echo "go $(awk '$1 == "go" {print $2; exit}' "$dir/go.mod")"
  echo
  awk '$1 == "godebug" {print; print ""}' "$dir/go.mod"
  echo "tool ("
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	// kube-controller-manager, kube-proxy and kube-scheduler for the scheduling tests"
  echo "	// (scripts/local-cluster.sh build-controllers): pods made by real controllers, placed by the"
  echo "	// real scheduler, reached through a Service's cluster IP."
  echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
  echo "	k8s.io/kubernetes/cmd/kube-proxy"
  echo "	k8s.io/kubernetes/cmd/kube-scheduler"
  echo "	// kubectl for the krew install test (scripts/build-krew.sh), so it needs no kubectl on PATH."
  echo "	k8s.io/kubernetes/cmd/kubectl"
  echo "	// kubelet for the real node's tests (scripts/local-cluster.sh build-node): pods run by"
  echo "	// containerd and runc on this machine."
  echo "	k8s.io/kubernetes/cmd/kubelet"
  echo ")"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  grep '=> ./staging' "$dir/go.mod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} >"$kas.new"
mv "$kas.new" "$kas"
(cd tests/controlplane/kube-apiserver && GOFLAGS=-mod=mod go mod tidy)

(cd tests/controlplane/etcd && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$etcd" && GOFLAGS=-mod=mod go mod tidy)
sed -i "s|^// etcd v[0-9.]* is the version Kubernetes v[0-9.]* pins.*|// etcd $etcd is the version Kubernetes $version pins (its build/dependencies.yaml).|" tests/controlplane/etcd/go.mod

echo "pinned k8s.io/kubernetes $version (staging $staging) and etcd $etcd; the next local-cluster.sh up rebuilds them"
