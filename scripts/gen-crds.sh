#!/usr/bin/env bash
# Regenerate crds/ from the Rust types in src/api. A unit test fails while the two differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo run --quiet --bin kubectl-portalloc -- install --dry-run >crds/portalloc-crds.yaml.tmp
mv crds/portalloc-crds.yaml.tmp crds/portalloc-crds.yaml
echo "wrote crds/portalloc-crds.yaml"
