"""The fleet document as one self-contained HTML page (the analyze report's page and
table helpers; computes nothing, every host-supplied string escaped)."""

from __future__ import annotations

from typing import Any

from gputrace.render.html import Col, Page, esc, human_bytes, num, table, text


def _reasons(v: Any) -> str:
    return esc("; ".join(v or []))


def _outliers(v: Any) -> str:
    return esc(", ".join(f"{o['host']}:{o['trace_id']} ({o['faults_per_s']:.3g}/s)"
                         for o in v or []))


def render_fleet_html(doc: dict[str, Any]) -> str:
    """The page: headline, warnings, then one table per fleet question."""
    lk, g = doc["leaks"], doc["gpus"]
    page = Page(f"gputrace fleet: {doc['dataset']}")
    where = f" where <code>{esc(doc['where'])}</code>" if doc["where"] else ""
    page.add(f"<h1>Fleet {esc(doc['dataset'])}</h1><p>{doc['traces']} traces{where}, "
             f"{doc['engine']['workers']} workers ({esc(doc['engine']['scheduler'])}). "
             f"Leaked: <b>{human_bytes(lk['total_bytes'])}</b> in {lk['total_count']} "
             "allocations.</p>")
    for w in doc["warnings"]:
        page.add(f'<div class="warn">{esc(w)}</div>')
    sections: list[tuple[str, list[dict[str, Any]], list[Col]]] = [
        ("Top leaking jobs", lk["top_jobs"],
         [("host", "host", text), ("pid", "pid", num), ("comm", "comm", text),
          ("bytes", "bytes", human_bytes), ("count", "count", num),
          ("cmdline", "command line", text)]),
        ("Top leaking call sites", lk["top_sites"],
         [("bytes", "bytes", human_bytes), ("count", "count", num),
          ("host_count", "hosts", num), ("traces", "traces", num), ("what", "what", text),
          ("frames", "frames", text)]),
        ("Top holders (held at exit or the trace's end, each byte once; per layer: a "
         f"breakdown; {human_bytes(doc['holders']['held_bytes'])} in all)",
         doc["holders"]["top_processes"],
         [("host", "host", text), ("pid", "pid", num), ("comm", "comm", text),
          ("held_bytes", "held", human_bytes), ("program_bytes", "program", human_bytes),
          ("allocator_pool_bytes", "allocator pool", human_bytes),
          ("cuda_context_bytes", "CUDA context", human_bytes),
          ("driver_only_bytes", "driver-only", human_bytes),
          ("api_layer_bytes", "api layer", human_bytes),
          ("rm_layer_bytes", "rm layer", human_bytes),
          ("uvm_layer_bytes", "uvm layer", human_bytes)]),
        ("GPUs by fragmentation", g["by_fragmentation"],
         [("host", "host", text), ("gpu_index", "GPU", num), ("gpu_model", "model", text),
          ("fragmentation_index", "index", num), ("memory_bytes", "memory", human_bytes)]),
        ("Traces by oversubscription", g["by_oversubscription"],
         [("host", "host", text), ("trace_id", "trace", text), ("gpu_model", "model", text),
          ("oversubscription_ratio", "ratio", num),
          ("managed_peak_bytes", "managed peak", human_bytes),
          ("gpu_memory_bytes", "GPU memory", human_bytes)]),
        ("Fault rate per driver version", doc["fault_rate"]["by_driver_version"],
         [("driver_version", "driver", text), ("traces", "traces", num),
          ("median_faults_per_s", "median/s", num), ("mad_faults_per_s", "MAD/s", num),
          ("max_faults_per_s", "max/s", num), ("outliers", "outliers", _outliers)]),
        ("Drops per host", doc["drops"]["by_host"],
         [("host", "host", text), ("traces", "traces", num),
          ("traces_with_drops", "with drops", num), ("dropped", "dropped", num)]),
        ("Flagged traces", doc["flagged"],
         [("host", "host", text), ("date", "date", text), ("trace_id", "trace", text),
          ("reasons", "why", _reasons)]),
    ]
    totals = [{"report": key, "traces": t["traces"], "figure": f, "total": v}
              for key, t in doc["report_totals"].items() for f, v in t.items() if f != "traces"]
    if totals:
        sections.append(("Report totals", totals,
                         [("report", "report", text), ("traces", "traces", num),
                          ("figure", "figure", text), ("total", "total", num)]))
    sections.append(("Reports not aggregated across traces", doc["not_aggregated"],
                     [("report", "report", text), ("why", "why", text)]))
    for title, rows, cols in sections:
        page.section(title, None, None, table(rows, cols))
    return page.html()
