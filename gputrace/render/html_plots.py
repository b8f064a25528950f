"""Plotly figure specs (data + layout dicts) for the HTML report's series.

Each function maps series that `gputrace.analyses.timeseries` (and the modules
it gathers) already built to Plotly traces; none computes a value. A figure is
None when its layer was not recorded, so the page says "not recorded" instead
of drawing a flat zero line.

Every figure is made by `render.safe.plot_figure`, which escapes every string in it
(process names, stack frames, ioctl names all come from the trace), so Plotly draws them
as text; `Page.section` takes nothing else. Hover templates are the constants below.
"""

from __future__ import annotations

from typing import Any

from gputrace.render.safe import PlotFigure, plot_figure

Figure = PlotFigure

HOVER_BYTES = "%{label}<br>%{value:,} bytes<extra></extra>"
HOVER_SITE = "%{meta[0]}<br>%{y:,} bytes live at %{x} s<br>%{meta[1]}<extra></extra>"
TEMPLATES = frozenset({HOVER_BYTES, HOVER_SITE})
"""The only strings of a figure that keep their markup (`plot_figure` refuses others)."""

_BYTES_AXIS = {"title": {"text": "bytes"}, "tickformat": "~s", "ticksuffix": "B",
               "rangemode": "tozero"}
_TIME_AXIS = {"title": {"text": "seconds since trace start"}}
_DASH = {"api": "solid", "rm": "dot", "uvm": "dash"}


def _layout(title: str, yaxis: dict[str, Any], **more: Any) -> dict[str, Any]:
    out = {"title": {"text": title}, "xaxis": _TIME_AXIS, "yaxis": yaxis, "height": 420,
           "margin": {"l": 70, "r": 20, "t": 50, "b": 40},
           "legend": {"orientation": "h", "y": -0.25},
           "hovermode": "closest"}
    out.update(more)
    return out


def live_bytes(s: dict[str, Any]) -> Figure | None:
    """Live bytes per process and layer (step lines) with growth fits drawn dashed."""
    if not s["recorded"] or not s["series"]:
        return None
    data: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "name": x["name"], "x": x["t_s"], "y": x["values"],
         "line": {"shape": "hv", "dash": _DASH.get(x["layer"], "solid")}}
        for x in s["series"]]
    data += [{"type": "scatter", "mode": "lines", "x": f["t_s"], "y": f["values"],
              "name": f"growth fit {f['layer']} pid {f['pid']}",
              "line": {"dash": "longdash", "width": 3, "color": "#d62728"}}
             for f in s["fits"]]
    return plot_figure(data, _layout("Live bytes per process and layer", _BYTES_AXIS))


def gpu_bytes(s: dict[str, Any]) -> Figure | None:
    """Bytes in use per GPU over time."""
    if not s["recorded"] or not s["series"]:
        return None
    data = [{"type": "scatter", "mode": "lines", "name": x["name"], "x": x["t_s"],
             "y": x["values"], "line": {"shape": "hv"}} for x in s["series"]]
    return plot_figure(data, _layout(f"Bytes in use per GPU ({s['source']})", _BYTES_AXIS))


def fault_rates(s: dict[str, Any]) -> Figure | None:
    """Faults, fault batches and migrations per second, one trace per recorded kind."""
    data: list[dict[str, Any]] = []
    label = {"cpu_faults": "CPU faults", "gpu_faults": "GPU faults",
             "fault_batches": "fault batches", "migrations": "migrations"}
    for key, what in label.items():
        part = s[key]
        if not part["recorded"]:
            continue
        for x in part["series"]:
            name = f"{what}: {x['name']}" if x["name"] else what
            data.append({"type": "scatter", "mode": "lines+markers", "name": name,
                         "x": x["t_s"], "y": x["per_s"], "line": {"shape": "hv"},
                         "marker": {"size": 4}})
    if not data:
        return None
    yaxis = {"title": {"text": f"per second (bucket {s['bucket_s']:g} s)"}, "rangemode": "tozero"}
    return plot_figure(data, _layout("Fault rate over time", yaxis))


def fragmentation(rm: dict[str, Any] | None) -> Figure | None:
    """RM heap samples per GPU: unusable share of free memory for 2 MiB allocations."""
    if not rm or not rm.get("gpus"):
        return None
    data: list[dict[str, Any]] = []
    for g in rm["gpus"]:
        pts = g.get("series") or []
        data.append({"type": "scatter", "mode": "lines+markers",
                     "name": f"GPU {g['gpu_index']} unusable share (2 MiB)",
                     "x": [p["t_s"] for p in pts], "y": [p["unusable_share_2m"] for p in pts]})
        data.append({"type": "scatter", "mode": "lines", "yaxis": "y2",
                     "name": f"GPU {g['gpu_index']} largest free",
                     "x": [p["t_s"] for p in pts], "y": [p["largest_free_bytes"] for p in pts],
                     "line": {"dash": "dot"}})
    y2 = dict(_BYTES_AXIS, overlaying="y", side="right", title={"text": "largest free"})
    return plot_figure(data, _layout(
        "Fragmentation over time (RM heap samples)",
        {"title": {"text": "unusable share"}, "range": [0, 1]}, yaxis2=y2))


def leak_icicle(tree: dict[str, Any]) -> Figure | None:
    """Leaked bytes by call stack: layer, process, then frames outermost first."""
    if not tree["ids"]:
        return None
    # The tree's ids are paths of trace text; Plotly only needs them distinct, so the
    # figure carries their positions (escaping could merge two: `printable` is not 1:1).
    node = {i: f"n{k}" for k, i in enumerate(tree["ids"])}
    data = [{"type": "icicle", "ids": [node[i] for i in tree["ids"]],
             "labels": tree["labels"],
             "parents": [node[p] if p else "" for p in tree["parents"]],
             "values": tree["values"], "branchvalues": "total",
             "tiling": {"orientation": "v"}, "root": {"color": "#eee"},
             "textinfo": "label+value", "hovertemplate": HOVER_BYTES}]
    return plot_figure(data, {"title": {"text": "Leaked bytes by call stack"}, "height": 460,
                              "margin": {"l": 10, "r": 10, "t": 50, "b": 10}}, TEMPLATES)


def latency(s: dict[str, Any]) -> Figure | None:
    """ioctl latency distribution per command (log-spaced buckets)."""
    if not s["recorded"] or not s["commands"]:
        return None
    data = [{"type": "scatter", "mode": "lines+markers", "name": c["name"], "x": s["from_us"],
             "y": c["counts"], "line": {"shape": "hv"}} for c in s["commands"]]
    return plot_figure(data, _layout(
        "ioctl latency distribution", {"title": {"text": "calls"}, "rangemode": "tozero"},
        xaxis={"title": {"text": "latency (us, bucket lower edge)"}, "type": "log"}))


def active_memory(s: dict[str, Any], bands: list[dict[str, Any]] | None = None,
                  where: str = "") -> Figure | None:
    """Live bytes stacked by allocation site (`bands`: one device's, else `s["bands"]`);
    the legend names each site, its hover the site and its full stack."""
    bands = s["bands"] if bands is None else bands
    if not s["recorded"] or not bands:
        return None
    data = [{"type": "scatter", "mode": "lines", "stackgroup": "sites", "x": s["t_s"],
             "y": b["values"], "name": _short(b["site"]),
             "meta": [b["site"], "stack: " + (b.get("frames") or b["site"])],
             "line": {"shape": "hv", "width": 0.5}, "hovertemplate": HOVER_SITE}
            for b in bands]
    return plot_figure(data, _layout(
        f"Active memory by allocation site{where} ({s['source']} layer)", _BYTES_AXIS),
        TEMPLATES)


def _short(site: str, width: int = 60) -> str:
    """A legend entry: the site's first `width` characters (the hover has it whole)."""
    return site if len(site) <= width else site[:width - 1] + "\N{HORIZONTAL ELLIPSIS}"


def allocator_state(s: dict[str, Any]) -> Figure | None:
    """One device's reserved and active bytes over time (the caching allocator's view),
    in all and per pool (reserved solid, active dotted), with a marker at each
    out-of-memory entry."""
    if not s.get("entries"):
        return None
    data: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "name": "reserved (segments)", "x": s["t_s"],
         "y": s["reserved"], "line": {"shape": "hv"}},
        {"type": "scatter", "mode": "lines", "name": "active (blocks held, rounded sizes)",
         "x": s["t_s"], "y": s["active"], "line": {"shape": "hv"}, "fill": "tozeroy"}]
    pools = s.get("pools") or []
    if len(pools) > 1:  # one pool: its lines are the totals
        for p in pools:
            data.append({"type": "scatter", "mode": "lines", "name": f"reserved: {p['pool']}",
                         "x": s["t_s"], "y": p["reserved"], "line": {"shape": "hv", "width": 1}})
            data.append({"type": "scatter", "mode": "lines", "name": f"active: {p['pool']}",
                         "x": s["t_s"], "y": p["active"],
                         "line": {"shape": "hv", "width": 1, "dash": "dot"}})
    if s.get("oom_t_s"):
        top = max((v for v in s["reserved"] if v is not None), default=0)
        data.append({"type": "scatter", "mode": "markers", "name": "out of memory",
                     "x": s["oom_t_s"], "y": [top] * len(s["oom_t_s"]),
                     "marker": {"symbol": "x", "size": 10, "color": "#d62728"}})
    return plot_figure(data, _layout(
        f"PyTorch allocator on device {s['device']}: reserved and active", _BYTES_AXIS))


_PIECE_COLOR = {"allocated": "#1f77b4", "internal free": "#ff7f0e", "free": "#dddddd"}


def segment_map(m: dict[str, Any], labels: list[str]) -> Figure | None:
    """One device's segments as bars (`labels`: each segment's name, in order), each
    block a piece at its offset: allocated, internal free (rounding), free."""
    if not m["segments"]:
        return None
    data = []
    for kind, color in _PIECE_COLOR.items():
        ys, xs, bases = [], [], []
        for label, seg in zip(labels, m["segments"], strict=True):
            for p in seg["pieces"]:
                if p["kind"] == kind:
                    ys.append(label)
                    xs.append(p["bytes"])
                    bases.append(p["offset"])
        if ys:
            data.append({"type": "bar", "orientation": "h", "name": kind, "y": ys, "x": xs,
                         "base": bases, "marker": {"color": color,
                                                   "line": {"color": "#fff", "width": 1}}})
    when = ("at the end" if m.get("oom_t_s") is None else
            f"at the out-of-memory at {m['oom_t_s']:.3f} s")
    layout = {"title": {"text": f"Segments on device {m['device']} {when} (where the "
                                "free bytes are)"},
              "barmode": "overlay", "height": 120 + 22 * len(labels),
              "xaxis": dict(_BYTES_AXIS, title={"text": "offset in segment"}),
              "yaxis": {"autorange": "reversed", "type": "category",
                        "categoryorder": "array", "categoryarray": labels},
              "margin": {"l": 200, "r": 20, "t": 50, "b": 40},
              "legend": {"orientation": "h", "y": -0.1}, "hovermode": "closest"}
    return plot_figure(data, layout)
