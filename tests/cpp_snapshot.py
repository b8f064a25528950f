"""A synthetic PyTorch memory snapshot recorded with C++ stacks (the default since
PyTorch 2.1: `_record_memory_history(stacks="all")`), built here, not recorded.

Each frame list is what PyTorch writes for such a snapshot, innermost first: the
unwinder (`torch::unwind::unwind`, `CapturedTraceback::gather`), the caching
allocator and the dispatcher (c10::, at::), the binding, CPython's eval loop, then
the Python frames of torch and of the program, and the interpreter's start-up.

The truth, one user line per stack (`SITES`): what each site must read, distinct,
with none of those library frames in it. Two sites share function, file base name
and line (`forward (model.py:42)` in two directories), so their labels must be told
apart; one allocation comes from a Windows path; one lives only in torch (no user
frame at all).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

MiB = 1 << 20
PY = "/usr/local/src/conda/python-3.10.13"
TORCH = "/opt/conda/lib/python3.10/site-packages/torch"


def _f(name: str, filename: str = "??", line: int = 0) -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": line}


UNWIND = [
    _f("torch::unwind::unwind()"),
    _f("torch::CapturedTraceback::gather(bool, bool, bool)",
       "/pytorch/torch/csrc/profiler/combined_traceback.cpp", 40),
    _f("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
       "signed char, unsigned long, CUstream_st*)", "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
       1104),
    _f("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, "
       "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
       "/pytorch/aten/src/ATen/EmptyTensor.cpp", 190),
    _f("at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>, ...)",
       "/pytorch/build/aten/src/ATen/Operators_2.cpp", 6291),
    _f("torch::autograd::THPVariable_randn(_object*, _object*, _object*)",
       "/pytorch/torch/csrc/autograd/generated/python_torch_functions_0.cpp", 4800),
    _f("cfunction_call", f"{PY}/Objects/methodobject.c", 543),
    _f("_PyObject_MakeTpCall", f"{PY}/Objects/call.c", 215),
    _f("_PyEval_EvalFrameDefault", f"{PY}/Python/ceval.c", 4181),
]
START = [_f("_PyEval_EvalFrameDefault", f"{PY}/Python/ceval.c", 4181),
         _f("PyRun_SimpleFileExFlags", f"{PY}/Python/pythonrun.c", 1250),
         _f("Py_BytesMain", f"{PY}/Modules/main.c", 1094),
         _f("__libc_start_main"), _f("_start")]
TRAIN = [_f("train_step", "/home/u/proj/train.py", 17), _f("main", "/home/u/proj/train.py", 30),
         _f("<module>", "/home/u/proj/train.py", 40)]
MODULE = [_f("_call_impl", f"{TORCH}/nn/modules/module.py", 1501),
          _f("_PyEval_EvalFrameDefault", f"{PY}/Python/ceval.c", 4181)]

STACKS: dict[str, list[dict[str, Any]]] = {
    # the program's own line, one frame outward of the eval loop
    "forward (/home/u/proj/a/model.py:42)": [*UNWIND, _f("forward", "/home/u/proj/a/model.py", 42),
                                 *MODULE, *TRAIN, *START],
    "forward (/home/u/proj/b/model.py:42)": [*UNWIND, _f("forward", "/home/u/proj/b/model.py", 42),
                                 *MODULE, *TRAIN, *START],
    # inside torch's Python: the site is the user's line that called it
    "forward (model.py:51)": [*UNWIND, _f("linear", f"{TORCH}/nn/functional.py", 2268),
                              _f("forward", "/home/u/proj/a/model.py", 51), *MODULE,
                              *TRAIN, *START],
    # inside an installed package (diffusers)
    "run (pipeline.py:9)": [*UNWIND, _f("__call__", "/opt/conda/lib/python3.10/site-packages/"
                                        "diffusers/pipelines/pipeline_utils.py", 880),
                            _f("run", "/home/u/proj/pipeline.py", 9), *TRAIN, *START],
    # through the standard library
    "load (data.py:3)": [*UNWIND, _f("_worker", "/opt/conda/lib/python3.10/concurrent/futures/"
                                     "thread.py", 58),
                         _f("load", "/home/u/proj/data.py", 3), *START],
    # a Windows program
    "step (train.py:88)": [*UNWIND, _f("run", "C:\\Python311\\Lib\\threading.py", 975),
                           _f("step", "C:\\Users\\u\\proj\\train.py", 88), *START],
    "train_step (train.py:17)": [*UNWIND, *TRAIN, *START],
    "main (train.py:30)": [*UNWIND, *TRAIN[1:], *START],
    # torch alone (its own thread): no user frame; named by torch's innermost frame
    "backward (graph.py:744)": [*UNWIND, _f("backward", f"{TORCH}/autograd/graph.py", 744),
                                *START],
}
SITES = list(STACKS)
"""The label each stack's site must read (the first two told apart by their full
paths, since both would read `forward (model.py:42)`)."""


OOM_MIB = 4096
"""With `oom_then_free`: the request that failed (4 GiB), 1 GiB free on the device."""


def snapshot(sizes_mib: dict[str, int] | None = None,
             oom_then_free: str | None = None) -> dict[str, Any]:
    """The snapshot: one segment per stack on device 0 holding one active block, and
    the history that allocated each (segment_alloc then alloc, 1 ms apart). With
    `oom_then_free` (a site), an allocation of OOM_MIB fails after them, and then that
    site's tensor is freed: at the failure its block was allocated, at the end it is
    free."""
    sizes = sizes_mib or {site: i + 1 for i, site in enumerate(SITES)}
    segments, trace = [], []
    addr, t = 0x7F0000000000, 1_700_000_000_000_000
    for site, frames in STACKS.items():
        size = sizes.get(site, 0) * MiB
        if not size:
            continue
        freed = site == oom_then_free
        block = {"address": addr, "size": size, "requested_size": size,
                 "state": "inactive" if freed else "active_allocated",
                 "frames": [] if freed else frames}
        held = 0 if freed else size
        segments.append({"device": 0, "address": addr, "total_size": size,
                         "allocated_size": held, "active_size": held, "requested_size": held,
                         "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                         "is_expandable": False, "frames": frames, "blocks": [block]})
        for action in ("segment_alloc", "alloc"):
            trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                          "time_us": t, "compile_context": "N/A", "user_metadata": "",
                          "frames": frames})
            t += 1000
        addr += size
    if oom_then_free is not None:
        gone = next(seg for seg in segments if seg["frames"] is STACKS[oom_then_free])
        trace.append({"action": "oom", "size": OOM_MIB * MiB, "device_free": 1 << 30,
                      "stream": 0, "time_us": t, "frames": STACKS[SITES[0]]})
        for action in ("free_requested", "free_completed"):
            t += 1000
            trace.append({"action": action, "addr": gone["address"],
                          "size": gone["total_size"], "stream": 0, "time_us": t,
                          "frames": STACKS[oom_then_free]})
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False,
                                   "max_split_size": -1},
            "external_annotations": []}


def write(path: Path, sizes_mib: dict[str, int] | None = None,
          oom_then_free: str | None = None) -> Path:
    """The snapshot pickled at `path`."""
    path.write_bytes(pickle.dumps(snapshot(sizes_mib, oom_then_free)))
    return path
