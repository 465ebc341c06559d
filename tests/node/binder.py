# Bind one port and say what the kernel answered: "ok" or the errno's name (EPERM, EADDRINUSE).
# usage: binder.py PORT tcp|udp 4|6|mapped [HOLD_SECONDS]
import errno
import socket
import sys
import time

port, proto, family = int(sys.argv[1]), sys.argv[2], sys.argv[3]
hold = float(sys.argv[4]) if len(sys.argv) > 4 else 0
kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
if family == "4":
    sock, address = socket.socket(socket.AF_INET, kind), ("0.0.0.0", port)
else:
    sock = socket.socket(socket.AF_INET6, kind)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    address = ("::ffff:127.0.0.1" if family == "mapped" else "::", port)
try:
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen()
    print("ok", flush=True)
    time.sleep(hold)
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)), flush=True)
