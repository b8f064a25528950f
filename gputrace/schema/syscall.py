"""Tables of the syscall layer: processes, and the ioctls, fd operations and mappings
of NVIDIA device files, as the tracepoint probes see them (any kernel with BPF).
"""

from __future__ import annotations

from gputrace.schema import model
from gputrace.schema.enums import (
    DEVICE_KINDS,
    FD_OPS,
    MAPPING_OPS,
)
from gputrace.schema.model import (
    BOOL,
    I16,
    I32,
    I64,
    STR,
    U32,
    U64,
    Column,
    PartSet,
    Table,
    enum_columns,
    who,
)

IDENTITY_COLUMNS = (
    Column("container_id", STR, "",
           "the container's id (64 hex), from the cgroup path (gputrace/identity.py: the "
           "layouts read); null outside a container or in a layout not known"),
    Column("container_runtime", STR, "",
           "docker, containerd, cri-o or podman: from the cgroup path or, when it does not "
           "say, the runtime whose files hold the container id; null when unknown", since=5),
    Column("pod_uid", STR, "", "Kubernetes pod uid (with dashes), from the cgroup path", since=5),
    Column("qos_class", STR, "", "the pod's QoS class: guaranteed, burstable or besteffort",
           since=5),
    Column("pod_namespace", STR, "",
           "the pod's namespace, from the node's /var/log/pods (null when not readable)", since=5),
    Column("pod_name", STR, "", "the pod's name, from the node's /var/log/pods", since=5),
    Column("container_name", STR, "",
           "the container's name in its pod, from the runtime's files (containerd, CRI-O, "
           "Docker) where readable", since=5),
)
"""Who a process is, as containers and Kubernetes say it: derived once, from the cgroup
path and the node's files, by gputrace/identity.py (whose `Identity` mirrors these)."""

PROCESSES = Table(
    "processes",
    "One row per process instance seen touching NVIDIA devices (or traced as a target).",
    "syscall",
    (
        Column("pid", I32, "", "process id (tgid)", False),
        Column("ppid", I32, "", "parent process id"),
        Column("comm", STR, "", "process name"),
        Column("exe", STR, "",
               "path of the executable (null when the process was gone before /proc "
               "could be read: docs/record.md)"),
        Column("cmdline", STR, "",
               "command line, arguments joined by spaces (null when gone before /proc "
               "could be read)"),
        Column("cgroup", STR, "", "cgroup v2 path (a v1-only host: the memory controller's)"),
        Column("start_ts_ns", I64, "ns",
               "process start: its fork (null when it predates the trace)"),
        Column("exit_ts_ns", I64, "ns", "process exit (null when it outlived the trace)"),
        Column("exit_code", I32, "", "exit status as wait(2) reports it"),
        Column("zombie_threads", I32, "",
               "threads still running when the recorder read the process at its main "
               "thread's exit: more than 0 is a zombie (`ps` shows it <defunct>) whose "
               "threads keep its files and GPU memory; null when not read", since=6),
        *IDENTITY_COLUMNS,  # last: identity.Identity mirrors them
    ),
)

IOCTLS = Table(
    "ioctls",
    "Every ioctl on an NVIDIA device file, decoded at entry and exit.",
    "syscall",
    (
        *who(),
        *enum_columns("device", DEVICE_KINDS, "device file kind"),
        Column("gpu_index", I16, "",
               "N of /dev/nvidiaN; for RM_ALLOC of a device (0x80) its deviceId (the RM "
               "device instance); null otherwise"),
        Column("fd", I32, "", "file descriptor", False),
        Column("cmd", U32, "", "raw ioctl request number", False),
        Column("nr", U32, "", "RM escape number (_IOC_NR) or UVM command number", False),
        Column("name", STR, "", "decoded command, e.g. RM_ALLOC, RM_FREE, UVM_FREE", False),
        Column("ret", I64, "", "syscall return value (negative errno)"),
        Column("status", U32, "", "NV_STATUS from the parameters (0 = NV_OK; null when none)"),
        Column("latency_ns", I64, "ns", "time from syscall entry to exit"),
        Column("h_client", U32, "", "RM client handle"),
        Column("h_parent", U32, "", "RM parent handle (RM_ALLOC) or device handle"),
        Column("h_object", U32, "", "RM object handle (new, freed, or mapped hMemory)"),
        Column("h_class", U32, "", "RM class of an allocated object"),
        Column("size_bytes", U64, "bytes", "allocation or mapping size"),
        Column("va_base", U64, "address", "UVM/GPU virtual base address"),
        Column("va_length", U64, "bytes", "UVM/GPU virtual length"),
        Column("offset", U64, "bytes", "offset (RM map offset, alloc OUT offset)"),
        Column("alignment", U64, "bytes", "requested alignment of a memory allocation"),
        Column("flags", U32, "", "command flags (NVOS32 alloc flags, map flags, UVM flags)"),
        Column("attr", U32, "", "NVOS32 attr of a memory allocation"),
        Column("attr2", U32, "", "NVOS32 attr2 of a memory allocation"),
        Column("ctrl_cmd", U32, "",
               "RM_CONTROL command; for RM_VID_HEAP_CONTROL the NVOS32 function (2 alloc, 3 free)"),
        Column("ref_fd", I32, "", "fd named inside the parameters (rmCtrlFd, uvmFd, map fd)"),
        Column("gpu_uuid", STR, "", "GPU UUID named by a UVM command, GPU-xxxxxxxx-... form"),
    ),
    part_sets=(
        PartSet("gputrace.ioctl_commands", ("device_code", "nr", "device", "name"),
                "the commands of the part's rows: each (device_code, nr) once, with the "
                "device kind and command name the decoder gave it"),
    ),
)

IOCTL_COMMANDS = IOCTLS.part_sets[0]
"""The `ioctls` parts' command set: lets the ioctl summary skip scanning the names."""

FILES = Table(
    "files",
    "Opens, duplications and closes of NVIDIA device fds (the RM frees a control "
    "fd's clients when its last reference closes).",
    "syscall",
    (
        *who(),
        *enum_columns("fd_op", FD_OPS, "what happened (seen = already open when recording began)"),
        *enum_columns("device", DEVICE_KINDS, "device file kind"),
        Column("gpu_index", I16, "", "N of /dev/nvidiaN (null for other devices)"),
        Column("fd", I32, "", "the fd opened, duplicated from, or closed", False),
        Column("new_fd", I32, "", "the new fd of a dup (null otherwise)"),
        Column("ret", I64, "", "syscall return value (negative errno)"),
    ),
)

MAPPINGS = Table(
    "mappings",
    "mmap and munmap of NVIDIA device files (managed ranges, RM mappings).",
    "syscall",
    (
        *who(),
        *enum_columns("op", MAPPING_OPS, "operation"),
        *enum_columns("device", DEVICE_KINDS, "device file kind (munmap: of the range's mmap)"),
        Column("gpu_index", I16, "", "N of /dev/nvidiaN (null for other devices)"),
        Column("fd", I32, "", "file descriptor (-1 for munmap)"),
        Column("addr", U64, "address", "start address: mmap result, or munmap argument"),
        Column("length", U64, "bytes", "length of the range", False),
        Column("offset", U64, "bytes", "file offset of an mmap"),
        Column("prot", U32, "", "PROT_* bits"),
        Column("flags", U32, "", "MAP_* bits"),
        Column("ret", I64, "", "syscall return (mmap: address or negative errno)"),
        Column("managed", BOOL, "", "mmap of the uvm fd with offset == address: a managed range"),
        Column("latency_ns", I64, "ns", "time from syscall entry to exit"),
    ),
)

CATALOG = model.Catalog(("syscall",), (PROCESSES, IOCTLS, FILES, MAPPINGS))
"""This module's layers and tables, in catalog order (`schema.CATALOG_MODULES`)."""
