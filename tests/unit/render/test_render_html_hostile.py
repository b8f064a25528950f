"""Names a traced process chose never act as markup in the HTML report's plots, and the
page's Content-Security-Policy forbids every outside connection and every script but
its own two.

Plotly renders a subset of HTML in every text it draws (trace names, legend entries,
icicle labels, hover text, tick labels, titles): `<a href>` becomes a clickable link,
`<span style>` restyles the text, `<br>` forges a line, and a newline is drawn too.
These tests put such markup into a synthetic trace (gputrace.trace.builder) as a process
comm, a command line, stack frames and an ioctl name, render the report, and check the
embedded figure JSON, the CSP meta and what chromium actually draws.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputrace.render import html_plots
from gputrace.render.safe import plot_figure, plot_text, printable
from gputrace.trace.builder import MiB, TraceBuilder
from tests.unit.render.test_render_html import _chromium, html_of

LINK = '<a href="https://evil.example">x</a>'
BIG = '<span style="font-size:80px">BIG</span>'
FORGED = "<br>forged line"
EVIL_COMM = LINK + BIG
EVIL_CMDLINE = f"train.py {FORGED}\nsecond line \u202eexe.txt"
EVIL_FRAMES = [f"leak_{BIG}", f"step{FORGED}\u202e", f"main{LINK}"]
EVIL_IOCTL = f"RM_CONTROL{LINK}"
TEMPLATE_KEYS = {"hovertemplate", "texttemplate"}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Synthetic: one process with a hostile comm, command line, call stack and ioctl
    name, leaking 4 MiB (so it has a live-bytes line, an icicle and a latency line)."""
    tmp = tmp_path_factory.mktemp("hostile")
    b = TraceBuilder(layers=("syscall", "api"), duration_s=4.0)
    b.process(100, EVIL_COMM, cmdline=EVIL_CMDLINE)
    b.cuda_alloc(1.0, 100, 4 * MiB, stack=EVIL_FRAMES)
    b.cuda_alloc(2.0, 100, 2 * MiB, stack=["main"])
    for i in range(5):
        b.ioctl(0.5 + i * 0.1, 100, EVIL_IOCTL, latency_ns=1_000 * (i + 1))
    path = b.build(tmp / "trace")
    return tmp, html_of(path, tmp)


def _figures(page: str) -> list[dict[str, Any]]:
    """The figure JSON the page hands to Plotly.newPlot."""
    start = page.index("const F=") + len("const F=")
    figs, _ = json.JSONDecoder().raw_decode(page, start)
    assert isinstance(figs, list)
    return figs


def _strings(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(attribute name, string) for every string in a figure, at any depth."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v, key)


def test_figures_draw_hostile_names_as_text(page: tuple[Path, str]) -> None:
    """Guards the choke point (render.safe.plot_figure): every string of every figure
    (names, labels, hover text, titles, ticks) has `<`, `>`, `&` as entities Plotly
    decodes into text, and no newline or bidi control; only the report's own hover
    templates keep markup, and they hold no trace text."""
    figs = _figures(page[1])
    assert len(figs) >= 3  # live bytes, leak icicle, ioctl latency
    found = list(_strings(figs))
    for key, s in found:
        if key in TEMPLATE_KEYS:
            assert s in html_plots.TEMPLATES
            continue
        assert "<" not in s and ">" not in s, (key, s)
        assert "\n" not in s and "\u202e" not in s, (key, s)
    shown = [s for _, s in found]
    # the hostile text did reach the plots, escaped: the legend entry, the icicle's
    # process and frame labels, the latency line
    link = "&lt;a href=\"https://evil.example\"&gt;x&lt;/a&gt;"
    big = "&lt;span style=\"font-size:80px\"&gt;BIG&lt;/span&gt;"
    assert any(s.startswith(f"api {link}{big} (100)") for s in shown)
    assert f"{link}{big} (100)" in shown
    assert "step&lt;br&gt;forged line\\u202e" in shown
    assert f"leak_{big}" in shown and f"main{link}" in shown
    assert f"RM_CONTROL{link}" in shown
    icicle = next(f["data"][0] for f in figs if f["data"][0]["type"] == "icicle")
    assert not any("evil" in i or "BIG" in i for i in icicle["ids"] + icicle["parents"])


def test_csp_allows_no_outside_origin_and_only_its_own_scripts(page: tuple[Path, str]) -> None:
    """Guards the page's Content-Security-Policy: nothing may be fetched or sent
    (default-src, base-uri and form-action 'none'), no origin is named anywhere, and
    scripts run only if their sha256 is one of the page's two inline scripts (so an
    injected script or event handler, e.g. Plotly's link `onclick`, would not run)."""
    html = page[1]
    metas = re.findall(r'<meta http-equiv=Content-Security-Policy content="([^"]*)">', html)
    assert len(metas) == 1
    csp = {d.split()[0]: d.split()[1:] for d in metas[0].split(";") if d.strip()}
    assert csp["default-src"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"] and csp["form-action"] == ["'none'"]
    scripts = re.findall(r"<script>(.*?)</script>", html, flags=re.DOTALL)
    assert len(scripts) == 2
    hashes = {"'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()
              + "'" for s in scripts}
    assert set(csp["script-src"]) == hashes
    allowed = {"'none'", "'unsafe-inline'", "data:"} | hashes
    for directive, sources in csp.items():
        assert set(sources) <= allowed, (directive, sources)
    assert "'unsafe-inline'" not in csp["script-src"]
    assert csp.get("style-src") == ["'unsafe-inline'"]
    assert not re.search(r"https?:|\*|//", metas[0])


def test_chromium_draws_no_link_or_style_from_the_trace(page: tuple[Path, str]) -> None:
    """Guards what the browser makes of it: with the hostile trace every plot is drawn,
    no console message (a CSP violation would print one), no SVG link or styled span
    built from the trace's text, and the text itself is shown."""
    tmp, html = page
    expected = int(re.search(r"data-plots=(\d+)", html).group(1))  # type: ignore[union-attr]
    r = _chromium(["--dump-dom", (tmp / "report.html").as_uri()], tmp)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [line for line in r.stderr.splitlines() if ":CONSOLE" in line] == []
    dom = r.stdout
    assert f'data-plots-rendered="{expected}"' in dom
    assert not re.search(r"<a\b[^>]*evil\.example", dom)
    assert not re.search(r"<[^>]*style=\"[^\"]*80px", dom)
    assert "forged line" in dom and "&lt;span style=\"font-size:80px\"&gt;BIG" in dom


def _plotly_shows(s: str) -> tuple[list[str], str]:
    """What Plotly's text renderer makes of `s` (svg_text_utils): the tags it would act
    on, and the text it draws (each entity decoded once into a text node)."""
    entities = {"mu": "\u03bc", "amp": "&", "lt": "<", "gt": ">", "nbsp": "\xa0",
                "times": "\xd7", "plusmn": "\xb1", "deg": "\xb0"}

    def decode(m: re.Match[str]) -> str:
        r = m.group(1)
        if r.startswith("#"):
            cp = int(r[2:], 16) if r[1] == "x" else int(r[1:])
            return chr(cp) if cp <= 0x10FFFF else m.group(0)
        return entities.get(r, m.group(0))

    parts = re.split(r"(<[^<>]*>)", re.sub(r"\r\n?|\n", " ", s))
    tags = [p for p in parts if re.fullmatch(r"<[^<>]*>", p)]
    text = "".join(re.sub(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);", decode, p) for p in parts
                   if p not in tags)
    return tags, text


@given(st.text())
def test_plot_text_is_shown_as_written(s: str) -> None:
    """Guards plot_text against any string: Plotly finds no tag in it and draws exactly
    the terminal-safe text (control and bidi characters as visible escapes)."""
    tags, shown = _plotly_shows(plot_text(s))
    assert tags == [] and shown == printable(s)


def test_plot_text_examples() -> None:
    """plot_text: markup and entities become text; ordinary names are unchanged."""
    assert plot_text("api train (1000)") == "api train (1000)"
    assert plot_text(FORGED) == "&lt;br&gt;forged line"
    assert plot_text("&lt;b&gt;") == "&amp;lt;b&amp;gt;"
    assert plot_text('a"b\'c') == 'a"b\'c'  # Plotly would draw &quot; literally
    assert plot_text("x\ny\u202e") == "x\\ny\\u202e"
    assert plot_text(7) == "7"


def test_plot_figure_keeps_only_registered_templates() -> None:
    """Guards the one way around the escaping: a hover template keeps its markup only
    when it is one of the renderer's constants; any other template is refused, so trace
    text can never be formatted into one."""
    fig = plot_figure([{"type": "icicle", "labels": [FORGED],
                        "hovertemplate": "%{label}<br>%{value}"}],
                      {"title": {"text": LINK}}, templates=frozenset({"%{label}<br>%{value}"}))
    assert fig["data"][0]["labels"] == ["&lt;br&gt;forged line"]
    assert fig["data"][0]["hovertemplate"] == "%{label}<br>%{value}"
    assert fig["layout"]["title"]["text"].startswith("&lt;a href=")
    with pytest.raises(ValueError, match="template"):
        plot_figure([{"type": "scatter", "hovertemplate": f"{FORGED}%{{y}}"}], {})
