# Carries TCP connections made inside a node's network namespace to a UNIX socket, whose other
# end (the test process, in the host's namespace) connects them on to the API server: the
# filesystem is shared across network namespaces, loopback is not.
# usage: relay.py LISTEN_PORT UNIX_SOCKET   (listens on 127.0.0.1:LISTEN_PORT)
import os
import socket
import sys
import threading
import time

port, path = int(sys.argv[1]), sys.argv[2]


# Its parent is the test process (nsenter and unshare exec): a test killed before it could
# stop the relay must not leave it holding a namespace.
def orphaned(parent=os.getppid()):
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


threading.Thread(target=orphaned, daemon=True).start()


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(128)
print("ready", flush=True)
while True:
    conn, _ = listener.accept()
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.connect(path)
    threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()
    threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
