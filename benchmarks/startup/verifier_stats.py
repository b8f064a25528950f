"""What the kernel's verifier does with each cached program's functions: instructions,
instructions processed (the complexity limit is 1,000,000), states, CPU of the load.
Reads the BPF object cache (fill it with one `gputrace record -- true` first; a
cache of one's own: GPUTRACE_BPF_CACHE=DIR); root:

    PYTHONPATH=$PWD python3 benchmarks/startup/verifier_stats.py [--all]

(`--all`: every uprobe_* function too, one per CUDA symbol, all alike.)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gputrace.record import bpf_cache, bpf_object, loader, verifier


def main() -> None:
    bcc = loader.import_bcc()
    d = Path(os.environ.get(bpf_cache.CACHE_ENV, bpf_cache.DEFAULT_DIR))
    skip = () if "--all" in sys.argv else ("uprobe_",)
    print(f"{'program':14} {'function':44} {'insns':>6} {'processed':>10} {'states':>7} "
          f"{'CPU s':>6}")  # fmt: skip
    for p in sorted(d.glob("*.bpfobj.json")):
        doc = json.loads(p.read_bytes())
        entry = bpf_object.Entry.from_json(doc["entry"])
        total = 0.0
        for w in verifier.walks(bcc, entry, skip):
            total += w.cpu_s
            note = "  (not a tracepoint/kprobe program: tp_btf)" if w.processed is None else ""
            processed = "?" if w.processed is None else w.processed
            states = "?" if w.states is None else w.states
            print(f"{doc['what']:14} {w.function[:44]:44} {w.insns:6} {processed:>10} "
                  f"{states:>7} {w.cpu_s:6.2f}{note}")  # fmt: skip
        print(f"{doc['what']:14} {'(all of the above)':44} {'':6} {'':>10} {'':>7} {total:6.2f}")


if __name__ == "__main__":
    main()
