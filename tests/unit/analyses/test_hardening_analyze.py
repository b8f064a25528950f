"""Hostile traces, manifests and terminals against the reading, analysis and CLI layers.

Each test names what it guards: a trace a traced process or a stranger shaped must give
a report with a warning or one line and a non-zero exit, never a traceback, a hang or
a silent wrong answer.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace.analyses.leaks.growth import growth
from gputrace.trace.builder import GiB, TraceBuilder
from tests.analyze_helpers import analyze
from tests.cli_helpers import cli

SIZE_MAX = (1 << 64) - 1


def assert_one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gputrace: error: "), r.stderr
    assert needle in lines[0], r.stderr


# ---------------------------------------------------------------- impossible sizes
def _huge_alloc_trace(path: Path) -> Path:
    b = TraceBuilder(layers=("api",))
    b.process(100, "evil")
    b.cuda_alloc(0.0, 100, SIZE_MAX, ptr=0x7E0000000000)  # cuMemAlloc_v2((size_t)-1)
    b.cuda_alloc(0.1, 100, 1 << 63, ptr=0x7E1000000000)
    b.process(101, "train")
    b.cuda_alloc(0.5, 101, 1 * GiB)
    return b.build(path)


def test_impossible_api_size_is_a_warning_not_a_failed_analysis(tmp_path: Path) -> None:
    """One process passing (size_t)-1 or 2^63 to cuMemAlloc used to make every analysis
    of the whole trace fail (u64 -> i64 cast); now the reports run, the impossible sizes
    count as 0 bytes (the real 1 GiB is the total, not swamped) and a warning carries
    the true value."""
    trace = _huge_alloc_trace(tmp_path / "t")
    doc = analyze(trace)
    assert doc["leaks"]["recorded"]
    warned = [w for w in doc["warnings"] if "size_bytes over 256 TiB" in w]
    assert len(warned) == 1, doc["warnings"]
    assert "2 rows" in warned[0] and str(SIZE_MAX) in warned[0]
    assert doc["leaks"]["total_bytes"] == 1 * GiB, doc["leaks"]["total_bytes"]
    r = cli("analyze", str(trace))
    assert r.returncode == 0, r.stderr
    assert "256 TiB" in r.stdout + r.stderr
    # the trace itself keeps the full value: dump shows it
    out = cli("dump", str(trace), "cuda_calls", "-f", "json")
    assert out.returncode == 0, out.stderr
    assert SIZE_MAX in {json.loads(line)["size_bytes"] for line in out.stdout.splitlines()}


def test_impossible_allocator_size_is_a_warning_not_a_failed_analysis(
        tmp_path: Path) -> None:
    """The caching allocator's sizes are the traced process's too (the torch_allocator
    layer reads them from its memory): one of 2^63 + 5 made every analysis of the trace
    fail ("u64 to i64 failed"); the API layer's guard now covers them: counted as 0
    bytes, with a warning carrying the true value."""
    from gputrace.trace.builder import MiB, ns

    b = TraceBuilder(layers=("api", "allocator"), duration_s=5.0)  # synthetic
    b.process(7, "train")
    b.cuda_alloc(0.5, 7, 20 * MiB)
    for i, (act, size) in enumerate([("segment_alloc", 20 * MiB), ("alloc", (1 << 63) + 5),
                                     ("alloc", MiB)]):  # fmt: skip
        b.row("allocator_events", ts_ns=ns(1.0 + i), seq=i, pid=7, device=0, action=act,
              address=0x7F0000000000 + i * MiB, size_bytes=size)
    trace = b.build(tmp_path / "t")
    r = cli("analyze", str(trace))
    assert r.returncode == 0, r.stderr
    assert (f"table allocator_events: 1 rows have a size_bytes over 256 TiB (largest "
            f"{(1 << 63) + 5} bytes)") in r.stdout.replace("\n", "")
    # the allocator's own figures: the real 1 MiB allocation, the impossible one as 0
    (by_stack,) = analyze(trace)["allocator_growth"]["by_stack"]
    assert (by_stack["allocs"], by_stack["alloc_bytes"]) == (2, MiB)


# ---------------------------------------------------------------- scale
def _lifetimes(processes: int, allocs: int = 4) -> pl.LazyFrame:
    """Allocation lifetimes of `processes` processes, `allocs` each, none freed."""
    n = processes * allocs
    return pl.LazyFrame({
        "layer": ["api"] * n,
        "pid": pl.Series([i // allocs for i in range(n)], dtype=pl.Int32),
        "alloc_ts_ns": pl.Series([(i % allocs) * 2_000_000_000 for i in range(n)],
                                 dtype=pl.Int64),
        "free_ts_ns": pl.Series([None] * n, dtype=pl.Int64),
        "size_bytes": pl.Series([1 << 20] * n, dtype=pl.Int64),
    })


def test_growth_does_not_look_up_each_process_among_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """`analyze --only leaks` on 10^6 processes was killed after 590 s: growth filtered
    the spans of every series once per series (quadratic). Guarded by counting
    DataFrame.filter calls, which must not grow with the number of processes (a timing
    test would be flaky on a shared machine)."""
    calls = 0
    real = pl.DataFrame.filter

    def counting(self: pl.DataFrame, *a: Any, **k: Any) -> pl.DataFrame:
        nonlocal calls
        calls += 1
        return real(self, *a, **k)

    monkeypatch.setattr(pl.DataFrame, "filter", counting)
    counts = []
    for n in (5, 80):
        calls = 0
        out = growth(_lifetimes(n))
        assert out.height == n and out["rising_troughs"].to_list() == [3] * n
        counts.append(calls)
    assert counts[0] == counts[1], counts


def test_many_unknown_manifest_tables_are_one_warning(tmp_path: Path) -> None:
    """10^5 unknown table names in a manifest meant 10^5 warnings de-duplicated against
    each other per report (quadratic). They are one line now, and the terminal report
    de-duplicates through a set."""
    b = TraceBuilder(layers=("api",))
    b.process(1, "a")
    b.cuda_alloc(0.0, 1, 4096)
    trace = b.build(tmp_path / "t")
    m = json.loads((trace / "manifest.json").read_text())
    m["tables"].update({f"junk{i}": {"rows": 0, "parts": 0} for i in range(20_000)})
    (trace / "manifest.json").write_text(json.dumps(m))
    doc = analyze(trace)
    unknown = [w for w in doc["warnings"] if "unknown to this gputrace" in w]
    assert len(unknown) == 1 and "20000 tables" in unknown[0], unknown[:3]


# ---------------------------------------------------------------- diff --fail-on
def _small(path: Path, layers: tuple[str, ...]) -> Path:
    b = TraceBuilder(layers=layers)
    b.process(1, "job")
    b.cuda_alloc(0.0, 1, 4096)
    if "syscall" in layers:
        b.rm_alloc(t=0.1, pid=1, size=1 << 20)
    return b.build(path)


def test_diff_fail_on_refuses_a_layer_the_after_trace_did_not_record(tmp_path: Path) -> None:
    """`diff --fail-on` passed (exit 0, no warning) when the after trace recorded no
    layer the gate reads, while `analyze --fail-on` refuses that case; now diff refuses
    too (exit 2, one line naming the metric, the layer and the trace)."""
    before = _small(tmp_path / "b", ("syscall", "api", "driver"))
    after = _small(tmp_path / "a", ("api",))
    for cond, layer in (("fault_rate>+10%", "cpu_faults, driver, uvm_tools"),
                        ("ioctl_p99>+10%", "syscall")):
        r = cli("diff", str(before), str(after), "--fail-on", cond)
        assert r.returncode == 2, (cond, r.returncode, r.stderr)
        assert_one_line_error(r, f"(layer {layer} not recorded in the after trace)")
    # a metric both traces measure still runs (and the same trace twice does not rise)
    r = cli("diff", str(before), str(after), "--fail-on", "leak_bytes>+10%")
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- one line, not a traceback
def _edit_manifest(trace: Path, **fields: Any) -> None:
    m = json.loads((trace / "manifest.json").read_text())
    for dotted, value in fields.items():
        at = m
        *outer, last = dotted.split("__")
        for k in outer:
            at = at.setdefault(k, {})
        at[last] = value
    (trace / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(("field", "value"), [
    ("clock__realtime_offset_ns", 10**30), ("clock__realtime_offset_ns", -(10**30)),
    ("start_ts_ns", 1 << 80), ("drops__syscall", 1 << 64)])  # fmt: skip
def test_manifest_integers_past_64_bits_are_refused_at_load(tmp_path: Path, field: str,
                                                            value: int) -> None:
    """A clock offset far out of range made `info` (and the HTML report's start date)
    end in an OverflowError traceback; every manifest integer is now bounded to 64 bits
    when the manifest is read, one line naming the field."""
    trace = _small(tmp_path / "t", ("api",))
    _edit_manifest(trace, **{field: value})
    for cmd in (("info", str(trace)), ("analyze", str(trace), "-f", "html", "-o",
                                         str(tmp_path / "r.html"))):
        assert_one_line_error(cli(*cmd), f"manifest field {field.replace('__', '.')!r}")


def test_extreme_but_64_bit_clock_offsets_still_give_a_date(tmp_path: Path) -> None:
    """The bound is the 64-bit range, and every date inside it prints."""
    trace = _small(tmp_path / "t", ("api",))
    for offset in ((1 << 63) - 1, -((1 << 63) - 1)):
        _edit_manifest(trace, clock__realtime_offset_ns=offset,
                       end_ts_ns=(1 << 63) - 1 if offset > 0 else None)
        r = cli("info", str(trace))
        assert r.returncode == 0, r.stderr


def _raw_part(tmp_path: Path, header: bytes) -> Path:
    import struct

    from gputrace.trace import rawparts
    from gputrace.trace.writer import TraceWriter

    trace = tmp_path / "raw"
    TraceWriter(trace).close()
    (trace / "ioctls").mkdir(mode=0o700)
    (trace / "ioctls" / rawparts.raw_part_name(1)).write_bytes(
        rawparts.MAGIC + struct.pack("<I", len(header)) + header)
    return trace


@pytest.mark.parametrize("header", [
    b'{"itemsize": 1e400, "codec": "zstd", "table": "ioctls"}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"itemsize": true, "codec": "zstd"}',
    b'{"itemsize": 1.5, "codec": "zstd"}',
], ids=["1e400", "deep", "bool", "float"])  # fmt: skip
def test_hostile_raw_part_header_is_one_line(tmp_path: Path, header: bytes) -> None:
    """A raw part header with `"itemsize": 1e400` (OverflowError) or JSON nested 10^5
    deep (RecursionError) made `convert` end in a traceback; a bool or fractional
    itemsize was silently converted. All are one line naming the part now."""
    trace = _raw_part(tmp_path, header)
    r = cli("convert", str(trace))
    assert_one_line_error(r, "unreadable raw part header")
    assert "part-000001.gtraw" in r.stderr


def _rewrite_part(trace: Path, table: str, change: Any) -> Path:
    import pyarrow.parquet as pq

    part = sorted((trace / table).glob("part-*.parquet"))[0]
    t = pq.read_table(part)
    pq.write_table(change(t).replace_schema_metadata(t.schema.metadata), part)
    return part


def test_part_with_a_duplicate_column_is_one_line(tmp_path: Path) -> None:
    """A Parquet part holding a column name twice ended in a KeyError traceback from
    pyarrow while its footer was checked."""
    import pyarrow as pa

    trace = _small(tmp_path / "t", ("api",))
    part = _rewrite_part(trace, "cuda_calls", lambda t: pa.Table.from_arrays(
        [*t.columns, t.column("pid")], names=[*t.column_names, "pid"]))
    for cmd in ("info", "analyze"):
        r = cli(cmd, str(trace))
        assert_one_line_error(r, "column pid appears more than once")
        assert str(part) in r.stderr


def test_current_part_missing_a_nullable_column_is_refused(tmp_path: Path) -> None:
    """A part of the current schema version without a nullable column was read as if
    the column held nulls, though docs/security.md says every column is checked present;
    now it is one line naming the part and the column. (A part of an older schema
    version may still lack the columns added since its version, `Column.since`:
    tests/unit/schema/test_schema_versions.py.)"""
    trace = _small(tmp_path / "t", ("api",))
    part = _rewrite_part(trace, "cuda_calls", lambda t: t.drop_columns(["stack_id"]))
    r = cli("analyze", str(trace))
    assert_one_line_error(r, "columns missing from table cuda_calls: stack_id")
    assert str(part) in r.stderr


# ---------------------------------------------------------------- text a terminal acts on
EVIL = "x\u009b2J\u202eevil\x1b]0;title\x07\u2028y"  # C1 CSI, bidi override, OSC, LS


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _evil_trace(path: Path) -> Path:
    b = TraceBuilder(layers=("api",))
    b.process(1, EVIL)
    b.cuda_alloc(0.0, 1, 4096)
    return b.build(path)


def _raw_controls(text: str) -> list[str]:
    return [ch for ch in text if not ch.isprintable() and ch not in "\n\r"]


def test_dump_json_escapes_c1_and_bidi_and_keeps_the_value(tmp_path: Path) -> None:
    """`dump -f json` wrote C1 controls and bidi overrides raw (JSON writers escape only
    C0); they are \\u escapes now, always: the same JSON strings, harmless on a terminal."""
    from gputrace.commands.dump import dump_table
    from gputrace.trace.reader import open_trace

    trace = open_trace(_evil_trace(tmp_path / "t"))
    for out in (io.StringIO(), _Terminal()):
        dump_table(trace, "cuda_calls", limit=None, fmt="json", out=out)
        text = out.getvalue()
        assert _raw_controls(text) == [], _raw_controls(text)
        assert [json.loads(x)["comm"] for x in text.splitlines()] == [EVIL]


def test_dump_csv_escapes_only_on_a_terminal(tmp_path: Path) -> None:
    """`dump -f csv` to a terminal wrote the escape sequences a traced process put in
    its name; to a terminal they are shown escaped now (render/safe), to a file or pipe
    the CSV stays verbatim for tools."""
    from gputrace.commands.dump import dump_table
    from gputrace.render.safe import printable
    from gputrace.trace.reader import open_trace

    trace = open_trace(_evil_trace(tmp_path / "t"))
    tty, pipe = _Terminal(), io.StringIO()
    dump_table(trace, "cuda_calls", limit=None, fmt="csv", out=tty)
    dump_table(trace, "cuda_calls", limit=None, fmt="csv", out=pipe)
    assert _raw_controls(tty.getvalue()) == [], _raw_controls(tty.getvalue())
    assert printable(EVIL) in tty.getvalue()
    assert EVIL in pipe.getvalue()


def test_convert_message_escapes_the_path(tmp_path: Path) -> None:
    """`convert` echoed the trace path raw: a path holding an escape sequence acted on
    the operator's terminal."""
    from gputrace.trace.writer import TraceWriter

    trace = tmp_path / "t\x1b]0;owned\x07"
    TraceWriter(trace).close()
    r = cli("convert", str(trace))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\\x1b]0;owned\\x07" in r.stdout, r.stdout


def test_record_raw_hint_escapes_the_output_path(capsys: pytest.CaptureFixture[str]) -> None:
    """The `--raw` hint (`run gputrace convert PATH`) printed the operator's -o raw;
    it is shown escaped now, like every path the CLI prints."""
    from unittest import mock

    from gputrace.record.recorder import Recorder

    rec = mock.MagicMock(opts=mock.MagicMock(raw=True))
    rec._target_exit.return_value = None
    session = mock.MagicMock()
    session.w.path = Path("/tmp/t\x1b[2J\u202e")
    Recorder._finish(rec, session, "complete")
    err = capsys.readouterr().err
    assert "gputrace convert /tmp/t\\x1b[2J\\u202e" in err, err
    assert _raw_controls(err) == []


def test_growth_r2_is_never_negative() -> None:
    """A Theil-Sen line can fit worse than the series' mean (1 - SSres/SStot < 0: the
    real H200 trace's API series printed R² -0.285); R² is the share explained, 0 at
    least, alone and in the batched rows alike."""
    import numpy as np

    from gputrace.analyses.leaks.growth import theil_sen, theil_sen_rows

    x = np.arange(6, dtype=float)
    y = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 100.0])  # a flat median line at 0, one spike
    slope, _icpt, r2, _mad = theil_sen(x, y)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    resid = y - (slope * x + float(np.median(y - slope * x)))
    assert 1.0 - float(np.sum(resid**2)) / ss_tot < 0  # the raw figure goes negative
    assert r2 == 0.0
    assert [r[2] for r in theil_sen_rows(np.stack([x, x]), np.stack([y, 2 * y]))] == [0.0, 0.0]
