"""Rows of the processes table without BPF: facts are taken from what the probes kept
of a fork and exec (`proc_starts`, faked here with hand-made entries) and from /proc only
while /proc/PID is still that process; a process gone before the recorder looked keeps
what the probes kept and nothing else; a reused pid never inherits an earlier row."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from gputrace import identity
from gputrace.record import decode, procfs
from gputrace.record.recorder import Options
from gputrace.record.session import Session

HEADER = Path(__file__).resolve().parents[3] / "probes" / "gputrace_events.h"


class Sink:
    """A TraceWriter stand-in that keeps the processes rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.manifest: dict[str, Any] = {}

    def append(self, table: str, data: pa.RecordBatch | pa.Table) -> None:
        if table == "processes":
            self.rows += data.to_pylist()

    def update_manifest(self, **fields: Any) -> None:
        self.manifest.update(fields)


class Table:
    """bcc's view of the `proc_starts` map: Key(pid), [key] -> the raw value."""

    def __init__(self, entries: dict[int, bytes]) -> None:
        self.entries = entries

    @staticmethod
    def Key(pid: int) -> int:  # bcc's name
        return pid

    def __getitem__(self, key: int) -> bytes:
        return self.entries[key]


class Probes:
    def __init__(self, entries: dict[int, bytes]) -> None:
        self.bpf = {"proc_starts": Table(entries)}
        self.raw: dict[str, list[bytes]] = {"proc_events": []}


def entry(fork_ns: int = 0, fork_boot_ns: int = 0, exec_ns: int = 0, cgroup_id: int = 0,
          ppid: int = 0) -> bytes:
    e = np.zeros(1, decode.PROC_START_DTYPE)
    e["fork_ns"], e["fork_boot_ns"], e["exec_ns"] = fork_ns, fork_boot_ns, exec_ns
    e["cgroup_id"], e["ppid"] = cgroup_id, ppid
    return e.tobytes()


def events(*evs: tuple[int, int, int]) -> np.ndarray[Any, Any]:
    """proc_event records from (kind, pid, ts)."""
    ev = np.zeros(len(evs), decode.PROC_DTYPE)
    for i, (kind, pid, ts) in enumerate(evs):
        ev[i]["kind"], ev[i]["pid"], ev[i]["ts_ns"] = kind, pid, ts
        ev[i]["exit_code"], ev[i]["comm"] = 0, b"job"
    return ev


def session(entries: dict[int, bytes] | None = None) -> tuple[Session, Sink, Probes]:
    s = Session(Options(output="unused"), "/dev/", None, [], [], 0)  # type: ignore[arg-type]
    sink, probes = Sink(), Probes(entries or {})
    s.writer, s.probes = sink, probes  # type: ignore[assignment]
    return s, sink, probes


def gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen(["/bin/true"])
    p.wait()
    return p.pid


def mono_to_boot(mono_ns: int) -> int:
    return mono_ns + time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_proc_start_layout_matches_numpy(tmp_path: Path) -> None:
    names = decode.PROC_START_DTYPE.names or ()
    src = tmp_path / "layout.c"
    src.write_text("\n".join([
        "#include <stdio.h>", "#include <stddef.h>", f'#include "{HEADER}"',
        "int main(void) {",
        'printf("size %zu\\n", sizeof(struct proc_start));',
        *[f'printf("{n} %zu\\n", offsetof(struct proc_start, {n}));' for n in names],
        "return 0; }"]))  # fmt: skip
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-DGT_USERSPACE", "-Wall", "-Werror", "-o", str(exe), str(src)],
                   check=True, capture_output=True)  # fmt: skip
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    got = {k: int(v) for k, v in (ln.split() for ln in out.splitlines())}
    fields: dict[str, Any] = dict(decode.PROC_START_DTYPE.fields or {})
    assert got == {"size": decode.PROC_START_DTYPE.itemsize, **{n: fields[n][1] for n in names}}


def test_proc_is_read_only_while_it_is_the_same_process() -> None:
    me = os.getpid()
    start = procfs.start_boot_ns(me)
    assert start is not None and start <= time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    tick = procfs.TICK_NS
    info = procfs.ProcInfo(me)
    # forked at the moment /proc says it started (within a tick): the same process
    assert procfs.read_checked(me, info, fork_boot_ns=start + tick // 2, alive_boot_ns=0)
    assert info.cmdline == procfs.read_info(me).cmdline
    assert info.exe == os.path.realpath(sys.executable)
    # a fork much later than /proc's start: /proc describes another process
    other = procfs.ProcInfo(me)
    assert not procfs.read_checked(me, other, fork_boot_ns=start + 10 * tick, alive_boot_ns=0)
    assert not procfs.read_checked(me, other, fork_boot_ns=start - 10 * tick, alive_boot_ns=0)
    # fork unknown: it must have started no later than a moment it held the pid
    assert not procfs.read_checked(me, other, fork_boot_ns=None, alive_boot_ns=start - 2 * tick)
    assert other.cmdline is None and other.exe is None
    assert procfs.read_checked(me, other, fork_boot_ns=None, alive_boot_ns=start + 2 * tick)
    gone = gone_pid()
    assert not procfs.read_checked(gone, procfs.ProcInfo(gone), fork_boot_ns=None,
                                   alive_boot_ns=1 << 62)  # fmt: skip


def test_a_process_gone_before_the_recorder_looked_keeps_what_the_probes_kept() -> None:
    pid = gone_pid()
    root_id = None
    mount = procfs._cgroup2_mount(procfs.CGROUP2)
    if mount is not None:
        root_id = os.stat(mount).st_ino
    s, _sink, _ = session({pid: entry(fork_ns=100, fork_boot_ns=100, exec_ns=150,
                                      cgroup_id=root_id or 0, ppid=4242)})  # fmt: skip
    info = s.facts(pid, 200)
    assert (info.start_ts_ns, info.ppid) == (100, 4242)
    assert info.exe is None and info.cmdline is None  # /proc is gone: null, never guessed
    assert info.cgroup == ("/" if root_id is not None else None)
    # asked about an instance alive before that fork: the entry is a later process's
    before = s.facts(pid, 50)
    assert before.start_ts_ns is None and before.ppid is None and before.cgroup is None


def test_facts_read_while_alive_serve_the_row_written_after_the_exit() -> None:
    code = "import sys; print(flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code, "job-7"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    try:
        # Popen returns once exec has closed the error pipe, which the kernel does
        # before it lays out the new argument pages: /proc/PID/cmdline may still be
        # empty then. The child's first line says it runs its own image.
        assert child.stdout is not None and child.stdout.readline() == b"\n"
        start = procfs.start_boot_ns(child.pid)
        assert start is not None
        fork_ns = start - (time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns())
        s, sink, probes = session({child.pid: entry(fork_ns=fork_ns, fork_boot_ns=start + 1,
                                                    ppid=os.getpid())})  # fmt: skip
        seen = events((decode.PROC_SEEN, child.pid, fork_ns + 1000))
        probes.raw["proc_events"].append(seen.tobytes())
        s.watch_procs()  # the poll thread, while the child runs
        s.procs_taken()
        assert list(s.early) == [(child.pid, fork_ns + 1000)]
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    s.proc_events(np.concatenate([seen, events((decode.PROC_EXIT, child.pid, fork_ns + 2000))]))
    [row] = sink.rows
    assert row["pid"] == child.pid and row["ppid"] == os.getpid()
    assert row["exe"] == os.path.realpath(sys.executable)
    assert row["cmdline"] == f"{sys.executable} -c {code} job-7"
    assert row["start_ts_ns"] == fork_ns and row["exit_ts_ns"] == fork_ns + 2000
    assert s.early == {} and s.procs == {}


def test_a_reused_pid_gets_a_row_per_instance_and_never_inherits() -> None:
    pid = gone_pid()
    s, sink, _ = session()
    s.early[(pid, 10)] = procfs.ProcInfo(pid, ppid=1, exe="/bin/a", cmdline="a --x",
                                         cgroup="/job-a", start_ts_ns=5)  # fmt: skip
    s.proc_events(events((decode.PROC_SEEN, pid, 10), (decode.PROC_EXIT, pid, 20),
                         (decode.PROC_SEEN, pid, 30), (decode.PROC_EXIT, pid, 40)))  # fmt: skip
    first, second = sink.rows
    assert (first["cmdline"], first["exe"], first["ppid"], first["cgroup"]) == (
        "a --x", "/bin/a", 1, "/job-a")
    assert first["start_ts_ns"] == 5 and first["exit_ts_ns"] == 20
    # the second instance: nothing vouches for anything but its pid and times
    assert (second["cmdline"], second["exe"], second["ppid"], second["cgroup"],
            second["start_ts_ns"]) == (None, None, None, None, None)  # fmt: skip
    assert second["exit_ts_ns"] == 40


def test_exec_replaces_what_was_known_of_the_old_image() -> None:
    pid = gone_pid()
    s, sink, _ = session({pid: entry(fork_ns=3, fork_boot_ns=3, ppid=77)})
    s.early[(pid, 10)] = procfs.ProcInfo(pid, ppid=77, exe="/bin/sh", cmdline="sh -c job",
                                         start_ts_ns=3)  # fmt: skip
    s.early[(pid, 20)] = procfs.ProcInfo(pid, ppid=77, exe="/opt/job", cmdline="/opt/job -n 2",
                                         cgroup="/c", start_ts_ns=3)  # fmt: skip
    s.proc_events(events((decode.PROC_SEEN, pid, 10), (decode.PROC_EXEC, pid, 20),
                         (decode.PROC_EXEC, pid, 30), (decode.PROC_EXIT, pid, 40)))  # fmt: skip
    [row] = sink.rows
    # the second exec was never read from /proc (gone): its image is unknown, not the first's
    assert (row["exe"], row["cmdline"], row["cgroup"]) == (None, None, None)
    assert (row["ppid"], row["start_ts_ns"], row["comm"]) == (77, 3, "job")
    s2, sink2, _ = session()
    s2.early[(pid, 20)] = procfs.ProcInfo(pid, exe="/opt/job", cmdline="/opt/job -n 2")
    s2.proc_events(events((decode.PROC_SEEN, pid, 10), (decode.PROC_EXEC, pid, 20),
                          (decode.PROC_EXIT, pid, 40)))  # fmt: skip
    assert (sink2.rows[0]["exe"], sink2.rows[0]["cmdline"]) == ("/opt/job", "/opt/job -n 2")


def test_cgroup_by_id_finds_a_cgroup_directory(tmp_path: Path) -> None:
    mount = procfs._cgroup2_mount(procfs.CGROUP2)
    if mount is None:
        pytest.skip("no cgroup2 mount")
    assert procfs.cgroup_by_id(os.stat(mount).st_ino) == "/"
    assert procfs.cgroup_by_id(0) is None


def test_a_forked_child_keeps_its_fork_facts_unless_it_execs() -> None:
    pid = gone_pid()
    forked = procfs.ProcInfo(pid, ppid=9, exe="/usr/bin/python3", cmdline="python3 train.py",
                             start_ts_ns=5)  # fmt: skip
    # fork without exec (a worker): the facts read at its fork are its own
    s, sink, _ = session()
    s.early[(pid, 5)] = forked
    s.proc_events(events((decode.PROC_FORK, pid, 5), (decode.PROC_EXIT, pid, 9)))
    assert (sink.rows[0]["cmdline"], sink.rows[0]["start_ts_ns"]) == ("python3 train.py", 5)
    # fork, then exec before the recorder read anything of the new image: unknown, not the old
    s, sink, _ = session()
    s.early[(pid, 5)] = forked
    s.proc_events(events((decode.PROC_FORK, pid, 5), (decode.PROC_EXEC, pid, 7),
                         (decode.PROC_EXIT, pid, 9)))  # fmt: skip
    [row] = sink.rows
    assert (row["exe"], row["cmdline"], row["start_ts_ns"]) == (None, None, 5)
    assert s.early == {}


def test_facts_read_ahead_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrace.record import session as session_mod

    monkeypatch.setattr(session_mod, "EARLY_MAX", 3)
    s, _sink, probes = session()
    pid = os.getpid()
    # seen events of processes whose exit never reaches the recorder: nothing takes them
    probes.raw["proc_events"].append(
        events(*[(decode.PROC_SEEN, pid, ts) for ts in range(1, 9)]).tobytes())
    s.watch_procs()
    assert sorted(s.early) == [(pid, 6), (pid, 7), (pid, 8)]
    # thread creations reach the probe as forks: not read at all
    import threading

    ids: list[int] = []
    t = threading.Thread(target=lambda: ids.append(threading.get_native_id()))
    t.start()
    t.join()
    gate = threading.Event()

    def waits() -> None:
        ids.append(threading.get_native_id())
        gate.wait()

    live = threading.Thread(target=waits)
    live.start()
    try:
        while len(ids) < 2:
            time.sleep(0.01)  # until the thread has told its id
        assert procfs.tgid(ids[1]) == pid and procfs.tgid(pid) == pid
        probes.raw["proc_events"].append(
            events((decode.PROC_FORK, ids[1], 20), (decode.PROC_FORK, ids[0], 21)).tobytes())
        s.watch_procs()
    finally:
        gate.set()
        live.join()
    assert sorted(s.early) == [(pid, 6), (pid, 7), (pid, 8)]
    s.watch_procs()  # nothing new since: nothing read twice
    s.procs_taken()
    assert len(s.early) == 3


def test_late_events_of_an_exited_process_start_no_row() -> None:
    """An exit can be read before its process's last ioctls (another ring; a per-CPU
    batch flushed later): events no later than the exit belong to that process and
    start no second row; a later event of the pid is a new process (pid reused)."""
    pid = 2_000_000_000  # no such process: /proc reads give nothing
    s, sink, _probes = session()
    s.proc_events(events((decode.PROC_SEEN, pid, 100), (decode.PROC_EXIT, pid, 500)))
    assert len(sink.rows) == 1 and sink.rows[0]["exit_ts_ns"] == 500
    # late ioctls, as records (raw path: pids of run starts with their first times)
    s.note_pids(np.array([pid, pid], np.uint32), np.array([450, 499], np.uint64))
    s.note_pids(np.array([pid], np.int32), np.array([500], np.int64))  # the exit's own time
    assert pid not in s.procs
    s.finish_processes()
    assert len(sink.rows) == 1
    # the pid again, after the exit: a new instance, a new row
    s.note_pids(np.array([pid, pid], np.int32), np.array([900, 501], np.int64))
    assert pid in s.procs and pid not in s.gone
    s.finish_processes()
    assert [r["pid"] for r in sink.rows] == [pid, pid]
    assert sink.rows[1]["exit_ts_ns"] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a cgroup: root only")
def test_a_process_gone_unread_keeps_its_container_from_its_cgroup_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probes kept the cgroup id; the cgroup still exists: its path, and the names the
    node's files give, say which container and pod the process was in."""
    mount = procfs._cgroup2_mount(procfs.CGROUP2)
    if mount is None:
        pytest.skip("no cgroup2 mount")
    uid, cid = "0b6c5a2e-1f3d-4c8e-9a7b-2d4e6f8a0c1e", "c0ffee" + "12" * 29
    # under a root of this process's own: no other test's cgroups meet these
    rel = (f"gputrace-test-proc-rows-{os.getpid()}/kubepods.slice/kubepods-besteffort.slice/"
           f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope")
    # kubelet's root is this test's (identity.KUBE_ROOTS_ENV: an unusual node's)
    monkeypatch.setenv(identity.KUBE_ROOTS_ENV, "/" + str(Path(rel).parents[2]))
    (tmp_path / "var/log/pods" / f"ml_trainer-0_{uid}" / "cuda").mkdir(parents=True)
    task = tmp_path / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / cid
    task.mkdir(parents=True)
    (task / "config.json").write_text(
        '{"annotations": {"io.kubernetes.cri.container-name": "cuda"}}')
    want = [mount / Path(rel).parents[i] for i in (3, 2, 1, 0)] + [mount / rel]
    made: list[Path] = []  # removed after, and only those
    try:
        for d in want:
            if not d.is_dir():
                d.mkdir()
                made.append(d)
        pid = gone_pid()
        s = Session(Options(output="unused", kube_root=str(tmp_path)), "/dev/", None, [], [],
                    0)  # type: ignore[arg-type]
        sink, probes = Sink(), Probes({pid: entry(fork_ns=100, fork_boot_ns=100, exec_ns=150,
                                                  cgroup_id=os.stat(want[-1]).st_ino)})
        s.writer, s.probes = sink, probes  # type: ignore[assignment]
        s.proc_events(events((decode.PROC_SEEN, pid, 200), (decode.PROC_EXIT, pid, 300)))
    finally:
        for d in reversed(made):
            with contextlib.suppress(OSError):
                d.rmdir()
    [row] = sink.rows
    assert row["cgroup"] == "/" + rel
    assert {k: row[k] for k in ("container_id", "container_runtime", "pod_uid", "qos_class",
                                "pod_namespace", "pod_name", "container_name")} == {
        "container_id": cid, "container_runtime": "containerd", "pod_uid": uid,
        "qos_class": "besteffort", "pod_namespace": "ml", "pod_name": "trainer-0",
        "container_name": "cuda"}
