#!/usr/bin/env bash
# Generate argocd-cm.yaml, the argocd-cm form of the health checks, from the one source of truth:
# resource_customizations/<group>/<Kind>/health.lua (the layout of Argo CD's own directory).
#
#   integrations/argocd/gen-argocd-cm.sh            rewrite argocd-cm.yaml
#   integrations/argocd/gen-argocd-cm.sh --stdout   print it instead (tests compare the two)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$here/argocd-cm.yaml
[[ ${1:-} == --stdout ]] && out=/dev/stdout
[[ $# -le 1 && ${1:---stdout} == --stdout ]] || { echo "usage: $0 [--stdout]" >&2; exit 2; }

generate() {
  cat <<'HEAD'
# Generated from resource_customizations/ by gen-argocd-cm.sh: do not edit by hand.
# Argo CD health checks for the portalloc.dev kinds, as argocd-cm keys. Merge them into Argo CD's
# ConfigMap, e.g.: kubectl -n argocd patch configmap argocd-cm --patch-file argocd-cm.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: argocd-cm
  namespace: argocd
data:
HEAD
  local script group kind
  while IFS= read -r script; do
    kind=$(basename "$(dirname "$script")")
    group=$(basename "$(dirname "$(dirname "$script")")")
    # A literal block keeps every line but normalises the end to one newline: insist on that.
    if [[ -n $(tail -c1 "$script") || -z $(tail -c2 "$script" | head -c1) ]]; then
      echo "gen-argocd-cm: $script must end with exactly one newline" >&2
      exit 1
    fi
    echo "  resource.customizations.health.${group}_${kind}: |"
    sed -e 's/^/    /' -e 's/^    $//' "$script"
  done < <(find "$here/resource_customizations" -name health.lua | LC_ALL=C sort)
}

text=$(generate)
printf '%s\n' "$text" > "$out"
