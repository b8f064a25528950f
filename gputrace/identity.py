"""Which container and which Kubernetes pod a process belongs to, from its cgroup
path and, for names, the node's own files: no API server, no runtime socket.

The one place these facts are derived (the `processes` columns of
`schema.IDENTITY_COLUMNS`; `Identity` mirrors them, a test checks the two agree).
Pure standard library: the recorder, the tests and the analyses import it without
bcc or polars.

Layouts recognised (the path as /proc/PID/cgroup or the cgroup v2 tree shows it):

- Kubernetes, cgroupfs driver: `/kubepods/<qos>/pod<uid>/<64-hex>` (a Guaranteed pod
  has no QoS level: `/kubepods/pod<uid>/<64-hex>`); CRI-O there: `.../crio-<64-hex>`;
- Kubernetes, systemd driver: `/kubepods.slice/kubepods-<qos>.slice/
  kubepods-<qos>-pod<uid with _>.slice/{cri-containerd,crio,docker}-<64-hex>.scope`;
- containerd without the systemd driver: `...:cri-containerd:<64-hex>`;
- Docker: `/docker/<64-hex>`, `/system.slice/docker-<64-hex>.scope`;
- Podman: `libpod-<64-hex>.scope` (or `/libpod_parent/libpod-<64-hex>`);
- containerd's `ctr`: `/default/<64-hex>`.

A pod is recognised only under a cgroup root kubelet uses (KUBE_ROOTS, or the roots
named in KUBE_ROOTS_ENV on an unusual node; docs/containers.md), or below a path that
climbs out of the reader's cgroup namespace (`/../..`: where kubelet's tree begins is
hidden there): a delegated subtree can make `.../kubepods/besteffort/pod<uid>/<id>` of
any pod's uid, and is not that pod.

A runtime's monitor (`crio-conmon-*`, `libpod-conmon-*`) is no workload: no container.
Anything else gives no identity at all (None everywhere), never a guess. A bare id under
a pod (cgroupfs) does not say its runtime; the runtime's own files may (`NodeNames`).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

RUNTIMES = ("docker", "containerd", "cri-o", "podman")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")

_HEX64 = r"[0-9a-f]{64}"
_UID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_SCOPE_PREFIX = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o",
                 "libpod": "podman"}
_SCOPE = re.compile(rf"(docker|cri-containerd|crio|libpod)-({_HEX64})(?:\.scope)?")
_CONMON = re.compile(rf"(?:crio|libpod)-conmon-{_HEX64}(?:\.scope)?")
_COLON = re.compile(rf"(.*):(cri-containerd|crio|docker):({_HEX64})")
_BARE = re.compile(_HEX64)
_POD_CGROUPFS = re.compile(rf"pod({_UID})")
_POD_SYSTEMD = re.compile(
    r"(?:.*-)?kubepods(?:-(burstable|besteffort))?-pod"
    r"([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})\.slice")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""What a namespace, pod or container name may be (Kubernetes names are DNS labels or
subdomains); anything else read from the host is dropped, not shown."""

KUBE_ROOTS = ("/kubepods", "/kubepods.slice", "/kubelet/kubepods",
              "/kubelet.slice/kubelet-kubepods.slice")
"""Where kubelet makes its pods' cgroups: the cgroupfs and systemd drivers at the
default --cgroup-root, and at kind's (`/kubelet`)."""
KUBE_ROOTS_ENV = "GPUTRACE_KUBEPODS_ROOTS"
"""Colon-separated absolute cgroup paths that replace KUBE_ROOTS (a node whose
kubelet runs with another --cgroup-root)."""

MAX_JSON_BYTES = 1 << 22
"""The most of a runtime's JSON file read (a container's config is tens of KiB)."""
RESCAN_S = 1.0
"""/var/log/pods is listed again for an unknown pod uid at most this often."""


@dataclass(frozen=True)
class Identity:
    """A process's container and pod (the processes columns of the same names)."""

    container_id: str | None = None
    container_runtime: str | None = None
    pod_uid: str | None = None
    qos_class: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    container_name: str | None = None


    def labels(self) -> tuple[str, str, str]:
        """(namespace, pod, container) as metric labels: names, else the uid and id, else
        empty (Prometheus's absent label)."""
        return (self.pod_namespace or "", self.pod_name or self.pod_uid or "",
                self.container_name or self.container_id or "")


NONE = Identity()


def from_cgroup(path: str | None) -> Identity:
    """The identity a cgroup path tells (no names: see `NodeNames`)."""
    if not path:
        return NONE
    parts = [p for p in path.strip().split("/") if p]
    for i in range(len(parts) - 1, -1, -1):  # the innermost container; below it, its own
        part = parts[i]
        if _CONMON.fullmatch(part):
            return _pod(parts[:i])
        m = _SCOPE.fullmatch(part)
        if m:
            pod = _pod(parts[:i])
            return replace(pod, container_id=m.group(2),
                           container_runtime=_SCOPE_PREFIX[m.group(1)])
        m = _COLON.fullmatch(part)
        if m:
            pod = _pod([*parts[:i], m.group(1)], top_ok=True)
            return replace(pod, container_id=m.group(3),
                           container_runtime=_SCOPE_PREFIX[m.group(2)])
        if _BARE.fullmatch(part):
            parent = parts[i - 1] if i else ""
            if i == 1 and parent in ("docker", "default"):
                return Identity(container_id=part,
                                container_runtime="docker" if parent == "docker"
                                else "containerd")
            pod = _pod(parts[:i])
            return replace(pod, container_id=part) if pod.pod_uid else NONE
    return NONE


def kube_roots() -> tuple[str, ...]:
    """The cgroup roots under which pods are recognised (KUBE_ROOTS_ENV, else
    KUBE_ROOTS); a root that is not an absolute path is ignored."""
    named = os.environ.get(KUBE_ROOTS_ENV)
    if named is None:
        return KUBE_ROOTS
    return tuple("/" + "/".join(p for p in r.split("/") if p)
                 for r in named.split(":") if r.startswith("/"))


def _rooted(prefix: list[str], top_ok: bool = False) -> bool:
    """Is `prefix` (the path above kubelet's pods) one of kubelet's roots? A prefix of
    `..` only climbs out of the reader's cgroup namespace: the rest is kubelet's."""
    if prefix and all(p == ".." for p in prefix):
        return True
    if not prefix:
        return top_ok
    return "/" + "/".join(prefix) in kube_roots()


def _pod(parts: list[str], top_ok: bool = False) -> Identity:
    """The pod whose cgroup ends `parts` (its last element), under a kubepods root
    (`top_ok`: the cgroup root itself counts, for runc's `slice:runtime:id` form)."""
    if not parts:
        return NONE
    last = parts[-1]
    m = _POD_SYSTEMD.fullmatch(last)
    if m:  # the slice's own name says kubepods; its QoS slice, then the root above
        qos = m.group(1)
        above = parts[:-1]
        if qos and above and above[-1].endswith(f"kubepods-{qos}.slice"):
            above = above[:-1]
        if not _rooted(above, top_ok):
            return NONE
        return Identity(pod_uid=m.group(2).replace("_", "-"), qos_class=qos or "guaranteed")
    m = _POD_CGROUPFS.fullmatch(last)
    if m and len(parts) >= 2:
        parent = parts[-2]
        if parent.endswith("kubepods") and _rooted_cgroupfs(parts[:-1]):
            return Identity(pod_uid=m.group(1), qos_class="guaranteed")
        if parent in ("burstable", "besteffort") and len(parts) >= 3 and parts[-3].endswith(
                "kubepods") and _rooted_cgroupfs(parts[:-2]):
            return Identity(pod_uid=m.group(1), qos_class=parent)
    return NONE


def _rooted_cgroupfs(kubepods: list[str]) -> bool:
    """Is `kubepods` (a path ending in kubelet's `kubepods` cgroup) a root of kubelet's,
    or that cgroup seen from inside a cgroup namespace (`/../../kubepods`)?"""
    if all(p == ".." for p in kubepods[:-1]) and kubepods[:-1]:
        return True
    return "/" + "/".join(kubepods) in kube_roots()


def proc_cgroup_paths(text: str) -> list[str]:
    """The paths of a /proc/PID/cgroup text, the v2 one ('0::') first, then v1's
    (memory, name=systemd, then the rest: on a hybrid host a container's v1 paths may
    say what the v2 one does not)."""
    v2: list[str] = []
    v1: list[tuple[int, str]] = []
    for ln in text.splitlines():
        fields = ln.split(":", 2)
        if len(fields) != 3:
            continue
        _hid, ctrls, path = fields
        if ctrls == "":
            v2.append(path)
        else:
            rank = 0 if "memory" in ctrls.split(",") else 1 if ctrls == "name=systemd" else 2
            v1.append((rank, path))
    return v2 + [p for _, p in sorted(v1, key=lambda x: x[0])]


def from_proc_cgroup(text: str) -> Identity:
    """The identity of the first of `proc_cgroup_paths` that tells one."""
    for path in proc_cgroup_paths(text):
        got = from_cgroup(path)
        if got != NONE:
            return got
    return NONE


def pod_log_dir(name: str) -> tuple[str, str, str] | None:
    """(namespace, pod name, pod uid) of a /var/log/pods entry
    `<namespace>_<pod-name>_<pod-uid>` (names hold no '_'), or None."""
    fields = name.split("_")
    if len(fields) != 3 or not re.fullmatch(_UID, fields[2]):
        return None
    ns, pod, uid = fields
    return (ns, pod, uid) if _name(ns) and _name(pod) else None


def _name(text: object) -> str | None:
    return text if isinstance(text, str) and _NAME.fullmatch(text) else None


def container_files(root: Path, cid: str) -> list[tuple[str, Path, tuple[str, ...]]]:
    """(runtime, file, keys to the container name) for each runtime's file about
    container `cid` under host root `root`."""
    return [
        ("containerd", root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / cid
         / "config.json", ("annotations", "io.kubernetes.cri.container-name")),
        ("cri-o", root / "run/containers/storage/overlay-containers" / cid / "userdata"
         / "config.json", ("annotations", "io.kubernetes.container.name")),
        ("docker", root / "var/lib/docker/containers" / cid / "config.v2.json",
         ("Config", "Labels", "io.kubernetes.container.name")),
    ]


def read_json(path: Path) -> object:
    """A JSON file of at most MAX_JSON_BYTES (None when absent, larger or not JSON):
    the runtime's files are read, never trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_JSON_BYTES:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _dig(doc: object, keys: tuple[str, ...]) -> object:
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


class NodeNames:
    """Names the node tells without an API server, under host root `root` ('/' on a
    host; `record --kube-root` elsewhere): pod namespace and name from
    /var/log/pods/<namespace>_<pod-name>_<pod-uid>/, the container's name (and, for an
    id whose cgroup did not say, its runtime) from the runtime's files. Each pod and
    container is looked up once."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self._pods: dict[str, tuple[str, str]] = {}
        self._scanned = -RESCAN_S
        self._containers: dict[str, tuple[str | None, str | None]] = {}

    def pod(self, uid: str) -> tuple[str, str] | None:
        """(namespace, name) of pod `uid`, or None when the node does not say."""
        if uid not in self._pods and time.monotonic() - self._scanned >= RESCAN_S:
            self._scanned = time.monotonic()
            try:
                entries = os.listdir(self.root / "var/log/pods")
            except OSError:
                entries = []
            for e in entries:
                got = pod_log_dir(e)
                if got is not None:
                    self._pods[got[2]] = (got[0], got[1])
        return self._pods.get(uid)

    def container(self, cid: str) -> tuple[str | None, str | None]:
        """(runtime, name) of container `cid` from the first runtime file about it that
        can be read; (None, None) when none can."""
        if cid not in self._containers:
            found: tuple[str | None, str | None] = (None, None)
            for runtime, path, keys in container_files(self.root, cid):
                doc = read_json(path)
                if doc is not None:
                    found = (runtime, _name(_dig(doc, keys)))
                    break
            self._containers[cid] = found
        return self._containers[cid]

    def named(self, ident: Identity) -> Identity:
        """`ident` with what the node says of its names (and a runtime its cgroup did
        not tell, from whose files name it)."""
        out = ident
        if ident.pod_uid:
            got = self.pod(ident.pod_uid)
            if got is not None:
                out = replace(out, pod_namespace=got[0], pod_name=got[1])
        if ident.container_id:
            runtime, name = self.container(ident.container_id)
            if runtime is not None and out.container_runtime in (None, runtime):
                out = replace(out, container_runtime=runtime, container_name=name)
        return out
