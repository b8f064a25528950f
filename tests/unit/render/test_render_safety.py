"""Text a traced process chose never drives the reader's terminal.

A process names itself (`comm`, its command line) and its binaries name the
symbols of call stacks; printed raw, an ESC byte clears the screen or sets the
window title. Terminal output escapes such characters visibly; JSON and CSV
keep the text exactly. All traces here are synthetic (gputrace.trace.builder).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputrace.cli import main
from gputrace.render.safe import printable, printable_tree
from gputrace.trace.builder import MiB, TraceBuilder

EVIL_COMM = "\x1b[2J\x1b]0;pwned\x07"
EVIL_SYMBOL = "cuMemAlloc\x1b[31m_v2\u202egnp.exe"
MARKUP_COMM = "[link=http://x]y[/link]"
EVIL_CMDLINE = "python\ntrain.py \x9b2J \u2066x\u2069"


@pytest.fixture(scope="module")
def evil_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic: two processes with hostile names, each leaking one allocation."""
    b = TraceBuilder(layers=("syscall", "api"), duration_s=10.0)
    b.process(100, EVIL_COMM, cmdline=EVIL_CMDLINE)
    b.process(200, MARKUP_COMM)
    b.cuda_alloc(1.0, 100, 4 * MiB, stack=[EVIL_SYMBOL, "main"])
    b.cuda_alloc(2.0, 200, 2 * MiB, stack=["main"])
    return b.build(tmp_path_factory.mktemp("evil") / "trace")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_inert(text: str) -> None:
    """No byte a terminal acts on: ESC, BEL, C1 CSI, bidi controls, raw newlines in cells."""
    for ch in ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u2069"):
        assert ch not in text, repr(ch)


def test_analyze_terminal_escapes_comm_and_symbols(
        capsys: pytest.CaptureFixture[str], evil_trace: Path) -> None:
    rc, out, err = run(capsys, "analyze", str(evil_trace), "--only", "leaks")
    assert rc == 0, err
    assert_inert(out)
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in out  # visible, not acted on
    assert "\\u202e" in out  # the symbol's bidi override, shown
    assert MARKUP_COMM in out  # rich markup in a comm is text, not a hyperlink


def test_analyze_terminal_file_output_is_escaped_too(
        capsys: pytest.CaptureFixture[str], evil_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    rc, _, err = run(capsys, "analyze", str(evil_trace), "-o", str(out))
    assert rc == 0, err
    text = out.read_text(encoding="utf-8")
    assert_inert(text)
    assert "pwned" in text


def test_analyze_json_keeps_the_text_verbatim(
        capsys: pytest.CaptureFixture[str], evil_trace: Path) -> None:
    rc, out, err = run(capsys, "analyze", str(evil_trace), "--only", "leaks", "-f", "json")
    assert rc == 0, err
    assert "\x1b" not in out  # JSON escapes control characters itself ...
    doc = json.loads(out)
    comms = {a["comm"] for a in doc["leaks"]["allocations"]}
    assert comms == {EVIL_COMM, MARKUP_COMM}  # ... and decodes to the exact original
    frames = " ".join(s["frames"] for s in doc["leaks"]["by_stack"])
    assert EVIL_SYMBOL in frames


@pytest.mark.parametrize("table", ["processes", "stacks", "cuda_calls"])
def test_dump_table_escapes(capsys: pytest.CaptureFixture[str], evil_trace: Path,
                            table: str) -> None:
    rc, out, err = run(capsys, "dump", str(evil_trace), table)
    assert rc == 0, err
    assert_inert(out)
    if table == "processes":
        assert "\\x1b[2J" in out and "\\n" in out  # the cmdline's newline stays in its cell


def test_dump_json_and_csv_keep_the_text_verbatim(
        capsys: pytest.CaptureFixture[str], evil_trace: Path) -> None:
    rc, out, _ = run(capsys, "dump", str(evil_trace), "processes", "-f", "json")
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["comm"] for r in rows} == {EVIL_COMM, MARKUP_COMM}
    assert EVIL_CMDLINE in {r["cmdline"] for r in rows}
    rc, out, _ = run(capsys, "dump", str(evil_trace), "stacks", "-f", "csv")
    assert rc == 0
    assert EVIL_SYMBOL in {r["symbol"] for r in csv.DictReader(io.StringIO(out))}


def test_error_lines_escape_what_they_quote(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    rc, out, err = run(capsys, "analyze", str(tmp_path / "no\x1b]0;x\x07\nsuch"))
    assert rc != 0 and out == ""
    assert err.count("\n") == 1 and err.startswith("gputrace: error: ")
    assert_inert(err)
    assert "\\x1b]0;x\\x07\\nsuch" in err


def test_info_text_escapes_and_json_keeps(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    b = TraceBuilder(layers=("syscall",), duration_s=1.0)
    b.process(100, "x")
    path = b.build(tmp_path / "trace")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["host"]["hostname"] = EVIL_COMM
    manifest["target"] = {"mode": "command", "command": ["sh", "-c", EVIL_CMDLINE]}
    (path / "manifest.json").write_text(json.dumps(manifest))
    rc, out, err = run(capsys, "info", str(path))
    assert rc == 0, err
    assert_inert(out)
    assert "\\x1b]0;pwned\\x07" in out and "\\ntrain.py" in out
    rc, out, err = run(capsys, "info", str(path), "--json")
    assert rc == 0, err
    facts = json.loads(out)
    assert facts["host"]["hostname"] == EVIL_COMM
    assert facts["target"]["command"][2] == EVIL_CMDLINE


# ------------------------------------------------------------ the helper itself
def test_printable_examples() -> None:
    assert printable("train") == "train"
    assert printable("naïve café 训练 \\x1b") == "naïve café 训练 \\x1b"  # text as is
    assert printable(EVIL_COMM) == "\\x1b[2J\\x1b]0;pwned\\x07"
    assert printable("a\tb\nc\rd") == "a\\tb\\nc\\rd"
    assert printable("\x7f\x85\x9b") == "\\x7f\\x85\\x9b"  # DEL, NEL, C1 CSI
    assert printable("\u202a\u202e\u2066\u2069\u200b") == "\\u202a\\u202e\\u2066\\u2069\\u200b"
    assert printable("\udcff") == "\\udcff"  # an undecodable byte (surrogateescape)
    assert printable("\U000e0041") == "\\U000e0041"  # a tag character
    assert printable(42) == "42"


def test_printable_tree_copies() -> None:
    doc = {"a\x1b": ["\x1b", 1, None, {"k": "\x07"}], "n": 1.5}
    assert printable_tree(doc) == {"a\\x1b": ["\\x1b", 1, None, {"k": "\\x07"}], "n": 1.5}
    assert doc["a\x1b"] == ["\x1b", 1, None, {"k": "\x07"}]  # the original is untouched


@given(st.text())
def test_printable_output_is_always_inert(s: str) -> None:
    out = printable(s)
    assert out.isprintable()
    if s.isprintable():
        assert out == s
    if "\\" not in s:  # nothing is lost: the escapes decode back to the original
        assert out.encode("latin-1", "backslashreplace").decode("unicode_escape") == s
