#!/usr/bin/env bash
# The CLI beside NodePort, as whole processes (issue 45, goal 4): 16 concurrent
# `kubectl portalloc create -f` of an 8-port PortAllocation against 16 concurrent
# `kubectl create service nodeport NAME --tcp=1:1,...,8:8`, taking turns, on a fresh local
# cluster (scripts/local-cluster.sh). Both sides hand out 128 ports per round, so the ratio of
# ports per second is theirs' wall time over ours'.
#
#   scripts/cli-beside-nodeport.sh [PAIRS]    default 10 pairs, after one warm-up pair
#
# Needs the release binary (cargo build --release) and kubectl on PATH. Prints each pair and
# the medians; leaves nothing running. The cluster's Service CIDR is a /24, so at most 14 pairs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pairs=${1:-10}
clients=16
if ((pairs > 14)); then
  echo "at most 14 pairs: the local cluster has 253 Service addresses" >&2
  exit 2
fi
plugin=$repo/target/release/kubectl-portalloc
[[ -x $plugin ]] || { echo "build it first: cargo build --release --locked" >&2; exit 2; }
command -v kubectl >/dev/null || { echo "kubectl is not on PATH" >&2; exit 2; }

work=$(mktemp -d)
export PORTALLOC_CLUSTER_DIR=$work/cluster
cleanup() {
  "$repo/scripts/local-cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
kubeconfig=$("$repo/scripts/local-cluster.sh" up | tail -1)
# A cache directory of its own, as a new user's would be.
export KUBECACHEDIR=$work/cache
"$plugin" --kubeconfig "$kubeconfig" install >/dev/null
for _ in $(seq 1 30); do
  "$plugin" --kubeconfig "$kubeconfig" pool create bench --range 40000-49999 >/dev/null 2>&1 && break
  sleep 1
done

allocation() { # round client
  local ports=""
  for p in $(seq 1 8); do ports+="    - {name: p$p, env: P${p}_PORT}"$'\n'; done
  printf 'apiVersion: portalloc.dev/v1alpha1\nkind: PortAllocation\nmetadata: {name: pa-%s-%s, namespace: default}\nspec:\n  pool: bench\n  roles:\n  - name: server\n    replicas: 1\n    ports:\n%s' "$1" "$2" "$ports"
}
for round in $(seq 0 "$pairs"); do
  for c in $(seq 1 $clients); do allocation "$round" "$c" >"$work/pa-$round-$c.yaml"; done
done

now() { date +%s.%N; }
ours() { # round: wall seconds of 16 concurrent creates
  local start; start=$(now)
  for c in $(seq 1 $clients); do
    "$plugin" --kubeconfig "$kubeconfig" create -f "$work/pa-$1-$c.yaml" >/dev/null 2>>"$work/ours.err" &
  done
  wait
  echo "$(now) - $start" | bc
}
theirs() { # round
  local start; start=$(now)
  for c in $(seq 1 $clients); do
    kubectl --kubeconfig "$kubeconfig" create service nodeport "svc-$1-$c" \
      --tcp=1:1,2:2,3:3,4:4,5:5,6:6,7:7,8:8 >/dev/null 2>>"$work/theirs.err" &
  done
  wait
  echo "$(now) - $start" | bc
}

ours 0 >/dev/null
theirs 0 >/dev/null
echo "pair  ours_s  nodeport_s  ours_ports_per_s_over_nodeport"
for round in $(seq 1 "$pairs"); do
  a=$(ours "$round")
  b=$(theirs "$round")
  printf '%4d  %6.3f  %10.3f  %5.2fx\n' "$round" "$a" "$b" "$(echo "$b / $a" | bc -l)"
  echo "$a $b" >>"$work/pairs"
done
failed=$(cat "$work/ours.err" "$work/theirs.err" | wc -l)
python3 - "$work/pairs" "$failed" <<'PY'
import statistics, sys
pairs = [tuple(map(float, line.split())) for line in open(sys.argv[1])]
ratios = sorted(b / a for a, b in pairs)
print(f"median: ours {statistics.median(a for a, _ in pairs):.3f} s, NodePort "
      f"{statistics.median(b for _, b in pairs):.3f} s; ratio median {statistics.median(ratios):.2f}x, "
      f"pairs {ratios[0]:.2f}-{ratios[-1]:.2f}x; {sys.argv[2]} error lines")
PY
