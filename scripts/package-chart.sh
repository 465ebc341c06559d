#!/usr/bin/env bash
# Package the Helm chart for a release, versioned as the plugin:
#
#   dist/kubectl-portalloc-<version>.tgz     (helm package --version V --app-version V)
#
# and beside it <chart>.tgz.sha256 (sha256sum format). <version> is Cargo.toml's; the chart then
# runs the image v<version> by default. The chart is linted (--strict) first, and deploy/ must
# be its rendering (scripts/gen-deploy.sh), so a release never ships the two apart. The last
# line printed is the package's path.
#
#   scripts/package-chart.sh [--out DIR]     default DIR: dist/
#
# Helm comes from scripts/build-helm.sh (built from its Go module once, cached), or $HELM.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$repo/dist
case ${1:-} in
  '') ;;
  --out) out=${2:?--out needs a directory} ;;
  *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
esac
log() { echo "package-chart: $*" >&2; }
die() { log "error: $*"; exit 1; }

version=$(awk -F'"' '/^version *= *"/ {print $2; exit}' "$repo/Cargo.toml")
[[ -n $version ]] || die "no version in $repo/Cargo.toml"
helm=${HELM:-$("$repo/scripts/build-helm.sh")}
chart=$repo/charts/kubectl-portalloc

generated=$(mktemp -d)
trap 'rm -rf "$generated"' EXIT
HELM=$helm "$repo/scripts/gen-deploy.sh" --out "$generated"
for file in $(cd "$generated" && find . -type f | sort); do
  cmp -s "$generated/$file" "$repo/$file" ||
    die "${file#./} is not what the chart renders: run scripts/gen-deploy.sh and commit"
done

"$helm" lint --strict "$chart" >&2
mkdir -p "$out"
"$helm" package "$chart" --version "$version" --app-version "$version" --destination "$out" >&2
package=$(cd "$out" && pwd)/kubectl-portalloc-$version.tgz
[[ -f $package ]] || die "helm package wrote no $package"
if command -v sha256sum >/dev/null; then
  sum=$(sha256sum "$package" | cut -d' ' -f1)
else
  sum=$(shasum -a 256 "$package" | cut -d' ' -f1)
fi
echo "$sum  $(basename "$package")" >"$package.sha256"
log "$(basename "$package"): chart and app version $version, sha256 $sum"
echo "$package"
