"""The recorder's layers, registered in one table.

`RECORDER_LAYERS` is the one registration: each entry is a `Layer` class whose `BUFFERS`
maps the work items it hands the writer thread (buffer -> table, record dtype,
decoder). The recorder runs every step over these in this order (the syscall
layer loads the program the cpu_faults layer reads; the driver layer attaches
trackers from the UVM_INITIALIZEs the syscall layer collected; the torch_allocator
layer's probes are compiled into the API layer's program, so it is built before it).
Adding a layer is its package and one entry here (its tables: one line in
`schema.CATALOG_MODULES`); `doctor`, the schema docs, `info`, the writer and the tests
take it from there (docs/record.md, "Layers").
"""

from __future__ import annotations

from gputrace.record.api.layer import ApiLayer
from gputrace.record.cpu_faults.layer import CpuFaultsLayer
from gputrace.record.driver_layer.layer import DriverLayer
from gputrace.record.layer import Buffer, Due, Layer
from gputrace.record.syscall.layer import SyscallLayer
from gputrace.record.torch_allocator.layer import TorchAllocatorLayer

RECORDER_LAYERS: tuple[type[Layer], ...] = (SyscallLayer, CpuFaultsLayer, TorchAllocatorLayer,
                                            ApiLayer, DriverLayer)


def buffer_table() -> dict[str, tuple[type[Layer], Buffer]]:
    """Every work item kind with a decoder: kind -> (layer, Buffer)."""
    out: dict[str, tuple[type[Layer], Buffer]] = {}
    for cls in RECORDER_LAYERS:
        for kind, buf in cls.BUFFERS.items():
            assert kind not in out, f"two layers hand over {kind!r}"
            out[kind] = (cls, buf)
    return out


__all__ = ["RECORDER_LAYERS", "Buffer", "Due", "Layer", "buffer_table"]
