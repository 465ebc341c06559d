#!/usr/bin/env bash
# Install what building and testing need and a fresh machine may lack. Rust and Go themselves are
# expected (rustup, https://go.dev/doc/install); kube-apiserver and etcd are built from Go modules
# by scripts/local-cluster.sh on first use, not installed here.
set -euo pipefail

# /dev/null must be the null device. Some sandboxes start with a regular file there: everything
# written "to /dev/null" piles up in it, and cargo's probe of a target (`rustc -` with stdin from
# /dev/null) then compiles that text and fails. As root, put the device back (major 1, minor 3).
if [[ ! -c /dev/null ]]; then
  if [[ $(id -u) == 0 ]]; then
    rm -f /dev/null && mknod -m 666 /dev/null c 1 3
    echo "install-deps: /dev/null was a regular file; it is the null device again" >&2
  else
    echo "install-deps: warning: /dev/null is not the null device and only root can fix it" >&2
  fi
fi

# tool -> the Debian/Ubuntu package that has it. umoci and skopeo build and inspect the OCI image
# (scripts/build-image.sh), shellcheck lets actionlint lint the workflows' run: scripts. unshare,
# nsenter and ip give the node simulation its namespaces (one network namespace per node);
# kube-proxy (scheduling::service_proxy) writes its rules there with iptables. containerd, runc
# and a static busybox run the real node's pods under kubelet (tests/image/real_node.rs).
declare -A package_of=(
  [curl]=curl [openssl]=openssl [base64]=coreutils [sha256sum]=coreutils [setsid]=util-linux
  [file]=file [umoci]=umoci [skopeo]=skopeo [shellcheck]=shellcheck
  [unshare]=util-linux [nsenter]=util-linux [ip]=iproute2
  [iptables]=iptables [iptables-save]=iptables [iptables-restore]=iptables
  [containerd]=containerd [runc]=runc [ctr]=containerd [busybox]=busybox-static
)
missing=() packages=()
for tool in "${!package_of[@]}"; do
  if ! command -v "$tool" >/dev/null; then
    missing+=("$tool")
    packages+=("${package_of[$tool]}")
  fi
done
if ((${#missing[@]})); then
  echo "install-deps: installing packages for: ${missing[*]}" >&2
  sudo=()
  [[ $(id -u) == 0 ]] || sudo=(sudo -n)
  if command -v apt-get >/dev/null && { ((${#sudo[@]} == 0)) || sudo -n true 2>/dev/null; }; then
    "${sudo[@]}" apt-get update -qq
    # Sorted and de-duplicated (coreutils serves three tools).
    mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${packages[@]}" >/dev/null
  else
    echo "install-deps: please install: ${missing[*]}" >&2
    exit 1
  fi
fi
for tool in cargo go; do
  command -v "$tool" >/dev/null || { echo "install-deps: $tool is required but not on PATH" >&2; exit 1; }
done
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
echo "install-deps: ok (cargo $(cargo --version | cut -d' ' -f2), $(go version | cut -d' ' -f3))" >&2
