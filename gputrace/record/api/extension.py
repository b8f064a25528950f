"""Other layers' probes compiled into the API layer's program, so that they share its
targets, its Python walk and its native walk (the torch_allocator layer's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Extension:
    """Another layer's BPF text (appended to cuda.bpf.c's), its compiler flags, and
    the probes it wants on every libcuda the API layer attaches to: (symbol, entry
    function or "", return function or "")."""

    source: str
    cflags: list[str]
    libcuda_probes: tuple[tuple[str, str, str], ...] = ()


def attach_extra(bpf: Any, path: str, shown: str, exported: set[str], ext: Extension,
                 skipped: list[dict[str, str]]) -> list[str]:
    """Attach `ext`'s libcuda probes to `path`; returns the hooks attached (the
    manifest's names, the function after the hook), a failure goes to `skipped`."""
    done: list[str] = []
    for sym, entry, ret in ext.libcuda_probes:
        if sym not in exported:
            continue
        for kind, fn in (("uprobe", entry), ("uretprobe", ret)):
            if not fn:
                continue
            name = f"{kind}:{sym}@{shown} ({fn})"
            try:
                if kind == "uprobe":
                    bpf.attach_uprobe(name=path, sym=sym, fn_name=fn)
                else:
                    bpf.attach_uretprobe(name=path, sym=sym, fn_name=fn)
            except Exception as e:  # bcc raises a bare Exception
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                skipped.append({"name": name, "reason": f"attach failed: {first}"})
                continue
            done.append(name)
    return done
