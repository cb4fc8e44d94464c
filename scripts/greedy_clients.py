#!/usr/bin/env python3
"""Greedy and slow NBD clients against `ftlab serve`; prints the server's resident memory.

50 clients each announce a 32 MiB write and send 100 bytes of it; then 50 more each send four
32 MiB reads and read none of the replies. Prints the server's VmRSS at start and its peak
(VmHWM) after each group. Usage:

    scripts/greedy_clients.py FTLAB_BINARY SOCKET_PATH [serve flags...]

e.g. `scripts/greedy_clients.py target/release/ftlab /tmp/g.sock --max-connections 200` (the
default limit of 64 connections refuses the last clients).
"""
import socket, struct, sys, time, subprocess, os
if len(sys.argv) < 3:
    sys.exit(__doc__)
binary, sockpath = sys.argv[1], sys.argv[2]
extra = sys.argv[3:]
if os.path.exists(sockpath): os.unlink(sockpath)
srv = subprocess.Popen([binary, "serve", "--no-tcp", "--unix", sockpath, "--set", "capacity.logical_bytes=1073741824"] + extra, stderr=subprocess.PIPE)
while not os.path.exists(sockpath): time.sleep(0.05)
def status(field):
    for l in open(f"/proc/{srv.pid}/status"):
        if l.startswith(field): return int(l.split()[1]) // 1024
def connect():
    s = socket.socket(socket.AF_UNIX); s.connect(sockpath)
    s.recv(18, socket.MSG_WAITALL)
    s.sendall(struct.pack(">I", 3))  # fixed newstyle, no zeroes
    s.sendall(struct.pack(">QII", 0x49484156454F5054, 1, 0))  # EXPORT_NAME ""
    s.recv(10, socket.MSG_WAITALL)
    return s
def req(cmd, cookie, off, length):
    return struct.pack(">IHHQQI", 0x25609513, 0, cmd, cookie, off, length)
base = status("VmRSS:")
conns = []
for i in range(50):
    s = connect(); s.sendall(req(1, i, 0, 32 << 20) + b"\xa5" * 100); conns.append(s)
time.sleep(2)
after_writers = status("VmHWM:")
for i in range(50):
    s = connect()
    for j in range(4): s.sendall(req(0, j, (i * 32 << 20) % (1 << 30), 32 << 20))
    conns.append(s)
time.sleep(3)
after_readers = status("VmHWM:")
print(f"start {base} MiB; peak after 50 slow 32 MiB writers {after_writers} MiB; after 50 more not reading 32 MiB reads {after_readers} MiB")
for s in conns: s.close()
srv.terminate(); srv.wait(timeout=60)
