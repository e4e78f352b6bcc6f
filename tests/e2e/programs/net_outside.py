"""A client of a server that is not under control.

    python3 net_outside.py HOST PORT TICKS INTERVAL_MS

Each tick sends "ping N" and expects the server's echo; prints "tick N echo"
while the connection works and "tick N closed" once it is gone (at a
restart, a connection that led out of the computation comes back closed).
A wrong echo is a FAIL (exit 3).  Ends with "done TICKS".
"""
import socket
import sys
import time


def main() -> int:
    host, port, ticks, ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    sock = socket.create_connection((host, port))
    stream = sock.makefile("rwb", buffering=0)
    closed = False
    for n in range(1, ticks + 1):
        time.sleep(ms / 1000)
        if not closed:
            try:
                sock.sendall(b"ping %d\n" % n)
                line = stream.readline()
            except OSError:
                line = b""
            if not line.endswith(b"\n"):  # end of file, maybe inside a line
                closed = True
            elif line != b"ping %d\n" % n:
                print(f"FAIL: echo {line!r} for ping {n}", file=sys.stderr, flush=True)
                return 3
        print(f"tick {n} {'closed' if closed else 'echo'}", flush=True)
    print(f"done {ticks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
