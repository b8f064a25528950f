"""The terminal view of `record --live` / `gputrace top`: what each process and
GPU holds now and how fast it changes, redrawn once a second from the running
aggregates (never from Parquet). Keys: b (sort by live bytes), g (growth),
a (allocation rate), f (GPU fault rate), p (pid), q (quit: stops the recording
as Ctrl-C does). It renders; the numbers come computed from the snapshot.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gputrace.live.aggregates import NS
from gputrace.live.snapshot import ProcView, Snapshot
from gputrace.render.safe import printable
from gputrace.units import format_bytes

REFRESH_S = 1.0
SORTS: dict[str, tuple[str, Callable[[ProcView], Any]]] = {
    "b": ("held", lambda p: (-p.held_bytes, p.pid)),
    "g": ("growth", lambda p: (-p.growth_bytes_per_s, p.pid)),
    "a": ("allocs/s", lambda p: (-p.alloc_rate, p.pid)),
    "f": ("GPU faults/s", lambda p: (-p.gpu_fault_rate, p.pid)),
    "p": ("pid", lambda p: p.pid),
}
MAX_ROWS = 30


def _rate(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def _layer(p: ProcView, layer: str) -> str:
    n = sum(v for (lay, _g), v in p.live.items() if lay == layer)
    return format_bytes(n) if n or layer in {lay for lay, _ in p.live} else "-"


def render(snap: Snapshot, sort: str = "b", started_ns: int | None = None) -> Group:
    """The whole screen for one snapshot, processes sorted by `sort` (a key of SORTS)."""
    label, key = SORTS.get(sort, SORTS["b"])
    up = "" if started_ns is None else f"  up {(snap.ts_ns - started_ns) / NS:,.0f} s"
    events = sum(snap.rows.values())
    head = Text.assemble(
        ("gputrace live", "bold"), up,
        f"  events {events:,}  drops {snap.drops_total:,}  alerts {sum(snap.alerts.values())}",
        f"  sort: {label}   keys: b g a f p  q quit",
    )  # fmt: skip
    gpus = Table(title="GPUs", title_justify="left", expand=False)
    for c in ("GPU", "free", "largest free", "heap", "fragmentation"):
        gpus.add_column(c, justify="right")
    for g in snap.gpus:
        frag = g.fragmentation
        gpus.add_row(str(g.index), *(format_bytes(v) if v is not None else "-"
                                      for v in (g.free_bytes, g.largest_free_bytes,
                                                g.heap_bytes)),
                     "-" if frag is None else f"{frag:.3f}")  # fmt: skip
    procs = Table(title="Processes", title_justify="left", expand=False)
    # held: the one figure (the joined model: each piece once); the layer columns are a
    # breakdown beside it, each at most the figure's pieces it saw, never added to it
    for c in ("PID", "COMM", "held", "api layer", "rm layer", "uvm layer", "allocs", "frees",
              "allocs/s",
              "frees/s", "GPU faults/s", "migr/s", "growth/min"):
        # numbers are never cut: narrow terminals lose the name's tail first
        procs.add_column(c, justify="left" if c == "COMM" else "right", no_wrap=True,
                         min_width=None if c == "COMM" else max(len(c), 7))
    rows = sorted(snap.procs, key=key)
    for p in rows[:MAX_ROWS]:
        procs.add_row(
            str(p.pid), printable(p.comm)[:16], format_bytes(p.held_bytes), _layer(p, "api"),
            _layer(p, "rm"), _layer(p, "uvm"),
            str(sum(p.allocations.values())), str(sum(p.frees.values())), _rate(p.alloc_rate),
            _rate(p.free_rate), _rate(p.gpu_fault_rate), _rate(p.migration_rate),
            format_bytes(p.growth_bytes_per_s * 60),
        )  # fmt: skip
    growing = sorted((p for p in snap.procs if p.growth_bytes_per_s > 0),
                     key=lambda p: (-p.growth_bytes_per_s, p.pid))[:5]
    grow = Text("top growing: " + ("  ".join(
        f"{p.pid} {printable(p.comm)[:16]} +{format_bytes(p.growth_bytes_per_s * 60)}/min"
        for p in growing) or "none"))  # fmt: skip
    more = [Text(f"... {len(rows) - MAX_ROWS} more processes")] if len(rows) > MAX_ROWS else []
    return Group(head, gpus, procs, *more, grow)


class View:
    """The view's thread: redraws, reads keys, and on q stops the recording."""

    def __init__(self, snapshot: Callable[[], Snapshot], console: Console | None = None,
                 quit_fn: Callable[[], None] | None = None) -> None:
        self.snapshot = snapshot
        self.console = console or Console()
        self.quit_fn = quit_fn or (lambda: os.kill(os.getpid(), signal.SIGINT))
        self.sort = "b"
        self.stop = threading.Event()
        self.started_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self.thread = threading.Thread(target=self._run, name="gputrace-view", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def key(self, ch: str) -> None:
        """One key press: a sort key or q."""
        if ch in SORTS:
            self.sort = ch
        elif ch in ("q", "Q"):
            self.stop.set()
            self.quit_fn()

    @contextlib.contextmanager
    def _keys(self) -> Iterator[int | None]:
        fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
        if fd is None:
            yield None
            return
        old = termios.tcgetattr(fd)
        try:
            tty.setcbreak(fd)
            yield fd
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, old)

    def _run(self) -> None:
        try:
            with self._keys() as fd, Live(console=self.console, auto_refresh=False,
                                          redirect_stderr=True, redirect_stdout=False,
                                          transient=False) as live:  # fmt: skip
                while not self.stop.is_set():
                    live.update(render(self.snapshot(), self.sort, self.started_ns),
                                refresh=True)  # fmt: skip
                    deadline = time.monotonic() + REFRESH_S
                    while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
                        if fd is None:
                            self.stop.wait(left)
                            continue
                        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
                        if ready:
                            data = os.read(fd, 32).decode("utf-8", "replace")
                            for ch in data:
                                self.key(ch)
                            if data:
                                break  # redraw at once in the new order
                live.update(render(self.snapshot(), self.sort, self.started_ns), refresh=True)
        except BaseException as e:  # the view failing must not end the recording
            self.error = e
