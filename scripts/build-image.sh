#!/usr/bin/env bash
# Build the OCI image of kubectl-portalloc without a container daemon, with umoci and skopeo
# (Debian's packages; scripts/install-deps.sh installs them). It writes
#
#   <out>/kubectl-portalloc_v<version>_image_linux_<arch>/       an OCI image layout
#   <out>/kubectl-portalloc_v<version>_image_linux_<arch>.tar    the same as an oci-archive
#
# and prints the tarball's path last. Load it with e.g.
# `skopeo copy oci-archive:<tar> docker://REGISTRY/kubectl-portalloc:v<version>`.
#
# The image holds one file, /kubectl-portalloc: a statically linked binary (glibc with
# crt-static), so there is no libc, shell or CA bundle in it. It runs as UID/GID 65532 with the
# binary as entrypoint. In a cluster it needs no CA bundle: the API server's CA comes from the
# mounted service account (/var/run/secrets/kubernetes.io/serviceaccount/ca.crt), and a kubeconfig
# carries its own. It writes no files, so it has no /tmp (and runs with a read-only root).
#
# The result is reproducible byte for byte: the same binary and commit give the same digests.
# Every time in it is SOURCE_DATE_EPOCH (default: the last commit's time), the layer's entries
# are root-owned with fixed modes, in a fixed order, and no host name, user or path goes in.
#
# Options:
#   --binary PATH    package this binary instead of building one (CI builds the release binary
#                    once and passes it); without it: cargo build --release of the host's
#                    <arch>-unknown-linux-gnu target with -C target-feature=+crt-static
#   --out DIR        where to write; default dist/
#   --tag TAG        the image's tag (its org.opencontainers.image.ref.name); default v<version>
#   --allow-dynamic  accept a dynamically linked binary: the image then cannot run it, so this is
#                    only for tests of the image's structure with a debug build
#   --build-only     only build the static release binary and print its path (CI builds it once
#                    this way, then packages it with --binary and tests it)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { echo "build-image: $*" >&2; }
die() { log "error: $*"; exit 1; }

binary='' out=$repo/dist tag='' allow_dynamic=0 build_only=0
while (($#)); do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --allow-dynamic) allow_dynamic=1; shift ;;
    --build-only) build_only=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

# [package] keys of Cargo.toml: the first `key = "..."` line.
cargo_key() { awk -F'"' -v key="$1" '$0 ~ "^" key " *= *\"" {print $2; exit}' "$repo/Cargo.toml"; }
version=$(cargo_key version)
repository=$(cargo_key repository)
license=$(cargo_key license)
[[ -n $version && -n $repository && -n $license ]] || die "Cargo.toml lacks version, repository or license"
tag=${tag:-v$version}

if [[ -z $binary ]]; then
  triple=$(uname -m)-unknown-linux-gnu
  var=CARGO_TARGET_$(echo "$triple" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
  log "cargo build --release --target $triple with crt-static (LTO: several minutes)"
  # Per-target flags: build scripts and proc-macros stay dynamic (a proc-macro cannot be static).
  # getrandom 0.3 finds glibc's getrandom() with dlsym, which a static binary cannot do, and then
  # falls back to reading /dev/urandom; told to call getrandom() directly, the binary needs no /dev.
  (cd "$repo" && env "$var=-C target-feature=+crt-static --cfg getrandom_backend=\"linux_getrandom\"" \
    cargo build --locked --release --target "$triple" --bin kubectl-portalloc) >&2
  target_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  binary=$target_dir/$triple/release/kubectl-portalloc
fi
[[ -f $binary ]] || die "no binary at $binary"
command -v file >/dev/null || die "file is needed (scripts/install-deps.sh installs it)"

# The image's architecture is the binary's, in Go's names as OCI uses them.
description=$(file -L "$binary")
case $description in
  *ELF*x86-64*) arch=amd64 ;;
  *ELF*aarch64*) arch=arm64 ;;
  *) die "not a linux amd64 or arm64 executable: $description" ;;
esac
# `file` says "statically linked" (or "static-pie linked") and names no interpreter.
if [[ $description == *"statically linked"* || $description == *"static-pie linked"* ]] &&
  [[ $description != *"interpreter"* ]]; then
  static=1
else
  static=0
  ((allow_dynamic)) || die "$binary is dynamically linked; the image ships no libc (build with -C target-feature=+crt-static, or see --help): $description"
  log "WARNING: $binary is dynamically linked: this image cannot run it (--allow-dynamic)"
fi
if ((build_only)); then
  echo "$binary"
  exit 0
fi
for tool in umoci skopeo tar; do
  command -v "$tool" >/dev/null || die "$tool is needed (scripts/install-deps.sh installs it)"
done

epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || true)}
[[ $epoch =~ ^[0-9]+$ ]] || die "no SOURCE_DATE_EPOCH and no git commit to take the time from"
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

name=kubectl-portalloc_v${version}_image_linux_$arch
mkdir -p "$out"
out=$(cd "$out" && pwd)
layout=$out/$name
archive=$out/$name.tar
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The one layer: the binary, root-owned and 0755, so the user the image runs as cannot change it.
# GNU tar with every varying field pinned (order, owners, mtime; no atime/ctime in PAX headers).
reproducible_tar() {
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}
mkdir "$work/rootfs"
install -m 0755 "$binary" "$work/rootfs/kubectl-portalloc"
reproducible_tar -C "$work/rootfs" -cf "$work/layer.tar" kubectl-portalloc

# umoci writes the layout; every field that would default to "now" is given the commit's time,
# and it gzips the layer without a name or timestamp.
rm -rf "$layout.tmp"
umoci init --layout "$layout.tmp"
umoci new --image "$layout.tmp:$tag"
umoci raw add-layer --image "$layout.tmp:$tag" \
  --history.created "$created" --history.created_by "scripts/build-image.sh: /kubectl-portalloc" \
  "$work/layer.tar"
labels=(
  "org.opencontainers.image.title=kubectl-portalloc"
  "org.opencontainers.image.description=Hands out collision-free network ports to Kubernetes workloads"
  "org.opencontainers.image.source=$repository"
  "org.opencontainers.image.url=$repository"
  "org.opencontainers.image.version=v$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.licenses=$license"
  "org.opencontainers.image.created=$created"
)
label_args=()
for label in "${labels[@]}"; do label_args+=(--config.label "$label"); done
umoci config --image "$layout.tmp:$tag" --no-history \
  --created "$created" --os linux --architecture "$arch" \
  --config.user 65532:65532 --config.entrypoint /kubectl-portalloc \
  "${label_args[@]}"
# umoci config leaves the superseded config and manifest blobs behind.
umoci gc --layout "$layout.tmp"
rm -rf "$layout"
mv "$layout.tmp" "$layout"

# An oci-archive is a tar of the layout; tarred here with the same pinned fields (skopeo's own
# copy to oci-archive: stamps the files with the time of the copy).
reproducible_tar --mode=u=rwX,go=rX -C "$layout" -cf "$archive.tmp" .
mv "$archive.tmp" "$archive"

# The image as a registry client sees it.
inspect=$(skopeo inspect --config "oci-archive:$archive:$tag")
grep -q '"User": "65532:65532"' <<<"$inspect" || die "the image's user is not 65532:65532: $inspect"
digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive:$tag")
log "$name ($arch, $( ((static)) && echo static || echo DYNAMIC) binary of $(wc -c <"$binary" | tr -d ' ') bytes): manifest $digest, archive $(wc -c <"$archive" | tr -d ' ') bytes"
echo "$archive"
