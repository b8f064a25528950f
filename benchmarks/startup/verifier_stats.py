"""What the kernel's verifier does with each cached program's functions: instructions,
instructions processed (the complexity limit is 1,000,000), states, CPU of the load.
Reads the BPF object cache (fill it with one `gputrace record -- true` first); root:

    PYTHONPATH=$PWD python3 benchmarks/startup/verifier_stats.py [--all]
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path

from gputrace.record import bpf_cache, bpf_object, loader

TRACEPOINT, KPROBE = 5, 2


def main() -> None:
    bcc = loader.import_bcc()
    d = Path(os.environ.get(bpf_cache.CACHE_ENV, bpf_cache.DEFAULT_DIR))
    show_all = "--all" in sys.argv
    print(f"{'program':14} {'function':44} {'insns':>6} {'processed':>10} {'states':>7} "
          f"{'CPU s':>6}")  # fmt: skip
    for p in sorted(d.glob("*.bpfobj.json")):
        doc = json.loads(p.read_bytes())
        entry = bpf_object.Entry.from_json(doc["entry"])
        cls = bpf_object.make_class(bcc)
        obj = object.__new__(cls)
        obj._init_loaded(entry)
        try:
            for name in entry.functions:
                if not show_all and name.startswith("uprobe_"):
                    continue  # one per CUDA symbol, all alike
                start, size = obj.instructions(name)
                lic = ctypes.create_string_buffer(b"GPL")
                log = ctypes.create_string_buffer(1 << 16)
                attr = bpf_object._ProgAttr(
                    prog_type=TRACEPOINT if name.startswith("tracepoint__") else KPROBE,
                    insn_cnt=size // 8, insns=start, license=ctypes.addressof(lic),
                    prog_name=name.encode()[:15], log_level=4, log_size=len(log),
                    log_buf=ctypes.addressof(log))  # fmt: skip
                t = time.thread_time()
                fd = bpf_object._bpf(5, attr)
                cpu = time.thread_time() - t
                if fd >= 0:
                    os.close(fd)
                last = log.value.decode(errors="replace").strip().splitlines()[-1:]
                words = last[0].split() if last else []
                processed = words[1] if len(words) > 1 else "?"
                states = "?"
                if "total_states" in words:
                    states = words[words.index("total_states") + 1]
                note = "" if fd >= 0 else "  (not a tracepoint/kprobe program: tp_btf)"
                print(f"{doc['what']:14} {name[:44]:44} {size // 8:6} {processed:>10} "
                      f"{states:>7} {cpu:6.2f}{note}")  # fmt: skip
        finally:
            obj.cleanup()


if __name__ == "__main__":
    main()
