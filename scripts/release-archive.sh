#!/usr/bin/env bash
# Build the release archive of kubectl-portalloc for one platform:
#
#   dist/kubectl-portalloc_v<version>_<os>_<arch>.tar.gz
#     kubectl-portalloc            the plugin (kubectl runs it as `kubectl portalloc`)
#     kubectl_complete-portalloc   kubectl's completion hook for `kubectl portalloc <TAB>`
#     LICENSE
#
# and beside it <archive>.sha256 (sha256sum format). The last line printed is the archive's path.
#
#   scripts/release-archive.sh                      cargo build --release (LTO, stripped) for the host
#   scripts/release-archive.sh --target aarch64-unknown-linux-gnu
#                                                   the same for a Rust target (its toolchain needed)
#   scripts/release-archive.sh --binary PATH        package a binary built already (no cargo build)
#
# Options:
#   --binary PATH   the kubectl-portalloc binary to package instead of building one
#   --target TRIPLE the Rust target to build for; also names the archive's os/arch
#   --os OS         override the os in the name (linux, darwin, windows)
#   --arch ARCH     override the arch in the name (amd64, arm64, ...)
#   --out DIR       where to write the archive; default dist/
#
# The archive is reproducible: for the same binary and commit it has the same bytes (sorted
# entries, root-owned, fixed modes, mtime = SOURCE_DATE_EPOCH or the last commit's time, gzip
# without a name or timestamp). That needs GNU tar (gtar on macOS); another tar still works but
# loses that property.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { echo "release-archive: $*" >&2; }
die() { log "error: $*"; exit 1; }

binary='' target='' os='' arch='' out=$repo/dist
while (($#)); do
  case $1 in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --target) target=${2:?--target needs a Rust target triple}; shift 2 ;;
    --os) os=${2:?--os needs a value}; shift 2 ;;
    --arch) arch=${2:?--arch needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

# The [package] version of Cargo.toml: the first `version = "..."` line.
version=$(awk -F'"' '/^version *= *"/ {print $2; exit}' "$repo/Cargo.toml")
[[ -n $version ]] || die "no version in $repo/Cargo.toml"

# Krew's names (Go's GOOS/GOARCH) for a Rust target triple or for `uname`.
os_of() {
  case $1 in
    *linux*) echo linux ;;
    *apple* | *darwin* | Darwin) echo darwin ;;
    *windows* | MINGW* | MSYS* | CYGWIN*) echo windows ;;
    Linux) echo linux ;;
    *) die "cannot tell the os of '$1': pass --os" ;;
  esac
}
arch_of() {
  case $1 in
    x86_64* | amd64) echo amd64 ;;
    aarch64* | arm64) echo arm64 ;;
    i686* | i386* | i586*) echo 386 ;;
    armv7* | arm-*) echo arm ;;
    powerpc64le* | ppc64le) echo ppc64le ;;
    *) die "cannot tell the arch of '$1': pass --arch" ;;
  esac
}
if [[ -n $target ]]; then
  os=${os:-$(os_of "$target")}
  arch=${arch:-$(arch_of "${target%%-*}")}
else
  os=${os:-$(os_of "$(uname -s)")}
  arch=${arch:-$(arch_of "$(uname -m)")}
fi

exe=''
[[ $os == windows ]] && exe=.exe

if [[ -z $binary ]]; then
  log "cargo build --release${target:+ --target $target} (LTO, one codegen unit: a few minutes)"
  (cd "$repo" && cargo build --locked --release ${target:+--target "$target"} --bin kubectl-portalloc) >&2
  target_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  binary=$target_dir/${target:+$target/}release/kubectl-portalloc$exe
fi
[[ -f $binary ]] || die "no binary at $binary"

# The completion hook is the text `completion kubectl-plugin` prints. A binary built for another
# platform cannot run here; the host's build of the same source prints the same text.
complete_script() {
  "$binary" completion kubectl-plugin 2>/dev/null && return
  log "$binary does not run here; taking the completion hook from a host build"
  (cd "$repo" && cargo run --locked --quiet --bin kubectl-portalloc -- completion kubectl-plugin)
}

name=kubectl-portalloc_v${version}_${os}_${arch}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$binary" "$stage/kubectl-portalloc$exe"
complete_script >"$stage/kubectl_complete-portalloc"
[[ -s $stage/kubectl_complete-portalloc ]] || die "the completion hook came out empty"
chmod 0755 "$stage/kubectl_complete-portalloc"
install -m 0644 "$repo/LICENSE" "$stage/LICENSE"

epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
tar=tar
command -v gtar >/dev/null && tar=gtar
mkdir -p "$out"
archive=$(cd "$out" && pwd)/$name.tar.gz
files=(LICENSE "kubectl-portalloc$exe" kubectl_complete-portalloc)
if "$tar" --version 2>/dev/null | grep -q 'GNU tar'; then
  "$tar" -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    --format=ustar -cf - "${files[@]}" | gzip -n >"$archive.tmp"
else
  log "not GNU tar: the archive is not byte-for-byte reproducible"
  "$tar" -C "$stage" -cf - "${files[@]}" | gzip -n >"$archive.tmp"
fi
mv "$archive.tmp" "$archive"

if command -v sha256sum >/dev/null; then
  sum=$(sha256sum "$archive" | cut -d' ' -f1)
else
  sum=$(shasum -a 256 "$archive" | cut -d' ' -f1)
fi
echo "$sum  $name.tar.gz" >"$archive.sha256"
log "$name.tar.gz: $(wc -c <"$archive" | tr -d ' ') bytes (binary $(wc -c <"$binary" | tr -d ' ') bytes), sha256 $sum"
echo "$archive"
