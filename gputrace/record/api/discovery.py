"""Where libcuda is: the files a process maps, the loader cache, `--libcuda PATH`
(the API layer attaches its uprobes to each; gputrace/record/api/libcuda.py)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from gputrace.errors import UsageError
from gputrace.record import elf

_LIB_RE = re.compile(r"^libcuda\.so(\.[\w.]+)?$")


def is_libcuda(path: str) -> bool:
    return bool(_LIB_RE.match(os.path.basename(path.removesuffix(" (deleted)"))))


def check_libcuda(path: str) -> str:
    """`--libcuda PATH`: an existing ELF shared object; returns its absolute path."""
    p = os.path.abspath(path)
    if not os.path.isfile(p):
        raise UsageError(f"--libcuda {path}: no such file")
    try:
        e = elf.read(p, symbols=False)
    except elf.ElfError as err:
        raise UsageError(f"--libcuda {path}: {err}") from None
    if e.e_type != elf.ET_DYN:
        raise UsageError(f"--libcuda {path}: not an ELF shared object")
    return p


def from_maps(pid: int) -> set[str]:
    """libcuda files mapped by `pid`, as paths the recorder can open."""
    out = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and is_libcuda(parts[5]):
                path = parts[5].removesuffix(" (deleted)")
                out.add(path if os.path.exists(path) else f"/proc/{pid}/root{path}")
    return out


def from_ldconfig() -> set[str]:
    exe = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if exe is None:
        return set()
    try:
        r = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    arch = "x86-64" if os.uname().machine == "x86_64" else os.uname().machine
    out = set()
    for line in r.stdout.splitlines():
        name, _, rest = line.strip().partition(" (")
        if is_libcuda(name) and "=>" in rest and (arch in rest or "64" in rest):
            out.add(rest.split("=>", 1)[1].strip())
    return out
