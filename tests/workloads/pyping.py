"""Two Python threads passing a byte back and forth through pipes, each
under DEPTH functions of its own: a context switch per pass, every one in
a CPython process (scripts/bench-builds --python). Prints the time per
round trip.

Usage: pyping.py ROUNDS [DEPTH [distinct]]

With PYPING_WAIT=1 in the environment, once both threads are under their
functions it prints "ready" and waits for a line on stdin before it
times anything: a profiler can be started on the process already running
(scripts/bench-builds --python-running).

With `distinct`, the DEPTH functions are each a code object of their own
(level0 ... levelN) rather than one function recursing: as in most real
stacks, where few frames run the same code.
"""

import os
import sys
import threading
import time

ROUNDS = int(sys.argv[1])
DEPTH = int(sys.argv[2]) if len(sys.argv) > 2 else 10
DISTINCT = len(sys.argv) > 3 and sys.argv[3] == "distinct"
A_R, A_W = os.pipe()
B_R, B_W = os.pipe()


def nest(depth, f):
    if depth == 0:
        return f()
    return nest(depth - 1, f)


def chain(depth):
    """DEPTH functions, each compiled on its own, calling the next, then f."""
    call = lambda f: f()
    for i in range(depth):
        ns = {"inner": call}
        exec("def level%d(f):\n    return inner(f)\n" % i, ns)
        call = ns["level%d" % i]
    return call


def echo():
    for _ in range(ROUNDS):
        os.read(A_R, 1)
        os.write(B_W, b"x")


def ping():
    for _ in range(ROUNDS):
        os.write(A_W, b"x")
        os.read(B_R, 1)


def main():
    if DISTINCT:
        t = threading.Thread(target=chain(DEPTH), args=(echo,))
    else:
        t = threading.Thread(target=nest, args=(DEPTH, echo))
    t.start()
    if os.environ.get("PYPING_WAIT") == "1":
        print("ready", flush=True)
        sys.stdin.readline()
    start = time.perf_counter_ns()
    if DISTINCT:
        chain(DEPTH)(ping)
    else:
        nest(DEPTH, ping)
    took = time.perf_counter_ns() - start
    t.join()
    print("%.1f ns/op" % (took / ROUNDS))


if __name__ == "__main__":
    main()
