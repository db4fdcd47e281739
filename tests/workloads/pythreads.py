"""Threads blocked in known Python functions, for the Python frame tests.

Each thread names itself (its comm, as the profiler shows it) and blocks
under two functions of its own: in time.sleep, a socket read, a queue, a
lock, and one through a C builtin that calls back into Python (sorted's
key function) and blocks there; one more blocks under a function recursing
(the same code object in four frames), and one under such a function sleeps
20 ms again and again (walked at its switches, not only by the iterators).
One more ("alternate") sleeps 2 ms at three places by turns, from the same
native stack and the same place of its data stack: in alt_b, and at two
lines of alt_a (the places are the lines marked "# alternate").
Once all are blocked, the program writes
what it sees of itself (sys._current_frames(), by native thread id) as
JSON to the file given, prints "ready", and stays blocked until killed.

Usage: pythreads.py OUT.json [PREFIX]

Threads are named PREFIX-sleep, PREFIX-recv, ... (PREFIX: py).
"""

import json
import os
import queue
import socket
import sys
import threading
import time

FOREVER = 3600


PREFIX = sys.argv[2] if len(sys.argv) > 2 else "py"


def name_thread(what):
    comm = PREFIX + "-" + what
    with open("/proc/self/task/%d/comm" % threading.get_native_id(), "w") as f:
        f.write(comm)


def sleep_inner():
    time.sleep(FOREVER)


def sleep_outer():
    name_thread("sleep")
    sleep_inner()


def recv_inner(sock):
    sock.recv(1)


def recv_outer(sock):
    name_thread("recv")
    recv_inner(sock)


def queue_inner(q):
    q.get()


def queue_outer(q):
    name_thread("queue")
    queue_inner(q)


def lock_inner(lock):
    lock.acquire()


def lock_outer(lock):
    name_thread("lock")
    lock_inner(lock)


def recurse(n):
    # The same code object in several frames of one stack.
    if n == 0:
        time.sleep(FOREVER)
    recurse(n - 1)


def recurse_outer():
    name_thread("recurse")
    recurse(3)


def tick(n):
    # The same, blocking again and again: walked at each switch.
    if n == 0:
        while True:
            time.sleep(0.02)
    tick(n - 1)


def tick_outer():
    name_thread("tick")
    tick(3)


def alt_a(first):
    if first:
        time.sleep(0.002)  # alternate
    else:
        time.sleep(0.002)  # alternate


def alt_b():
    time.sleep(0.002)  # alternate


def alternate_outer():
    name_thread("alternate")
    i = 0
    while True:
        if i % 3 == 0:
            alt_b()
        else:
            alt_a(i % 3 == 1)
        i += 1


class Sorter:
    def key_wait(self, x):
        time.sleep(FOREVER)
        return x

    def key(self, x):
        return self.key_wait(x)

    def sort_inner(self):
        return sorted([3, 1, 2], key=self.key)

    def sort_outer(self):
        name_thread("sort")
        self.sort_inner()


def code_name(code):
    return getattr(code, "co_qualname", code.co_name)


def main():
    out = sys.argv[1]
    a, b = socket.socketpair()
    q = queue.Queue()
    lock = threading.Lock()
    lock.acquire()
    threads = [
        threading.Thread(target=sleep_outer, daemon=True),
        threading.Thread(target=recv_outer, args=(a,), daemon=True),
        threading.Thread(target=queue_outer, args=(q,), daemon=True),
        threading.Thread(target=lock_outer, args=(lock,), daemon=True),
        threading.Thread(target=Sorter().sort_outer, daemon=True),
        threading.Thread(target=recurse_outer, daemon=True),
        threading.Thread(target=tick_outer, daemon=True),
        threading.Thread(target=alternate_outer, daemon=True),
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    seen = {}
    for ident, frame in sys._current_frames().items():
        frames = []
        while frame is not None:
            frames.append(
                {
                    "function": code_name(frame.f_code),
                    "file": frame.f_code.co_filename,
                    "line": frame.f_lineno,
                }
            )
            frame = frame.f_back
        native = next(
            (t.native_id for t in threading.enumerate() if t.ident == ident), None
        )
        seen[str(native)] = frames
    with open(out + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "version": list(sys.version_info[:3]), "threads": seen}, f)
    os.rename(out + ".tmp", out)
    print("ready", flush=True)
    name_thread("main")
    main_wait(threading.Event())


def main_wait(event):
    event.wait()


if __name__ == "__main__":
    main()
