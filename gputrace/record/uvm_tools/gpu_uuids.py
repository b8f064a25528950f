"""GPU UUIDs: the UVM tools processor table mapped to trace GPU indices, and the
`GPU-xxxxxxxx-...` text form nvidia-smi prints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def processor_map(table: Sequence[bytes] | None, gpu_uuids: dict[bytes, int]) -> dict[int, int]:
    """Tools processor index -> trace GPU index (CPU, index 0, -> -1).

    Processor indices are the driver's ids, not GPU numbers (the single H200 was
    index 1): a GPU maps through its UUID. A GPU whose UUID the trace does not
    know is left out, and the decoder reports its rows with no GPU.
    """
    out = {0: -1}
    if not table:
        return out
    for i, uuid in enumerate(table):
        if i == 0 or not any(uuid):
            continue
        gpu = gpu_uuids.get(bytes(uuid))
        if gpu is not None:
            out[i] = gpu
    return out


def unmapped(table: Iterable[bytes] | None, gpu_uuids: dict[bytes, int]) -> list[str]:
    """UUIDs of GPU processors in the table that no trace GPU has (for the manifest)."""
    if not table:
        return []
    return [format_uuid(u) for i, u in enumerate(table)
            if i and any(u) and bytes(u) not in gpu_uuids]  # fmt: skip


def format_uuid(raw: bytes) -> str:
    """16 bytes -> 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx', as nvidia-smi prints."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_uuid(text: str) -> bytes | None:
    """'GPU-xxxxxxxx-...' -> 16 bytes, or None when it is not a GPU UUID."""
    t = text.strip()
    if t.startswith(("GPU-", "MIG-")):
        t = t[4:]
    h = t.replace("-", "")
    if len(h) != 32:
        return None
    try:
        return bytes.fromhex(h)
    except ValueError:
        return None
