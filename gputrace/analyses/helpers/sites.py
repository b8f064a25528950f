"""Where in the user's own code was memory allocated?

A *site* is the first frame, innermost first, that belongs to the user's program:
the frames of the unwinder that took the stack (`torch::unwind::unwind`,
`CapturedTraceback::gather`), of the interpreter (CPython's eval loop, `_PyEval_*`,
`PyObject_*`, libpython), of PyTorch's dispatcher and C++ (`c10::`, `at::`,
`torch::`), of `torch` itself, of installed packages (site-packages,
dist-packages), of the standard library (Unix and Windows layouts) and of system
and CUDA libraries are skipped for the site and kept in the full stack. The rules
follow what PyTorch's own viewer omits (`_frame_filter` in
torch/cuda/_memory_viz.py) and go further, to the user's line.

In a recorded (API-layer) stack the CUDA call the program made is part of the
site: `cudaMalloc < main`, where `cudaMalloc` is the outermost CUDA API frame
inside the user's frame. The hashed symbols of a statically linked CUDA runtime
(`libcudart_static_<40 hex>`) read as one `libcudart (static)` frame.

A user whose own code is a package (installed in site-packages) names it with a
`SiteFilter` (`--site-filter`): a path prefix, or a pattern with `*` and `?`; then
exactly the frames whose file (or native module) matches are the user's.

Two different sites never share a label: where two would read the same, each
names its full path (Python) or module and offset (native), and if that still
reads the same, a number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

STATIC_CUDART = "libcudart (static)"
"""How the hashed symbols of a statically linked CUDA runtime read, as one frame."""
NO_STACK = "(no stack recorded)"

_UNWINDER = r"unwind::unwind|CapturedTraceback::gather|gather_with_cpp"
# CPython's C API, eval loop and startup, by function and by source file
_INTERP_FN = (r"^_?Py[A-Z_]|PyEval_|PyObject_|PyFunction_|^cfunction_|vectorcall|"
              r"^slot_tp_|^method_|^_start$|^__libc_start|^start_thread$|^clone3?$|"
              r"^pymain_|^run_(mod|eval_code_obj|pyc_file)$|^_?PyRun")
_INTERP_FILE = (r"(^|/)(Python|Objects|Modules|Include|Parser|Programs)/[^/]+\.[ch]$|"
                r"pythonrun\.c|ceval|pycore_|cpython/|(^|/)libpython[\d.]*\.so")
_PYTHON_BINARY = r"(^|/)python[\d.]*$"
# PyTorch's dispatcher, ATen, c10 and bindings
_DISPATCH_FN = (r"^([\w:<>*& ]+ )?(c10|at|torch|caffe2|pybind11|std|__gnu_cxx|c10d|"
                r"THP\w*)::|^THP|^at_|^void (c10|at|torch)::|"
                # the same names mangled, as symbol tables hold them (c10::, at::, std::)
                r"^_ZN[KL]?(3c10|2at|5torch|8pybind11|6caffe2|4c10d|St)")
_DISPATCH_FILE = (r"core/boxing|/Register|/Redispatch|/aten/src/|(^|/)c10/|"
                  r"/torch/csrc/|/pybind11/")
# torch's Python, installed packages, the standard library, system and CUDA libraries
_LIBRARY_FILE = (r"(^|/)torch/|(^|/)lib(torch|c10)[\w.-]*\.so|/(site|dist)-packages/|"
                 r"(?i:/lib(64)?/python\d[\d.]*/)|^<frozen |"
                 r"(?i:^[a-z]:/(.*/)?(python\d*|anaconda\d*|miniconda\d*|miniforge\d*)/"
                 r"(envs/[^/]+/)?lib/)|"
                 r"^/usr/lib|^/lib(64)?/|^/usr/local/cuda|/lib64/|"
                 r"(^|/)(ld-linux[\w.-]*|lib(c|m|dl|rt|pthread|stdc\+\+|gcc_s|cuda|cudart|"
                 r"cublas|cublasLt|cudnn\w*|nccl|nvrtc|ffi|nvidia-[\w-]+)[.-][\w.-]*)$")
_STATIC_CUDART = r"^libcudart_static_[0-9a-f]{40}$"
# a public CUDA (or CUDA library) entry point: the call the program made
_API_FN = (r"^cu(da)?[A-Z]\w*$|^(nccl|cublas|cublasLt|cudnn|cufft|curand|cusparse|"
           r"cusolver|nvrtc)[A-Z]\w*$")

SITE_FILTER_MAX = 1024
"""Longest `--site-filter` accepted (a path prefix or pattern, never a document)."""


@dataclass(frozen=True)
class SiteFilter:
    """The user's own code, for a user whose code is itself a package: frames whose
    file or module starts with `text`, or matches it as a pattern (`*`, `?`)."""

    text: str

    @classmethod
    def parse(cls, text: str) -> SiteFilter:
        """A filter from `--site-filter`; ValueError with one line saying why not."""
        if not text or not text.strip():
            raise ValueError("--site-filter: give a path prefix or pattern, not nothing")
        if len(text) > SITE_FILTER_MAX:
            raise ValueError(f"--site-filter: at most {SITE_FILTER_MAX} characters")
        if not text.isprintable():
            raise ValueError("--site-filter: control characters are not a path")
        return cls(text.replace("\\", "/"))

    def regex(self) -> str:
        """The filter as a regular expression over a frame's path ('/' separators)."""
        if not any(c in self.text for c in "*?"):
            return "^" + re.escape(self.text)
        body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                       for c in self.text)
        return "^" + body + "$"


_FRAME_KEY = ["kind", "function", "filename", "line", "symbol", "module", "offset", "_ip"]


def _hex_series(s: pl.Series) -> pl.Series:
    """Each integer as `0x…` text, formatted once per distinct value (a stack table
    repeats offsets: per row it would cost a Python call each)."""
    values = s.drop_nulls().unique().to_list()
    return s.replace_strict(values, [f"0x{v:x}" for v in values], default=None,
                            return_dtype=pl.String)


def _hex(column: str) -> pl.Expr:
    return pl.col(column).map_batches(_hex_series, return_dtype=pl.String)


def _classified(frames: pl.LazyFrame, site_filter: SiteFilter | None) -> pl.LazyFrame:
    """`frames` (depth, kind, function, filename, line, symbol, module, offset, ip)
    plus `text` (one frame as reports write it), `long` (the same with full path or
    module and offset), `ident`, and the flags `user`, `plumbing` (unwinder,
    interpreter, dispatcher) and `api`."""
    source = (pl.col("kind") == "python").fill_null(False)
    name = pl.when(source).then(pl.col("function")).otherwise(pl.col("symbol")).fill_null("")
    path = (pl.when(source).then(pl.col("filename")).otherwise(pl.col("module"))
            .fill_null("").str.replace_all("\\", "/", literal=True))
    static = name.str.contains(_STATIC_CUDART)
    line = pl.col("line").cast(pl.String).fill_null("?")
    func = pl.col("function").fill_null("?")
    base = path.str.extract(r"([^/]+)$").fill_null("?")
    py_text = pl.format("{} ({}:{})", func, base, line)
    py_long = pl.format("{} ({}:{})", func, pl.when(path == "").then(pl.lit("?"))
                        .otherwise(path), line)
    off, ipx = _hex("offset"), _hex("_ip")
    unresolved = pl.coalesce(pl.format("{}+{}", base, off), ipx, pl.lit("?"))
    nat_text = (pl.when(static).then(pl.lit(STATIC_CUDART))
                .otherwise(pl.coalesce(pl.col("symbol"), unresolved)))
    nat_long = pl.format("{} ({})", nat_text, base)
    plumbing = (name.str.contains(_UNWINDER) | name.str.contains(_INTERP_FN)
                | path.str.contains(_INTERP_FILE)
                | ((name == "main") & path.str.contains(_PYTHON_BINARY))
                | name.str.contains(_DISPATCH_FN)
                | path.str.contains(_DISPATCH_FILE))
    api = ~source & name.str.contains(_API_FN)
    # a frame of no known file or module (C++ `??`, an address nothing maps)
    unknown = (path.str.contains(r"^(\?\?)?$")
               & (source | pl.col("symbol").is_null()))
    library = plumbing | api | static | unknown | path.str.contains(_LIBRARY_FILE)
    user = (path.str.contains(site_filter.regex()) & ~static & ~api
            if site_filter is not None else ~library)
    # a stack table repeats its frames: each distinct one is read once, then joined back
    # (the instruction address matters only to a frame with neither symbol nor module)
    frames = frames.with_columns(_ip=pl.when(pl.col("symbol").is_null()
                                             & pl.col("module").is_null()).then(pl.col("ip")))
    distinct = frames.select(_FRAME_KEY).unique().with_columns(
        text=pl.when(source).then(py_text).otherwise(nat_text),
        long=pl.when(source).then(py_long).otherwise(nat_long),
        # a native frame's site is its function (no line to tell calls in it apart)
        ident=pl.when(source).then(py_long).otherwise(
            pl.format("{}|{}", pl.coalesce(pl.col("symbol"), unresolved), path)),
        user=user.fill_null(False), plumbing=plumbing.fill_null(False),
        api=api.fill_null(False))
    return frames.join(distinct, on=_FRAME_KEY, how="left", nulls_equal=True,
                       maintain_order="left")


def _sites(frames: pl.LazyFrame, keys: list[str], site_filter: SiteFilter | None,
           full_paths: bool = False, site_frames: bool = False) -> pl.LazyFrame:
    """One row per stack (`keys`): `frames`, every frame innermost first joined by
    ' < ' (a run of static-runtime frames as one); `site`, its label, distinct per
    site; `site_id`, the site with full paths (the same whatever other sites a trace
    holds: what two traces are matched by); with `site_frames`, also the stack without
    the unwinder, interpreter and dispatcher frames (what a flame graph draws)."""
    f = _classified(frames.sort([*keys, "depth"]), site_filter)
    # a run of hashed static-runtime frames reads as one frame
    repeat = ((pl.col("text") == STATIC_CUDART)
              & (pl.col("text").shift(1).over(keys) == STATIC_CUDART))
    f = f.filter(~repeat.fill_null(False))
    first_user = pl.col("depth").filter(pl.col("user")).min()
    shown = pl.col("long" if full_paths else "text")
    per = f.group_by(keys, maintain_order=True).agg(
        shown.str.join(" < ").alias("frames"),
        shown.filter(~pl.col("plumbing")).str.join(" < ").alias("site_frames"),
        u_text=pl.col("text").filter(pl.col("depth") == first_user).first(),
        u_long=pl.col("long").filter(pl.col("depth") == first_user).first(),
        u_ident=pl.col("ident").filter(pl.col("depth") == first_user).first(),
        c_text=pl.col("text").filter(pl.col("api") & (pl.col("depth") < first_user)).last(),
        c_ident=pl.col("ident").filter(pl.col("api") & (pl.col("depth") < first_user)).last(),
        # no user frame: the outermost CUDA call (what the libraries asked for on the
        # program's behalf), else the innermost frame that is not plumbing
        **{f"f_{c}": pl.coalesce(pl.col(c).filter(pl.col("api")).last(),
                                 pl.col(c).filter(~pl.col("plumbing")).first(),
                                 pl.col(c).first()) for c in ("text", "long", "ident")})
    has_user = pl.col("u_ident").is_not_null()

    def joined(call: str, own: str) -> pl.Expr:
        return (pl.when(pl.col(call).is_not_null())
                .then(pl.format("{} < {}", pl.col(call), pl.col(own))).otherwise(pl.col(own)))

    per = per.with_columns(
        short=pl.when(has_user).then(joined("c_text", "u_text")).otherwise("f_text"),
        longer=pl.when(has_user).then(joined("c_text", "u_long")).otherwise("f_long"),
        sid=pl.when(has_user).then(pl.format("{}#{}", pl.col("c_ident").fill_null(""),
                                             pl.col("u_ident")))
        .otherwise(pl.col("f_ident")))
    # two sites never share a label: the longer form, then a number
    clash = pl.col("sid").n_unique().over("short") > 1
    per = per.with_columns(label=pl.when(clash).then("longer").otherwise("short"))
    rank = pl.col("sid").rank("dense").over("label").cast(pl.String)
    clash2 = pl.col("sid").n_unique().over("label") > 1
    per = per.with_columns(site=pl.when(clash2).then(pl.format("{} #{}", pl.col("label"), rank))
                           .otherwise("label"))
    return per.select(*keys, "frames", pl.col("site").fill_null(NO_STACK),
                      pl.col("longer").fill_null(NO_STACK).alias("site_id"),
                      *(["site_frames"] if site_frames else []))


_FRAME_COLUMNS = {"kind": pl.String, "function": pl.String, "filename": pl.String,
                  "line": pl.Int64, "symbol": pl.String, "module": pl.String,
                  "offset": pl.UInt64, "ip": pl.UInt64}


def _complete(frames: pl.LazyFrame, kind: str | None) -> pl.LazyFrame:
    """`frames` with every column _classified reads, the missing ones null."""
    have = frames.collect_schema().names()
    add = [pl.lit(kind if c == "kind" else None, dtype).alias(c)
           for c, dtype in _FRAME_COLUMNS.items() if c not in have]
    return frames.with_columns(add) if add else frames


def recorded_sites(stacks: pl.LazyFrame, site_filter: SiteFilter | None = None,
                   site_frames: bool = False) -> pl.LazyFrame:
    """(pid, stack_id, frames, site, site_id[, site_frames]) of the recorded `stacks`
    table."""
    return _sites(_complete(stacks, None), ["pid", "stack_id"], site_filter,
                  site_frames=site_frames)


def allocator_sites(frames: pl.LazyFrame, site_filter: SiteFilter | None = None,
                    site_frames: bool = False) -> pl.LazyFrame:
    """(stack_id, frames, site, site_id[, site_frames]) of a snapshot's `allocator_frames` table
    (each frame `function (file:line)` with its full path in `frames`, C++ frames
    included)."""
    return _sites(_complete(frames, "python").with_columns(kind=pl.lit("python")),
                  ["stack_id"], site_filter, full_paths=True, site_frames=site_frames)
