"""Generate a large synthetic trace for benchmarking `gputrace analyze` (vectorized).

    python benchmarks/analyze/gen.py OUT --events 10_000_000

Event mix (rows): 60 % ioctls (RM_ALLOC/RM_FREE pairs of vidmem with handles
reused from a small pool per process, 1 % never freed, plus RM_CONTROL noise),
25 % cuda_calls (cuMemAlloc/cuMemFree pairs, pointers reused), 10 % GPU
faults, 3 % migrations, 2 % PMM chunk events. Written in 1 M-row batches, so
memory stays flat whatever the size. The manifest says `"synthetic": true`; the
ioctls parts carry their command set in the footer, as the recorder's do
(`schema.IOCTL_COMMANDS`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from gputrace import schema
from gputrace.trace.writer import TraceWriter

T0 = 1_000_000_000_000
STEP_NS = 1_000  # one event per microsecond
PIDS = 64
POOL = 4096  # handles per process, reused
BATCH = 1_000_000


def _table(name: str, cols: dict[str, object], n: int) -> pa.Table:
    t = schema.table(name)
    arrays = []
    for c in t.columns:
        v = cols.get(c.name)
        if v is None:
            arrays.append(pa.nulls(n, c.type))
        elif isinstance(v, str):
            arrays.append(pa.array(np.full(n, v), c.type))
        else:
            arrays.append(pa.array(v, c.type))
    tbl = pa.Table.from_arrays(arrays, schema=t.arrow_schema)
    for ps in t.part_sets:  # as the recorder's decoder: the footer set (schema.PartSet)
        rows = tbl.group_by(list(ps.columns)).aggregate([]).to_pylist()
        tbl = tbl.replace_schema_metadata({**(tbl.schema.metadata or {}), ps.key.encode():
                                           ps.encode([r[c] for c in ps.columns] for r in rows)})
    return tbl


def rm_batch(start: int, n_pairs: int, rng: np.random.Generator) -> pa.Table:
    """n_pairs RM objects (alloc + free rows), instance ids start..start+n_pairs."""
    i = np.arange(start, start + n_pairs, dtype=np.int64)
    pid = (i % PIDS).astype(np.int32) + 1000
    handle = (0xC0000000 + (i // PIDS) % POOL).astype(np.uint32)
    client = (0xC1D00000 + pid.astype(np.int64)).astype(np.uint32)
    t_alloc = T0 + i * STEP_NS
    t_free = t_alloc + PIDS * (POOL // 2) * STEP_NS  # freed before the handle comes back
    freed = rng.random(n_pairs) >= 0.01
    size = (rng.integers(1, 512, n_pairs) * 65536).astype(np.uint64)
    n_free = int(freed.sum())
    n = n_pairs + n_free
    cols: dict[str, object] = {
        "ts_ns": np.concatenate([t_alloc, t_free[freed]]),
        "pid": np.concatenate([pid, pid[freed]]),
        "tid": np.concatenate([pid, pid[freed]]),
        "comm": "bench", "device_code": np.ones(n, np.uint8), "device": "ctl",
        "fd": np.full(n, 3, np.int32),
        "cmd": np.concatenate([np.full(n_pairs, 0xC030462B), np.full(n_free, 0xC0104629)]),
        "nr": np.concatenate([np.full(n_pairs, 0x2B), np.full(n_free, 0x29)]),
        "name": pa.array(np.concatenate([np.full(n_pairs, "RM_ALLOC"),
                                         np.full(n_free, "RM_FREE")])),
        "ret": np.zeros(n, np.int64), "status": np.zeros(n, np.uint32),
        "latency_ns": rng.lognormal(8.0, 0.6, n).astype(np.int64),
        "h_client": np.concatenate([client, client[freed]]),
        "h_parent": np.concatenate([client, client[freed]]),
        "h_object": np.concatenate([handle, handle[freed]]),
        "h_class": np.concatenate([np.full(n_pairs, 0x40, np.uint32),
                                   np.zeros(n_free, np.uint32)]),
        "size_bytes": pa.array(np.concatenate([size, np.zeros(n_free, np.uint64)]),
                               pa.uint64()),
    }
    return _table("ioctls", cols, n)


def control_batch(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    pid = (i % PIDS).astype(np.int32) + 1000
    return _table("ioctls", {
        "ts_ns": T0 + i * STEP_NS + 500, "pid": pid, "tid": pid, "comm": "bench",
        "device_code": np.full(n, 2, np.uint8), "device": "gpu",
        "gpu_index": (i % 8).astype(np.int16), "fd": np.full(n, 5, np.int32),
        "cmd": np.full(n, 0xC020462A), "nr": np.full(n, 0x2A), "name": "RM_CONTROL",
        "ret": np.zeros(n, np.int64), "status": np.zeros(n, np.uint32),
        "latency_ns": rng.lognormal(7.0, 0.8, n).astype(np.int64)}, n)


def cuda_batch(start: int, n_pairs: int, rng: np.random.Generator) -> pa.Table:
    i = np.arange(start, start + n_pairs, dtype=np.int64)
    pid = (i % PIDS).astype(np.int32) + 1000
    ptr = (0x7F0000000000 + ((i // PIDS) % POOL) * (1 << 21)).astype(np.uint64)
    t_alloc = T0 + i * STEP_NS + 250
    t_free = t_alloc + PIDS * (POOL // 2) * STEP_NS
    freed = rng.random(n_pairs) >= 0.01
    nf = int(freed.sum())
    n = n_pairs + nf
    return _table("cuda_calls", {
        "ts_ns": np.concatenate([t_alloc, t_free[freed]]),
        "pid": np.concatenate([pid, pid[freed]]), "tid": np.concatenate([pid, pid[freed]]),
        "comm": "bench",
        "func": pa.array(np.concatenate([np.full(n_pairs, "cuMemAlloc_v2"),
                                         np.full(nf, "cuMemFree_v2")])),
        "size_bytes": np.concatenate([(rng.integers(1, 256, n_pairs) * 4096).astype(np.uint64),
                                      np.zeros(nf, np.uint64)]),
        "ptr": np.concatenate([ptr, ptr[freed]]), "result": np.zeros(n, np.int32),
        "latency_ns": rng.lognormal(9.0, 0.5, n).astype(np.int64)}, n)


def faults_batch(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    addr = (0x7E0000000000 + rng.integers(0, 1 << 34, n)).astype(np.uint64)
    return _table("faults", {
        "ts_ns": T0 + i * STEP_NS * 6, "pid": (i % PIDS).astype(np.int32) + 1000,
        "source_code": np.full(n, 2, np.uint8), "source": "gpu_replayable",
        "gpu_index": (i % 8).astype(np.int16), "address": addr,
        "block_2m": addr & ~np.uint64((1 << 21) - 1),
        "fault_type_code": np.ones(n, np.uint8), "fault_type": "invalid_pte",
        "access_type_code": np.ones(n, np.uint8), "access_type": "read",
        "instances": np.ones(n, np.uint16), "batch_id": (i // 256).astype(np.uint32)}, n)


def migrations_batch(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    src = (i % 2).astype(np.int16)
    return _table("migrations", {
        "ts_ns": T0 + i * STEP_NS * 20, "pid": (i % PIDS).astype(np.int32) + 1000,
        "src": src, "dst": (1 - src).astype(np.int16),
        "address": (0x7E0000000000 + rng.integers(0, 1 << 14, n) * (1 << 21)).astype(np.uint64),
        "size_bytes": np.full(n, 1 << 21, np.uint64), "cause_code": np.ones(n, np.uint8),
        "cause": "replayable_fault", "duration_ns": np.full(n, 50_000, np.int64)}, n)


def chunks_batch(start: int, n: int, rng: np.random.Generator) -> pa.Table:
    i = np.arange(start, start + n, dtype=np.int64)
    op = np.where(i % 2 == 0, 1, 2).astype(np.uint8)  # alloc, then free of the same chunk
    slot = (i // 2) % 200_000
    return _table("chunks", {
        "ts_ns": T0 + i * STEP_NS * 30, "gpu_index": (slot % 8).astype(np.int16),
        "chunk_op_code": op, "chunk_op": pa.array(np.where(op == 1, "alloc", "free")),
        "address": (slot * 65536).astype(np.uint64), "log2_size": np.full(n, 16, np.uint8),
        "mem_type_code": np.zeros(n, np.uint8), "mem_type": "user"}, n)


def generate(out: str, events: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    share = {"rm": 0.40, "ctl": 0.20, "cuda": 0.25, "faults": 0.10, "mig": 0.03, "chunks": 0.02}
    end = T0 + int(events * STEP_NS * 1.1)
    w = TraceWriter(out, force=True, rotate_rows=4_000_000, manifest={
        "synthetic": True, "layers": ["syscall", "api", "driver"], "start_ts_ns": T0,
        "end_ts_ns": end, "drops": {}, "target": {"mode": "synthetic-benchmark"},
        "gpus": [{"index": g, "memory_bytes": 80 << 30} for g in range(8)]})
    makers = {"rm": (rm_batch, 2), "ctl": (control_batch, 1), "cuda": (cuda_batch, 2),
              "faults": (faults_batch, 1), "mig": (migrations_batch, 1),
              "chunks": (chunks_batch, 1)}
    for kind, frac in share.items():
        fn, rows_per = makers[kind]
        todo = int(events * frac) // rows_per
        table = {"rm": "ioctls", "ctl": "ioctls", "cuda": "cuda_calls", "faults": "faults",
                 "mig": "migrations", "chunks": "chunks"}[kind]
        for s in range(0, todo, BATCH):
            w.append(table, fn(s, min(BATCH, todo - s), rng))
    w.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--events", type=lambda s: int(s.replace("_", "")), default=10_000_000)
    a = ap.parse_args()
    t = time.perf_counter()
    generate(a.out, a.events)
    print(f"{a.events:,} events -> {a.out} in {time.perf_counter() - t:.1f} s")
