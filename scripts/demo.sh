#!/usr/bin/env bash
# The main job, end to end: use the configured cluster, or bring up the local control plane
# (kube-apiserver + etcd built from Go modules) when none answers; install the CRDs; create a pool
# and an SGLang prefill/decode PortAllocation; print what was allocated.
#
#   scripts/demo.sh          stop the local control plane afterwards (if this script started it)
#   scripts/demo.sh --keep   leave it running and print how to use it
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

keep=false
[[ ${1:-} == --keep ]] && keep=true

echo "== building kubectl-portalloc"
cargo build --quiet --locked
bin=$PWD/target/debug/kubectl-portalloc

started_here=false
if "$bin" get -A --request-timeout 5s >/dev/null 2>&1 || [[ $? == 8 ]]; then
  echo "== using the cluster of the current kubeconfig ($(kubectl config current-context 2>/dev/null || echo "\$KUBECONFIG"))"
else
  echo "== no cluster answers: starting the local control plane (the first run builds it, several minutes)"
  export PORTALLOC_CLUSTER_DIR=${PORTALLOC_CLUSTER_DIR:-$PWD/.local-cluster}
  KUBECONFIG=$(scripts/local-cluster.sh up | tail -n 1)
  export KUBECONFIG
  started_here=true
fi
cleanup() {
  if $started_here && ! $keep; then
    scripts/local-cluster.sh down
  fi
}
trap cleanup EXIT

run() {
  echo
  echo "\$ kubectl portalloc $*"
  "$bin" "$@"
}

run install
run create -f examples/quickstart.yaml
run get -o wide
run resolve sglang-pd --role decode --pod sglang-pd-decode-1
run pool describe quickstart
echo
echo "== re-running is idempotent: every pod keeps its port"
run create -f examples/quickstart.yaml

if $started_here && $keep; then
  echo
  echo "The local control plane keeps running. Use it with:"
  echo "  export KUBECONFIG=$KUBECONFIG"
  echo "and stop it with: scripts/local-cluster.sh down"
fi
