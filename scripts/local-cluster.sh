#!/usr/bin/env bash
# A real, local Kubernetes control plane for development and tests: etcd + kube-apiserver, both
# built from their Go modules (tests/controlplane/*), on loopback, with TLS, RBAC, an admin identity
# (client certificate in system:masters) and two unprivileged identities for RBAC tests.
#
#   scripts/local-cluster.sh up      build (cached) and start; prints the kubeconfig path last
#   scripts/local-cluster.sh down    stop exactly what `up` started and delete its state
#   scripts/local-cluster.sh status  say whether it runs, and where
#   scripts/local-cluster.sh build   only build (or find in the cache) the two binaries
#   scripts/local-cluster.sh build-controllers  build (or find) kube-scheduler,
#                                    kube-controller-manager and kube-proxy from the same pinned
#                                    Kubernetes module; prints their directory (the scheduling tests
#                                    start them)
#   scripts/local-cluster.sh build-node  build (or find) kubelet from the same module; prints its
#                                    directory (the real node's tests run it with containerd)
#   scripts/local-cluster.sh stop [--kill]  stop kube-apiserver and etcd but keep their data, certs
#                                    and ports (--kill: SIGKILL, as a crash; default SIGTERM)
#   scripts/local-cluster.sh start   start them again from what `stop` kept, on the same ports
#   scripts/local-cluster.sh restart [--kill]  stop, then start (fault tests use this)
#
# Environment:
#   PORTALLOC_CLUSTER_DIR   runtime state (certs, data, logs, kubeconfig); default .local-cluster/
#   PORTALLOC_CACHE_DIR     built binaries, keyed by the pinned versions; default ~/.cache/kubectl-portalloc
#   PORTALLOC_CLUSTER_OWNER_PID  if set, the cluster stops itself when that process exits (tests use
#                           this so a killed test run never leaves servers behind)
#   PORTALLOC_APISERVER_FLAGS  extra kube-apiserver flags for `up` (kept for `start`), e.g.
#                           --enable-aggregator-routing for the webhook's Service test
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster_dir=${PORTALLOC_CLUSTER_DIR:-$repo/.local-cluster}
cache_dir=${PORTALLOC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-portalloc}
kas_module=$repo/tests/controlplane/kube-apiserver
etcd_module=$repo/tests/controlplane/etcd

log() { echo "local-cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

# The versions come from the wrapper modules, so the cache key changes exactly when a pin does.
k8s_version() { awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' "$kas_module/go.mod"; }
etcd_version() { awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$etcd_module/go.mod"; }

bin_dir() {
  local sum
  sum=$(cat "$kas_module/go.mod" "$kas_module/go.sum" "$etcd_module/go.mod" "$etcd_module/go.sum" | sha256sum | cut -c1-12)
  echo "$cache_dir/control-plane/k8s-$(k8s_version)-etcd-$(etcd_version)-$sum"
}

build() {
  local dir k8s minor
  dir=$(bin_dir)
  if [[ -x $dir/kube-apiserver && -x $dir/etcd ]]; then
    echo "$dir"
    return
  fi
  command -v go >/dev/null || die "Go is needed to build kube-apiserver and etcd (https://go.dev/doc/install)"
  # Several test binaries may start at once: one builds, the others wait and then reuse it.
  mkdir -p "$cache_dir/control-plane"
  exec 9>"$cache_dir/control-plane/.build.lock"
  flock 9
  if [[ -x $dir/kube-apiserver && -x $dir/etcd ]]; then
    exec 9>&-
    echo "$dir"
    return
  fi
  k8s=$(k8s_version)
  [[ -n $k8s ]] || die "no k8s.io/kubernetes version in $kas_module/go.mod"
  minor=$(echo "$k8s" | cut -d. -f2)
  mkdir -p "$dir.tmp"
  log "building etcd $(etcd_version) from its Go module (once; cached in $dir)"
  (cd "$etcd_module" && go build -trimpath -ldflags "-s -w" -o "$dir.tmp/etcd" go.etcd.io/etcd/server/v3) >&2
  log "building kube-apiserver $k8s from its Go module (several minutes on 2 cores; cached)"
  # Without these, /version reports v0.0.0-master and clients' version checks complain.
  local v=k8s.io/component-base/version
  (cd "$kas_module" && go build -trimpath \
    -ldflags "-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
    -o "$dir.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver) >&2
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  # Closed before `up` starts the servers, which would otherwise inherit the lock.
  exec 9>&-
  echo "$dir"
}

# kube-scheduler, kube-controller-manager and kube-proxy, in one `go build` (they share most of
# their packages, compiled once), keyed by the Kubernetes pin and the wrapper module's go.mod and go.sum
# (etcd plays no part). Not part of `build`: only the scheduling tests need them.
controllers_dir() {
  local sum
  sum=$(cat "$kas_module/go.mod" "$kas_module/go.sum" | sha256sum | cut -c1-12)
  echo "$cache_dir/controllers/k8s-$(k8s_version)-$sum"
}

controllers_built() { [[ -x $1/kube-scheduler && -x $1/kube-controller-manager && -x $1/kube-proxy ]]; }

build_controllers() {
  local dir k8s minor tmp
  dir=$(controllers_dir)
  if controllers_built "$dir"; then
    echo "$dir"
    return
  fi
  command -v go >/dev/null || die "Go is needed to build kube-scheduler, kube-controller-manager and kube-proxy (https://go.dev/doc/install)"
  mkdir -p "$cache_dir/controllers"
  exec 8>"$cache_dir/controllers/.build.lock"
  flock 8
  if ! controllers_built "$dir"; then
    k8s=$(k8s_version)
    [[ -n $k8s ]] || die "no k8s.io/kubernetes version in $kas_module/go.mod"
    minor=$(echo "$k8s" | cut -d. -f2)
    log "building kube-scheduler, kube-controller-manager and kube-proxy $k8s from the pinned Kubernetes module (once; cached in $dir)"
    local v=k8s.io/component-base/version started=$SECONDS
    # A fresh directory moved into place whole: a killed build leaves no half-filled entry.
    tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    if ! (cd "$kas_module" && go build -trimpath \
      -ldflags "-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
      -o "$tmp/" k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-proxy) >&2; then
      rm -rf "$tmp"
      die "building kube-scheduler, kube-controller-manager and kube-proxy $k8s failed (see above)"
    fi
    rm -rf "$dir" && mv -T "$tmp" "$dir"
    log "built kube-scheduler, kube-controller-manager and kube-proxy in $((SECONDS - started))s"
  fi
  exec 8>&-
  echo "$dir"
}

# kubelet, from the same pinned module, for the real node's tests (tests/image/real_node.rs):
# keyed as the controllers are, in a directory of its own.
node_dir() {
  local sum
  sum=$(cat "$kas_module/go.mod" "$kas_module/go.sum" | sha256sum | cut -c1-12)
  echo "$cache_dir/node/k8s-$(k8s_version)-$sum"
}

build_node() {
  local dir k8s minor tmp
  dir=$(node_dir)
  if [[ -x $dir/kubelet ]]; then
    echo "$dir"
    return
  fi
  command -v go >/dev/null || die "Go is needed to build kubelet (https://go.dev/doc/install)"
  mkdir -p "$cache_dir/node"
  exec 8>"$cache_dir/node/.build.lock"
  flock 8
  if [[ ! -x $dir/kubelet ]]; then
    k8s=$(k8s_version)
    [[ -n $k8s ]] || die "no k8s.io/kubernetes version in $kas_module/go.mod"
    minor=$(echo "$k8s" | cut -d. -f2)
    log "building kubelet $k8s from the pinned Kubernetes module (once; cached in $dir)"
    local v=k8s.io/component-base/version started=$SECONDS
    tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    if ! (cd "$kas_module" && go build -trimpath \
      -ldflags "-s -w -X $v.gitVersion=$k8s -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
      -o "$tmp/" k8s.io/kubernetes/cmd/kubelet) >&2; then
      rm -rf "$tmp"
      die "building kubelet $k8s failed (see above)"
    fi
    rm -rf "$dir" && mv -T "$tmp" "$dir"
    log "built kubelet in $((SECONDS - started))s"
  fi
  exec 8>&-
  echo "$dir"
}

# A random loopback port nobody listens on, below the NodePort and ephemeral ranges that tests use.
free_port() {
  local port
  for _ in $(seq 200); do
    port=$((20000 + RANDOM % 10000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  die "no free loopback port found in 20000-29999"
}

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

ready() {
  [[ -f $cluster_dir/kubeconfig ]] || return 1
  local port
  port=$(cat "$cluster_dir/apiserver.port" 2>/dev/null) || return 1
  curl -fsS --max-time 2 --cacert "$cluster_dir/pki/ca.crt" \
    --cert "$cluster_dir/pki/admin.crt" --key "$cluster_dir/pki/admin.key" \
    "https://127.0.0.1:$port/readyz" >/dev/null 2>&1
}

# One CA signs the serving certificate and both client identities.
make_pki() {
  local pki=$cluster_dir/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=portalloc-local-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >"$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  client_cert admin "/O=system:masters/CN=admin"
  client_cert user "/CN=portalloc-user"
  client_cert user2 "/CN=portalloc-user2"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

client_cert() {
  local pki=$cluster_dir/pki name=$1 subject=$2
  openssl req -newkey rsa:2048 -nodes -subj "$subject" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$pki/client.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/client.ext" -out "$pki/$name.crt" 2>/dev/null
}

b64() { base64 -w0 <"$1"; }

write_kubeconfig() {
  local pki=$cluster_dir/pki port=$1
  cat >"$cluster_dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: portalloc-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: portalloc-admin
  user:
    client-certificate-data: $(b64 "$pki/admin.crt")
    client-key-data: $(b64 "$pki/admin.key")
- name: portalloc-user
  user:
    client-certificate-data: $(b64 "$pki/user.crt")
    client-key-data: $(b64 "$pki/user.key")
- name: portalloc-user2
  user:
    client-certificate-data: $(b64 "$pki/user2.crt")
    client-key-data: $(b64 "$pki/user2.key")
contexts:
- name: portalloc-local
  context: {cluster: portalloc-local, user: portalloc-admin, namespace: default}
- name: portalloc-local-user
  context: {cluster: portalloc-local, user: portalloc-user, namespace: default}
- name: portalloc-local-user2
  context: {cluster: portalloc-local, user: portalloc-user2, namespace: default}
current-context: portalloc-local
EOF
}

wait_for() {
  local what=$1 seconds=$2 pidfile=$3 logfile=$4
  shift 4
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    alive "$pidfile" || { tail -n 30 "$logfile" >&2; die "$what exited during start-up (log: $logfile)"; }
    ((SECONDS < deadline)) || { tail -n 30 "$logfile" >&2; die "$what was not ready after ${seconds}s (log: $logfile)"; }
    sleep 0.3
  done
}

etcd_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$(cat "$cluster_dir/etcd.port")/health" >/dev/null 2>&1; }

# Start etcd and kube-apiserver from the state in $cluster_dir (certs, data, ports), and wait
# until both answer. Used by `up` on fresh state and by `start` on what `stop` kept.
start_servers() {
  local bins=$1 etcd_port peer_port port started=$SECONDS
  etcd_port=$(cat "$cluster_dir/etcd.port")
  peer_port=$(cat "$cluster_dir/etcd-peer.port")
  port=$(cat "$cluster_dir/apiserver.port")
  # setsid: the servers outlive this script but not `down`, which kills their process groups.
  setsid "$bins/etcd" --name portalloc-local --data-dir "$cluster_dir/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "portalloc-local=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync=true --log-level=warn \
    </dev/null >>"$cluster_dir/etcd.log" 2>&1 &
  echo $! >"$cluster_dir/etcd.pid"
  wait_for etcd 30 "$cluster_dir/etcd.pid" "$cluster_dir/etcd.log" etcd_healthy

  local pki=$cluster_dir/pki extra=()
  [[ -f $cluster_dir/apiserver.flags ]] && { read -ra extra <"$cluster_dir/apiserver.flags" || true; }
  # Tests create pods without ServiceAccounts to mount, so the plugin is off, unless the extra
  # flags enable it (the real node's tests: a kubelet mounts the pods' tokens).
  local plugins=(--disable-admission-plugins ServiceAccount)
  [[ " ${extra[*]} " == *" --enable-admission-plugins ServiceAccount "* ]] && plugins=()
  setsid "$bins/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --authorization-mode RBAC \
    --service-account-issuer "https://127.0.0.1:$port/" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 --service-node-port-range 30000-32767 \
    "${plugins[@]}" \
    --allow-privileged=true \
    --cert-dir "$cluster_dir/apiserver-certs" \
    "${extra[@]}" \
    </dev/null >>"$cluster_dir/apiserver.log" 2>&1 &
  echo $! >"$cluster_dir/apiserver.pid"
  wait_for kube-apiserver 90 "$cluster_dir/apiserver.pid" "$cluster_dir/apiserver.log" ready
  log "ready in $((SECONDS - started))s at https://127.0.0.1:$port ($(basename "$bins"))"
}

# A cluster started by an older version of this script lacks the second user: add it.
ensure_identities() {
  local pki=$cluster_dir/pki
  if [[ ! -f $pki/user2.crt ]]; then
    client_cert user2 "/CN=portalloc-user2"
    write_kubeconfig "$(cat "$cluster_dir/apiserver.port")"
  fi
}

up() {
  if alive "$cluster_dir/apiserver.pid" && ready; then
    ensure_identities
    log "already running"
    echo "$cluster_dir/kubeconfig"
    return
  fi
  # Anything half-started by an earlier, interrupted `up` goes first.
  down_quiet
  local bins
  bins=$(build)
  mkdir -p "$cluster_dir"
  make_pki
  free_port >"$cluster_dir/etcd.port"
  free_port >"$cluster_dir/etcd-peer.port"
  free_port >"$cluster_dir/apiserver.port"
  echo "${PORTALLOC_APISERVER_FLAGS:-}" >"$cluster_dir/apiserver.flags"
  write_kubeconfig "$(cat "$cluster_dir/apiserver.port")"
  start_servers "$bins"

  if [[ -n ${PORTALLOC_CLUSTER_OWNER_PID:-} ]]; then
    # Stop the servers when the owning process goes away, however it ends.
    local owner=$PORTALLOC_CLUSTER_OWNER_PID self=$0
    setsid bash -c "while kill -0 $owner 2>/dev/null; do sleep 1; done; PORTALLOC_CLUSTER_DIR='$cluster_dir' '$self' down" \
      </dev/null >/dev/null 2>&1 &
    echo $! >"$cluster_dir/watcher.pid"
  fi
  echo "$cluster_dir/kubeconfig"
}

# Stop both servers, keeping the data dir, certs, ports and the owner watcher.
stop() {
  [[ -f $cluster_dir/apiserver.port ]] || die "no cluster state in $cluster_dir: run \`$0 up\` first"
  local signal=TERM
  [[ ${1:-} == --kill ]] && signal=KILL
  if [[ $signal == KILL ]]; then
    for f in apiserver etcd; do
      [[ -f $cluster_dir/$f.pid ]] && kill -KILL "$(cat "$cluster_dir/$f.pid")" 2>/dev/null || true
    done
  fi
  stop_pidfile "$cluster_dir/apiserver.pid"
  stop_pidfile "$cluster_dir/etcd.pid"
  log "stopped (SIG$signal); state kept in $cluster_dir"
}

# Start again from what `stop` kept: same data, certs and ports.
start() {
  [[ -f $cluster_dir/apiserver.port && -f $cluster_dir/etcd-peer.port ]] \
    || die "no cluster state in $cluster_dir: run \`$0 up\` first"
  if alive "$cluster_dir/apiserver.pid" && ready; then
    log "already running"
  else
    stop_pidfile "$cluster_dir/apiserver.pid"
    stop_pidfile "$cluster_dir/etcd.pid"
    start_servers "$(build)"
  fi
  echo "$cluster_dir/kubeconfig"
}

stop_pidfile() {
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

down_quiet() {
  [[ -d $cluster_dir ]] || return 0
  stop_pidfile "$cluster_dir/apiserver.pid"
  stop_pidfile "$cluster_dir/etcd.pid"
  # The watcher may be the caller of `down`, as our parent or (bash -c execs its last command)
  # as this very process; don't kill ourselves before the state is gone.
  local watcher
  watcher=$(cat "$cluster_dir/watcher.pid" 2>/dev/null || true)
  if [[ -n $watcher && $watcher != "$PPID" && $watcher != "$$" ]]; then
    stop_pidfile "$cluster_dir/watcher.pid"
  fi
  rm -rf "$cluster_dir"
}

down() {
  if [[ -f $cluster_dir/apiserver.pid || -f $cluster_dir/etcd.pid ]]; then
    down_quiet
    log "stopped"
  else
    down_quiet
    log "not running"
  fi
}

status() {
  if alive "$cluster_dir/apiserver.pid" && ready; then
    echo "running: https://127.0.0.1:$(cat "$cluster_dir/apiserver.port") (apiserver pid $(cat "$cluster_dir/apiserver.pid"), etcd pid $(cat "$cluster_dir/etcd.pid"))"
    echo "$cluster_dir/kubeconfig"
  else
    echo "not running"
    return 1
  fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  build) build ;;
  build-controllers) build_controllers ;;
  build-node) build_node ;;
  stop) stop "${2:-}" ;;
  start) start ;;
  restart) stop "${2:-}" && start ;;
  *) echo "usage: $0 up|down|status|build|build-controllers|build-node|stop [--kill]|start|restart [--kill]" >&2; exit 2 ;;
esac
