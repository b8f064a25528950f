"""TEST STAND-IN Python program for the native unwinder under Python frames:
calls libchain_a.so (chain_libs.c: no frame pointers -> frame pointers -> none ->
the stand-in libcuda) through ctypes from named functions, as PyTorch's
libraries sit below the interpreter's frames.
Usage: python py_chain.py LIB_DIR: loads the chain libraries, prints
"READY PID", waits for a line, makes N_CALLS allocations of 1 MiB, prints
"ALLOCATED", waits for a line (the recorder names code objects while the
process lives), frees them and prints "DONE"."""

import ctypes
import os
import sys

N_CALLS = 2
lib_dir = sys.argv[1]
c = ctypes.CDLL(os.path.join(lib_dir, "libchain_c.so"))
a = ctypes.CDLL(os.path.join(lib_dir, "libchain_a.so"))
a.chain_a.restype = ctypes.c_ulong
a.chain_a.argtypes = [ctypes.c_ulong, ctypes.c_ulong]
c.chain_free.argtypes = [ctypes.c_ulong]


def call_chain(i):
    return a.chain_a(1 << 20, i)  # PLANT: call


def main():
    print(f"READY {os.getpid()}", flush=True)
    sys.stdin.readline()
    if c.chain_init() != 0:
        sys.exit(2)
    ps = []
    for i in range(N_CALLS):  # a loop, not a comprehension: no frame of its own
        ps.append(call_chain(i))  # PLANT: main
    print("ALLOCATED", flush=True)
    sys.stdin.readline()
    for p in ps:
        c.chain_free(p)
    print("DONE", flush=True)


main()  # PLANT: module
