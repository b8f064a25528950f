"""`--where EXPR`: which traces, and which jobs in them, a fleet report covers.

Syntax (docs/fleet.md)::

    expr   := term ("or" term)*          term := factor ("and" factor)*
    factor := "not" factor | "(" expr ")" | FIELD OP VALUE | FIELD "in" "(" VALUE, ... ")"
    OP     := = | != | ~ (regex search) | !~ | < | <= | > | >=

Trace fields (from the dataset index): host, date, driver_version, gpu_model, status,
trace_id. Job fields: every column of the processes table (schema.PROCESSES: pid,
ppid, comm, exe, cmdline, cgroup, ..., and the container and pod identity, e.g.
`pod_namespace = 'ml'`). VALUE is a bare word or a quoted string (a whole number for
an integer column). Missing values (null) match nothing, as in SQL; so does a column a
trace older than it does not have.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl
import pyarrow as pa

from gputrace.errors import UsageError
from gputrace.schema import PROCESSES

TRACE_FIELDS = ("host", "date", "driver_version", "gpu_model", "status", "trace_id")
JOB_FIELDS = tuple(c.name for c in PROCESSES.columns)
_INT_FIELDS = tuple(c.name for c in PROCESSES.columns if pa.types.is_integer(c.type))
_OPS = ("!=", "!~", "<=", ">=", "=", "~", "<", ">")
_TOKEN = re.compile(r"""\s*(?:(?P<q>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
                       |(?P<op>!=|!~|<=|>=|[=~<>(),])|(?P<w>[^\s()=!<>~,'"]+))""", re.X)
Node = tuple[Any, ...]


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise UsageError(f"--where: cannot read {text[pos:].strip()[:30]!r} "
                             f"at character {pos + 1}")
        kind = "q" if m.group("q") else "op" if m.group("op") else "w"
        value = m.group(kind)
        if kind == "q":
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out.append((kind, value, m.start(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks, self.i = _tokens(text), 0

    def peek(self, *values: str) -> bool:
        if self.i >= len(self.toks):
            return False
        kind, value, _ = self.toks[self.i]
        return kind != "q" and (value.lower() if kind == "w" else value) in values

    def take(self, what: str) -> tuple[str, str, int]:
        if self.i >= len(self.toks):
            raise UsageError(f"--where: expression ends where {what} was expected")
        self.i += 1
        return self.toks[self.i - 1]

    def expr(self) -> Node:
        node = self.term()
        while self.peek("or"):
            self.i += 1
            node = ("or", node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.peek("and"):
            self.i += 1
            node = ("and", node, self.factor())
        return node

    def factor(self) -> Node:
        if self.peek("not"):
            self.i += 1
            return ("not", self.factor())
        if self.peek("("):
            self.i += 1
            node = self.expr()
            if not self.peek(")"):
                raise UsageError("--where: missing ')'")
            self.i += 1
            return node
        kind, name, at = self.take("a field name")
        if kind != "w" or name not in TRACE_FIELDS + JOB_FIELDS:
            raise UsageError(f"--where: unknown field {name!r} at character {at + 1} (fields: "
                             f"{', '.join(TRACE_FIELDS + JOB_FIELDS)})")
        if self.peek("in"):
            self.i += 1
            if not self.peek("("):
                raise UsageError("--where: 'in' needs a list: in (a, b)")
            self.i += 1
            values = [self.value(name)]
            while self.peek(","):
                self.i += 1
                values.append(self.value(name))
            if not self.peek(")"):
                raise UsageError("--where: missing ')' after the 'in' list")
            self.i += 1
            return ("in", name, tuple(values))
        kind, op, at = self.take("an operator")
        if kind != "op" or op not in _OPS:
            raise UsageError(f"--where: expected an operator ({' '.join(_OPS)}) after "
                             f"{name!r}, not {op!r}")
        value = self.value(name, regex=op in ("~", "!~"))
        return ("cmp", name, op, value)

    def value(self, field: str, regex: bool = False) -> str | int:
        kind, text, at = self.take("a value")
        if kind == "op":
            raise UsageError(f"--where: expected a value at character {at + 1}, not {text!r}")
        if regex:
            try:
                pl.select(pl.lit("").str.contains(text))
            except pl.exceptions.PolarsError:
                raise UsageError(f"--where: {text!r} is not a valid regular expression") \
                    from None
            return text
        if field in _INT_FIELDS:
            try:
                return int(text)
            except ValueError:
                raise UsageError(f"--where: {field} takes an integer, not {text!r}") from None
        return text


def parse(text: str) -> Node:
    """The expression's syntax tree; UsageError naming what is wrong."""
    p = _Parser(text)
    if not p.toks:
        raise UsageError("--where: empty expression")
    node = p.expr()
    if p.i < len(p.toks):
        raise UsageError(f"--where: unexpected {p.toks[p.i][1]!r} at character "
                         f"{p.toks[p.i][2] + 1}")
    return node


def fields(node: Node) -> set[str]:
    if node[0] in ("and", "or"):
        return fields(node[1]) | fields(node[2])
    if node[0] == "not":
        return fields(node[1])
    return {node[1]}


def to_expr(node: Node, known: tuple[str, ...]) -> pl.Expr:
    """A boolean polars expression; fields not in `known` are unknown (null), so the
    result is null where the answer depends on them (Kleene logic)."""
    if node[0] == "and":
        return to_expr(node[1], known) & to_expr(node[2], known)
    if node[0] == "or":
        return to_expr(node[1], known) | to_expr(node[2], known)
    if node[0] == "not":
        return ~to_expr(node[1], known)
    name = node[1]
    if name not in known:
        return pl.lit(None, pl.Boolean)
    col = pl.col(name)
    if node[0] == "in":
        return pl.when(col.is_null()).then(None).otherwise(col.is_in(list(node[2])))
    op, value = node[2], node[3]
    if op in ("~", "!~"):
        hit = col.cast(pl.String).str.contains(str(value))
        return hit if op == "~" else ~hit
    lit = pl.lit(value)
    return {"=": col == lit, "!=": col != lit, "<": col < lit, "<=": col <= lit,
            ">": col > lit, ">=": col >= lit}[op]
