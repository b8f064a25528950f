"""The generated blocks of the docs: prose pages that list what the code already lists
(the reports, the /proc facts) hold that list between two markers, written from the code
by `python3 -m gputrace.docblocks` (`--check`: exit 1 naming each stale block; a test
runs it). A block is

    <!-- generated: NAME (python3 -m gputrace.docblocks) -->
    ...
    <!-- end generated: NAME -->

and BLOCKS says which function writes it. docs/trace-format.md is generated whole, from
the schema (`python3 -m gputrace.schema`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gputrace.analyses.report_spec import resolve

ROOT = Path(__file__).resolve().parent.parent

BLOCKS: dict[tuple[str, str], str] = {
    ("docs/reports.md", "reports"): "gputrace.analyses.catalog:reports_table",
    ("docs/json-report.md", "json-keys"): "gputrace.analyses.catalog:json_keys_table",
    ("docs/record.md", "procfs"): "gputrace.record.procfs:facts_table",
}
"""(doc file relative to the repository, block name) → "module:function" returning the
block's markdown."""


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {re.escape(name)} [^\n]*-->\n)(.*?)"
                      rf"(<!-- end generated: {re.escape(name)} -->)", re.S)


def fill(text: str, name: str, body: str) -> str:
    """`text` with block `name`'s contents replaced by `body` (the markers kept)."""
    pat = _pattern(name)
    if not pat.search(text):
        raise ValueError(f"no generated block {name!r}")
    return pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(3), text, count=1)


def stale(root: Path = ROOT) -> list[str]:
    """The blocks whose text is not what the code writes now, as "file: name"."""
    out = []
    for (doc, name), path in BLOCKS.items():
        text = (root / doc).read_text()
        if fill(text, name, resolve(path)()) != text:
            out.append(f"{doc}: {name}")
    return out


def write(root: Path = ROOT) -> None:
    """Rewrite every generated block from the code."""
    for (doc, name), path in BLOCKS.items():
        f = root / doc
        f.write_text(fill(f.read_text(), name, resolve(path)()))


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        bad = stale()
        for b in bad:
            print(f"stale generated block {b}: run `python3 -m gputrace.docblocks`")
        return 1 if bad else 0
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
