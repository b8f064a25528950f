"""Who holds the NVIDIA device files, and what memory does no live process own?

At the end of the trace and at each out-of-memory incident: every live process
holding an NVIDIA device file (`holders`, from the fd replay: replay.py) and the
cases where memory outlives its owner, one plain-words verdict each (`cases`):

- `inherited`: processes forked after another opened the device files hold them
  (and so its RM clients and its CUDA context): who opened them, whether and when
  the opener exited, the memory the driver still charges to the opener (else what
  the trace recorded it holding);
- `zombie`: a pid the driver still lists whose main thread exited alone while its
  other threads ran on (`ps` shows it <defunct>; the threads keep its files and
  memory): the recorder read its threads at the exit (`processes.zombie_threads`);
- `exited`: a pid the driver's accounting still lists after the trace saw it exit,
  and no traced process holds its files (a holder the trace did not see, or a
  zombie the recorder could not read);
- `unseen`: a pid the driver lists that the trace never saw (another PID
  namespace, or a process started before the recording that made no call).

Memory of the `zombie`, `exited` and `unseen` cases, and of `inherited` ones whose opener
exited, is `orphaned_bytes`: memory no live traced process owns. The driver's
figures need the rm_query layer (`gpu_process_memory`); the fd replay the syscall
layer. docs/analyses/holders.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from gputrace.analyses.allocations.held import by_holder, held_pieces
from gputrace.analyses.helpers.common import NS_PER_S
from gputrace.analyses.helpers.identity import IDENTITY, with_identity
from gputrace.analyses.helpers.inputs import Inputs, trace_warnings
from gputrace.analyses.helpers.partition import per_slice
from gputrace.analyses.holders.replay import Holder, replay
from gputrace.analyses.oom import failures, gpu_state
from gputrace.analyses.registry import unrecorded
from gputrace.analyses.report import Report
from gputrace.analyses.report_spec import FleetUse, ReportSpec
from gputrace.units import format_bytes

if TYPE_CHECKING:
    from gputrace.analyses.registry import Context


def _run(ctx: Context) -> Report:
    return holders(ctx.inp)


SPEC = ReportSpec(
    "holders", "holders", "Device-file holders",
    "Who holds the NVIDIA device files, and what GPU memory does no live process own "
    "(children that inherited them, exited or zombie processes, pids of another PID "
    "namespace)?",
    ("syscall", "rm_query"), _run,
    unrecorded_data={"instants": [], "orphaned_bytes": None},
    terminal="gputrace.render.holder_sections:holders_section",
    html=("gputrace.render.holder_html:holders_html",),
    fleet=FleetUse(sums=("orphaned_bytes", "cases")), place=50)
QUESTION = SPEC.question
MAX_PIDS_LISTED = 20
"""Pids a verdict line names (the rest counted)."""
MAX_LISTED = 1000
"""Cases and device-file holders listed per instant, largest first; the rest are
counted and added up (`left_out`). The driver may list 10^5 pids another namespace
runs: every figure still counts them, the report stays readable and bounded
(docs/security.md)."""


def _names(pids: list[int], comm: dict[int, str]) -> str:
    shown = ", ".join(str(p) for p in pids[:MAX_PIDS_LISTED])
    more = f" and {len(pids) - MAX_PIDS_LISTED} more" if len(pids) > MAX_PIDS_LISTED else ""
    kinds = sorted({comm.get(p) or "?" for p in pids})
    many = len(pids) > 1
    what = (kinds[0] + " " if len(kinds) == 1 else "") + ("processes" if many else "process")
    return f"{len(pids)} {what} (pid{'s' if many else ''} {shown}{more})"


class Facts:
    """What every instant reads, read once: processes, the fd replay's inputs, the
    driver's accounting and (when needed) the recorded memory per process."""

    def __init__(self, inp: Inputs) -> None:
        self.inp = inp
        procs = inp.scan("processes").select("pid", "ppid", "comm", "start_ts_ns",
                                             "exit_ts_ns", "zombie_threads").collect()
        self.procs = procs
        self.comm = {int(p): c for p, c in zip(procs["pid"], procs["comm"], strict=True) if c}
        self.exit = {int(p): e for p, e in zip(procs["pid"], procs["exit_ts_ns"], strict=True)
                     if e is not None}
        # threads a pid's main thread left running at its exit (the last such exit)
        self.zombie = {int(p): int(z) for p, e, z in zip(
            procs["pid"], procs["exit_ts_ns"], procs["zombie_threads"], strict=True)
            if e is not None and z and e == self.exit.get(int(p))}
        self.files = (inp.scan("files").select("ts_ns", "pid", "fd_op_code", "fd", "new_fd",
                                               "ret").collect()
                      if inp.has("syscall") else None)
        self.gpus = sorted(int(g) for g in inp.scan("gpu_process_memory").select(
            "gpu_index").unique().collect()["gpu_index"]) if inp.has("rm_query") else []
        self._held: pl.DataFrame | None = None
        # seen: a pid of which the trace holds an event, or whose process facts the
        # recorder read; a row the recorder wrote only because the driver named the
        # pid (nothing readable in /proc) is not
        known = procs.filter(pl.col("comm").is_not_null() | pl.col("start_ts_ns").is_not_null())
        seen = [inp.scan(n).select("pid").unique() for n, layer in (
            ("cuda_calls", "api"), ("ioctls", "syscall"), ("files", "syscall"))
            if inp.has(layer)]
        self.seen = {int(p) for p in known["pid"]} | {
            int(p) for f in pl.collect_all(seen) for p in f["pid"] if p is not None}

    def held_at(self, at_ns: int) -> dict[int, int]:
        """Recorded bytes each pid holds at `at_ns` (the joined model, one figure)."""
        if self._held is None:
            got = per_slice(self.inp, {"h": held_pieces})["h"]
            self._held = pl.concat(got, how="diagonal_relaxed")
        return {int(r["pid"]): int(r["held_bytes"])
                for r in by_holder(self._held, at_ns).iter_rows(named=True)}

    def driver_at(self, at_ns: int, gpu: int | None) -> dict[int, int]:
        """The driver's bytes per pid at `at_ns` (on `gpu`, else every GPU added)."""
        out: dict[int, int] = {}
        for g in self.gpus if gpu is None else [gpu]:
            for pid, b in gpu_state.driver_round(self.inp, g, at_ns)[1].items():
                out[pid] = out.get(pid, 0) + (b or 0)
        return out


def _inherited(f: Facts, at: int, holders: list[Holder], driver: dict[int, int],
               recorded: dict[int, int]) -> list[dict[str, Any]]:
    """One case per opener whose device files other live processes hold at `at`."""
    kids: dict[int, list[int]] = {}
    for h in holders:
        for origin in h.origins:
            if origin != h.pid:
                kids.setdefault(origin, []).append(h.pid)
    out = []
    for origin, pids in sorted(kids.items()):
        gone = f.exit.get(origin)
        exited = gone is not None and gone <= at
        from_driver = origin in driver
        b = driver.get(origin, recorded.get(origin, 0))
        name = f.comm.get(origin) or "?"
        verdict = (f"{_names(pids, f.comm)} forked from {name} (pid {origin}) after it "
                   f"opened the GPU device files ")
        if exited:
            verdict += (f"keep its memory alive: {format_bytes(b)}; {name} exited "
                        f"{(at - int(gone or 0)) / NS_PER_S:,.0f} s ago")
        else:
            verdict += f"share them ({format_bytes(b)}); {name} still runs"
        out.append({"case": "inherited", "pid": origin, "comm": f.comm.get(origin),
                    "holders": pids, "opener_exit_ts_ns": gone if exited else None,
                    "bytes": b, "bytes_from": "driver" if from_driver else "recorded",
                    "orphaned": exited, "verdict": verdict})
    return out


def _listed(f: Facts, at: int, driver: dict[int, int], covered: set[int],
            seen: set[int]) -> list[dict[str, Any]]:
    """One case per pid the driver charges that no live traced process is."""
    out = []
    for pid, b in sorted(driver.items()):
        if pid in covered or b <= 0:
            continue
        gone = f.exit.get(pid)
        if pid not in seen:
            out.append({"case": "unseen", "pid": pid, "comm": None, "holders": [],
                        "opener_exit_ts_ns": None, "bytes": b, "bytes_from": "driver",
                        "orphaned": True,
                        "verdict": f"pid {pid}: the driver charges it {format_bytes(b)}; the "
                                   "trace never saw it (a process of another PID namespace, "
                                   "or one started before the recording that made no call)"})
        elif gone is not None and gone <= at and pid in f.zombie:
            name, n = f.comm.get(pid) or "?", f.zombie[pid]
            out.append({"case": "zombie", "pid": pid, "comm": f.comm.get(pid), "holders": [],
                        "opener_exit_ts_ns": gone, "bytes": b, "bytes_from": "driver",
                        "orphaned": True,
                        "verdict": f"{name} (pid {pid}) is a zombie: its main thread exited "
                                   f"{(at - gone) / NS_PER_S:,.0f} s ago while {n} other "
                                   f"thread{'s' if n > 1 else ''} ran on, keeping its device "
                                   f"files; the driver still charges it {format_bytes(b)} "
                                   "(`ps` shows it <defunct>; ending its threads frees it)"})
        elif gone is not None and gone <= at:
            name = f.comm.get(pid) or "?"
            out.append({"case": "exited", "pid": pid, "comm": f.comm.get(pid), "holders": [],
                        "opener_exit_ts_ns": gone, "bytes": b, "bytes_from": "driver",
                        "orphaned": True,
                        "verdict": f"{name} (pid {pid}) exited {(at - gone) / NS_PER_S:,.0f} s "
                                   f"ago and the driver still charges it {format_bytes(b)}: no "
                                   "traced process holds its device files (a holder the "
                                   "trace did not see, or a zombie whose threads still run)"})
    return out


def instants_report(f: Facts, asked: list[tuple[str, int, int | None]]) -> list[dict[str, Any]]:
    """For each (what, ts_ns, gpu) asked: the device-file holders and the cases."""
    at_list = [t for _w, t, _g in asked]
    replayed = (replay(f.files, f.procs, at_list) if f.files is not None
                else [[] for _ in asked])
    seen = f.seen
    out = []
    for (what, at, gpu), holders in zip(asked, replayed, strict=True):
        driver = f.driver_at(at, gpu)
        openers = {o for h in holders for o in h.origins}
        recorded = f.held_at(at) if openers - set(driver) else {}
        cases = _inherited(f, at, holders, driver, recorded)
        cases += _listed(f, at, driver, {c["pid"] for c in cases}
                         | {h.pid for h in holders}, seen)
        cases.sort(key=lambda c: (-c["bytes"], c["pid"]))
        listed = sorted(holders, key=lambda h: (-(driver.get(h.pid) or 0), h.pid))
        left_out = {"cases": max(0, len(cases) - MAX_LISTED),
                    "cases_bytes": sum(c["bytes"] for c in cases[MAX_LISTED:]),
                    "holders": max(0, len(listed) - MAX_LISTED)}
        out.append({
            "at": what, "ts_ns": at, "t_s": (at - f.inp.start_ns) / NS_PER_S, "gpu_index": gpu,
            "holders": [{"pid": h.pid, "comm": f.comm.get(h.pid), "fds": h.fds,
                         "opened_by": sorted(h.origins), "inherited": set(h.origins) != {h.pid},
                         "driver_bytes": driver.get(h.pid)} for h in listed[:MAX_LISTED]],
            "cases": cases[:MAX_LISTED],
            "orphaned_bytes": sum(c["bytes"] for c in cases if c["orphaned"]),
            "orphaned_pids": sum(1 for c in cases if c["orphaned"]),
            "left_out": left_out,
            "driver_accounting": bool(f.gpus),
        })
    _identity(f.inp, out)
    return out


def _identity(inp: Inputs, out: list[dict[str, Any]]) -> None:
    """Container and pod of each case's pid (the processes table's, where read)."""
    rows = [(i, j, c["pid"], o["ts_ns"]) for i, o in enumerate(out)
            for j, c in enumerate(o["cases"])]
    if not rows:
        return
    frame = pl.LazyFrame(rows, schema={"i": pl.Int64, "j": pl.Int64, "pid": pl.Int32,
                                       "ts_ns": pl.Int64}, orient="row")
    got = with_identity(frame, inp.scan("processes"), at="ts_ns").collect()
    for r in got.iter_rows(named=True):
        out[r["i"]]["cases"][r["j"]].update(
            {k: r[k] for k in IDENTITY if k in ("container_name", "pod_namespace", "pod_name")})


def end_and_incidents(inp: Inputs) -> list[dict[str, Any]]:
    """The instants report at the end of the trace and at each incident."""
    asked: list[tuple[str, int, int | None]] = [("end", inp.end_ns, None)]
    if inp.has("api") or inp.has("syscall") or inp.has("allocator"):
        asked += [("incident", int(i["end_ns"]), i["gpu_index"])
                  for i in failures.incidents(inp)]
    return instants_report(Facts(inp), asked)


def holders(inp: Inputs) -> Report:
    """The holders report."""
    warnings = trace_warnings(inp)
    if (absent := unrecorded(SPEC, inp, warnings)) is not None:
        return absent
    instants = end_and_incidents(inp)
    if not inp.has("rm_query"):
        warnings.append("holders: layer rm_query not recorded: the driver's per-process "
                        "accounting is unknown (exited and unseen pids cannot be told)")
    if not inp.has("syscall"):
        warnings.append("holders: layer syscall not recorded: who holds the device files "
                        "is unknown")
    end = instants[0]
    data = {"instants": instants, "orphaned_bytes": end["orphaned_bytes"],
            "cases": len(end["cases"]) + end["left_out"]["cases"]}
    return Report("holders", QUESTION, True, data, [], warnings)
