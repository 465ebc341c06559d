#!/usr/bin/python3
"""Stand-in for the engines the examples start (SGLang server and router, vLLM, Ray).

Installed by the node simulation (tests/e2e/simulation) as `python3`, `ray` and `vllm` first on
PATH. It reads each engine's own flags, binds every port they name (or the fixed default the
real engine would bind) on 127.0.0.1 (or $PORTALLOC_SIM_BIND), then connects to every
address:port they name, resolving host names only through the simulation's map of pod DNS names.
Every bind, connect and failure is one JSON line in $PORTALLOC_SIM_LOG. Once everything is bound
and reached it serves (accepts and answers with its pod's name, so a connector can tell which pod
it reached) until killed.

It fails loudly (exit 1, a "fail" line) on: a port already in use, an unknown host name, a peer
that never answers, a connection that reaches another pod than the name says, and a flag it does
not know whose name says it is about ports or addresses (rather than ignoring a port it would
have to bind).
"""

import json
import os
import re
import select
import socket
import sys
import threading
import time

REAL_PYTHON = "/usr/bin/python3"
POD = os.environ.get("PORTALLOC_SIM_POD", "?")
# 127.0.0.1 on this machine; 0.0.0.0 in a simulated node's own network namespace, where peers
# on other nodes connect to the node's address.
BIND = os.environ.get("PORTALLOC_SIM_BIND", "127.0.0.1")
TIMEOUT = float(os.environ.get("PORTALLOC_SIM_TIMEOUT", "30"))
INVOCATION = "%s:%d" % (POD, os.getpid())
PROG = "?"


class Fail(Exception):
    pass


def emit(event, **fields):
    record = {"t": round(time.time(), 3), "pod": POD, "prog": PROG, "id": INVOCATION,
              "pid": os.getpid(), "event": event}
    record.update(fields)
    path = os.environ.get("PORTALLOC_SIM_LOG")
    if path:
        # One write of one line in append mode: lines of concurrent processes do not interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)


def load_hosts():
    path = os.environ.get("PORTALLOC_SIM_HOSTS")
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


HOSTS = load_hosts()


def resolve(host):
    """The IP and the pods a name may lead to (None: any), through the simulation's map only."""
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", host):
        return host, None
    entry = HOSTS.get(host)
    if entry is None:
        raise Fail("unknown host %r (no pod DNS name of the simulation)" % host)
    return entry["ip"], set(entry["pods"])


# --- command lines -----------------------------------------------------------------------------

PORTISH = re.compile(r"port|addr|host|url|listen", re.I)


def parse(argv, spec, normalise_underscores=False):
    """Flags by name (last one wins, or a list for 'append' kinds) and positional arguments.

    spec maps a flag to 'bool', 'value', 'append' or a callable taking (args, i) and returning
    (value, next i). A flag missing from spec fails if its name speaks of ports or addresses.
    """
    opts, positional, i = {}, [], 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":
            positional.append(token)
            i += 1
            continue
        name, eq, inline = token.partition("=")
        if normalise_underscores:
            name = name.replace("_", "-")
        kind = spec.get(name)
        if kind is None:
            if PORTISH.search(name):
                raise Fail("unknown flag %s: it names a port or address this stand-in "
                           "does not model" % name)
            # Unknown, harmless flag: skip it and a value that follows it.
            i += 1
            if not eq and i < len(argv) and not argv[i].startswith("-"):
                i += 1
            continue
        if kind == "bool":
            opts[name] = inline.lower() not in ("false", "0") if eq else True
            i += 1
        elif kind in ("value", "append"):
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(argv):
                value, i = argv[i + 1], i + 2
            else:
                raise Fail("flag %s needs a value" % name)
            if kind == "append":
                opts.setdefault(name, []).append(value)
            else:
                opts[name] = value
        else:
            value, i = kind(argv, i + 1)
            opts.setdefault(name, []).append(value)
    return opts, positional


def port_of(opts, name, default=None):
    value = opts.get(name)
    if value is None:
        return default
    try:
        port = int(value)
    except ValueError:
        raise Fail("%s %r is not a port number" % (name, value))
    if not 0 <= port <= 65535:
        raise Fail("%s %d is out of range" % (name, port))
    return port


def host_port(text, what):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise Fail("%s %r is not HOST:PORT" % (what, text))
    return host.strip("[]"), int(port)


def url_host_port(url, what):
    m = re.fullmatch(r"https?://([^/:]+|\[[^\]]+\]):(\d+)/?", url)
    if not m:
        raise Fail("%s %r is not http://HOST:PORT" % (what, url))
    return m.group(1).strip("[]"), int(m.group(2))


# --- network -------------------------------------------------------------------------------------

class Node:
    """The sockets one invocation binds and the peers it must reach."""

    def __init__(self):
        self.binds = []      # (port, why)
        self.connects = []   # (host, port, why)
        self.listeners = []

    def bind(self, port, why):
        self.binds.append((port, why))

    def connect(self, host, port, why):
        self.connects.append((host, port, why))

    def open(self):
        for port, why in self.binds:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            # As servers do: a port left in TIME_WAIT by an earlier run may be bound again;
            # a port another socket listens on still may not (Linux).
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((BIND, port))
            except OSError as e:
                name = "EADDRINUSE" if e.errno == 98 else (os.strerror(e.errno) if e.errno else str(e))
                emit("bind", port=port, why=why, ok=False, error=name)
                raise Fail("cannot bind %s:%d (%s): %s" % (BIND, port, why, name))
            s.listen(64)
            self.listeners.append(s)
            emit("bind", port=s.getsockname()[1], requested=port, why=why, ok=True)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            ready, _, _ = select.select(self.listeners, [], [], 1.0)
            for s in ready:
                try:
                    conn, _ = s.accept()
                    conn.sendall((POD + "\n").encode())
                    conn.close()
                except OSError:
                    pass

    def reach(self):
        deadline = time.time() + TIMEOUT
        for host, port, why in self.connects:
            ip, pods = resolve(host)
            attempts, last = 0, None
            while True:
                attempts += 1
                try:
                    with socket.create_connection((ip, port), timeout=2) as c:
                        c.settimeout(5)
                        reached = c.makefile().readline().strip()
                    break
                except OSError as e:
                    last = e
                    if time.time() > deadline:
                        emit("connect", host=host, port=port, why=why, ok=False,
                             attempts=attempts, error=str(last))
                        raise Fail("no answer from %s:%d (%s) within %.0fs: %s"
                                   % (host, port, why, TIMEOUT, last))
                    time.sleep(0.1)
            if pods is not None and reached not in pods:
                emit("connect", host=host, port=port, why=why, ok=False, reached=reached,
                     error="wrong pod")
                raise Fail("%s:%d (%s) answered from pod %s, not %s"
                           % (host, port, why, reached, sorted(pods)))
            emit("connect", host=host, port=port, why=why, ok=True, reached=reached,
                 attempts=attempts)

    def run(self, on_up=None):
        self.open()
        self.reach()
        emit("up", binds=len(self.binds), connects=len(self.connects))
        if on_up:
            on_up()
        while True:
            time.sleep(3600)


# --- engines -------------------------------------------------------------------------------------

def sglang_server(argv):
    spec = {f: "value" for f in (
        "--model-path", "--model", "--tokenizer-path", "--host", "--port",
        "--disaggregation-mode", "--disaggregation-bootstrap-port",
        "--disaggregation-transfer-backend", "--disaggregation-ib-device", "--tp-size",
        "--tensor-parallel-size", "--tp", "--dist-init-addr", "--nccl-init-addr", "--nnodes",
        "--node-rank", "--nccl-port", "--mem-fraction-static", "--served-model-name",
        "--context-length", "--log-level", "--dp-size", "--dp")}
    spec.update({f: "bool" for f in ("--trust-remote-code", "--enable-dp-attention",
                                     "--disable-cuda-graph", "--enable-metrics")})
    opts, positional = parse(argv, spec)
    if positional:
        raise Fail("unexpected arguments %r" % positional)
    if opts.get("--enable-dp-attention"):
        raise Fail("--enable-dp-attention reserves ports after the dist-init port; not modelled")
    node = Node()
    rank = int(opts.get("--node-rank", "0"))
    nnodes = int(opts.get("--nnodes", "1"))
    # Every rank binds --port: rank 0 the HTTP server, ranks >= 1 a dummy health server.
    node.bind(port_of(opts, "--port", 30000), "--port")
    mode = opts.get("--disaggregation-mode", "null")
    if mode == "prefill":
        node.bind(port_of(opts, "--disaggregation-bootstrap-port", 8998),
                  "--disaggregation-bootstrap-port")
    elif mode not in ("null", "decode"):
        raise Fail("--disaggregation-mode %r" % mode)
    node.bind(port_of(opts, "--nccl-port", 0), "--nccl-port")
    dist = opts.get("--dist-init-addr") or opts.get("--nccl-init-addr")
    if nnodes > 1:
        if not dist:
            raise Fail("--nnodes %d without --dist-init-addr" % nnodes)
        if not 0 <= rank < nnodes:
            raise Fail("--node-rank %d outside 0..%d" % (rank, nnodes - 1))
        host, port = host_port(dist, "--dist-init-addr")
        if rank == 0:
            resolve(host)  # the address the other ranks dial must name this pod's node
            node.bind(port, "--dist-init-addr (rank 0)")
        else:
            node.connect(host, port, "--dist-init-addr")
    node.run()


def take_prefill(argv, i):
    """`--prefill URL [BOOTSTRAP_PORT|none]`, as the router parses it."""
    if i >= len(argv):
        raise Fail("--prefill needs a URL")
    url, i = argv[i], i + 1
    bootstrap = None
    if i < len(argv) and not argv[i].startswith("--"):
        if argv[i] == "none":
            i += 1
        elif argv[i].isdigit():
            bootstrap, i = int(argv[i]), i + 1
        else:
            raise Fail("--prefill %s: bootstrap port %r is not a number" % (url, argv[i]))
    return (url, bootstrap), i


def sglang_router(argv):
    spec = {f: "value" for f in ("--host", "--port", "--policy", "--prefill-policy",
                                 "--decode-policy", "--prometheus-port", "--prometheus-host",
                                 "--log-level")}
    spec.update({"--pd-disaggregation": "bool", "--mini-lb": "bool",
                 "--decode": "append", "--prefill": take_prefill})
    opts, positional = parse(argv, spec)
    if positional:
        raise Fail("unexpected arguments %r" % positional)
    prefills, decodes = opts.get("--prefill", []), opts.get("--decode", [])
    if (prefills or decodes) and not opts.get("--pd-disaggregation"):
        raise Fail("--prefill/--decode without --pd-disaggregation")
    if opts.get("--pd-disaggregation") and not (prefills and decodes):
        raise Fail("PD mode needs at least one --prefill and one --decode")
    node = Node()
    node.bind(port_of(opts, "--port", 30000), "--port")
    node.bind(port_of(opts, "--prometheus-port", 29000), "--prometheus-port")
    for url, bootstrap in prefills:
        host, port = url_host_port(url, "--prefill")
        node.connect(host, port, "--prefill")
        if bootstrap is not None:
            # The router hands (prefill host, bootstrap port) to decode, which dials it.
            node.connect(host, bootstrap, "--prefill bootstrap")
    for url in decodes:
        host, port = url_host_port(url, "--decode")
        node.connect(host, port, "--decode")
    node.run()


def vllm_server(argv):
    spec = {f: "value" for f in (
        "--model", "--host", "--port", "--tensor-parallel-size", "-tp",
        "--pipeline-parallel-size", "-pp", "--distributed-executor-backend",
        "--served-model-name", "--max-model-len", "--gpu-memory-utilization", "--dtype")}
    spec.update({"--trust-remote-code": "bool", "--enforce-eager": "bool"})
    opts, positional = parse(argv, spec, normalise_underscores=True)
    if len(positional) > 1:
        raise Fail("unexpected arguments %r" % positional[1:])
    node = Node()
    node.bind(port_of(opts, "--port", 8000), "--port")
    if opts.get("--distributed-executor-backend") == "ray":
        # ray.init() with no address: $RAY_ADDRESS, else the cluster `ray start` left on this node.
        address = os.environ.get("RAY_ADDRESS")
        if not address:
            try:
                with open("/tmp/ray/ray_current_cluster") as f:
                    address = f.read().strip()
            except OSError:
                raise Fail("--distributed-executor-backend ray but no Ray cluster on this node")
        host, port = host_port(address, "Ray address")
        node.connect(host, port, "Ray GCS")
    node.run()


RAY_PORT_FLAGS = ("--port", "--ray-client-server-port", "--dashboard-port",
                  "--dashboard-grpc-port", "--node-manager-port", "--object-manager-port",
                  "--min-worker-port", "--max-worker-port", "--dashboard-agent-listen-port",
                  "--dashboard-agent-grpc-port", "--metrics-export-port",
                  "--runtime-env-agent-port", "--gcs-server-port")


def ray(argv):
    if not argv or argv[0] != "start":
        raise Fail("ray %s: only `ray start` is modelled" % (argv[:1] or ["(nothing)"])[0])
    spec = {f: "value" for f in RAY_PORT_FLAGS + (
        "--address", "--node-ip-address", "--dashboard-host", "--include-dashboard",
        "--worker-port-list", "--num-cpus", "--num-gpus", "--resources", "--temp-dir")}
    spec.update({f: "bool" for f in ("--head", "--block", "--disable-usage-stats")})
    opts, positional = parse(argv[1:], spec)
    if positional:
        raise Fail("unexpected arguments %r" % positional)
    node = Node()
    head = opts.get("--head", False)
    if head == bool(opts.get("--address")):
        raise Fail("ray start needs exactly one of --head and --address")
    if head:
        gcs = port_of(opts, "--port", 6379)
        node.bind(gcs, "--port (GCS)")
        node.bind(port_of(opts, "--ray-client-server-port", 10001), "--ray-client-server-port")
        if opts.get("--include-dashboard", "true").lower() not in ("false", "0"):
            node.bind(port_of(opts, "--dashboard-port", 8265), "--dashboard-port")
            node.bind(port_of(opts, "--dashboard-grpc-port", 0), "--dashboard-grpc-port")
    else:
        host, port = host_port(opts["--address"], "--address")
        node.connect(host, port, "--address (head GCS)")
    for flag in ("--node-manager-port", "--object-manager-port", "--dashboard-agent-grpc-port",
                 "--metrics-export-port", "--runtime-env-agent-port"):
        node.bind(port_of(opts, flag, 0), flag)
    node.bind(port_of(opts, "--dashboard-agent-listen-port", 52365),
              "--dashboard-agent-listen-port")
    if opts.get("--worker-port-list"):
        for p in opts["--worker-port-list"].split(","):
            node.bind(int(p), "--worker-port-list")
    elif "--min-worker-port" in opts or "--max-worker-port" in opts:
        low, high = port_of(opts, "--min-worker-port"), port_of(opts, "--max-worker-port")
        if low is None or high is None or low > high:
            raise Fail("--min-worker-port/--max-worker-port must both be set, min <= max")
        # Worker processes take ports from the block; with every one bound, none is shared.
        for p in range(low, high + 1):
            node.bind(p, "--min-worker-port..--max-worker-port")

    def record_cluster():
        if head:
            os.makedirs("/tmp/ray", exist_ok=True)
            with open("/tmp/ray/ray_current_cluster", "w") as f:
                f.write("127.0.0.1:%d\n" % gcs)

    if opts.get("--block"):
        node.run(record_cluster)
    # Without --block, Ray leaves its daemons running and the command returns once they are up.
    read_end, write_end = os.pipe()
    if os.fork() == 0:
        os.close(read_end)

        def signal_parent():
            record_cluster()
            os.write(write_end, b"up")
            os.close(write_end)

        try:
            node.run(signal_parent)
        except Fail as e:
            emit("fail", error=str(e))
            os._exit(1)
    os.close(write_end)
    answer = os.read(read_end, 16)
    sys.exit(0 if answer == b"up" else 1)


def main():
    global PROG
    name = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    if name == "python3":
        if len(args) >= 2 and args[0] == "-m" and args[1] in (
                "sglang.launch_server", "sglang_router.launch_router",
                "vllm.entrypoints.openai.api_server"):
            PROG, args = args[1], args[2:]
        else:
            os.execv(REAL_PYTHON, [REAL_PYTHON] + args)
    elif name == "vllm":
        if not args or args[0] != "serve":
            raise Fail("vllm %s: only `vllm serve` is modelled" % (args[:1] or [""])[0])
        PROG, args = "vllm serve", args[1:]
    elif name == "ray":
        PROG = "ray start"
    else:
        raise Fail("stand-in called as %r" % name)
    emit("start", argv=sys.argv)
    {"sglang.launch_server": sglang_server,
     "sglang_router.launch_router": sglang_router,
     "vllm.entrypoints.openai.api_server": vllm_server,
     "vllm serve": vllm_server,
     "ray start": ray}[PROG](args)


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        emit("fail", error=str(e))
        sys.stderr.write("stand-in %s (%s): %s\n" % (PROG, POD, e))
        sys.exit(1)
