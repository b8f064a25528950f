"""The reports, as docs/reports.md lists them: a table written from the registry (a
generated block, gputrace/docblocks.py), so no page lists reports by hand."""

from __future__ import annotations

from gputrace.analyses import registry


def reports_table() -> str:
    """Every registered report: its CLI name, JSON key, question, the trace layers it
    reads and its page, in registry order."""
    out = ["| report (`--only`) | JSON key | question | trace layers read | page |",
           "|---|---|---|---|---|"]
    for s in registry.REPORTS:
        layers = ", ".join(f"`{x}`" for x in s.layers) or "none"
        out.append(f"| `{s.name}` | `{s.key}` | {s.question} | {layers} | "
                   f"[{s.name}](analyses/{s.name}.md) |")
    return "\n".join(out) + "\n"


def json_keys_table() -> str:
    """docs/json-report.md's top-level table: a key per report, then the document's own
    (run.document writes them)."""
    out = ["| key | type | meaning |", "|---|---|---|"]
    out += [f"| `{s.key}` | object or null | {s.question} ([analyses/{s.name}.md]"
            f"(analyses/{s.name}.md)); `null` when `--only` left it out |"
            for s in registry.REPORTS]
    out += ["| `warnings` | list of strings | trace-level warnings: status other than "
            "`complete`, events dropped |",
            "| `trace` | object | `status`, `layers`, `synthetic`, `start_ts_ns`, `end_ts_ns`, "
            "`duration_s`, `drops`, `gpu_memory_bytes` |"]
    return "\n".join(out) + "\n"
