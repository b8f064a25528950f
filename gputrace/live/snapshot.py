"""What a snapshot of a live recording shows: processes (live bytes, rates, growth),
GPUs (free memory, fragmentation) and the recording's own counters, copied at one
instant for the view, the metrics endpoint and the alert evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ProcView:
    """A process as a snapshot shows it (rates per second)."""

    pid: int
    comm: str
    live: dict[tuple[str, int | None], int]
    held_bytes: int
    allocations: dict[str, int]
    frees: dict[str, int]
    gpu_faults: int
    cpu_faults: int
    migrations: int
    growth_bytes_per_s: float
    alloc_rate: float
    free_rate: float
    gpu_fault_rate: float
    migration_rate: float
    who: tuple[str, str, str] = ("", "", "")
    """(namespace, pod, container) of its Kubernetes pod and container (gputrace.identity
    `Identity.labels`), empty when none."""


@dataclass(frozen=True)
class GpuView:
    index: int
    heap_bytes: int | None
    free_bytes: int | None
    largest_free_bytes: int | None
    ts_ns: int

    @property
    def fragmentation(self) -> float | None:
        """Share of free memory no single allocation can use: 1 - largest free / free
        (the offline report's `unusable_share`)."""
        if not self.free_bytes or self.largest_free_bytes is None:
            return None
        return max(0.0, 1.0 - self.largest_free_bytes / self.free_bytes)


@dataclass(frozen=True)
class Snapshot:
    """Everything the view, the metrics and the alerts read, copied at `ts_ns`."""

    ts_ns: int
    procs: list[ProcView]
    gpus: list[GpuView]
    ioctls: dict[str, int]
    ioctl_latency: dict[str, tuple[list[int], float]]  # name -> (bucket counts, sum s)
    gpu_faults: dict[tuple[int | None, str], int]  # (gpu, source)
    fault_batches: dict[int | None, int]
    migrations: dict[str, tuple[int, int]]  # cause -> (count, bytes)
    cpu_faults: int
    rows: dict[str, int]
    drops: dict[str, int]
    decode_errors: dict[str, int]
    cpu_seconds: float
    rss_bytes: int
    alerts: dict[str, int]
    exited: int
    ooms: dict[tuple[int | None, str], int] = field(default_factory=dict)  # (gpu, verdict)
    orphaned: dict[int, int] = field(default_factory=dict)
    """Per GPU, the video memory the driver's latest per-process accounting charges to
    pids no live traced process has: exited (their memory kept alive by a child that
    inherited the descriptors, or a zombie) or never seen (another PID namespace, or
    started before the recording). docs/analyses/holders.md."""

    @property
    def drops_total(self) -> int:
        return sum(self.drops.values())
