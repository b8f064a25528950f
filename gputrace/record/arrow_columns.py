"""Arrow tables of a schema table from numpy columns, built fast: narrowing in numpy,
enum names from their codes run by run, repeated values and nulls built once and
sliced, a table's plan (schema, columns, which are enum names) cached.

Used by the UVM tools decoder, whose drains can hold a million records, and by
the driver layer's sample tables. Pure numpy/pyarrow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from gputrace import schema

_ENUM_NAMES = {k: pa.array([v.get(i) for i in range(256)], pa.string())
               for k, v in schema.ENUMS.items()}
_ENUM_BYTES = {k: [v[i].encode() if i in v else None for i in range(256)]
               for k, v in schema.ENUMS.items()}
_ENUM_LEN = {k: np.array([len(b or b"") for b in v], np.int32) for k, v in _ENUM_BYTES.items()}


def masked(values: npt.NDArray[Any], valid: npt.NDArray[np.bool_] | None) -> Any:
    """`values` as an Arrow array, null where `valid` is False.

    Numeric values are wrapped without a copy under a packed validity bitmap:
    `pa.array(values, mask=...)` costs ~23 ns a value (it converts value by value), this
    ~1, and a drain holds a million events of a dozen nullable columns."""
    v = np.ascontiguousarray(values)
    if valid is None or bool(valid.all()):
        return pa.array(v)
    if v.dtype.kind not in "iuf" or not v.dtype.isnative:
        return pa.array(v, mask=~valid)
    bitmap = np.packbits(valid, bitorder="little")
    return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v),
                                 [pa.py_buffer(bitmap.data), pa.py_buffer(v.data)])


Col = Any
"""A column value for `build_table`: a numpy array, (array, null mask), or a pyarrow array."""


_INT_TYPES: dict[Any, tuple[np.dtype[Any], int, int]] = {
    t: (np.dtype(d), int(np.iinfo(d).min), int(np.iinfo(d).max))
    for t, d in ((pa.int8(), np.int8), (pa.int16(), np.int16), (pa.int32(), np.int32),
                 (pa.int64(), np.int64), (pa.uint8(), np.uint8), (pa.uint16(), np.uint16),
                 (pa.uint32(), np.uint32), (pa.uint64(), np.uint64))}
"""Arrow integer type -> its numpy type and range."""


def _arrow(v: Col, typ: Any) -> Any:
    """One column as an Arrow array of type `typ` (a safe cast: out-of-range values raise)."""
    if isinstance(v, pa.Array | pa.ChunkedArray):
        return v if v.type == typ else v.cast(typ)
    null = None
    if isinstance(v, tuple):
        v, null = v
        nulls = int(np.count_nonzero(null))
        if nulls == len(null):
            return pa.nulls(len(null), typ)
        if not nulls:
            null = None
        else:  # values under a null do not count in the range check below
            v = np.where(null, 0, v)
    want = _INT_TYPES.get(typ)
    # narrowing in numpy where every value fits (an Arrow cast costs ~25 us a column);
    # otherwise Arrow's safe cast below raises as it always did
    if (want is not None and v.dtype != want[0] and len(v)
            and want[1] <= int(v.min()) and int(v.max()) <= want[2]):
        v = v.astype(want[0])
    arr = masked(v, None if null is None else ~null)
    return arr if arr.type == typ else arr.cast(typ)


_REPEATS: dict[tuple[Any, ...], Any] = {}


def _repeated(key: tuple[Any, ...], n: int, make: Any) -> Any:
    """`make(size)` (an Arrow array of one repeated value, or nulls) sliced to n rows:
    built once at a power-of-two size per key, then sliced (zero-copy)."""
    arr = _REPEATS.get(key)
    if arr is None or len(arr) < n:
        arr = _REPEATS[key] = make(max(1024, 1 << (n - 1).bit_length()))
    return arr.slice(0, n)


def _enum_strings(enum: str, codes: npt.NDArray[np.uint8]) -> Any:
    """The names of `codes` (null where a code has none) as a string array.

    Codes come in long runs (a drain's GPU faults share source and access type), so
    the array is built run by run from cached name bytes; many short runs use Arrow's
    take over the 256-entry name table instead."""
    n = len(codes)
    names = _ENUM_BYTES[enum]
    change = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = [0, *change.tolist()] if n and len(change) <= (n >> 5) + 16 else []
    run_codes = codes[starts].tolist()
    if not starts or any(names[c] is None for c in run_codes):
        idx: Any = pa.array(np.ascontiguousarray(codes))
        return _ENUM_NAMES[enum].take(idx)
    if len(starts) == 1:
        name = names[run_codes[0]] or b""
        return _repeated(("enum", enum, name), n, lambda size: _strings(
            np.arange(0, (size + 1) * len(name), len(name), dtype=np.int32), name * size))
    first = np.array(starts, np.intp)
    runs = np.append(first[1:], n) - first
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.repeat(_ENUM_LEN[enum][run_codes], runs), out=offsets[1:])
    return _strings(offsets, b"".join([(names[c] or b"") * m for c, m in zip(
        run_codes, runs.tolist(), strict=True)]))


def const(value: int, dtype: type[np.integer[Any]], n: int) -> Any:
    """`value` n times (as an Arrow array)."""
    return _repeated(("const", value, dtype), n,
                     lambda size: pa.array(np.full(size, value, dtype)))


def _strings(offsets: npt.NDArray[np.int32], data: bytes) -> Any:
    """A string array over `data` cut at `offsets` (no copy)."""
    return pa.Array.from_buffers(pa.string(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.data), pa.py_buffer(data)])


_Plan = tuple[pa.Schema, tuple[tuple[str, pa.DataType, bool], ...]]
_PLANS: dict[str, _Plan] = {}


def _plan(name: str) -> _Plan:
    """A table's Arrow schema and (column, type, is an enum name) list, built once."""
    p = _PLANS.get(name)
    if p is None:
        t = schema.table(name)
        p = _PLANS[name] = (t.arrow_schema, tuple(
            (c.name, c.type, c.name in schema.ENUMS) for c in t.columns))
    return p


def build_table(name: str, n: int, cols: Mapping[str, Col]) -> pa.Table:
    """A table of `name` from the given columns; enum names come from their codes, other
    columns not given are null."""
    arrow_schema, plan = _plan(name)
    arrays: list[Any] = []
    for cname, typ, enum in plan:
        v = cols.get(cname)
        if v is not None:
            arrays.append(_arrow(v, typ))
        elif enum and (code := cols.get(f"{cname}_code")) is not None:
            if isinstance(code, pa.Array):  # a `const`
                code = code.to_numpy()
            arrays.append(_enum_strings(cname, code))  # codes are uint8 (the LUTs')
        else:
            arrays.append(_repeated(("null", typ), n, lambda size, t=typ: pa.nulls(size, t)))
    return pa.Table.from_arrays(arrays, schema=arrow_schema)
