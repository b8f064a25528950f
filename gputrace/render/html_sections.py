"""The HTML report's sections: each plot with the table it comes from.

The page lists the reports in registry order; each report's entry names its sections
here (`ReportSpec.html`), and a report that names none gets `generic_section`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gputrace.analyses import registry
from gputrace.analyses.report import REPORT_FIELDS
from gputrace.analyses.report_spec import GROUPINGS, ReportSpec, resolve
from gputrace.render import html_plots as plots
from gputrace.render.allocator_html import stack_cell
from gputrace.render.cells import by_name, workload
from gputrace.render.holder_html import instant_html
from gputrace.render.html import (
    Page,
    bytes_per_min,
    esc,
    human_bytes,
    not_recorded,
    num,
    pid,
    table,
    text,
    yes_no,
)
from gputrace.render.oom_sections import HELD_NOTE
from gputrace.render.terminal import not_recorded_line


def _missing(rep: dict[str, Any] | None, what: str) -> str | None:
    """Why a section has no plot: its report was left out, its layers not recorded, or it
    found nothing to draw."""
    if rep is None:
        return f'<p class="note">{what}: not asked for (--only)</p>'
    if not rep.get("recorded", True):
        layers = ", ".join(rep.get("not_recorded_layers") or [])
        return not_recorded(f"{what} (layer {layers})")
    return None


OWN_SOURCE = frozenset({"active_memory"})
"""Sections drawn from their own series, whatever their report found: the active-memory
timeline draws the allocator layer (a snapshot) when the leak report's layers are absent."""


def sections(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Every section of the analyze report: each report's, in registry order; the reports
    whose layers the trace lacks are one line at the end, not a page of "no rows"."""
    absent = []
    for spec in registry.REPORTS:
        rep = doc.get(spec.key)
        if rep is None:
            continue  # left out with --only
        if not rep.get("recorded", True):
            absent.append(f"{spec.title} ({', '.join(rep.get('not_recorded_layers') or [])})")
            for path in spec.html:
                if path.rsplit(":", 1)[-1] in OWN_SOURCE:
                    resolve(path)(page, doc, s)
            continue
        if spec.html:
            for path in spec.html:
                resolve(path)(page, doc, s)
        else:
            generic_section(page, spec, rep)
        groups_section(page, spec, rep)
    if absent:
        page.add(f'<p class="nr">{esc(not_recorded_line(absent))}</p>')


def groups_section(page: Page, spec: ReportSpec, rep: dict[str, Any] | None) -> None:
    """A report's figures per pod or container (`analyze --by`), when it has them."""
    for by in GROUPINGS:
        rows = (rep or {}).get(f"by_{by}")
        if rows is not None:
            page.section(f"{spec.title} by {by}", None, None, table(rows, [
                (c, c, human_bytes if c.endswith("bytes") else text if isinstance(
                    rows[0].get(c), str) else num) for c in spec.columns_of(f"by_{by}", rows)]))


def generic_section(page: Page, spec: ReportSpec, rep: dict[str, Any] | None) -> None:
    """A report without sections of its own: its question, each figure on a line and each
    list of rows a table (its declared columns: `ReportSpec.columns_of`), in name order."""
    figures, tables = [], []
    for k, v in sorted((rep or {}).items()):
        if k in REPORT_FIELDS:
            continue
        if isinstance(v, list) and all(isinstance(r, dict) for r in v):
            tables.append(f"<h3>{esc(k)}</h3>" + table(v, [
                (c, c, _as_terminal(by_name(c))) for c in spec.columns_of(k, v)]))
        else:  # a figure, or nested values written as text (never Python's repr)
            figures.append(f"<dt>{esc(k)}</dt><dd>{_as_terminal(by_name(k))(v)}</dd>")
    body = (f'<p class="note">{esc(rep["question"])}</p>' if rep else "") + (
        f"<dl>{''.join(figures)}</dl>" if figures else "") + "".join(tables)
    page.section(spec.title, None, _missing(rep, spec.title), body)


def _as_terminal(f: Callable[[Any], str]) -> Callable[[Any], str]:
    """A cell written as the terminal writes it, escaped; '' for None."""
    return lambda v: "" if v is None else esc(f(v))


def live_bytes(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Live bytes per process and layer, with the growth fits (leaks report)."""
    leaks, summ = doc.get("leaks"), doc.get("summary")
    live = s["live_bytes"]
    miss = _missing(leaks, "allocations") or (
        not_recorded("allocation layers (api, syscall)") if not live["recorded"]
        else '<p class="note">no allocations in this trace</p>')
    procs = (summ or {}).get("processes") or []
    growth = (leaks or {}).get("growth") or []
    page.section("Live bytes over time, per process and layer", plots.live_bytes(live), miss,
                 table(procs, [("layer", "layer", text), ("pid", "pid", pid),
                               ("comm", "process", text), ("allocations", "allocations", num),
                               ("peak_bytes", "peak", human_bytes),
                               ("live_end_bytes", "live at end", human_bytes)])
                 + "<h3>Growth fits</h3>"
                 + table(growth, [("layer", "layer", text), ("pid", "pid", pid),
                                  ("slope_bytes_per_min", "slope", bytes_per_min),
                                  ("r2", "R²", num), ("rising_troughs", "rising troughs", num),
                                  ("duration_s", "span s", num),
                                  ("flagged", "growing", yes_no)]))


def active_memory(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Live bytes over time stacked by allocation site, one plot per device; each band's
    hover holds the site's full stack (leaks report; a snapshot's allocator layer)."""
    a = s["active_memory"]
    if not a["recorded"]:
        return  # the line of layers this trace lacks says so
    devices = a.get("devices") or [{"device": None, "bands": a["bands"]}]
    for d in devices:
        where = "" if d["device"] is None else f" on device {d['device']}"
        rows = [{"site": b["site"], "peak": b["peak"],
                 "end": b["values"][-1] if b["values"] else 0} for b in d["bands"]]
        page.section(f"Active memory by allocation site{where}",
                     plots.active_memory(a, d["bands"], where),
                     '<p class="note">no allocations in this trace</p>',
                     table(rows, [("site", "allocation site (first frame of your code)", text),
                                  ("peak", "peak", human_bytes),
                                  ("end", "at end", human_bytes)]))


def gpu_bytes(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Bytes in use per GPU (summary report)."""
    summ = doc.get("summary")
    g = s["gpu_bytes"]
    gt = (summ or {}).get("gpus") or {}
    page.section("Bytes in use per GPU", plots.gpu_bytes(g),
                 _missing(summ, "GPU memory")
                 or (not_recorded("GPU memory (driver or syscall layer)") if not g["recorded"]
                     else '<p class="note">no GPU-attributed memory in this trace</p>'),
                 table(gt.get("gpus") or [], [("gpu_index", "GPU", num),
                                              ("peak_bytes", "peak", human_bytes),
                                              ("end_bytes", "end", human_bytes),
                                              ("memory_bytes", "memory", human_bytes),
                                              ("peak_share", "peak share", num)])
                 + (f"<p>source: {text(gt.get('source'))}; imbalance (max/mean) at peak "
                    f"{num(gt.get('imbalance_peak'))}, at end "
                    f"{num(gt.get('imbalance_end'))}</p>" if gt.get("gpus") else ""))


def fault_rate(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Fault rates over time, fault batches and migrations (fault-rate report)."""
    fr = doc.get("fault_rate")
    f = s["fault_rates"]
    absent = [name for key, name in (("cpu_faults", "CPU faults"), ("gpu_faults", "GPU faults"),
                                     ("fault_batches", "fault batches"),
                                     ("migrations", "migrations")) if not f[key]["recorded"]]
    notes = "".join(not_recorded(a) for a in absent)
    mig = ((fr or {}).get("migrations") or {}).get("by_cause_direction") or []
    page.section("Fault rate over time", plots.fault_rates(f),
                 _missing(fr, "fault rate") or '<p class="note">no faults in this trace</p>',
                 notes + table((fr or {}).get("rates") or [],
                               [("pid", "pid", pid), ("gpu_index", "GPU", num),
                                ("source", "source", text), ("access_type", "access", text),
                                ("faults", "faults", num), ("mean_per_s", "mean/s", num),
                                ("peak_per_s", "peak/s", num)])
                 + "<h3>Fault batches</h3>"
                 + (table(fr["batches"], [("gpu_index", "GPU", num), ("batches", "batches", num),
                                          ("faults", "faults", num),
                                          ("duplicate_share", "dup share", num),
                                          ("service_ns_p50", "service p50 ns", num),
                                          ("service_ns_max", "service max ns", num)])
                    if fr and fr.get("batches") is not None else not_recorded("fault batches"))
                 + "<h3>Migrations by cause</h3>"
                 + (table(mig, [("cause", "cause", text), ("direction", "direction", text),
                                ("migrations", "migrations", num), ("bytes", "bytes", human_bytes)])
                    if fr and fr.get("migrations") is not None else not_recorded("migrations")))


def fragmentation(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Fragmentation over time and PMM chunks (fragmentation report)."""
    frag = doc.get("fragmentation")
    rm = (frag or {}).get("rm")
    pmm = (frag or {}).get("gpus")
    fmiss = _missing(frag, "fragmentation") or not_recorded(
        "fragmentation over time (rm_query layer)")
    pmm_rows = [{"gpu_index": x["gpu_index"], **{f"{at}_{k}": v for at in ("peak", "end")
                                                 for k, v in (x.get(at) or {}).items()}}
                for x in pmm or []]
    page.section("Fragmentation over time", plots.fragmentation(rm), fmiss,
                 (table(rm["gpus"], [("gpu_index", "GPU", num), ("samples", "samples", num),
                                     ("heap_size_bytes", "heap", human_bytes),
                                     ("min_free_bytes", "min free", human_bytes),
                                     ("min_largest_free_bytes", "min largest free",
                                      human_bytes)]) if rm else "")
                 + ("<h3>PMM chunks (driver layer)</h3>" + table(pmm_rows, [
                     ("gpu_index", "GPU", num), ("peak_used_bytes", "peak used", human_bytes),
                     ("peak_fragmentation_index", "peak index", num),
                     ("end_used_bytes", "end used", human_bytes),
                     ("end_fragmentation_index", "end index", num)]) if pmm is not None
                    else not_recorded("PMM chunks (driver layer)")))


def leak_sites(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Leaked bytes by call stack (leaks report)."""
    leaks = doc.get("leaks")
    rows = [dict(r, stack={"site": r.get("site"), "frames": r["frames"][::-1]})
            for r in s["leak_stacks"]]
    page.section("Top leak sites: leaked bytes by call stack", plots.leak_icicle(s["leak_tree"]),
                 _missing(leaks, "leaks") or '<p class="note">nothing leaked</p>',
                 table(rows, [("layer", "layer", text), ("pid", "pid", pid),
                              ("comm", "process", text), ("count", "allocations", num),
                              ("bytes", "bytes", human_bytes),
                              ("stack", "site (click for the stack, innermost first)",
                                                        stack_cell)], limit=30)
                 + "".join(f'<p class="note">{num(n)} more {esc(k)} rows not kept by the report '
                           "(--top or its bound; the totals count them)</p>"
                           for k, n in sorted(((leaks or {}).get("left_out") or {}).items()))
                 + (instant_html(own, none_line=False)
                    if (own := (leaks or {}).get("no_live_owner")) else ""))


def ioctl_latency(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """ioctl latency per command (summary report)."""
    summ = doc.get("summary")
    page.section("ioctl latency per command", plots.latency(s["latency"]),
                 _missing(summ, "ioctl latency") or (
                     not_recorded("ioctls (syscall layer)") if not s["latency"]["recorded"]
                     else '<p class="note">no ioctls in this trace</p>'),
                 table((summ or {}).get("ioctls") or [], [
                     ("name", "command", text), ("device", "device", text),
                     ("gpu_index", "GPU", num), ("count", "calls", num),
                     ("failed", "failed", num), ("latency_ns_p50", "p50 ns", num),
                     ("latency_ns_p90", "p90 ns", num), ("latency_ns_p99", "p99 ns", num),
                     ("latency_ns_max", "max ns", num), ("total_ns", "total ns", num)]))


def oom(page: Page, doc: dict[str, Any], s: dict[str, Any]) -> None:
    """Each out-of-memory incident: what failed, the GPU then, the verdict, the holders
    (oom report)."""
    rep = doc.get("oom")
    window = (rep or {}).get("window_s")
    parts = []
    for n, inc in enumerate((rep or {}).get("incidents") or [], 1):
        g = inc["gpu"] or {}
        parts.append(
            f"<h3>Incident {n}: {esc(inc['verdict'])}</h3><p>{num(inc['t_s'])} s: "
            + (f"pid {pid(inc['pid'])} ({esc(inc['comm'])}) tid {pid(inc['tid'])}"
               f"{esc(' in ' + where) if (where := workload(inc)) else ''}, "
               if inc["pid"] is not None else "")
            +
            f"{esc(inc['call'])} ({esc(inc['layer'])}) of "
            f"{human_bytes(inc['requested_bytes'])} on GPU {num(inc['gpu_index'])}, "
            f"{num(inc['attempts'])} attempt(s)</p><p>{esc(inc['evidence'])}</p>"
            + table([g], [("total_bytes", "total", human_bytes),
                          ("free_bytes", "free", human_bytes),
                          ("largest_free_bytes", "largest free", human_bytes),
                          ("sample_trigger", "sample", text),
                          ("sample_distance_ns", "sample distance ns", num)])
            + (f"<details><summary>call stack</summary><small>{esc(inc['stack'])}</small>"
               "</details>" if inc["stack"] else "<p>stack: (none recorded)</p>")
            + table([dict(h, traced="yes" if h["traced"] else "not traced")
                     for h in inc["holders"]],
                    [("pid", "pid", pid), ("comm", "comm", text), ("traced", "traced", text),
                     ("driver_bytes", "driver", human_bytes), ("held_bytes", "held", human_bytes),
                     ("grew_bytes", f"grew in {window} s", human_bytes),
                     ("api_bytes", "layer api", human_bytes), ("rm_bytes", "layer rm", human_bytes),
                     ("uvm_bytes", "layer uvm", human_bytes),
                     ("allocator_reserved_bytes", "pool reserved", human_bytes),
                     ("allocator_allocated_bytes", "pool allocated", human_bytes)])
            + (f'<p class="note">{esc(HELD_NOTE)}</p>' if inc["holders"] else "")
            + (f'<p class="note">{num(rest["count"])} more holders not listed (driver '
               f'{human_bytes(rest["driver_bytes"])}, held {human_bytes(rest["held_bytes"])}; '
               "--format json lists the first ones)</p>"
               if (rest := inc.get("holders_left_out")) and rest["count"] else "")
            + (table(sites, [
                ("pid", "pid", pid), ("layer", "layer", text), ("what", "what", text),
                ("bytes", "bytes", human_bytes), ("count", "count", num),
                ("stack", "site", text)]) if (sites := [
                    dict(x, pid=h["pid"]) for h in inc["holders"] for x in h["top_sites"]])
               else "")
            + (instant_html(own, none_line=False) if (own := inc.get("no_live_owner")) else ""))
    body = "".join(parts) or ('<p class="note">no allocation failed for want of memory</p>'
                              if rep and rep.get("recorded") else "")
    page.section("Out of memory", None, _missing(rep, "out of memory"), body)
