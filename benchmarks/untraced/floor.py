#!/usr/bin/env python3
"""The dispatch floor: what the kernel charges for running a BPF program that
returns 0 at once on each hook point the recorder uses, which no filter inside
the program can remove. Run as root:  python3 benchmarks/untraced/floor.py MODE
MODE is `tracepoint` (the syscalls:* tracepoints the recorder attaches, and
exceptions:page_fault_user) or `tp_btf` (raw_syscalls sys_enter/sys_exit and
page_fault_user as BTF raw tracepoints). Prints "ready" once attached and
detaches when stdin closes (run.py drives it)."""

from __future__ import annotations

import sys

sys.path.insert(0, "/usr/lib/python3/dist-packages")

from bcc import BPF

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from gputrace.record.bpf_load import attach_tp_btf, load_tp_btf

SYSCALLS = ("ioctl", "openat", "open", "openat2", "close", "dup", "dup2", "dup3",
            "fcntl", "mmap", "munmap")  # fmt: skip


def tracepoint_text() -> str:
    """One null TRACEPOINT_PROBE per hook of gputrace/record/hooks.py."""
    out = [f"TRACEPOINT_PROBE(syscalls, sys_{d}_{s}) {{ return 0; }}"
           for s in SYSCALLS for d in ("enter", "exit")]  # fmt: skip
    out.append("TRACEPOINT_PROBE(syscalls, sys_enter_exit_group) { return 0; }")
    out.append("TRACEPOINT_PROBE(exceptions, page_fault_user) { return 0; }")
    return "\n".join(out)


TP_BTF = """
int null_enter(u64 *ctx) { return 0; }
int null_exit(u64 *ctx) { return 0; }
int null_fault(u64 *ctx) { return 0; }
"""


def main() -> int:
    mode = sys.argv[1]
    if mode == "tracepoint":
        b = BPF(text=tracepoint_text())
    elif mode == "tp_btf":
        b = BPF(text=TP_BTF)
        for fn, tp in (("null_enter", "sys_enter"), ("null_exit", "sys_exit"),
                       ("null_fault", "page_fault_user")):  # fmt: skip
            attach_tp_btf(load_tp_btf(b, fn, tp), tp)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("ready", flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
