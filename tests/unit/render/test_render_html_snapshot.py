"""The HTML report of a PyTorch snapshot recorded with C++ stacks (tests/cpp_snapshot.py,
built beside the test): the active-memory legend and every site column name the
user's lines, no two alike and no unwinder, interpreter or dispatcher frame; the
header shows what a snapshot gives and no blank host lines; the reports of layers
a snapshot lacks are one line at the end; chromium draws every plot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gputrace.cli import main
from tests import cpp_snapshot
from tests.unit.render.test_render_html import _chromium

UNWINDER = ("unwind::unwind", "CapturedTraceback", "_PyEval", "c10::", "at::", "??:0")


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("snap")
    snap = cpp_snapshot.write(tmp / "cpp.pickle")
    assert main(["import", "torch-snapshot", str(snap), "-o", str(tmp / "t")]) == 0
    out = tmp / "report.html"
    assert main(["analyze", str(tmp / "t"), "--format", "html", "-o", str(out)]) == 0
    return out, out.read_text(encoding="utf-8")


def _figures(html: str) -> list[dict[str, object]]:
    figs = re.search(r"const F=(\[.*?\]);let n=0;", html, re.S)
    assert figs is not None
    return json.loads(figs.group(1))  # type: ignore[no-any-return]


def test_legend_sites_distinct_and_the_users(page: tuple[Path, str]) -> None:
    _, html = page
    active = [f for f in _figures(html)
              if "Active memory" in json.dumps(f["layout"])]
    assert len(active) == 1
    names = [t["name"] for t in active[0]["data"]]  # type: ignore[index]
    # the top 8 of the 9 sites, each the user's line, then `other`
    assert len(names) == len(set(names)) == 9 and names[-1] == "other"
    for n in names[:-1]:
        assert n in [s.replace("<", "\\u003c") for s in cpp_snapshot.SITES], n
        assert not any(w in n for w in UNWINDER), n
    # the hover carries the whole stack, unwinder included
    meta = active[0]["data"][0]["meta"]  # type: ignore[index]
    assert "unwind::unwind" in meta[1]


def test_site_columns_distinct_and_the_users(page: tuple[Path, str]) -> None:
    _, html = page
    body = html[html.index("<body"):]
    tensors = body[body.index("Tensors alive (PyTorch)</h2>"):]
    site_cells = re.findall(r"<summary>(.*?)</summary>", tensors[:tensors.index("</section>")])
    # tensors: one row per site, each its own label
    assert sorted(site_cells) == sorted(s.replace("<", "&lt;") for s in cpp_snapshot.SITES)
    cols = re.findall(r'<td class="t">([^<]*)</td>', body)
    sites = [c for c in cols if "(" in c]
    assert len(sites) == len(set(sites)) and sites
    for s in [*site_cells, *sites]:
        assert not any(w in s for w in UNWINDER), s


def test_header_and_absent_layers(page: tuple[Path, str]) -> None:
    _, html = page
    body = re.sub(r"<script>.*?</script>", "", html[html.index("<body"):], flags=re.S)
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", body.split("</dl>")[0]))
    assert facts["devices"] == "0" and facts["imported"].startswith("torch-snapshot cpp.pickle")
    for blank in ("host", "kernel", "driver", "GPUs"):
        assert blank not in facts
    assert "no rows" not in body
    assert body.count('class="nr"') == 1
    assert re.search(r"not recorded in this trace \(layers missing\): Leaks \(api, syscall\); "
                     r"Fault rate", body)
    assert not re.search(r"\d\.\d+e\+\d", body) and "False" not in body


def test_snapshot_page_renders_in_chromium(page: tuple[Path, str], tmp_path: Path) -> None:
    out, html = page
    expected = int(re.search(r"data-plots=(\d+)", html).group(1))  # type: ignore[union-attr]
    assert expected == 3  # active memory, allocator over time, segment map
    r = _chromium(["--dump-dom", out.as_uri()], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if ":CONSOLE" in line] == []
    assert f'data-plots-rendered="{expected}"' in r.stdout
    assert r.stdout.count('class="main-svg"') >= expected


def test_real_h200_cuda_page_reads_as_the_terminal(tmp_path: Path) -> None:
    """The real H200 CUDA trace: sites `cudaMallocManaged < main` (no hashed static-runtime
    symbols anywhere on the page), pids and flags as the terminal writes them, the growth
    slope in bytes per minute, no `0: ? ()` GPU line."""
    out = tmp_path / "r.html"
    trace = Path(__file__).parents[3] / "fixtures" / "real-h200-cuda"
    assert main(["analyze", str(trace), "--format", "html", "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    body = re.sub(r"<script>.*?</script>", "", html[html.index("<body"):], flags=re.S)
    assert "libcudart_static_" not in html
    assert "pid 1239: cudaMallocManaged &lt; main" in body
    assert "<summary>cudaMalloc &lt; main</summary>" in body
    assert "1,239" not in body and "False" not in body and "True" not in body
    assert not re.search(r"\d\.\d+e\+\d", body)
    assert re.search(r"<td>116\.5 GiB/min</td>", body)
    assert "? ()" not in body
    # the growth fits: R² a share (0 at least), growing as yes/no
    fits = body[body.index("<h3>Growth fits</h3>"):].split("</table>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", fits)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]
    assert [c[3] for c in cells] == ["0", "0.727", "0.75"] and {c[6] for c in cells} == {"no"}


def test_header_shows_what_an_import_wrote_down() -> None:
    """The facts an importer records beside the file (a snapshot's format, its allocator
    settings) are in the header, numbers and flags as the terminal writes them; what the
    trace lacks (host, GPUs) is left out."""
    from gputrace.render.html import Page, header

    page = Page("t")
    info = {"path": "/t", "host": {}, "gpus": [{"index": 0}],
            "imported": [{"kind": "torch-snapshot", "file": "s.pickle", "sha256": "ab",
                          "format": "2.1 (no time_us)", "allocator_settings": {
                              "expandable_segments": True, "max_split_size": -1,
                              "garbage_collection_threshold": 0.8}}]}
    header(page, info, {"trace": {"layers": ["allocator"], "duration_s": 1.5}}, [0, 1])
    html = "".join(page.parts)
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", html))
    assert facts["format"] == "2.1 (no time_us)" and facts["devices"] == "0, 1"
    assert facts["allocator settings"] == ("expandable_segments=yes, max_split_size=-1, "
                                           "garbage_collection_threshold=0.8")
    assert facts["GPUs"] == "0" and "host" not in facts and "sha256" not in facts
    assert facts["duration"] == "1.5 s"
