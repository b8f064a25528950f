"""Compiled BPF programs kept across recordings on one host (bpf_object.Entry).

clang is most of a recording's start (benchmarks/README.md "Start-up"): each
program is compiled once per host instead, keyed by everything the compile
reads: the program text, the headers of its -I folders, its flags, the kernel
(release and build) and bcc's version. Kept under `GPUTRACE_BPF_CACHE` (default
/var/cache/gputrace/bpf; "off": none; `record --no-cache` turns it off).

As the unwind-table cache (unwind/cache.py): the directory is used only when it
is a real directory owned by the effective user and writable by nobody else; an
entry is used only when it is a regular file of that owner, writable by nobody
else, whose key and content digest match and whose instructions reference only
its own maps (Entry.check); anything else is compiled again and rewritten, never
loaded. Entries are written whole (a temporary file renamed).

A missing entry is compiled in a child process (`compile_entries`), all of a
recording's programs at once, each on its own core, before the layers load them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gputrace.record.bpf_object import Entry, NotCacheable

CACHE_ENV = "GPUTRACE_BPF_CACHE"
DEFAULT_DIR = "/var/cache/gputrace/bpf"
VERSION = 1  # of the entry format and of bpf_object's rules: a change makes new keys
MAX_ENTRY_BYTES = 64 << 20
COMPILE_TIMEOUT_S = 300
# programs that share maps with another bcc module by name stay bcc's (its
# process-wide table registry is not something a cached object can join)
UNCACHED_FLAGS = ("-DGT_CUDA_SHARE", "-DGT_CUDA_EXTERN")
_SUFFIX = ".bpfobj.json"

used: dict[str, str] = {}
"""What each loaded program came from this run: "cache", "compiled (cached now)",
"compiled (…why not cached)": the trace manifest's recorder.bpf_objects."""
fresh: set[str] = set()
"""Keys compile_entries wrote in this process (their loads are "compiled (cached now)")."""


def cache_dir() -> Path | None:
    """The cache directory to use, made if missing; None when off or not safe."""
    where = os.environ.get(CACHE_ENV, DEFAULT_DIR)
    if where == "off" or not where:
        return None
    d = Path(where)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return d


def host() -> dict[str, str]:
    """The compile's environment beyond the text: kernel and bcc."""
    from gputrace.errors import GputraceError
    from gputrace.record import loader

    u = os.uname()
    try:
        bcc_version = str(loader.import_bcc().version.__version__)
    except (GputraceError, AttributeError):
        bcc_version = "?"
    return {"kernel": f"{u.release} {u.version}", "machine": u.machine, "bcc": bcc_version}


def cacheable(flags: list[str]) -> bool:
    return not any(f in UNCACHED_FLAGS for f in flags)


def key(text: str, flags: list[str]) -> str:
    """The entry name of `text` compiled with `flags` on this host."""
    h = hashlib.sha256()
    h.update(json.dumps([VERSION, host(), text, flags]).encode())
    for f in flags:  # headers the text includes (gputrace_events.h stays an include)
        if f.startswith("-I"):
            with contextlib.suppress(OSError):
                for p in sorted(Path(f[2:]).glob("*.h")):
                    h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _digest(entry: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()


def read(d: Path, k: str) -> Entry | None:
    """The entry `k` when it is present and sound; None otherwise (compile again)."""
    path = d / (k + _SUFFIX)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                    or st.st_mode & 0o022 or st.st_size > MAX_ENTRY_BYTES):  # fmt: skip
                return None
            doc = json.loads(f.read())
        if doc.get("v") != VERSION or doc.get("key") != k:
            return None
        if doc.get("sha256") != _digest(doc["entry"]):
            return None
        return Entry.from_json(doc["entry"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def write(d: Path, k: str, entry: Entry, what: str) -> None:
    """Whole or not at all; errors ignored: the cache only saves time."""
    body = entry.to_json()
    doc = {"v": VERSION, "key": k, "what": what, "created": int(time.time()), **host(),
           "sha256": _digest(body), "entry": body}  # fmt: skip
    with contextlib.suppress(OSError):
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(tmp, d / (k + _SUFFIX))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def compile_entries(d: Path, programs: list[tuple[str, list[str], str]]) -> None:
    """Compile the programs (text, flags, what) whose entries are missing or unsound,
    each in a child process, all at once; a child that fails leaves no entry (the
    layer then compiles in the recorder, and its error is reported from there)."""
    children = []
    tree = str(Path(__file__).resolve().parent.parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [tree, *filter(None, [os.environ.get("PYTHONPATH")])])}  # fmt: skip
    keys = []
    for text, flags, what in programs:
        k = key(text, flags)
        if not cacheable(flags) or read(d, k) is not None:
            continue
        keys.append(k)
        p = subprocess.Popen([sys.executable, "-m", "gputrace.record.bpf_cache", str(d), what],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        children.append(p)
        assert p.stdin is not None
        with contextlib.suppress(OSError):
            p.stdin.write(json.dumps({"text": text, "flags": flags}).encode())
            p.stdin.close()
    for p in children:
        try:
            p.wait(COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    fresh.update(k for k in keys if read(d, k) is not None)


def _compile_child(d: Path, what: str) -> int:
    """The child's work: compile the program on stdin with bcc, keep its entry."""
    import ctypes

    from gputrace.record import bpf_object, loader

    doc = json.loads(sys.stdin.buffer.read())
    text, flags = str(doc["text"]), [str(f) for f in doc["flags"]]
    bcc = loader.import_bcc()
    argv = [f.encode() for f in [*flags, "-w"]]
    module = bcc.lib.bpf_module_create_c_from_string(
        text.encode(), 0, (ctypes.c_char_p * len(argv))(*argv), len(argv), True, None)
    if not module:
        return 1
    try:
        entry = bpf_object.extract(module)
    except NotCacheable as e:
        print(f"not cacheable: {e}", file=sys.stderr)
        return 2
    write(d, key(text, flags), entry, what)
    return 0


def state() -> dict[str, Any]:
    """For `doctor` (which changes nothing: the directory is not made here): where
    the cache is, whether it is used, its entries and how many were made on this
    kernel and bcc (older ones are never used again: removing them is safe)."""
    where = os.environ.get(CACHE_ENV, DEFAULT_DIR)
    if where == "off" or not where:
        return {"dir": None, "state": f"off ({CACHE_ENV}=off)"}
    try:
        st = os.lstat(where)
    except OSError:
        return {"dir": where, "state": "empty (made at the first recording)"}
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return {"dir": where, "state": "not used: not a directory of this user, "
                "writable by it alone"}  # fmt: skip
    now = host()
    entries = current = size = 0
    for p in Path(where).glob("*" + _SUFFIX):
        with contextlib.suppress(OSError, ValueError):
            entries += 1
            size += p.stat().st_size
            with open(p, "rb") as f:
                head = json.loads(f.read())
            current += all(head.get(k) == v for k, v in now.items())
    return {"dir": where, "state": "on", "entries": entries, "current": current,
            "bytes": size, **now}  # fmt: skip


if __name__ == "__main__":
    sys.exit(_compile_child(Path(sys.argv[1]), sys.argv[2]))
