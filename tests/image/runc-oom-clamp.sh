#!/usr/bin/env bash
# containerd's runc for the real node's tests (tests/image/kubelet_node.rs). kubelet asks for a
# negative oom_score_adj (-998 for sandboxes, -997 for Guaranteed pods); lowering it needs
# CAP_SYS_RESOURCE, which this machine's sandbox does not grant even to root, so runc fails with
# EPERM and no pod starts. Raise a negative oomScoreAdj in the bundle's config.json to 0, then
# run the real runc with the same arguments.
set -euo pipefail
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == --bundle || ${args[i]} == -b ]]; then
    python3 - "${args[i + 1]}/config.json" <<'PY'
import json
import sys

path = sys.argv[1]
config = json.load(open(path))
process = config.get("process", {})
if process.get("oomScoreAdj", 0) < 0:
    process["oomScoreAdj"] = 0
    json.dump(config, open(path, "w"))
PY
  fi
done
exec runc "$@"
