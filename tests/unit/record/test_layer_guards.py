"""Guards on the recorder's layers: each layer's buffers hand rows to a table the schema
defines, of a trace layer that table belongs to; and each hook the recorder attaches is
one `gputrace doctor` checks and names when the kernel lacks it; each trace layer a
layer says it records (`Layer.RECORDS`, doctor's recordable list) is in the schema, and
the doctor checks it needs are ones doctor makes. A toy layer whose buffer names a table
that does not exist, or that needs a check doctor lacks, fails the guard."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gputrace import schema
from gputrace.commands import doctor
from gputrace.record import hooks
from gputrace.record.layer import Buffer, Layer
from gputrace.record.layers import RECORDER_LAYERS


def _doctor_checks() -> set[str]:
    """The keys of the checks `gputrace doctor` makes (on a bare SYNTHETIC host)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return {c.key for c in doctor.run_checks(doctor.Host(root=Path(d), devdir=d))}


DOCTOR_CHECKS = _doctor_checks()


def layer_problems(layers: tuple[type[Layer], ...]) -> list[str]:
    """What is wrong with these layers' declarations against the schema."""
    out = []
    for cls in layers:
        writes = cls.trace_layer or cls.name
        if writes not in schema.LAYERS:
            out.append(f"{cls.__name__}: trace layer {writes!r} is not in schema.LAYERS")
        for layer, needs in cls.records().items():
            if layer not in schema.LAYERS:
                out.append(f"{cls.__name__}: records trace layer {layer!r}, which is not in "
                           "schema.LAYERS")
            unknown = sorted(set(needs) - DOCTOR_CHECKS)
            if unknown:
                out.append(f"{cls.__name__}: {layer} needs doctor checks {unknown}, which "
                           "doctor does not make")
        for kind, buf in cls.BUFFERS.items():
            t = schema.TABLES.get(buf.table)
            if t is None:
                out.append(f"{cls.__name__}: buffer {kind} names table {buf.table!r}, "
                           "which the schema does not define")
            elif writes not in t.layers:
                out.append(f"{cls.__name__}: buffer {kind} writes {buf.table}, a table of "
                           f"layers {', '.join(t.layers)}, not {writes}")
    return out


def test_every_layer_writes_tables_the_schema_defines() -> None:
    assert layer_problems(RECORDER_LAYERS) == []


def _decoder(layer: Any, s: Any, kind: str, data: Any) -> tuple[None, int]:
    return None, 0


class ToyLayer(Layer):
    """A layer whose buffer names a table that does not exist."""

    name = "syscall"
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        "toy_events": Buffer("toy_table", "toy_events", np.dtype([("x", "<u8")]), _decoder)}


class ElsewhereLayer(Layer):
    """A layer writing another layer's table."""

    name = "api"
    BUFFERS: ClassVar[dict[str, Buffer]] = {
        "x": Buffer("ioctls", "x", np.dtype([("x", "<u8")]), _decoder)}


class UnknownNeedsLayer(Layer):
    """A layer recording a trace layer the schema lacks, needing a check doctor lacks."""

    name = "api"
    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {"api": ("no-such-check",),
                                                     "no_such_layer": ()}


def test_the_guard_refuses_unknown_trace_layers_and_doctor_checks() -> None:
    assert layer_problems((UnknownNeedsLayer,)) == [
        "UnknownNeedsLayer: api needs doctor checks ['no-such-check'], which doctor does "
        "not make",
        "UnknownNeedsLayer: records trace layer 'no_such_layer', which is not in "
        "schema.LAYERS"]
    assert {"uprobes", "uvm-tools", "rm-client"} <= DOCTOR_CHECKS


def test_the_guard_refuses_a_missing_table_and_a_foreign_one() -> None:
    assert layer_problems((ToyLayer,)) == [
        "ToyLayer: buffer toy_events names table 'toy_table', which the schema does not "
        "define"]
    assert layer_problems((ElsewhereLayer,)) == [
        "ElsewhereLayer: buffer x writes ioctls, a table of layers syscall, not api"]


def _tracefs(root: Path, without: set[str]) -> doctor.Host:
    """A SYNTHETIC host whose tracefs has every hook's format file but those `without`."""
    (root / "proc").mkdir(parents=True)
    (root / "proc/mounts").write_text("tracefs /sys/kernel/tracing tracefs rw 0 0\n")
    events = root / "sys/kernel/tracing/events"
    events.mkdir(parents=True)
    for h in hooks.HOOKS:
        if h.name not in without:
            (events / h.category / h.event).mkdir(parents=True, exist_ok=True)
            (events / h.category / h.event / "format").write_text("")
    return doctor.Host(root=root)


def test_doctor_checks_every_hook(tmp_path: Path) -> None:
    """Each hook the recorder attaches (on this machine) is named by doctor when missing:
    NO for a required one, WARN for an optional one; none missing is OK."""
    assert doctor.check_hooks(_tracefs(tmp_path / "all", set())).state == doctor.OK
    for i, h in enumerate(hooks.HOOKS):
        if h.arch is not None and h.arch != platform.machine():
            continue
        c = doctor.check_hooks(_tracefs(tmp_path / str(i), {h.name}))
        assert h.name in c.detail, h.name
        assert c.state == (doctor.NO if h.required else doctor.WARN), h.name
    assert doctor.check_hooks in doctor.CHECKS
