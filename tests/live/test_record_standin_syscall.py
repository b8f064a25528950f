"""Live recordings of the stand-in NVIDIA driver with real BPF probes (root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.trace.reader import open_trace
from tests.record_helpers import (
    ROOT,
    RUN_S,
    RecorderProc,
    live_skip_reason,
    record_cmd,
    standin_driver_args,
)

pytestmark = [pytest.mark.live]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

DRIVER = standin_driver_args()


def _expected() -> dict[str, Any]:
    from tests.standin.standin import load_expected_json

    return load_expected_json()


def _counts(ioctls: pl.DataFrame) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for dev, name, n in ioctls.group_by("device", "name").len().iter_rows():
        out.setdefault(dev, {})[name] = n
    return out


def _minus(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, Any]:
    out = {d: dict(Counter(v) - Counter(b.get(d, {}))) for d, v in a.items()}
    return {d: v for d, v in out.items() if v}


def _check_files(files: pl.DataFrame, ioctls: pl.DataFrame, exp: dict[str, Any],
                 pid: int) -> dict[str, int]:
    """The `files` rows of one workload run replay to a consistent fd set that ends
    empty (every fd opened, seen or dup'ed is closed once, with ret 0); returns the
    opens per device. Checks the dup of the ctl fd and the early close of the
    second uvm fd."""
    files = files.sort("ts_ns", "fd_op_code", maintain_order=True)
    assert set(files["pid"].to_list()) == {pid} and set(files["comm"].to_list()) == {"workload"}
    live: dict[int, str] = {}
    for r in files.iter_rows(named=True):
        op, dev, fd = r["fd_op"], r["device"], r["fd"]
        if op in ("open", "seen"):
            assert fd not in live and r["new_fd"] is None, r
            assert r["ret"] == (fd if op == "open" else None), r
            live[fd] = dev
        elif op == "dup":
            assert live.get(fd) == dev and r["new_fd"] not in live and r["ret"] == r["new_fd"], r
            live[r["new_fd"]] = dev
        else:
            assert op == "close" and live.pop(fd, None) == dev and r["ret"] == 0, r
    assert live == {}
    dups = files.filter(pl.col("fd_op") == "dup")
    assert dups.height == exp["dups_of_ctl"] and dups["device"].to_list() == ["ctl"]
    dup = dups.row(0, named=True)
    via = ioctls.filter((pl.col("fd") == dup["new_fd"]) & (pl.col("ts_ns") > dup["ts_ns"])
                        & (pl.col("device") == "ctl"))  # fmt: skip
    assert _counts(via) == exp["ioctls_via_dup_fd"]
    # the second uvm fd is closed right after UVM_MM_INITIALIZE, its only ioctl
    mm = ioctls.filter(pl.col("name") == "UVM_MM_INITIALIZE").row(0, named=True)
    after = files.filter((pl.col("fd") == mm["fd"]) & (pl.col("ts_ns") > mm["ts_ns"]))
    close = after.row(0, named=True)
    assert (close["fd_op"], close["device"]) == ("close", "uvm")
    between = ioctls.filter(pl.col("ts_ns").is_between(mm["ts_ns"], close["ts_ns"], "none"))
    assert between.height == 0
    opens = files.filter(pl.col("fd_op") == "open")
    return dict(Counter(opens["device"].to_list()))


def _convert_raw(out: Path) -> None:
    """A `record --raw` trace: readers refuse it until `gputrace convert` decoded
    its raw ioctl parts, which leaves only Parquet parts and says so in the manifest."""
    with pytest.raises(TraceError, match=r"raw parts not decoded yet .*gputrace convert"):
        open_trace(out)
    m = json.loads((out / "manifest.json").read_text())
    assert m["raw_tables"] == {"ioctls": "ioctl_event"}
    raws = sorted((out / "ioctls").glob("part-*.gtraw"))
    assert raws and m["tables"]["ioctls"]["raw_parts"] == len(raws)
    assert not list((out / "ioctls").glob("part-*.parquet"))
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "convert", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=RUN_S)  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = m["tables"]["ioctls"]["raw_records"]
    assert f"{len(raws)} raw parts decoded into {rows} rows of ioctls" in r.stdout
    assert not list((out / "ioctls").glob("part-*.gtraw"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["tables"]["ioctls"] == {"rows": rows, "parts": len(raws)}
    assert m["decode_errors"]["ioctl_events"] == 0 and "converted" in m


@pytest.mark.parametrize("mode", ["decoded", "raw", "spilled"])
def test_record_command_exact(tmp_path: Path, mode: str) -> None:
    """The stand-in workload's every ioctl, mapping, fd and process, exactly; with
    --raw, the same after `gputrace convert`; spilled (the writer thread counted as
    behind from the start, GPUTRACE_SPILL_MIB=0), the same as the recorder decodes
    the spilled parts when the recording ends."""
    from tests.standin.standin import build, mounted_driver

    exp = _expected()
    wl = build().workload
    out = tmp_path / "trace"
    extra = ["--raw"] if mode == "raw" else []
    env = {**os.environ, "GPUTRACE_SPILL_MIB": "0"} if mode == "spilled" else None
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        r = subprocess.run(
            record_cmd(out, "--device-dir", str(dev), *DRIVER, *extra, "--", str(wl), str(dev)),
            cwd=ROOT, capture_output=True, text=True, timeout=RUN_S, env=env,
        )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "DONE" in r.stdout
    if mode == "raw":
        assert "gputrace convert" in r.stderr
        _convert_raw(out)
    if mode == "spilled":
        assert "parts written undecoded while the recorder was behind" in r.stderr
        m = json.loads((out / "manifest.json").read_text())
        assert m["spilled"]["ioctls"] >= 1 and m["raw_tables"] == {"ioctls": "ioctl_event"}
        assert "converted" in m and not list((out / "ioctls").glob("part-*.gtraw"))
    t = open_trace(out)
    assert t.status == "complete"
    assert t.layers[0] == "syscall"  # + "cpu_faults" on x86-64
    assert sum(t.drops.values()) == 0
    assert t.manifest["target"]["mode"] == "command"
    ioctls = t.scan("ioctls").collect()
    assert _counts(ioctls) == exp["ioctls_by_device"]
    assert ioctls.height == exp["ioctls_total"]
    # every part's footer names its commands (decoded, converted or spilled alike)
    commands = schema.IOCTL_COMMANDS
    assert t.part_set("ioctls", commands.key) == sorted(
        {tuple(r) for r in ioctls.select(commands.columns).unique().rows()}, key=repr)
    # one process, the workload, with its exit
    procs = t.scan("processes").collect()
    assert procs.height == 1
    pid = procs["pid"][0]
    assert set(ioctls["pid"].to_list()) == {pid}
    assert procs["exit_code"][0] == 0 and procs["exit_ts_ns"][0] is not None
    assert procs["comm"][0] == "workload"
    # raw request words
    words = exp["cmd_words"]
    for name, cmd in ioctls.select("name", "cmd").unique().iter_rows():
        assert cmd in (words[name], words.get(name + "_NVOS21")), name
    assert (ioctls.filter(pl.col("cmd") == words["RM_ALLOC_NVOS21"]).height
            == exp["rm_alloc_structs"]["NVOS21"])  # fmt: skip
    # memory allocations: handle, class, size, status
    allocs = ioctls.filter(pl.col("name").is_in(["RM_ALLOC", "RM_ALLOC_MEMORY"]))
    by_handle = {row["h_object"]: row for row in allocs.iter_rows(named=True)}
    for m in exp["memory_allocations"]:
        if m["ioctl"] == "RM_DUP_OBJECT":
            dup = ioctls.filter(pl.col("name") == "RM_DUP_OBJECT").row(0, named=True)
            assert dup["h_object"] == m["handle"] and dup["status"] == 0
            continue
        row = by_handle[m["handle"]]
        assert (row["name"], row["h_class"], row["size_bytes"], row["status"]) == (
            m["ioctl"], m["class"], m["size"], m["status"]), m  # fmt: skip
    failed = ioctls.filter(pl.col("status") == exp["failing_status"])
    assert failed.height == exp["failing_allocations"] and failed["name"][0] == "RM_ALLOC"
    # handles of the object tree
    h = exp["handles"]
    for cls, key in ((128, "device"), (8320, "subdevice"), (37105, "vaspace")):
        assert by_handle[h[key]]["h_class"] == cls
    mm = ioctls.filter(pl.col("name") == "UVM_MM_INITIALIZE")
    assert mm["status"].to_list() == [exp["uvm_mm_initialize_status"]]
    ext = exp["uvm_external_ranges"][0]
    mea = ioctls.filter(pl.col("name") == "UVM_MAP_EXTERNAL_ALLOCATION").row(0, named=True)
    assert (mea["va_base"], mea["va_length"], mea["h_object"]) == (
        ext["base"], ext["length"], ext["hMemory"])  # fmt: skip
    assert ioctls.filter(pl.col("device") == "uvm")["status"].is_not_null().all()
    ctrl = ioctls.filter(pl.col("name") == "RM_CONTROL").sort("ts_ns")
    assert ctrl["ctrl_cmd"].to_list() == [c["cmd"] for c in exp["rm_controls"]]
    # mappings: the managed range and the gpu mapping
    maps = t.scan("mappings").collect()
    managed = maps.filter(pl.col("managed"))
    mexp = exp["managed_mmap"]
    assert managed.select("addr", "length", "offset").row(0) == (
        mexp["address"], mexp["length"], mexp["offset"])  # fmt: skip
    gpu_mmaps = maps.filter((pl.col("op") == "mmap") & (pl.col("device") == "gpu"))
    assert gpu_mmaps.height == exp["gpu_mmaps"]["count"]
    assert gpu_mmaps["length"][0] == exp["gpu_mmaps"]["length"]
    # files: opens per device, the dup of the ctl fd, closes of every fd; no "seen" rows
    files = t.scan("files").collect()
    assert _check_files(files, ioctls, exp, pid) == exp["opens"]
    assert files.filter(pl.col("fd_op") == "seen").height == 0
    # the trace is private to its owner
    assert (out.stat().st_mode & 0o777) == 0o700
    for p in out.rglob("*"):
        assert (p.stat().st_mode & 0o077) == 0, p


def test_record_attach_pid_seeds_open_fds(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver, waiting_workload

    exp = _expected()
    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev, waiting_workload(dev) as wl:
        rec = RecorderProc(record_cmd(out, "-p", str(wl.pid), "--device-dir", str(dev), *DRIVER))
        rec.wait_ready()
        rc, _stdout, err = wl.go()
        assert rc == 0, err
        assert rec.wait(timeout=60) == 0, "".join(rec.stderr)
    t = open_trace(out)
    assert t.status == "complete" and sum(t.drops.values()) == 0
    assert t.manifest["target"] == {"mode": "pids", "pids": [wl.pid]}
    ioctls = t.scan("ioctls").collect()
    want = _minus(exp["ioctls_by_device"], exp["ioctls_before_ready"])
    assert _counts(ioctls) == want
    assert set(ioctls["pid"].to_list()) == {wl.pid}
    # the dup'ed fd was open before attaching as well
    assert ioctls.filter(pl.col("name") == "RM_CONTROL").height == exp["ioctls"]["RM_CONTROL"]
    procs = t.scan("processes").collect()
    assert procs["pid"].to_list() == [wl.pid]
    assert procs["start_ts_ns"][0] is None and procs["exit_ts_ns"][0] is not None
    # files: "seen" rows at the start for the fds opened before attaching, the rest live
    files = t.scan("files").collect()
    seen = files.filter(pl.col("fd_op") == "seen")
    assert seen["ts_ns"].to_list() == [t.manifest["start_ts_ns"]] * seen.height
    assert seen["tid"].to_list() == [wl.pid] * seen.height
    assert sorted(seen["device"].to_list()) == ["ctl", "gpu", "uvm"]
    opens = _check_files(files, ioctls, exp, wl.pid)
    assert Counter(opens) + Counter(seen["device"].to_list()) == Counter(exp["opens"])


def test_record_sigkill_leaves_readable_trace(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver, run_workload

    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *DRIVER, "-d", "120"))
        rec.wait_ready()
        run_workload(dev)
        deadline = time.monotonic() + 30
        while not list((out / "ioctls").glob("part-*.parquet")):
            assert time.monotonic() < deadline, "no part written within 30 s"
            time.sleep(0.05)  # polling a condition with a deadline
        rec.proc.send_signal(signal.SIGKILL)
        rec.wait(timeout=30)
    r = subprocess.run([sys.executable, "-m", "gputrace.cli", "info", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["status"] == "recording"
    assert info["rows"]["ioctls"] >= _expected()["ioctls_total"]


def test_record_sigint_completes(tmp_path: Path) -> None:
    from tests.standin.standin import mounted_driver, run_workload

    out = tmp_path / "trace"
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *DRIVER))
        rec.wait_ready()
        run_workload(dev)
        rec.proc.send_signal(signal.SIGINT)
        assert rec.wait(timeout=60) == 0, "".join(rec.stderr)
    t = open_trace(out)
    assert t.status == "complete"
    assert t.manifest["target"] == {"mode": "host"}
    ioctls = t.scan("ioctls").collect()
    assert ioctls.height == _expected()["ioctls_total"]
    assert os.stat(out).st_mode & 0o777 == 0o700


def test_record_in_process_observers_stats_and_a_toy_layer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Recorder.add_observer` sees every table appended, so its rows per table equal
    the trace's, as do `stats().rows`; a toy layer added to the one registration
    table (and nowhere else) takes part in every step, and its manifest fragment
    lands in the trace."""
    from gputrace import schema
    from gputrace.record import recorder as recmod
    from gputrace.record.layers import RECORDER_LAYERS, Due, Layer
    from gputrace.record.recorder import Options, Recorder
    from gputrace.record.session import Session
    from tests.standin.standin import build, mounted_driver

    steps: Counter[str] = Counter()

    class Toy(Layer):
        name = "toy"

        def configure(self, s: Session) -> None:
            steps["configure"] += 1

        def attach(self, s: Session) -> None:
            steps["attach"] += 1

        def seed(self, s: Session) -> None:
            steps["seed"] += 1

        def drain(self, s: Session, due: Due) -> list[tuple[str, Any]]:
            steps[due.value] += 1
            return [("toy:item", due.value)]

        def write(self, s: Session, kind: str, data: Any) -> None:
            steps["write"] += 1

        def manifest(self, s: Session, m: dict[str, Any]) -> dict[str, Any]:
            return {"layers": ["toy"], "toy": {"writes": steps["write"]}}

        def close(self, s: Session) -> None:
            steps["close"] += 1

    monkeypatch.setattr(recmod, "RECORDER_LAYERS", (*RECORDER_LAYERS, Toy))
    wl = build().workload
    out = tmp_path / "trace"
    seen: Counter[str] = Counter()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with mounted_driver(tmp_path, budget=1 << 30) as dev:
        rec = Recorder(Options(output=str(out), device_dir=str(dev), driver_version=DRIVER[1],
                               command=[str(wl), str(dev)]))  # fmt: skip
        rec.add_observer(lambda name, t: seen.update({name: t.num_rows}))
        try:
            assert rec.run() == 0
        finally:
            signal.signal(signal.SIGINT, handlers[0])
            signal.signal(signal.SIGTERM, handlers[1])
    t = open_trace(out)
    rows = {name: t.rows(name) for name in schema.TABLES if t.rows(name)}
    assert dict(seen) == rows and rows["ioctls"] == _expected()["ioctls_total"]
    st = rec.stats()
    assert st.rows == rows and st.observer_errors == 0 and sum(st.decode_errors.values()) == 0
    assert st.drops == t.drops and st.cpu_s > 0 and st.rss_bytes > 0
    assert (steps["configure"], steps["attach"], steps["seed"], steps["close"]) == (1, 1, 1, 1)
    assert steps["final"] == 1 and steps["rotate"] >= 0
    assert steps["write"] == steps["poll"] + steps["rotate"] + steps["final"]
    assert "toy" in t.layers and t.manifest["toy"] == {"writes": steps["write"]}
