"""Where PyTorch's caching allocator starts and ends a tensor's life, in a libc10_cuda.so.

The entry points are methods of `c10::cuda::CUDACachingAllocator::Native::
NativeCachingAllocator`, found by their mangled names in .symtab (the wheels build
libc10_cuda with hidden visibility: these are LOCAL symbols, absent from .dynsym),
else .dynsym. One table per release line, each traced to the tag whose
c10/cuda/CUDACachingAllocator.cpp declares them; docs/driver-facts.md ("PyTorch")
lists what the real wheels hold.

malloc's return is taken at its `ret` instructions (uprobes at those offsets), never
by a uretprobe: malloc throws c10::OutOfMemoryError, and a C++ exception that unwinds
through a uretprobe's return trampoline finds no unwind information there and ends
the process in std::terminate. The `ret`s are the places where malloc's .eh_frame
says the CFA is rsp + 8 (everything popped) and the byte there is a `ret`; a
function whose frame ends in anything else there (a tail jump) is refused: its
return could not be seen, and rows would be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputrace.record import elf

_NS = "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator"
MALLOC = f"{_NS}6mallocEPPvamP11CUstream_st"
"""malloc(void** devPtr, c10::DeviceIndex (signed char) device, size_t size, cudaStream_t)"""
FREE = f"{_NS}4freeEPv"
"""free(void* ptr): every tensor's and raw_delete's free goes through it (2.14)."""
RAW_DELETE = f"{_NS}10raw_deleteEPv"
"""raw_delete(void* ptr): free inlined into it (2.5)."""
LOCAL_RAW_DELETE = "_ZN3c104cuda20CUDACachingAllocator6Native16local_raw_deleteEPv"
"""c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void* ptr), a free function:
the deleter of every tensor's DataPtr, with free inlined into it (2.5)."""
MALLOC_INT_DEVICE = f"{_NS}6mallocEPPvimP11CUstream_st"
"""malloc(void**, int device, size_t, cudaStream_t): 2.1's (the device an int, not yet
c10::DeviceIndex; the probe reads its low byte, as for an int8_t)."""

_ASYNC = "_ZN3c104cuda20CUDACachingAllocator15CudaMallocAsync12_GLOBAL__N_1"
MALLOC_ASYNC = f"{_ASYNC}11mallocAsyncEPPvamP11CUstream_st"
"""The cudaMallocAsync backend's `mallocAsync(void** devPtr, c10::DeviceIndex device,
size_t size, cudaStream_t stream)`, a free function in an anonymous namespace of
CudaMallocAsync (c10/cuda/CUDAMallocAsyncAllocator.cpp): every tensor of that backend."""
MALLOC_ASYNC_INT_DEVICE = f"{_ASYNC}11mallocAsyncEPPvimP11CUstream_st"
"""2.1's: the device an int."""
FREE_ASYNC = f"{_ASYNC}9freeAsyncEPv"
"""`freeAsync(void* ptr)`: every tensor's free of that backend. Its memory goes back
at the `cudaFreeAsync` (libcuda's cuMemFreeAsync) of that pointer, inside it or, for a
tensor made outside a CUDA graph capture and freed during one, deferred to the next
mallocAsync after the capture."""
_DEVICE = "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator"
INSERT_EVENTS = f"{_DEVICE}13insert_eventsEPNS2_12_GLOBAL__N_15BlockE"
"""DeviceCachingAllocator::insert_events(Block*): a free whose block another stream still
uses (recordStream) waits for events on those streams: called inside that free."""
FREE_BLOCK = (f"{_DEVICE}10free_blockEPNS2_12_GLOBAL__N_15Block"
              "ERKSt10shared_ptrINS_15GatheredContextEE")
"""DeviceCachingAllocator::free_block(Block*, std::shared_ptr<GatheredContext> const&): a
block back in the cache, inside its free, or for a deferred one in process_events once
its streams' events have completed. The Block is known only by its address (its layout
differs per release): the probe pairs it with the pointer of the free that deferred it."""


@dataclass(frozen=True)
class Release:
    """The entry points of one line of PyTorch releases: malloc, and the functions
    a free enters with the pointer in argument `n` (1-based, `this` counted)."""

    name: str
    malloc: str
    frees: tuple[tuple[str, int], ...]
    async_malloc: str = MALLOC_ASYNC
    async_free: str = FREE_ASYNC
    defer: str = INSERT_EVENTS
    release_block: str = FREE_BLOCK


RELEASES: tuple[Release, ...] = (
    # v2.14.1 (c10/cuda/CUDACachingAllocator.cpp, class NativeCachingAllocator:
    # `void malloc(void** devPtr, c10::DeviceIndex device, size_t size,
    # cudaStream_t stream)`, `void free(void* ptr)`, which local_raw_delete and
    # raw_delete call); read on the wheel's libc10_cuda.so (torch-2.14.1-cp311
    # manylinux_2_28_x86_64): both LOCAL in .symtab, malloc with one `ret`
    Release("2.14", MALLOC, ((FREE, 2),)),
    # (each line's async backend, c10/cuda/CUDAMallocAsyncAllocator.cpp at the same
    # tag: `void mallocAsync(void** devPtr, c10::DeviceIndex device, size_t size,
    # cudaStream_t stream)` and `void freeAsync(void* ptr)` in
    # CudaMallocAsync::(anonymous namespace), LOCAL in .symtab of all three wheels,
    # mallocAsync with one `ret`; 2.1.2's takes an `int device`; and
    # DeviceCachingAllocator::insert_events(Block*) and free_block(Block*,
    # std::shared_ptr<GatheredContext> const&), LOCAL in all three, the same names)
    # v2.5.1: the same malloc; free has no symbol (inlined into its two callers,
    # the DataPtr deleter `local_raw_delete(void*)` and `raw_delete(void*)`), read on
    # torch-2.5.1-cp311 manylinux1_x86_64's libc10_cuda.so
    Release("2.5", MALLOC, ((LOCAL_RAW_DELETE, 1), (RAW_DELETE, 2))),
    # v2.1.2: `void malloc(void** devPtr, int device, size_t size, cudaStream_t
    # stream)`; free inlined as in 2.5; read on torch-2.1.2-cp311 manylinux1_x86_64
    Release("2.1", MALLOC_INT_DEVICE, ((LOCAL_RAW_DELETE, 1), (RAW_DELETE, 2)),
            MALLOC_ASYNC_INT_DEVICE),
)

LIBRARY = "libc10_cuda.so"


@dataclass(frozen=True)
class ProbePoints:
    """The probe points found in one file: link-time addresses."""

    release: str
    malloc: int
    malloc_rets: tuple[int, ...]
    frees: tuple[tuple[int, int], ...]  # (address, argument holding the pointer)
    async_malloc: int = 0  # the cudaMallocAsync backend's; 0: not in this file
    async_rets: tuple[int, ...] = ()
    async_free: int = 0
    defer: int = 0  # insert_events and free_block; 0: deferred frees not seen
    release_block: int = 0


class SymbolsMissing(ValueError):
    """The file is no caching allocator this gputrace knows: the reason, in one line."""


def _func(e: elf.Elf, name: str) -> tuple[int, int] | None:
    try:
        i = e.names.index(name)
    except ValueError:
        return None
    return e.starts[i], e.ends[i]


def find(path: str) -> ProbePoints:
    """The entry points of the libc10_cuda.so at `path`, or SymbolsMissing."""
    try:
        e = elf.read(path)
    except elf.ElfError as err:
        raise SymbolsMissing(str(err)) from None
    for rel in RELEASES:
        m = _func(e, rel.malloc)
        frees = [(_func(e, name), arg) for name, arg in rel.frees]
        if m is None or any(f is None for f, _ in frees):
            continue
        if m[1] <= m[0]:
            raise SymbolsMissing(f"{path}: malloc's symbol has no size")
        rets = ret_sites(path, e, m[0], m[1])
        am, af = _func(e, rel.async_malloc), _func(e, rel.async_free)
        a_rets: tuple[int, ...] = ()
        if am is not None and af is not None and am[1] > am[0]:
            try:
                a_rets = ret_sites(path, e, am[0], am[1])
            except SymbolsMissing:
                a_rets = ()  # the native allocator is still traced; async not
        async_points = (am[0], a_rets, af[0]) if a_rets and am and af else (0, (), 0)
        d, fb = _func(e, rel.defer), _func(e, rel.release_block)
        return ProbePoints(rel.name, m[0], rets, tuple((f[0], arg) for f, arg in frees if f),
                           *async_points, *((d[0], fb[0]) if d and fb else (0, 0)))
    where = ".symtab" if e.has_symtab else ".dynsym only (stripped)"
    raise SymbolsMissing(f"{path}: no NativeCachingAllocator::malloc/free in {where} "
                         "(a PyTorch release this gputrace has no table for)")


def ret_sites(path: str, e: elf.Elf, start: int, end: int) -> tuple[int, ...]:
    """The addresses of malloc's `ret` instructions, from its .eh_frame rows."""
    try:
        from elftools.dwarf.callframe import FDE
        from elftools.elf.elffile import ELFFile
    except ImportError:
        raise SymbolsMissing("pyelftools is not installed (pip install 'gputrace[record]')"
                             ) from None  # fmt: skip
    pcs: list[int] = []
    with open(path, "rb") as fh:
        ef = ELFFile(fh)
        dw = ef.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
        if not dw.has_EH_CFI():
            raise SymbolsMissing(f"{path}: no .eh_frame to find malloc's returns in")
        fde = next((x for x in dw.EH_CFI_entries() if isinstance(x, FDE)
                    and x["initial_location"] == start), None)  # fmt: skip
        if fde is None:
            raise SymbolsMissing(f"{path}: malloc has no .eh_frame entry")
        for line in fde.get_decoded().table:
            cfa = line.get("cfa")
            if line["pc"] > start and cfa is not None and cfa.expr is None \
                    and cfa.reg == 7 and cfa.offset == 8:  # fmt: skip
                pcs.append(int(line["pc"]))
        code = _bytes(ef, pcs)
    rets = []
    for pc in pcs:
        b = code.get(pc, b"")
        if b[:1] == b"\xc3" or b[:2] == b"\xf3\xc3":
            rets.append(pc)
        else:  # a tail jump (or anything else) ends the frame: its return is not seen
            raise SymbolsMissing(f"{path}: malloc leaves by other than `ret` at {pc:#x}")
    if not rets or any(not start < pc < end for pc in rets):
        raise SymbolsMissing(f"{path}: malloc's `ret` instructions were not found")
    return tuple(rets)


def _bytes(ef: object, pcs: list[int]) -> dict[int, bytes]:
    """Two bytes of code at each link-time address in `pcs`."""
    out: dict[int, bytes] = {}
    for seg in ef.iter_segments():  # type: ignore[attr-defined]
        if seg["p_type"] != "PT_LOAD":
            continue
        lo, hi = seg["p_vaddr"], seg["p_vaddr"] + seg["p_filesz"]
        data = None
        for pc in pcs:
            if lo <= pc < hi - 1:
                data = data if data is not None else seg.data()
                out[pc] = bytes(data[pc - lo: pc - lo + 2])
    return out


def mapped_libraries(proc: str = "/proc") -> dict[str, int]:
    """libc10_cuda.so files mapped by running processes: path -> one pid mapping it."""
    import os
    import re

    name = re.compile(r"^libc10_cuda\.so(\.[\w.]+)?$")
    out: dict[str, int] = {}
    for d in os.listdir(proc):
        if not d.isdigit():
            continue
        try:
            with open(f"{proc}/{d}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and name.match(os.path.basename(parts[5].strip())):
                        out.setdefault(parts[5].strip().removesuffix(" (deleted)"), int(d))
        except OSError:
            continue
    return out


def verdicts(paths: dict[str, int], proc: str = "/proc") -> list[tuple[str, str | None]]:
    """(path, None when probed as a known release, else why not) of each library."""
    out: list[tuple[str, str | None]] = []
    for path, pid in sorted(paths.items()):
        try:
            find(path if path.startswith(proc) else f"{proc}/{pid}/root{path}")
            out.append((path, None))
        except (SymbolsMissing, OSError) as e:
            out.append((path, str(e).rsplit(": ", 1)[-1] if ": " in str(e) else str(e)))
    return out
