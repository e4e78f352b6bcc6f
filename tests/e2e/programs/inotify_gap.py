"""res_inotify_gap.c's rounds (mode epoll), as Python inotify modules do it:
the instance made through ctypes.CDLL("libc.so.6") (which the shim's
inotify_init1 wrapper never sees), events read with os.read.
usage: inotify_gap.py DIR ROUNDS"""
import ctypes
import os
import select
import struct
import sys
import time

IN_CLOSE_WRITE, IN_NONBLOCK, IN_CLOEXEC = 0x8, 0o4000, 0o2000000
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


def fail(text: str) -> None:
    sys.stderr.write(f"FAIL[{os.getpid()}]: {text}\n")
    sys.stderr.flush()
    os._exit(3)


def write_file(path: str) -> None:
    with open(path, "w") as f:
        f.write("x\n")


def main() -> None:
    directory, rounds = sys.argv[1], int(sys.argv[2])
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
    wd = libc.inotify_add_watch(fd, directory.encode(), IN_CLOSE_WRITE)
    if fd < 0 or wd < 0:
        fail(f"inotify: errno {ctypes.get_errno()}")
    ep = select.epoll()
    ep.register(fd, select.EPOLLIN)
    for n in range(1, rounds + 1):
        write_file(f"{directory}/{n}.a")
        write_file(f"{directory}/{n}.b")
        print(f"closed {n}", flush=True)
        while not os.path.exists(f"{directory}/go.{n}"):
            time.sleep(0.005)
        write_file(f"{directory}/{n}.c")
        want = [f"{n}.a", f"{n}.b", f"{n}.c"]
        deadline = time.monotonic() + 5
        while want:
            if time.monotonic() > deadline:
                fail(f"round {n}: still waiting for {want}")
            if not ep.poll(0.2):
                continue
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                continue
            while data:
                ev_wd, mask, _, size = EVENT.unpack_from(data)
                name = data[EVENT.size:EVENT.size + size].rstrip(b"\0").decode()
                if ev_wd != wd or mask != IN_CLOSE_WRITE or not want or name != want[0]:
                    fail(f"round {n}: event wd {ev_wd} mask {mask:#x} name {name!r}, "
                         f"not {want[:1]}")
                want.pop(0)
                data = data[EVENT.size + size:]
        print(f"event {n}", flush=True)
    print(f"done {rounds}", flush=True)


if __name__ == "__main__":
    main()
