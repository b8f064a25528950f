"""Several small integer group keys packed into one Int64, so a high-cardinality
group_by hashes one machine word per row instead of row-encoding many columns.

Polars' streaming group_by row-encodes any multi-column key (strings most of all)
before hashing it; a single integer key takes its much cheaper single-column path.
Packing is exact only when every value lies in the range the packing was built for,
so the ranges come from the data itself (a small pre-aggregation) and a packing that
would not fit in 63 bits is refused (`None`): callers then group by the columns.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import polars as pl

_MAX_KEYS = 1 << 63


@dataclass(frozen=True)
class Field:
    """One packed component: `expr` (an integer expression) in [lo, lo + span), nulls
    taking the extra slot `span` when `nullable`; or, with `modulus`, `expr % modulus`
    (non-negative values only: the caller proves the residues keep rows apart)."""

    name: str
    expr: pl.Expr
    lo: int
    span: int
    nullable: bool = True
    modulus: int | None = None

    @property
    def size(self) -> int:
        return self.span + 1 if self.nullable else self.span

    def code(self) -> pl.Expr:
        """The row's digit in [0, size)."""
        return self.shifted() - self.offset() if self.offset() else self.shifted()

    def shifted(self) -> pl.Expr:
        """The digit plus `offset()`: nulls as lo + span, folded values as they are."""
        x = self.expr.cast(pl.Int64)
        if self.modulus is not None:
            x = x % self.modulus
        return x.fill_null(self.offset() + self.span) if self.nullable else x

    def offset(self) -> int:
        return 0 if self.modulus is not None else self.lo

    def unpacked(self) -> pl.Expr:
        """What a row's value unpacks to (`nr % modulus` when folded), named as the field:
        to join unpacked rows with a frame that has the field's input columns."""
        return self.value(self.code())

    def value(self, digit: pl.Expr) -> pl.Expr:
        v = digit if self.modulus is not None else digit + self.lo
        if self.nullable:
            v = pl.when(digit != self.span).then(v)
        return v.alias(self.name)


@dataclass(frozen=True)
class Packing:
    """Mixed-radix packing of `fields`, the first one most significant."""

    fields: tuple[Field, ...]

    @staticmethod
    def of(fields: list[Field]) -> Packing | None:
        """The packing, or None when the fields' sizes multiply to 2**63 or more."""
        total = 1
        for f in fields:
            total *= max(f.size, 1)
        return Packing(tuple(fields)) if total < _MAX_KEYS else None

    def _strides(self) -> list[int]:
        out, stride = [], 1
        for f in reversed(self.fields):
            out.append(stride)
            stride *= max(f.size, 1)
        return out[::-1]

    def key(self) -> pl.Expr:
        """The packed Int64 key of a row, sum of code_i * stride_i: written as
        sum of x_i * stride_i minus one constant (a kernel less per field) when no
        partial sum can leave the Int64 range, else field by field."""
        strides = self._strides()
        bound = sum(max(abs(f.offset()), abs(f.offset() + f.size - 1)) * s
                    for f, s in zip(self.fields, strides, strict=True))
        direct = bound < _MAX_KEYS
        parts, offset = [], 0
        for f, s in zip(self.fields, strides, strict=True):
            x = f.shifted() if direct else f.code()
            parts.append(x if s == 1 else x * s)
            offset += f.offset() * s if direct else 0
        key = functools.reduce(operator.add, parts)
        return key - offset if offset else key

    def unpack(self, key: str) -> list[pl.Expr]:
        """Each field's value back from the packed column `key`, named as the field."""
        k = pl.col(key)
        return [f.value((k // s) % max(f.size, 1))
                for f, s in zip(self.fields, self._strides(), strict=True)]
