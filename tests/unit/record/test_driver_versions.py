"""Driver version detection, --driver-version and the layout boundaries.

Answers: which version does gputrace pick (option > host > assumed latest), from
which host file, and which UVM/RM layouts does each side of every version
boundary get? Host files are synthetic (written under a tmp root); the boundary
versions and offsets come from docs/driver-facts.md §1.3-1.4, §2.3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gputrace.errors import UsageError
from gputrace.record import driver_version as driver
from gputrace.record.driver_version import (
    LATEST,
    SLOT_DEINITIALIZE,
    SLOT_INITIALIZE,
    UVM_DEINITIALIZE,
    UVM_INITIALIZE,
    UvmLayout,
    detect_version,
    parse_version,
    resolve,
    rm_defines,
    slot,
    uvm_layouts,
)

UVM = "sys/module/nvidia_uvm/version"
NV = "sys/module/nvidia/version"
PROC = "proc/driver/nvidia/version"
# synthetic /proc/driver/nvidia/version text in the driver's own format
PROC_TEXT = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build"
    "  (dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 19:36:05 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def _host(root: Path, files: dict[str, str | bytes]) -> str:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
    return str(root)


# ----------------------------------------------------------------- detect_version
@pytest.mark.parametrize("rel", [UVM, NV])
def test_detect_from_each_sys_module_file(tmp_path: Path, rel: str) -> None:
    assert detect_version(_host(tmp_path, {rel: "550.54.14\n"})) == "550.54.14"


def test_detect_from_proc_text(tmp_path: Path) -> None:
    assert detect_version(_host(tmp_path, {PROC: PROC_TEXT})) == "570.86.15"


def test_detect_prefers_uvm_then_nvidia_then_proc(tmp_path: Path) -> None:
    root = _host(tmp_path, {UVM: "580.65.06\n", NV: "575.51.03\n", PROC: PROC_TEXT})
    assert detect_version(root) == "580.65.06"
    (tmp_path / UVM).unlink()
    assert detect_version(root) == "575.51.03"
    (tmp_path / NV).unlink()
    assert detect_version(root) == "570.86.15"


def test_detect_skips_unreadable_and_versionless_sources(tmp_path: Path) -> None:
    (tmp_path / UVM).mkdir(parents=True)  # reading a directory raises OSError
    root = _host(tmp_path, {NV: "no version here\n", PROC: PROC_TEXT})
    assert detect_version(root) == "570.86.15"


def test_detect_two_part_version_and_bad_bytes(tmp_path: Path) -> None:
    root = _host(tmp_path, {UVM: b"\xff\xfe 470.42 \x80\n"})
    assert detect_version(root) == "470.42"


def test_detect_nothing_loaded(tmp_path: Path) -> None:
    assert detect_version(str(tmp_path)) is None


def test_detect_default_root_reads_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def fake_read_text(self: Path, errors: str = "strict") -> str:
        seen.append(str(self))
        raise OSError("synthetic: no driver")

    monkeypatch.setattr(Path, "read_text", fake_read_text)
    assert detect_version() is None
    assert seen == [
        "/sys/module/nvidia_uvm/version",
        "/sys/module/nvidia/version",
        "/proc/driver/nvidia/version",
    ]


# ------------------------------------------------------------------------ resolve
def _expect(info: driver.DriverInfo, version: str | None, layout: str, source: str) -> None:
    assert (info.version, info.layout_version, info.source) == (version, layout, source)
    v = parse_version(layout)
    assert info.layouts == uvm_layouts(v)
    assert info.defines == rm_defines(v)


def test_resolve_option_wins_over_host(tmp_path: Path) -> None:
    root = _host(tmp_path, {UVM: "590.44.01\n"})
    _expect(resolve("535.43.01", root), "535.43.01", "535.43.01", "option")
    info = resolve("535.43.01", root)
    assert info.defines["GT_NVOS21_STATUS_OFF"] == 24  # not the host's (28)
    assert {lay.cmd for lay in info.layouts} >= {34, 28}


def test_resolve_host(tmp_path: Path) -> None:
    _expect(resolve(None, _host(tmp_path, {PROC: PROC_TEXT})), "570.86.15", "570.86.15", "host")


def test_resolve_nothing_loaded_assumes_latest(tmp_path: Path) -> None:
    _expect(resolve(None, str(tmp_path)), None, LATEST, "assumed")


def test_resolve_unknown_host_version_assumes_latest(tmp_path: Path) -> None:
    # "340.108" matches the host pattern but major 340 is older than any known layout
    _expect(resolve(None, _host(tmp_path, {UVM: "340.108\n"})), None, LATEST, "assumed")


def test_resolve_default_root(monkeypatch: pytest.MonkeyPatch) -> None:
    roots: list[str] = []
    monkeypatch.setattr(driver, "detect_version", lambda root="/": roots.append(root))
    _expect(resolve(None), None, LATEST, "assumed")
    assert roots == ["/"]


@pytest.mark.parametrize("bad", ["550", "abc", "5500.1.1", "550.54.14.1", "550.1234", ""])
def test_resolve_bad_option_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    with pytest.raises(UsageError, match=r"bad --driver-version .*expected a driver version"):
        resolve(bad, str(tmp_path))


# ------------------------------------------------------------------ parse_version
@pytest.mark.parametrize(
    ("text", "want"),
    [("400.1", (400, 1, 0)), ("999.9.9", (999, 9, 9)), (" 550.54 \n", (550, 54, 0)),
     ("550.54.14", (550, 54, 14))],
)  # fmt: skip
def test_parse_version(text: str, want: tuple[int, int, int]) -> None:
    assert parse_version(text) == want


@pytest.mark.parametrize("text", ["399.99.99", "100.1.1"])
def test_parse_version_unknown_major(text: str) -> None:
    major = text.split(".")[0]
    with pytest.raises(UsageError, match=f"bad --driver-version '{text}': major version {major}"):
        parse_version(text)


# ------------------------------------------------------------- rm_defines / slot
@pytest.mark.parametrize(
    ("v", "nvos21", "nvos64"),
    [((524, 99, 99), 24, 32), ((525, 0, 0), 24, 36), ((525, 0, 5), 24, 36),
     ((535, 40, 0), 24, 36), ((535, 43, 0), 24, 36), ((535, 43, 1), 24, 36),
     ((535, 43, 2), 28, 36), ((550, 0, 0), 28, 36)],
)  # fmt: skip
def test_rm_defines_boundaries(v: tuple[int, int, int], nvos21: int, nvos64: int) -> None:
    assert rm_defines(v) == {"GT_NVOS21_STATUS_OFF": nvos21, "GT_NVOS64_40_STATUS_OFF": nvos64}


def test_slots() -> None:
    assert slot(UVM_INITIALIZE) == SLOT_INITIALIZE
    assert slot(UVM_DEINITIALIZE) == SLOT_DEINITIALIZE
    assert [slot(c) for c in (0, 1, 80, SLOT_INITIALIZE - 1)] == [0, 1, 80, 125]
    for bad in (-1, SLOT_INITIALIZE, SLOT_DEINITIALIZE, 0x3000_0003):
        with pytest.raises(ValueError, match=f"UVM command {bad:#x} has no layout slot"):
            slot(bad)


# ------------------------------------------------------ uvm_layouts at boundaries
def _by_cmd(v: tuple[int, int, int]) -> dict[int, UvmLayout]:
    return {lay.cmd: lay for lay in uvm_layouts(v)}


@pytest.mark.parametrize(
    ("v", "big"),
    [((550, 40, 52), False), ((550, 40, 53), True), ((550, 40, 99), True),
     ((550, 41, 0), False), ((550, 41, 5), False), ((550, 50, 0), False),
     ((550, 54, 0), False), ((550, 54, 13), False), ((550, 54, 14), True),
     ((551, 0, 0), True), ((535, 0, 0), False)],
)  # fmt: skip
def test_map_external_allocation_gpu_array_size(v: tuple[int, int, int], big: bool) -> None:
    lay = _by_cmd(v)
    mea, pool = lay[33], lay[68]
    if big:
        assert (mea.status, mea.ref_fd, mea.h_client, mea.h_object) == (9260, 9248, 9252, 9256)
        assert pool.status == 9240
    else:
        assert (mea.status, mea.ref_fd, mea.h_client, mea.h_object) == (1196, 1184, 1188, 1192)
        assert pool.status == 1176


@pytest.mark.parametrize(
    ("v", "status"),
    [((550, 7, 0), 32), ((550, 40, 0), 32), ((550, 40, 6), 32), ((550, 40, 7), 36),
     ((550, 41, 0), 36)],
)  # fmt: skip
def test_set_preferred_location_boundary(v: tuple[int, int, int], status: int) -> None:
    assert _by_cmd(v)[42].status == status


@pytest.mark.parametrize(
    ("v", "new"),
    [((590, 1, 0), False), ((590, 44, 0), False), ((590, 44, 1), True), ((591, 0, 0), True)],
)
def test_free_and_unregister_channel_boundary(v: tuple[int, int, int], new: bool) -> None:
    lay = _by_cmd(v)
    if new:
        assert lay[34] == UvmLayout(34, status=8, base=0)
        assert lay[28] == UvmLayout(28, status=8, h_client=0, h_object=4)
    else:
        assert lay[34] == UvmLayout(34, status=16, base=0, length=8)
        assert lay[28] == UvmLayout(28, status=24, uuid=0, h_client=16, h_object=20)


@pytest.mark.parametrize(
    ("v", "p2p", "discard"),
    [((565, 1, 0), False, False), ((565, 57, 0), False, False), ((565, 57, 1), True, False),
     ((580, 6, 0), True, False), ((580, 65, 0), True, False), ((580, 65, 5), True, False),
     ((580, 65, 6), True, True)],
)  # fmt: skip
def test_commands_added_by_version(v: tuple[int, int, int], p2p: bool, discard: bool) -> None:
    lay = _by_cmd(v)
    assert (78 in lay, 80 in lay) == (p2p, discard)
    if p2p:
        assert lay[78] == UvmLayout(78, status=52, base=0, length=8, offset=16, uuid=24,
                                    ref_fd=40, h_client=44, h_object=48)  # fmt: skip
    if discard:
        assert lay[80] == UvmLayout(80, status=24, base=0, length=8, flags=16, flags_size=8)
