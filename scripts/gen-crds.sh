#!/usr/bin/env bash
# Regenerate crds/ from the Rust types in src/api, and the Helm chart's copy of it. A unit test
# fails while crds/ and the types differ, an e2e test while the chart's copy differs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --quiet --bin kubectl-portalloc -- install --dry-run >crds/portalloc-crds.yaml.tmp
mv crds/portalloc-crds.yaml.tmp crds/portalloc-crds.yaml
cp crds/portalloc-crds.yaml charts/kubectl-portalloc/crds/portalloc-crds.yaml
echo "wrote crds/portalloc-crds.yaml and charts/kubectl-portalloc/crds/portalloc-crds.yaml"
