"""A UDP sender and receiver, each connected to the other.

    python3 net_udp.py send HOST PORT PEER_HOST PEER_PORT TICKS INTERVAL_MS
    python3 net_udp.py receive HOST PORT PEER_HOST PEER_PORT TICKS INTERVAL_MS

The sender sends datagram N (a sequence number and a checksummed payload)
every tick.  The receiver reads only every fifth tick, so several
datagrams wait in its queue whenever a checkpoint comes: they must be
there after a restart, none lost, doubled or changed, still from the
sender's address.  The receiver ends with "done TICKS" once it has
datagram TICKS; the sender sends until the receiver says so ("end").
"""
import hashlib
import socket
import sys
import time


def payload(n: int) -> bytes:
    body = b"%08d" % n + hashlib.sha256(b"%d" % n).digest() * 8
    return body


def fail(text: str) -> int:
    time.sleep(0.3)  # a kill takes the trees one by one
    print(f"FAIL: {text}", file=sys.stderr, flush=True)
    return 3


def main() -> int:
    mode, host, port, peer_host, peer_port, ticks, ms = sys.argv[1:8]
    port, peer_port, ticks, ms = int(port), int(peer_port), int(ticks), int(ms)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, port))
    sock.connect((peer_host, peer_port))
    print("bound", flush=True)
    if mode == "send":
        n = 0
        sock.setblocking(False)
        while True:
            time.sleep(ms / 1000)
            n += 1
            try:
                sock.send(payload(n) if n <= ticks else b"idle")
            except ConnectionRefusedError:
                pass  # the receiver is not up yet, or gone
            while True:  # an ICMP error comes before the data: read past it
                try:
                    if sock.recv(16) == b"end":
                        print(f"done {ticks} sent", flush=True)
                        return 0
                except ConnectionRefusedError:
                    continue
                except BlockingIOError:
                    break
            print(f"tick {min(n, ticks)} sent", flush=True)
    expected, tick = 1, 0
    sock.setblocking(False)
    while expected <= ticks:
        time.sleep(ms / 1000)
        tick += 1
        if tick % 5 == 0:
            while True:
                try:
                    data, src = sock.recvfrom(65536)
                except (BlockingIOError, ConnectionRefusedError):
                    break
                if src != (peer_host, peer_port):
                    return fail(f"datagram from {src}, not from the sender")
                if data == b"idle":
                    continue
                if data != payload(expected):
                    return fail(f"got {data[:8]!r}..., expected datagram {expected}")
                expected += 1
        print(f"tick {tick} received {expected - 1}", flush=True)
    for _ in range(20):
        try:
            sock.send(b"end")
        except ConnectionRefusedError:
            break  # the sender heard an earlier one and is gone (its port answered ICMP)
    print(f"done {ticks} received", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
