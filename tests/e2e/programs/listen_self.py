"""A server without SO_REUSEADDR (socketserver's default) that is also its
own client, holding the connection idle: killed, it leaves the connection
in TIME_WAIT on the listening port for a minute.

    python3 listen_self.py TICKS INTERVAL_MS

Prints "listening PORT", then each tick "tick N port PORT", PORT being
where the listener is now (a restart must give it back its port).  Ends
with "done TICKS".
"""
import socket
import sys
import time


def main() -> int:
    ticks, ms = int(sys.argv[1]), int(sys.argv[2])
    listener = socket.socket()  # (no SO_REUSEADDR)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    print(f"listening {listener.getsockname()[1]}", flush=True)
    for n in range(1, ticks + 1):
        time.sleep(ms / 1000)
        print(f"tick {n} port {listener.getsockname()[1]}", flush=True)
    client.close()
    server.close()
    print(f"done {ticks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
