"""Hostile snapshot files, each a real file on disk run through `gputrace import
torch-snapshot`: decompression bombs, shared structure ("billion laughs"), too many
rows, absurd integers, lone surrogates, an escape in the file name, and a recording
whose part is a symbolic link. Each is refused (or imported safely) with one line,
fast, never a traceback. The bounds are the named constants of docs/security.md."""

from __future__ import annotations

import gzip
import lzma
import os
import pickle
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from gputrace import cli
from gputrace.importers import safe_pickle, torch_rows
from gputrace.importers.torch_snapshot import read_snapshot, write_alone
from gputrace.trace.builder import TraceBuilder
from gputrace.trace.reader import open_trace

MiB = 1 << 20
T_US = 1_767_225_600_000_000


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _import(capsys: pytest.CaptureFixture[str], f: Path, out: Path) -> tuple[int, str, str]:
    return run(capsys, "import", "torch-snapshot", str(f), "-o", str(out))


def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


def _seg(addr: int, blocks: list[dict[str, Any]], size: int = 2 * MiB) -> dict[str, Any]:
    return {"device": 0, "address": addr, "total_size": size, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
            "blocks": blocks}


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------ decompression


def test_xz_declaring_more_than_its_bound_is_refused_before_reading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bomb.pickle.xz"
    f.write_bytes(lzma.compress(b"\0" * (64 * MiB), preset=0))  # 9.9 KB declaring 64 MiB
    assert f.stat().st_size * safe_pickle.MAX_EXPANSION < 64 * MiB
    t0, rss0 = time.monotonic(), _maxrss_mib()
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "declares 67,108,864 decompressed bytes" in err, err
    _one_line(err)
    assert time.monotonic() - t0 < 2 and _maxrss_mib() - rss0 < 32
    assert not (tmp_path / "t").exists()


def test_gzip_past_its_bound_is_cut_off_while_read(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bomb.pickle.gz"
    f.write_bytes(gzip.compress(pickle.dumps(b"\0" * (64 * MiB), 4), 9))  # 1,028x
    assert f.stat().st_size * safe_pickle.MAX_EXPANSION < 64 * MiB
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "decompresses to more than" in err, err
    _one_line(err)


def test_expansion_bound() -> None:
    assert safe_pickle.expansion_bound(937_000) == 937_000 * safe_pickle.MAX_EXPANSION
    assert safe_pickle.expansion_bound(1 << 40) == safe_pickle.MAX_PICKLE_BYTES
    assert safe_pickle.expansion_bound(10) == 1 << 20


# ------------------------------------------------------------------ shared structure


def test_billion_laughs_is_refused_fast(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """1,000 references to one segment of 1,000 references to one block: 8 KB of
    pickle standing for 10^6 block rows."""
    blk = {"address": 1 << 40, "size": 512, "requested_size": 512, "state": "inactive"}
    seg = _seg(1 << 40, [blk] * 1000)
    data = pickle.dumps({"segments": [seg] * 1000, "device_traces": []}, 4)
    assert len(data) < 8192
    f = tmp_path / "laughs.pickle"
    f.write_bytes(data)
    t0 = time.monotonic()
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert time.monotonic() - t0 < 2
    assert rc == 1 and "second reference to a dict already read" in err, err
    _one_line(err)


def test_shared_trace_entries_are_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    e = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": T_US}
    f = tmp_path / "entries.pickle"
    f.write_bytes(pickle.dumps({"segments": [], "device_traces": [[e] * 100_000] * 100}, 4))
    assert f.stat().st_size < 400_000
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "second reference" in err, err


def test_shared_frames_are_honest_and_read_once(tmp_path: Path) -> None:
    """PyTorch shares frame dicts (and may share frames lists) between entries: read,
    one stack."""
    frames = [{"name": "f", "filename": "a.py", "line": 1}]
    entries = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0,
                "time_us": T_US + i, "frames": frames} for i in range(1000)]
    f = tmp_path / "s.pickle"
    f.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, 4))
    snap = read_snapshot(f)
    assert snap.rows.event_count == 1000 and len(snap.rows.stacks) == 1


def test_row_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_rows, "MAX_ROWS", 100)
    blocks = [{"address": (1 << 40) + 512 * i, "size": 512, "requested_size": 0,
               "state": "inactive"} for i in range(101)]
    f = tmp_path / "rows.pickle"
    f.write_bytes(pickle.dumps({"segments": [_seg(1 << 40, blocks)], "device_traces": []}))
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "more than 100 blocks" in err, err


def test_text_ceiling(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One long string referenced by many entries must not become terabytes of rows."""
    monkeypatch.setattr(torch_rows, "MAX_TEXT_BYTES", 10 * MiB)
    meta = "x" * MiB
    entries = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0,
                "time_us": T_US, "user_metadata": meta} for i in range(20)]
    f = tmp_path / "text.pickle"
    f.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}, 4))
    assert f.stat().st_size < 2 * MiB
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "bytes of text" in err, err


# ------------------------------------------------------------------ values


def test_huge_integer_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "big.pickle"
    f.write_bytes(pickle.dumps({"segments": [_seg(0, [], 10**5000)], "device_traces": []}))
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "total_size = an integer of 16610 bits is out of range" in err, err
    _one_line(err)


def test_size_past_i64_is_refused_at_import(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "u64.pickle"
    f.write_bytes(pickle.dumps({"segments": [_seg(0, [], (1 << 63) + 5)], "device_traces": []}))
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "bytes is more than any GPU holds" in err, err
    _one_line(err)


def test_lone_surrogate_in_a_frame(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    e = {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": T_US,
         "frames": [{"name": "bad\udcffname", "filename": "x\ud800.py", "line": 1}],
         "user_metadata": "m\udfff"}
    f = tmp_path / "sur.pickle"
    f.write_bytes(pickle.dumps({"segments": [], "device_traces": [[e]]}))
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 0, err
    fr = open_trace(tmp_path / "t").scan("allocator_frames").collect()
    assert fr["function"].to_list() == ["bad\\udcffname"]
    assert fr["filename"].to_list() == ["x\\ud800.py"]


def test_result_line_escapes_the_file_name(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "evil\x1b]0;owned\x07.pickle"
    f.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    rc, out, err = _import(capsys, f, tmp_path / "t")
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]0;owned\\x07" in out


# ------------------------------------------------------------------ --into


def test_into_never_follows_a_symlinked_part(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A recording whose part is a link to another file (root-only, as `import --into`
    run by root would read it): refused, nothing of it copied."""
    b = TraceBuilder(("syscall", "api"), duration_s=10.0)
    b.process(4242, "python")
    b.cuda_alloc(0.9, 4242, 20 * MiB, ptr=0x7F00_0000_0000)
    rec = b.build(tmp_path / "rec")
    secret = tmp_path / "secret.parquet"  # rows of a table the user may not read
    part = sorted((rec / "processes").glob("*.parquet"))[0]
    part.rename(secret)
    os.chmod(secret, 0o600)
    part.symlink_to(secret)
    snap = {"segments": [_seg(0x7F00_0000_0000, [], 20 * MiB)], "device_traces": [[
        {"action": "segment_alloc", "addr": 0x7F00_0000_0000, "size": 20 * MiB,
         "stream": 0, "time_us": T_US + 1_000_000}]]}
    f = tmp_path / "s.pickle"
    f.write_bytes(pickle.dumps(snap))
    rc, _, err = run(capsys, "import", "torch-snapshot", str(f), "--into", str(rec),
                     "-o", str(tmp_path / "j"))
    assert rc == 1 and "is a symbolic link" in err, err
    _one_line(err)


def test_honest_snapshot_still_written(tmp_path: Path) -> None:
    """The bounds leave an honest file alone (the real H200 snapshot has its own tests)."""
    e = [{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": T_US + i}
         for i in range(10)]
    f = tmp_path / "ok.pickle.xz"
    f.write_bytes(lzma.compress(pickle.dumps({"segments": [], "device_traces": [e]})))
    out = write_alone(read_snapshot(f), tmp_path / "t")
    assert open_trace(out).scan("allocator_events").collect().height == 10


def test_fifo_is_refused_not_waited_on(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.pickle"
    os.mkfifo(f)
    t0 = time.monotonic()
    rc, _, err = _import(capsys, f, tmp_path / "t")
    assert rc == 1 and "not a regular file" in err and time.monotonic() - t0 < 2, err
