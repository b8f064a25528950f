"""A probe that fails to compile or verify is one line, with the details in a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrace.errors import GputraceError


def test_compile_failure_is_one_line_with_log_file(capfd: pytest.CaptureFixture[str]) -> None:
    from gputrace.record import loader

    try:
        bcc = loader.import_bcc()
    except GputraceError as e:
        pytest.skip(str(e))
    with pytest.raises(GputraceError) as info:
        loader.load_bpf(bcc, "int broken( { this is not C", [], "test")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("loading the test BPF programs failed")
    log = Path(msg.rsplit(" in ", 1)[1].rstrip(")"))
    try:
        assert "error" in log.read_text()
    finally:
        log.unlink()
    assert capfd.readouterr().err == ""
