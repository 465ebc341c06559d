#!/usr/bin/env bash
# Install what building and testing need and a fresh machine may lack. Rust and Go themselves are
# expected (rustup, https://go.dev/doc/install); kube-apiserver and etcd are built from Go modules
# by scripts/local-cluster.sh on first use, not installed here.
set -euo pipefail

missing=()
for tool in curl openssl base64 sha256sum setsid; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "install-deps: installing packages for: ${missing[*]}" >&2
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    apt-get update -qq
    apt-get install -y -qq curl openssl coreutils util-linux >/dev/null
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
