# Open COUNT outgoing TCP connections to a listener on loopback (the kernel picks each source
# port from net.ipv4.ip_local_port_range, skipping net.ipv4.ip_local_reserved_ports) and print
# how many source ports fell in FIRST-LAST.
# usage: ephemeral.py COUNT FIRST LAST
import resource
import socket
import sys

count, first, last = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
# One descriptor per connection kept open (the accepted ends are closed at once), as root may
# raise its own limit.
need = count + 64
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(need, soft), max(need, hard)))
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4096)
address = listener.getsockname()
clients, inside = [], 0
for _ in range(count):
    c = socket.create_connection(address)
    clients.append(c)
    listener.accept()[0].close()
    if first <= c.getsockname()[1] <= last:
        inside += 1
print(inside, flush=True)
