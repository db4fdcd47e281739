"""Python threads that wake each other, for the Python wakers test.

A thread waits on a lock that another releases every 50 ms, and one reads
a pipe that another writes every 50 ms; each under functions of its own.
Prints "ready" once started, and runs until killed.

Usage: pywakers.py PREFIX (threads are named PREFIX-lwait, PREFIX-lrel,
PREFIX-pread, PREFIX-pwrite)
"""

import os
import sys
import threading
import time

PREFIX = sys.argv[1] if len(sys.argv) > 1 else "py"
LOCK = threading.Lock()
LOCK.acquire()
READ, WRITE = os.pipe()


def name_thread(what):
    with open("/proc/self/task/%d/comm" % threading.get_native_id(), "w") as f:
        f.write(PREFIX + "-" + what)


def waiter_inner():
    LOCK.acquire()


def waiter():
    name_thread("lwait")
    while True:
        waiter_inner()


def release_inner():
    try:
        LOCK.release()
    except RuntimeError:
        # Not taken again yet: released already.
        pass


def releaser():
    name_thread("lrel")
    while True:
        time.sleep(0.05)
        release_inner()


def read_inner():
    os.read(READ, 1)


def reader():
    name_thread("pread")
    while True:
        read_inner()


def write_inner():
    os.write(WRITE, b"x")


def writer():
    name_thread("pwrite")
    while True:
        time.sleep(0.05)
        write_inner()


def main():
    for f in (waiter, releaser, reader, writer):
        threading.Thread(target=f, daemon=True).start()
    time.sleep(0.3)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
