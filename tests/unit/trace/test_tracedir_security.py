"""Attacks on the root recorder's trace writer by an unprivileged user.

The suite runs as root; the attacker's steps run as `nobody` (uid 65534) in
child processes (subprocess with user=/group=). The prize is a root-only 0600
file (or a root-only trace) that a link points at: after each attack it must
hold exactly the bytes it held before, and the writer must either refuse with
one line or finish the trace in the directory it opened. Most cases drive
`TraceWriter` directly (the recorder writes only through it); the last ones
run a live `gputrace record` on the FUSE stand-in.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from gputrace import schema
from gputrace.errors import TraceError
from gputrace.trace.builder import MiB, TraceBuilder
from gputrace.trace.output import check_output
from gputrace.trace.reader import open_trace
from gputrace.trace.writer import TraceWriter

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="attacks on root's writer need root")

NOBODY = 65534
SECRET = b"root-only secret: must never change\n"


def as_nobody(*argv: str) -> None:
    """Run one attacker step as uid/gid 65534 with no supplementary groups."""
    subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], check=True, cwd="/",
                   capture_output=True, timeout=60)  # fmt: skip


def attacker_fails(*argv: str) -> bool:
    r = subprocess.run(argv, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                       capture_output=True, timeout=60)  # fmt: skip
    return r.returncode != 0


@dataclass
class Scene:
    base: Path  # root-owned 0755 (traversable), like /tmp's parent of things
    secret: Path  # root-owned 0600 file in a root-only 0700 directory
    vault: Path  # that root-only directory
    user_dir: Path  # owned by the attacker, like their home or their /tmp folder

    def assert_secret_intact(self) -> None:
        st = os.lstat(self.secret)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert self.secret.read_bytes() == SECRET
        assert sorted(p.name for p in self.vault.iterdir()) == ["secret"]


@pytest.fixture
def scene() -> Iterator[Scene]:
    base = Path(tempfile.mkdtemp(prefix="gputrace-attack-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        vault = base / "vault"
        vault.mkdir(mode=0o700)
        secret = vault / "secret"
        secret.write_bytes(SECRET)
        os.chmod(secret, 0o600)
        user_dir = base / "user"
        user_dir.mkdir(mode=0o755)
        os.chown(user_dir, NOBODY, NOBODY)
        yield Scene(base, secret, vault, user_dir)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def rows(n: int, start: int = 0) -> pa.Table:
    b = TraceBuilder()
    for i in range(n):
        b.rm_alloc(float(start + i), 7, size=MiB)
    return pa.Table.from_pylist(b.rows["ioctls"], schema=schema.IOCTLS.arrow_schema)


def plant_trace_with_links(scene: Scene, t: Path) -> None:
    """As the attacker: a valid-looking old trace whose next files are links to the secret."""
    manifest = {"format": "gputrace-trace", "format_version": 1, "status": "recording",
                "tables": {}}  # fmt: skip
    as_nobody("mkdir", "-p", str(t / "ioctls"), str(t / "processes"))
    as_nobody("sh", "-c", 'printf %s "$1" > "$2"', "sh", json.dumps(manifest),
              str(t / "manifest.json"))
    for name in ("manifest.json.tmp", "ioctls/part-000001.parquet",
                 "ioctls/part-000001.parquet.tmp", "processes/part-000001.parquet.tmp"):
        as_nobody("ln", "-s", str(scene.secret), str(t / name))


# ---------------------------------------------------------------- before start
def test_links_planted_in_an_attacker_directory_reused_with_force(scene: Scene) -> None:
    t = scene.user_dir / "trace"
    plant_trace_with_links(scene, t)
    with pytest.raises(TraceError, match=r"owned by uid 65534, not by the recording user"):
        check_output(t, force=True)
    with pytest.raises(TraceError, match=r"owned by uid 65534, not by the recording user"):
        TraceWriter(t, force=True)
    with pytest.raises(TraceError, match="already exists"):
        TraceWriter(t)
    scene.assert_secret_intact()
    assert os.path.islink(t / "manifest.json.tmp")  # nothing of theirs deleted either


def test_links_planted_in_a_world_writable_root_directory(scene: Scene) -> None:
    """A root-owned trace directory others can write (made 0777 long ago) is refused."""
    t = scene.base / "shared-trace"
    t.mkdir()
    os.chmod(t, 0o777)
    for name in ("manifest.json.tmp", "manifest.json"):
        as_nobody("ln", "-s", str(scene.secret), str(t / name))
    with pytest.raises(TraceError, match=r"writable by group and others \(mode 0777\)"):
        TraceWriter(t, force=True)
    scene.assert_secret_intact()


@pytest.mark.parametrize("force", [False, True])
def test_trace_path_is_a_link_to_roots_own_trace(scene: Scene, force: bool) -> None:
    """-o names a link the attacker planted to a trace of root's: never followed,
    so --force cannot be turned into deleting root's files."""
    roots_trace = scene.vault / "old-trace"
    w = TraceWriter(roots_trace)
    w.append("ioctls", rows(3))
    w.close()
    before = {p: p.read_bytes() for p in roots_trace.rglob("*") if p.is_file()}
    link = scene.user_dir / "trace"
    as_nobody("ln", "-s", str(roots_trace), str(link))
    with pytest.raises(TraceError, match="is a symbolic link; refusing to write through it"):
        TraceWriter(link, force=force)
    assert {p: p.read_bytes() for p in roots_trace.rglob("*") if p.is_file()} == before
    (roots_trace / "manifest.json").unlink()
    shutil.rmtree(roots_trace)
    scene.assert_secret_intact()


def test_trace_path_is_a_link_to_the_secret_file(scene: Scene) -> None:
    link = scene.user_dir / "trace"
    as_nobody("ln", "-s", str(scene.secret), str(link))
    for force in (False, True):
        with pytest.raises(TraceError, match="symbolic link"):
            TraceWriter(link, force=force)
    scene.assert_secret_intact()


@pytest.mark.parametrize("swap", ["foreign-owner", "with-content"])
def test_directory_swapped_between_mkdir_and_open(
    scene: Scene, swap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between creating the directory and opening it: whatever is opened
    must be the private, empty directory just made (the swap is simulated in-process:
    a real race would be flaky)."""
    t = scene.user_dir / "trace"
    real_mkdir = os.mkdir

    def racing_mkdir(name: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(name, mode, dir_fd=dir_fd)
        if swap == "foreign-owner":
            os.chown(t, NOBODY, NOBODY)
        else:
            os.symlink(scene.secret, t / "manifest.json.tmp")

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    match = "owned by uid 65534" if swap == "foreign-owner" else "was replaced while"
    with pytest.raises(TraceError, match=match):
        TraceWriter(t)
    scene.assert_secret_intact()


# ---------------------------------------------------------------- between rotations
def test_links_planted_between_rotations(scene: Scene) -> None:
    """Defence in depth: even if the trace directory becomes writable to the
    attacker mid-recording (a careless chmod, an ACL), the next part, its
    temporary file and the manifest's are created O_EXCL|O_NOFOLLOW: the
    planted links are replaced, never written through, and no row is lost."""
    t = scene.base / "trace"
    w = TraceWriter(t)
    w.append("ioctls", rows(3))
    w.rotate()
    os.chmod(t, 0o777)
    os.chmod(t / "ioctls", 0o777)
    for name in ("ioctls/part-000002.parquet", "ioctls/part-000002.parquet.tmp",
                 "manifest.json.tmp"):
        as_nobody("ln", "-s", str(scene.secret), str(t / name))
    w.append("ioctls", rows(4, start=10))
    w.rotate()
    as_nobody("ln", "-s", str(scene.secret), str(t / "manifest.json.tmp"))
    w.close()
    scene.assert_secret_intact()
    trace = open_trace(t)
    assert trace.status == "complete"
    assert trace.scan("ioctls").collect().height == 7
    assert not any(p.is_symlink() for p in t.rglob("*"))


def test_directory_planted_at_the_next_part_name_is_a_clean_error(scene: Scene) -> None:
    t = scene.base / "trace"
    w = TraceWriter(t)
    w.append("ioctls", rows(2))
    w.rotate()
    os.chmod(t, 0o755)
    os.chmod(t / "ioctls", 0o777)
    as_nobody("mkdir", str(t / "ioctls" / "part-000002.parquet.tmp"))
    w.append("ioctls", rows(2, start=10))
    with pytest.raises(TraceError, match="exists and cannot be replaced") as e:
        w.rotate()
    assert "\n" not in str(e.value)
    assert open_trace(t).scan("ioctls").collect().height == 2  # what was written stays
    scene.assert_secret_intact()


# ---------------------------------------------------------------- after start
@pytest.mark.parametrize("parent_kind", ["attacker-owned", "world-writable"])
def test_directory_swapped_after_start(
    scene: Scene, parent_kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The attacker can rename entries of the parent: the trace directory is moved
    away and a link to the vault put in its place. The writer keeps writing
    through the descriptor it opened: the trace is finished where it was moved,
    nothing reaches the vault, and the move is reported."""
    if parent_kind == "attacker-owned":
        parent = scene.user_dir
    else:
        parent = scene.base / "open"
        parent.mkdir()
        os.chmod(parent, 0o777)  # no sticky bit: anyone may rename root's entries
    t = parent / "trace"
    w = TraceWriter(t)
    w.append("ioctls", rows(3))
    w.rotate()
    as_nobody("mv", str(t), str(parent / "moved"))
    as_nobody("ln", "-s", str(scene.vault), str(t))
    w.append("ioctls", rows(4, start=10))
    w.rotate()
    w.append("ioctls", rows(1, start=20))
    w.close()
    scene.assert_secret_intact()
    trace = open_trace(parent / "moved")
    assert trace.status == "complete"
    assert trace.scan("ioctls").collect().height == 8
    assert "was moved or replaced while recording" in capsys.readouterr().err


def test_sticky_parent_stops_the_swap(scene: Scene) -> None:
    """In a sticky shared directory (/tmp) others cannot even move root's directory."""
    parent = scene.base / "tmp"
    parent.mkdir()
    os.chmod(parent, 0o1777)
    w = TraceWriter(parent / "trace")
    assert attacker_fails("mv", str(parent / "trace"), str(parent / "moved"))
    w.close()
    assert open_trace(parent / "trace").status == "complete"


# ---------------------------------------------------------------- live recorder
@pytest.mark.live
def test_live_record_directory_swapped_mid_recording(scene: Scene) -> None:
    """`gputrace record` as root into a directory of the attacker's; after the
    ready line the attacker swaps the trace directory for a link to the vault."""
    from tests.record_helpers import RecorderProc, live_skip_reason, record_cmd
    from tests.record_helpers import standin_driver_args as driver_args

    reason = live_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    from tests.standin.standin import mounted_driver, run_workload

    t = scene.user_dir / "trace"
    work = scene.base / "work"
    work.mkdir()
    with mounted_driver(work, budget=1 << 30) as dev:
        rec = RecorderProc(record_cmd(t, "--device-dir", str(dev), *driver_args()))
        rec.wait_ready()
        as_nobody("mv", str(t), str(scene.user_dir / "moved"))
        as_nobody("ln", "-s", str(scene.vault), str(t))
        run_workload(dev)
        rec.proc.send_signal(signal.SIGINT)
        assert rec.wait(timeout=60) == 0, "".join(rec.stderr)
    scene.assert_secret_intact()
    trace = open_trace(scene.user_dir / "moved")
    assert trace.status == "complete"
    assert trace.scan("ioctls").collect().height > 0
    assert "was moved or replaced while recording" in "".join(rec.stderr)


@pytest.mark.live
def test_live_record_force_through_a_link_to_roots_trace(scene: Scene) -> None:
    from tests.record_helpers import live_skip_reason, record_cmd

    reason = live_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    roots_trace = scene.vault / "old-trace"
    w = TraceWriter(roots_trace)
    w.append("ioctls", rows(3))
    w.close()
    before = {p: p.read_bytes() for p in roots_trace.rglob("*") if p.is_file()}
    link = scene.user_dir / "trace"
    as_nobody("ln", "-s", str(roots_trace), str(link))
    r = subprocess.run(record_cmd(link, "--force", "-d", "1"), capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputrace: error: "), r.stderr
    assert "symbolic link" in lines[0]
    assert {p: p.read_bytes() for p in roots_trace.rglob("*") if p.is_file()} == before
