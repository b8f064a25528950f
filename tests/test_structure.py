"""The package's shape (docs/design.md, "Size guide"): no two classes in gputrace
share a name, and no module grows past the size guide. Both checks read the
source; each is also run on a planted violation, so neither can pass vacuously."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gputrace"
MAX_LINES = 450  # docs/design.md states the same guide


def class_names(files: dict[str, str]) -> dict[str, list[str]]:
    """Class name -> the modules defining a class of that name (nested ones too)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name, src in files.items():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef):
                out[node.name].append(name)
    return out


def duplicates(files: dict[str, str]) -> dict[str, list[str]]:
    return {k: v for k, v in class_names(files).items() if len(v) > 1}


def oversized(files: dict[str, str], limit: int = MAX_LINES) -> dict[str, int]:
    return {n: c for n, s in files.items() if (c := len(s.splitlines())) > limit}


def package_sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE.parent).as_posix(): p.read_text()
            for p in sorted(PACKAGE.rglob("*.py"))}  # fmt: skip


def test_no_two_classes_share_a_name() -> None:
    assert duplicates(package_sources()) == {}


def test_no_module_over_the_size_guide() -> None:
    assert oversized(package_sources()) == {}


def test_checks_see_planted_violations() -> None:
    """Guards the two checks above: a duplicated class (even nested) and a long
    module are reported."""
    files = {"a.py": "class Layer:\n    pass\n",
             "b.py": "def f():\n    class Layer:\n        pass\n"}  # fmt: skip
    assert duplicates(files) == {"Layer": ["a.py", "b.py"]}
    assert oversized({"long.py": "x = 1\n" * (MAX_LINES + 1), "ok.py": "x = 1\n"}) == {
        "long.py": MAX_LINES + 1}
    assert len(package_sources()) > 100  # the real package was read
